// The CPU model every benchmark prints beside its numbers. Shared by the benches.
#ifndef MODSERVE_TESTS_BENCH_CPU_MODEL_H_
#define MODSERVE_TESTS_BENCH_CPU_MODEL_H_

#include <fstream>
#include <string>

namespace modserve::bench {

// "model name" from /proc/cpuinfo, or `fallback` when there is none.
inline std::string CpuModel(const std::string& fallback = "unknown CPU") {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return fallback;
}

}  // namespace modserve::bench

#endif  // MODSERVE_TESTS_BENCH_CPU_MODEL_H_
