// The small-batch GEMM (n <= kGemvMaxRows rows of x): the decode path, bound by reading w once.
// Exact f32 numerics: weights widened exactly, f32 FMAs, f32 sums (only the summation order differs
// from the reference). Not for large n: it does n FMAs per weight on CUDA cores.
//
// Work split: one CTA of 256 threads owns kRowsPerCta rows of w and all n rows of x. Its threads
// stride over k in 16-byte chunks of w (8 bf16/f16 or 4 f32), kUnroll chunks per row in flight,
// so a 4096-wide bf16 row is read by one sweep of the CTA. Each x chunk a thread loads (L1-cached;
// w bypasses L1) is reused for the kRowsPerCta rows. Partial sums are reduced by warp shuffles and
// one shared-memory pass; the bias is added after the sum, as in the reference.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "engine/backend/cuda/kernels/device_utils.cuh"
#include "engine/backend/cuda/kernels/kernels.h"

namespace modserve::backend::cuda::kernels {
namespace {

// The shape the engine uses (GemvVariant's 0); the others exist for the GPU benchmark's choice.
struct Shape256x4x2 {
  static constexpr int kThreads = 256, kRowsPerCta = 4, kUnroll = 2;
};

// kN: rows of x this instantiation holds accumulators for (1, 2, 4 or 8); n <= kN at run time.
// Under a device row count the rows are n = min(count, capacity): each row's sums run in the same
// order whatever kN and n are, so a counted row gets the bits of a call with exactly n rows.
// vec: w rows and x rows are 16-byte aligned and k is a multiple of the chunk (checked on the
// host); otherwise every element goes through the scalar loop.
template <typename W, int kN, int kThreads, int kRowsPerCta, int kUnroll>
__global__ void __launch_bounds__(kThreads)
    GemvKernel(const float* __restrict__ x, const W* __restrict__ w, const W* __restrict__ bias,
               int capacity, int64_t m, int64_t k, bool vec, const int32_t* __restrict__ rows,
               float* __restrict__ out) {
  constexpr int kWarps = kThreads / 32;
  constexpr int kVec = 16 / sizeof(W);  // weights per 16-byte chunk
  const int n = static_cast<int>(EffectiveRows(rows, capacity));
  // Nothing to compute (a routed layer that no row entered): leave before reading any weight, so a
  // skipped layer inside a graph costs one tiny kernel instead of a pass over w.
  if (n == 0) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRowsPerCta;
  float acc[kRowsPerCta][kN];
#pragma unroll
  for (int r = 0; r < kRowsPerCta; ++r) {
#pragma unroll
    for (int i = 0; i < kN; ++i) acc[r][i] = 0.0f;
  }

  int64_t scalar_begin = 0;
  if (vec) {
    const int64_t chunks = k / kVec;
    const uint4* w_rows[kRowsPerCta];
#pragma unroll
    for (int r = 0; r < kRowsPerCta; ++r) {
      // Rows past m re-read the last row (harmless, never stored) so the loop has no branches.
      const int64_t row = r0 + r < m ? r0 + r : m - 1;
      w_rows[r] = reinterpret_cast<const uint4*>(w + row * k);
    }
    for (int64_t c0 = threadIdx.x; c0 < chunks; c0 += kThreads * kUnroll) {
      uint4 raw[kUnroll][kRowsPerCta];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + u * kThreads;
#pragma unroll
        for (int r = 0; r < kRowsPerCta; ++r) {
          raw[u][r] = c < chunks ? LoadStreaming16(w_rows[r] + c) : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + u * kThreads;
        if (c >= chunks) break;
        float wf[kRowsPerCta][kVec];
#pragma unroll
        for (int r = 0; r < kRowsPerCta; ++r) Unpack16(raw[u][r], wf[r], w);
#pragma unroll
        for (int i = 0; i < kN; ++i) {
          if (i >= n) break;
          const float4* xp = reinterpret_cast<const float4*>(x + i * k + c * kVec);
          float xf[kVec];
#pragma unroll
          for (int q = 0; q < kVec / 4; ++q) {
            const float4 v = __ldg(xp + q);
            xf[4 * q] = v.x;
            xf[4 * q + 1] = v.y;
            xf[4 * q + 2] = v.z;
            xf[4 * q + 3] = v.w;
          }
#pragma unroll
          for (int r = 0; r < kRowsPerCta; ++r) {
#pragma unroll
            for (int e = 0; e < kVec; ++e) acc[r][i] = fmaf(xf[e], wf[r][e], acc[r][i]);
          }
        }
      }
    }
    scalar_begin = chunks * kVec;
  }
  for (int64_t c = scalar_begin + threadIdx.x; c < k; c += kThreads) {
#pragma unroll
    for (int r = 0; r < kRowsPerCta; ++r) {
      const float wv = r0 + r < m ? ToF32(w[(r0 + r) * k + c]) : 0.0f;
#pragma unroll
      for (int i = 0; i < kN; ++i) {
        if (i < n) acc[r][i] = fmaf(x[i * k + c], wv, acc[r][i]);
      }
    }
  }

  // Reduce kRowsPerCta * kN partial sums over the CTA.
  __shared__ float red[kWarps][kRowsPerCta * kN];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int r = 0; r < kRowsPerCta; ++r) {
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const float v = WarpSum(acc[r][i]);
      if (lane == 0) red[warp][r * kN + i] = v;
    }
  }
  __syncthreads();
  if (threadIdx.x < kRowsPerCta * kN) {
    const int r = threadIdx.x / kN, i = threadIdx.x % kN;
    const int64_t row = r0 + r;
    if (row < m && i < n) {
      float sum = 0.0f;
      for (int wp = 0; wp < kWarps; ++wp) sum += red[wp][threadIdx.x];
      if (bias != nullptr) sum += ToF32(bias[row]);
      out[i * m + row] = sum;
    }
  }
}

template <typename W, int kN, typename S>
cudaError_t LaunchGemvN(cudaStream_t stream, const float* x, const W* w, const W* bias, int64_t n,
                        int64_t m, int64_t k, const int32_t* rows, float* out) {
  constexpr int kVec = 16 / sizeof(W);
  const bool vec = k % kVec == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const unsigned int grid = static_cast<unsigned int>((m + S::kRowsPerCta - 1) / S::kRowsPerCta);
  GemvKernel<W, kN, S::kThreads, S::kRowsPerCta, S::kUnroll>
      <<<grid, S::kThreads, 0, stream>>>(x, w, bias, static_cast<int>(n), m, k, vec, rows, out);
  return cudaGetLastError();
}

template <typename W, typename S>
cudaError_t LaunchGemv(cudaStream_t stream, const float* x, const void* w, const void* bias,
                       int64_t n, int64_t m, int64_t k, const int32_t* rows, float* out) {
  const W* wt = static_cast<const W*>(w);
  const W* bt = static_cast<const W*>(bias);
  if (n <= 1) return LaunchGemvN<W, 1, S>(stream, x, wt, bt, n, m, k, rows, out);
  if (n <= 2) return LaunchGemvN<W, 2, S>(stream, x, wt, bt, n, m, k, rows, out);
  if (n <= 4) return LaunchGemvN<W, 4, S>(stream, x, wt, bt, n, m, k, rows, out);
  return LaunchGemvN<W, 8, S>(stream, x, wt, bt, n, m, k, rows, out);
}

// Benchmark variants (bf16 only): threads per CTA, rows of w per CTA, 16-byte chunks per row in
// flight per thread.
struct Shape128x8x4 {
  static constexpr int kThreads = 128, kRowsPerCta = 8, kUnroll = 4;
};
struct Shape256x8x2 {
  static constexpr int kThreads = 256, kRowsPerCta = 8, kUnroll = 2;
};
struct Shape128x4x4 {
  static constexpr int kThreads = 128, kRowsPerCta = 4, kUnroll = 4;
};
struct Shape512x4x1 {
  static constexpr int kThreads = 512, kRowsPerCta = 4, kUnroll = 1;
};
struct Shape128x16x2 {
  static constexpr int kThreads = 128, kRowsPerCta = 16, kUnroll = 2;
};

}  // namespace

namespace {

// The variants in one list: a name and a launcher each (bf16 w, no bias, no row count).
struct GemvVariant {
  const char* name;
  cudaError_t (*launch)(cudaStream_t, const float*, const void*, const void*, int64_t, int64_t,
                        int64_t, const int32_t*, float*);
};
using B = __nv_bfloat16;
constexpr GemvVariant kVariants[] = {
    {"256 thr x 4 rows x 2 in flight (engine)", &LaunchGemv<B, Shape256x4x2>},
    {"128 thr x 8 rows x 4", &LaunchGemv<B, Shape128x8x4>},
    {"256 thr x 8 rows x 2", &LaunchGemv<B, Shape256x8x2>},
    {"128 thr x 4 rows x 4", &LaunchGemv<B, Shape128x4x4>},
    {"512 thr x 4 rows x 1", &LaunchGemv<B, Shape512x4x1>},
    {"128 thr x 16 rows x 2", &LaunchGemv<B, Shape128x16x2>},
};
static_assert(sizeof(kVariants) / sizeof(kVariants[0]) == kGemvVariants);

}  // namespace

const char* GemvVariantName(int variant) {
  return variant >= 0 && variant < kGemvVariants ? kVariants[variant].name : "?";
}

cudaError_t GemvVariantBf16(int variant, cudaStream_t stream, const float* x, const void* w,
                            int64_t n, int64_t m, int64_t k, float* out) {
  if (n < 1 || n > kGemvMaxRows || variant < 0 || variant >= kGemvVariants) {
    return cudaErrorInvalidValue;
  }
  return kVariants[variant].launch(stream, x, w, nullptr, n, m, k, nullptr, out);
}

cudaError_t Gemv(cudaStream_t stream, const float* x, const void* w, const void* bias, DType dt,
                 int64_t n, int64_t m, int64_t k, const int32_t* rows, float* out) {
  static_assert(kGemvMaxRows == 8, "GemvKernel instantiates kN up to 8");
  if (n == 0 || m == 0) return cudaSuccess;
  if (n > kGemvMaxRows) return cudaErrorInvalidValue;
  using S = Shape256x4x2;
  switch (dt) {
    case DType::kF32:
      return LaunchGemv<float, S>(stream, x, w, bias, n, m, k, rows, out);
    case DType::kF16:
      return LaunchGemv<__half, S>(stream, x, w, bias, n, m, k, rows, out);
    case DType::kBF16:
      return LaunchGemv<__nv_bfloat16, S>(stream, x, w, bias, n, m, k, rows, out);
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
