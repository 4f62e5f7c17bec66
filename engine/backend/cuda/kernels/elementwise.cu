// The f32 elementwise and row ops: SwiGLU, activations, add, row gather, the MoD weighted scatter
// and the MoD routing decision with its compaction.
// Grid-stride loops in the reference's operation order (accurate expf/erff, no fast-math).
#include <cmath>

#include "engine/backend/cuda/kernels/device_utils.cuh"
#include "engine/backend/cuda/kernels/kernels.h"

namespace modserve::backend::cuda::kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float Sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// `out` may alias gate or up: each element is read before it is written by the same thread.
__global__ void SwiGluKernel(const float* gate, const float* up, int64_t count, float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = gate[i];
    out[i] = g * Sigmoid(g) * up[i];
  }
}

__global__ void ActivationKernel(int kind, int64_t count, float* x) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[i];
    switch (kind) {
      case 0:
        x[i] = v * Sigmoid(v);
        break;
      case 1:
        x[i] = 0.5f * v * (1.0f + erff(v * static_cast<float>(M_SQRT1_2)));
        break;
      default:
        x[i] = v > 0.0f ? v : 0.0f;
        break;
    }
  }
}

__global__ void AddKernel(const float* a, const float* b, int64_t count, float* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = a[i] + b[i];
  }
}

__global__ void GatherRowsKernel(const float* __restrict__ x, int64_t n, int64_t d,
                                 const int32_t* __restrict__ idx, int64_t m,
                                 float* __restrict__ out) {
  const int64_t count = m * d;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = i / d, c = i % d;
    const int32_t r = idx[j];
    TrapUnless(r >= 0 && r < n);
    out[i] = x[r * d + c];
  }
}

// Rows idx[j] are distinct (contract), so no two threads touch the same element of x.
__global__ void ScatterCombineKernel(int weight_fn, int scale_target, float* x, int64_t n,
                                     int64_t d, const float* __restrict__ y,
                                     const int32_t* __restrict__ idx, const float* __restrict__ s,
                                     int64_t m) {
  const int64_t count = m * d;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = i / d, c = i % d;
    const int32_t r = idx[j];
    TrapUnless(r >= 0 && r < n);
    float& xc = x[r * d + c];
    if (weight_fn == 2) {  // g = 1: the row becomes y exactly
      xc = y[i];
      continue;
    }
    const float g = weight_fn == 0 ? s[j] : Sigmoid(s[j]);
    xc = scale_target == 0 ? xc + g * (y[i] - xc) : g * y[i];
  }
}

// One block; tile t covers rows [t * blockDim.x, (t + 1) * blockDim.x). Each warp ballots its
// decisions, the warp totals of the tile are summed in shared memory, and a routed row's output
// slot is the rows routed before the tile + the earlier warps' totals + the earlier lanes of its
// own warp: an ordered compaction, so idx comes out ascending as the host loop produced it.
constexpr int kRouteThreads = 1024;

__global__ void __launch_bounds__(kRouteThreads)
    RouteSelectKernel(const float* __restrict__ z, const float* __restrict__ tau,
                      const float* __restrict__ s, int64_t n, float* __restrict__ probs,
                      int32_t* __restrict__ idx, float* __restrict__ s_sel,
                      int32_t* __restrict__ count) {
  __shared__ int warp_totals[kRouteThreads / 32];
  __shared__ int before;  // rows routed in by earlier tiles
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
  if (threadIdx.x == 0) before = 0;
  __syncthreads();
  for (int64_t start = 0; start < n; start += blockDim.x) {
    const int64_t i = start + threadIdx.x;
    bool routed = false;
    if (i < n) {
      const double p = 1.0 / (1.0 + exp(-static_cast<double>(z[i])));
      probs[i] = static_cast<float>(p);
      routed = p > static_cast<double>(tau[i]);
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, routed);
    if (lane == 0) warp_totals[warp] = __popc(ballot);
    __syncthreads();
    int slot = before + __popc(ballot & ((1u << lane) - 1u));
    for (int w = 0; w < warp; ++w) slot += warp_totals[w];
    if (routed) {
      idx[slot] = static_cast<int32_t>(i);
      s_sel[slot] = s[i];
    }
    __syncthreads();  // every thread has read `before` and warp_totals
    if (threadIdx.x == 0) {
      int tile = 0;
      for (int w = 0; w < num_warps; ++w) tile += warp_totals[w];
      before += tile;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *count = before;
}

}  // namespace

cudaError_t SwiGlu(cudaStream_t stream, const float* gate, const float* up, int64_t count,
                   float* out) {
  if (count == 0) return cudaSuccess;
  SwiGluKernel<<<GridFor(count, kThreads), kThreads, 0, stream>>>(gate, up, count, out);
  return cudaGetLastError();
}

cudaError_t Activation(cudaStream_t stream, int kind, int64_t count, float* x) {
  if (count == 0) return cudaSuccess;
  ActivationKernel<<<GridFor(count, kThreads), kThreads, 0, stream>>>(kind, count, x);
  return cudaGetLastError();
}

cudaError_t Add(cudaStream_t stream, const float* a, const float* b, int64_t count, float* out) {
  if (count == 0) return cudaSuccess;
  AddKernel<<<GridFor(count, kThreads), kThreads, 0, stream>>>(a, b, count, out);
  return cudaGetLastError();
}

cudaError_t GatherRows(cudaStream_t stream, const float* x, int64_t n, int64_t d,
                       const int32_t* idx, int64_t m, float* out) {
  if (m * d == 0) return cudaSuccess;
  GatherRowsKernel<<<GridFor(m * d, kThreads), kThreads, 0, stream>>>(x, n, d, idx, m, out);
  return cudaGetLastError();
}

cudaError_t ScatterCombine(cudaStream_t stream, int weight_fn, int scale_target, float* x,
                           int64_t n, int64_t d, const float* y, const int32_t* idx,
                           const float* s, int64_t m) {
  if (m * d == 0) return cudaSuccess;
  ScatterCombineKernel<<<GridFor(m * d, kThreads), kThreads, 0, stream>>>(
      weight_fn, scale_target, x, n, d, y, idx, s, m);
  return cudaGetLastError();
}

cudaError_t RouteSelect(cudaStream_t stream, const float* z, const float* tau, const float* s,
                        int64_t n, float* probs, int32_t* idx, float* s_sel, int32_t* count) {
  RouteSelectKernel<<<1, kRouteThreads, 0, stream>>>(z, tau, s, n, probs, idx, s_sel, count);
  return cudaGetLastError();
}

}  // namespace modserve::backend::cuda::kernels
