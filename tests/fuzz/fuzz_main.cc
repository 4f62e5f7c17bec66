// libFuzzer entry point for one target, chosen at compile time by MODSERVE_FUZZ_TARGET (a name
// from fuzz_targets.cc). It adds nothing to the target: the checks live in the target itself.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "tests/fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const modserve::fuzz::FuzzFn fn = [] {
    const modserve::fuzz::FuzzFn f = modserve::fuzz::FindTarget(MODSERVE_FUZZ_TARGET);
    if (f == nullptr) {
      std::fprintf(stderr, "unknown fuzz target %s\n", MODSERVE_FUZZ_TARGET);
      std::abort();
    }
    return f;
  }();
  return fn(data, size);
}
