// quant_dump OUT_DIR: quantizes a fixed, seeded set of rows (Gaussian at scales 1e-5 .. 1e3,
// zeros, constants, all-negative, single spikes, heavy tails, near-subnormal values) with every
// quantized type and writes, per type T: T.src.f32 (the input), T.blocks (quant::QuantizeRow's
// bytes) and T.deq.f32 (quant::DequantizeRow's output), for tests/python/test_quant_gguf.py to
// compare with the `gguf` package. A test helper, not a user tool.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/common/dtype.h"
#include "engine/common/quant.h"

namespace {

constexpr int64_t kRowElems = 512;
constexpr int kNumRows = 96;

std::vector<float> MakeRows() {
  std::mt19937 rng(20261201);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::exponential_distribution<float> expo(1.0f);
  std::vector<float> x(kRowElems * kNumRows);
  for (int r = 0; r < kNumRows; ++r) {
    float* row = x.data() + r * kRowElems;
    const float scale = std::pow(10.0f, -5.0f + 8.0f * uniform(rng));
    for (int64_t i = 0; i < kRowElems; ++i) {
      switch (r % 8) {
        case 0:
          row[i] = scale * normal(rng);
          break;
        case 1:
          row[i] = 0.0f;
          break;
        case 2:
          row[i] = -scale * (1.0f + uniform(rng));
          break;
        case 3:
          row[i] = scale;
          break;
        case 4:
          row[i] = i % 97 == 5 ? -scale * 50.0f : scale * 0.01f * normal(rng);
          break;
        case 5:
          row[i] = scale * uniform(rng);
          break;
        case 6:
          row[i] = (rng() & 1 ? scale : -scale) * expo(rng);
          break;
        default:
          row[i] = 3e-6f * normal(rng);
          break;
      }
    }
  }
  return x;
}

bool Write(const std::string& path, const void* data, size_t bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(data, 1, bytes, f) == bytes;
  return std::fclose(f) == 0 && ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: quant_dump OUT_DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  const std::vector<float> x = MakeRows();
  const int64_t n = static_cast<int64_t>(x.size());
  for (modserve::DType t : {modserve::DType::kQ8_0, modserve::DType::kQ4_0, modserve::DType::kQ4_1,
                            modserve::DType::kQ5_0, modserve::DType::kQ5_1, modserve::DType::kQ4_K,
                            modserve::DType::kQ5_K, modserve::DType::kQ6_K}) {
    const std::string name(modserve::DTypeName(t));
    std::vector<uint8_t> blocks(modserve::DTypeRowBytes(t, n));
    const absl::Status status = modserve::quant::QuantizeRow(t, x.data(), n, blocks.data());
    if (!status.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), status.ToString().c_str());
      return 1;
    }
    std::vector<float> y(n);
    modserve::quant::DequantizeRow(t, blocks.data(), n, y.data());
    if (!Write(dir + "/" + name + ".src.f32", x.data(), x.size() * 4) ||
        !Write(dir + "/" + name + ".blocks", blocks.data(), blocks.size()) ||
        !Write(dir + "/" + name + ".deq.f32", y.data(), y.size() * 4)) {
      std::fprintf(stderr, "cannot write under %s\n", dir.c_str());
      return 1;
    }
  }
  return 0;
}
