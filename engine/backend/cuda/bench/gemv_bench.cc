// modserve-cuda-gemv-bench: the decode GEMV (bf16 w, f32 x, n <= 8 rows) in every launch shape
// kernels::GemvVariantBf16 offers, on the matrices of the TinyLlama and Llama-3-8B shapes, against
// the device-to-device copy bandwidth measured in the same run. Weights rotate through copies that
// together are several times the L2, so every call reads HBM. Prints one markdown table; each
// variant's output is compared with variant 0 (the engine's), which differs only in summation
// order.
//
//   modserve-cuda-gemv-bench [--batches 1,2,4,8] [--calls 40]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/backend/cuda/kernels/kernels.h"
#include "tools/cli_usage.h"

ABSL_FLAG(std::string, batches, "1,2,4,8", "rows of x (1 to 8)");
ABSL_FLAG(int32_t, calls, 40, "timed calls per cell (after 3 warm-up calls)");

namespace {

#define CHECK_CUDA(expr)                                                 \
  do {                                                                   \
    const cudaError_t err_ = (expr);                                     \
    if (err_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr, \
                   cudaGetErrorString(err_));                            \
      std::exit(1);                                                      \
    }                                                                    \
  } while (0)

struct MatrixShape {
  const char* name;
  int64_t m, k;
};

constexpr MatrixShape kShapes[] = {
    {"tinyllama q/o", 2048, 2048},
    {"tinyllama k/v", 256, 2048},
    {"tinyllama gate/up", 5632, 2048},
    {"tinyllama down", 2048, 5632},
    {"tinyllama lm_head", 32000, 2048},
    {"8b q/o", 4096, 4096},
    {"8b k/v", 1024, 4096},
    {"8b gate/up", 14336, 4096},
    {"8b down", 4096, 14336},
    {"8b lm_head", 128256, 4096},
};

// Device-to-device copy of 1 GiB, bytes read plus bytes written, best of 5.
double CopyBandwidth() {
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, bytes));
  CHECK_CUDA(cudaMalloc(&b, bytes));
  CHECK_CUDA(cudaMemset(a, 1, bytes));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  CHECK_CUDA(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
  float best = 1e30f;
  for (int r = 0; r < 5; ++r) {
    CHECK_CUDA(cudaEventRecord(e0));
    CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    best = std::min(best, ms);
  }
  cudaFree(a);
  cudaFree(b);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * static_cast<double>(bytes) / (best * 1e-3) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  modserve::cli::SetUsage(
      "modserve-cuda-gemv-bench: the decode GEMV's launch shapes against the copy bandwidth",
      __FILE__);
  absl::ParseCommandLine(argc, argv);
  std::vector<int64_t> batches;
  for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_batches), ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(b, &v) || v < 1 || v > 8) {
      std::fprintf(stderr, "--batches: '%s' is not 1 to 8\n", std::string(b).c_str());
      return 2;
    }
    batches.push_back(v);
  }
  const int calls = std::max(1, absl::GetFlag(FLAGS_calls));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const double copy_gbs = CopyBandwidth();
  std::printf(
      "modserve-cuda-gemv-bench: %s, %d SMs, L2 %d MiB; copy bandwidth %.1f GB/s "
      "(read + write, 1 GiB, best of 5)\n\n",
      prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, copy_gbs);

  // Random bf16 weights ~ N(0, 0.02) (a 64 MiB host pattern, copied over each buffer).
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<uint16_t> pattern(size_t{32} << 20);
  for (uint16_t& v : pattern) {
    const float f = dist(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    v = static_cast<uint16_t>(bits >> 16);
  }
  std::vector<float> xh(8 * 14336);
  for (float& v : xh) v = dist(rng) * 50;
  float* x = nullptr;
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&x), xh.size() * 4));
  CHECK_CUDA(cudaMemcpy(x, xh.data(), xh.size() * 4, cudaMemcpyHostToDevice));
  float* out = nullptr;
  float* ref = nullptr;
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&out), 8 * 128256 * 4));
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&ref), 8 * 128256 * 4));
  std::vector<float> out_h(8 * 128256), ref_h(8 * 128256);
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));

  std::printf("| matrix | m x k | n |");
  for (int v = 0; v < modserve::backend::cuda::kernels::kGemvVariants; ++v) {
    std::printf(" %s: GB/s (%% of copy) |", modserve::backend::cuda::kernels::GemvVariantName(v));
  }
  std::printf(" max rel diff vs 0 |\n|---|---|---:|");
  for (int v = 0; v < modserve::backend::cuda::kernels::kGemvVariants; ++v) std::printf("---:|");
  std::printf("---:|\n");

  for (const MatrixShape& s : kShapes) {
    const size_t bytes = static_cast<size_t>(s.m * s.k) * 2;
    const size_t copies = std::max<size_t>(2, (size_t{512} << 20) / bytes + 1);
    std::vector<void*> w(copies);
    for (void*& p : w) {
      CHECK_CUDA(cudaMalloc(&p, bytes));
      for (size_t off = 0; off < bytes; off += pattern.size() * 2) {
        const size_t n = std::min(pattern.size() * 2, bytes - off);
        CHECK_CUDA(
            cudaMemcpy(static_cast<char*>(p) + off, pattern.data(), n, cudaMemcpyHostToDevice));
      }
    }
    for (int64_t n : batches) {
      std::printf("| %s | %lld x %lld | %lld |", s.name, static_cast<long long>(s.m),
                  static_cast<long long>(s.k), static_cast<long long>(n));
      double worst = 0;
      for (int v = 0; v < modserve::backend::cuda::kernels::kGemvVariants; ++v) {
        auto call = [&](size_t i) {
          CHECK_CUDA(modserve::backend::cuda::kernels::GemvVariantBf16(
              v, nullptr, x, w[i % copies], n, s.m, s.k, v == 0 ? ref : out));
        };
        for (int i = 0; i < 3; ++i) call(static_cast<size_t>(i));
        CHECK_CUDA(cudaEventRecord(e0));
        for (int i = 0; i < calls; ++i) call(static_cast<size_t>(i));
        CHECK_CUDA(cudaEventRecord(e1));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        const double gbs = static_cast<double>(bytes) * calls / (ms * 1e-3) / 1e9;
        std::printf(" %.0f (%.0f%%) |", gbs, 100 * gbs / copy_gbs);
        if (v > 0) {
          // Same weights as variant 0's last call.
          call(static_cast<size_t>(calls - 1));
          CHECK_CUDA(cudaMemcpy(out_h.data(), out, static_cast<size_t>(n * s.m) * 4,
                                cudaMemcpyDeviceToHost));
          for (int64_t i = 0; i < n * s.m; ++i) {
            const double d = std::fabs(out_h[i] - ref_h[i]) / (std::fabs(ref_h[i]) + 1e-3);
            worst = std::max(worst, d);
          }
        } else {
          CHECK_CUDA(cudaMemcpy(ref_h.data(), ref, static_cast<size_t>(n * s.m) * 4,
                                cudaMemcpyDeviceToHost));
        }
      }
      std::printf(" %.1e |\n", worst);
    }
    for (void* p : w) cudaFree(p);
  }
  cudaFree(x);
  cudaFree(out);
  cudaFree(ref);
  return 0;
}
