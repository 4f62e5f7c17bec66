// Embedding lookup and RMSNorm: one CTA per row, f32 out. Memory-bound and tiny next to the GEMMs;
// written for clarity (coalesced scalar loops), not vectorised.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "engine/backend/cuda/kernels/device_utils.cuh"
#include "engine/backend/cuda/kernels/kernels.h"

namespace modserve::backend::cuda::kernels {
namespace {

constexpr int kThreads = 256;
// RMSNorm's CTA covers a 4096-wide row in one load per thread: with 256 threads each thread's 16
// loads ran one after another and a single row took ~13 us on an H200.
constexpr int kNormThreads = 1024;

template <typename W>
__global__ void EmbedKernel(const int32_t* __restrict__ ids, const W* __restrict__ table,
                            int64_t n, int64_t vocab, int64_t d, const int32_t* __restrict__ rows,
                            float* __restrict__ out) {
  const int64_t i = blockIdx.x;
  if (i >= EffectiveRows(rows, n)) return;  // an uncounted row: its id is not read
  const int32_t id = ids[i];
  TrapUnless(id >= 0 && id < vocab);
  const W* row = table + static_cast<int64_t>(id) * d;
  float* o = out + i * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) o[c] = ToF32(row[c]);
}

// Same operation order as the reference: sum of squares, 1 / sqrt(sum / d + eps) (IEEE division and
// sqrt: the build does not use --use_fast_math), then (x * inv_rms) * w. Each thread reads its
// elements of x before it writes them, so out may alias x.
template <typename W>
__global__ void RmsNormKernel(const float* x, const W* __restrict__ w, int64_t n, int64_t d,
                              float eps, const int32_t* __restrict__ rows, float* out) {
  __shared__ float red[32];
  // The whole CTA leaves together, before BlockSum's barriers.
  if (blockIdx.x >= EffectiveRows(rows, n)) return;
  const float* xr = x + blockIdx.x * d;
  float* o = out + blockIdx.x * d;
  float sum_sq = 0.0f;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) sum_sq += xr[c] * xr[c];
  sum_sq = BlockSum(sum_sq, red);
  const float inv_rms = 1.0f / sqrtf(sum_sq / static_cast<float>(d) + eps);
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) o[c] = xr[c] * inv_rms * ToF32(w[c]);
}

template <typename W>
cudaError_t LaunchEmbed(cudaStream_t stream, const int32_t* ids, int64_t n, const void* table,
                        int64_t vocab, int64_t d, const int32_t* rows, float* out) {
  EmbedKernel<W><<<static_cast<unsigned int>(n), kThreads, 0, stream>>>(
      ids, static_cast<const W*>(table), n, vocab, d, rows, out);
  return cudaGetLastError();
}

template <typename W>
cudaError_t LaunchRmsNorm(cudaStream_t stream, const float* x, const void* w, int64_t n, int64_t d,
                          float eps, const int32_t* rows, float* out) {
  RmsNormKernel<W><<<static_cast<unsigned int>(n), kNormThreads, 0, stream>>>(
      x, static_cast<const W*>(w), n, d, eps, rows, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t Embed(cudaStream_t stream, const int32_t* ids, int64_t n, const void* table, DType dt,
                  int64_t vocab, int64_t d, const int32_t* rows, float* out) {
  if (n == 0) return cudaSuccess;
  switch (dt) {
    case DType::kF32:
      return LaunchEmbed<float>(stream, ids, n, table, vocab, d, rows, out);
    case DType::kF16:
      return LaunchEmbed<__half>(stream, ids, n, table, vocab, d, rows, out);
    case DType::kBF16:
      return LaunchEmbed<__nv_bfloat16>(stream, ids, n, table, vocab, d, rows, out);
    case DType::kI32:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ4_K:
    case DType::kQ6_K:
    case DType::kQ5_K:
    case DType::kQ5_0:
    case DType::kQ5_1:
      break;
  }
  return cudaErrorInvalidValue;
}

cudaError_t RmsNorm(cudaStream_t stream, const float* x, const void* w, DType dt, int64_t n,
                    int64_t d, float eps, const int32_t* rows, float* out) {
  if (n == 0) return cudaSuccess;
  switch (dt) {
    case DType::kF32:
      return LaunchRmsNorm<float>(stream, x, w, n, d, eps, rows, out);
    case DType::kF16:
      return LaunchRmsNorm<__half>(stream, x, w, n, d, eps, rows, out);
    case DType::kBF16:
      return LaunchRmsNorm<__nv_bfloat16>(stream, x, w, n, d, eps, rows, out);
    case DType::kI32:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ4_K:
    case DType::kQ6_K:
    case DType::kQ5_K:
    case DType::kQ5_0:
    case DType::kQ5_1:
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace modserve::backend::cuda::kernels
