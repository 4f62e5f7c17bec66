// The f32 elementwise and row ops: SwiGLU, activations, add, row gather, the MoD weighted scatter,
// the MoD routing decision with its compaction and the routed rows' KV metadata.
// Grid-stride loops in the reference's operation order (accurate expf/erff, no fast-math); under a
// device row count they stop at count * width (the grid stays sized for the capacity).
#include <cmath>

#include "engine/backend/cuda/kernels/device_utils.cuh"
#include "engine/backend/cuda/kernels/kernels.h"

namespace modserve::backend::cuda::kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float Sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }

// `out` may alias gate or up: each element is read before it is written by the same thread.
__global__ void SwiGluKernel(const float* gate, const float* up, int64_t n, int64_t width,
                             const int32_t* rows, float* out) {
  const int64_t count = EffectiveRows(rows, n) * width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float g = gate[i];
    out[i] = g * Sigmoid(g) * up[i];
  }
}

__global__ void ActivationKernel(int kind, int64_t n, int64_t width, const int32_t* rows,
                                 float* x) {
  const int64_t count = EffectiveRows(rows, n) * width;
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

__global__ void AddKernel(const float* a, const float* b, int64_t n, int64_t width,
                          const int32_t* rows, float* out) {
  const int64_t count = EffectiveRows(rows, n) * width;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = a[i] + b[i];
  }
}

__global__ void GatherRowsKernel(const float* __restrict__ x, int64_t n, int64_t d,
                                 const int32_t* __restrict__ idx, int64_t m,
                                 const int32_t* __restrict__ rows, float* __restrict__ out) {
  const int64_t count = EffectiveRows(rows, m) * d;
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
                                     int64_t m, const int32_t* __restrict__ rows) {
  const int64_t count = EffectiveRows(rows, m) * d;
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
// Under a device row count only the first `count` rows are candidates; every thread reads the same
// count, so the tile loop stays uniform.
constexpr int kRouteThreads = 1024;

__global__ void __launch_bounds__(kRouteThreads)
    RouteSelectKernel(const float* __restrict__ z, const float* __restrict__ z_cut,
                      const float* __restrict__ s, int64_t capacity,
                      const int32_t* __restrict__ rows, float* __restrict__ probs,
                      int32_t* __restrict__ idx, float* __restrict__ s_sel,
                      int32_t* __restrict__ count) {
  const int64_t n = EffectiveRows(rows, capacity);
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
      const float zi = z[i];
      probs[i] = static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(zi))));
      routed = zi > z_cut[i];  // the host's f64 rule, as an f32 cut (Backend::RouteSelect)
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

// One thread per selected row j. idx is ascending, so the selected rows of earlier sequences are
// exactly a prefix of idx[0 .. j): a binary search for seq_first_row[s] counts them, and the rest
// of the prefix are s's own earlier selected rows, i.e. the rank.
__global__ void RouteRowsKernel(RouteRowsArgs a) {
  const int64_t m = EffectiveRows(a.rows, a.m);
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < m;
       j += int64_t{gridDim.x} * blockDim.x) {
    const int32_t r = a.idx[j];
    TrapUnless(r >= 0 && r < a.num_rows);
    const int32_t seq = a.row_seq[r];
    TrapUnless(seq >= 0 && seq < a.num_seqs);
    const int32_t first = a.seq_first_row[seq];
    int64_t lo = 0, hi = j;  // lower_bound(idx[0 .. j), first)
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (a.idx[mid] < first) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    const int64_t rank = j - lo;
    const int64_t cand = first + rank;
    TrapUnless(first >= 0 && cand < a.num_rows);
    a.out_pos[j] = a.row_pos[r];
    a.out_slots[j] = a.cand_slots[cand];
    a.out_seq[j] = seq;
    a.out_kv_len[j] = a.seq_kv_base[seq] + static_cast<int32_t>(rank) + 1;
  }
}

}  // namespace

cudaError_t SwiGlu(cudaStream_t stream, const float* gate, const float* up, int64_t n,
                   int64_t width, const int32_t* rows, float* out) {
  const int64_t count = n * width;
  if (count == 0) return cudaSuccess;
  SwiGluKernel<<<GridFor(count, kThreads), kThreads, 0, stream>>>(gate, up, n, width, rows, out);
  return cudaGetLastError();
}

cudaError_t Activation(cudaStream_t stream, int kind, int64_t n, int64_t width,
                       const int32_t* rows, float* x) {
  const int64_t count = n * width;
  if (count == 0) return cudaSuccess;
  ActivationKernel<<<GridFor(count, kThreads), kThreads, 0, stream>>>(kind, n, width, rows, x);
  return cudaGetLastError();
}

cudaError_t Add(cudaStream_t stream, const float* a, const float* b, int64_t n, int64_t width,
                const int32_t* rows, float* out) {
  const int64_t count = n * width;
  if (count == 0) return cudaSuccess;
  AddKernel<<<GridFor(count, kThreads), kThreads, 0, stream>>>(a, b, n, width, rows, out);
  return cudaGetLastError();
}

cudaError_t GatherRows(cudaStream_t stream, const float* x, int64_t n, int64_t d,
                       const int32_t* idx, int64_t m, const int32_t* rows, float* out) {
  if (m * d == 0) return cudaSuccess;
  GatherRowsKernel<<<GridFor(m * d, kThreads), kThreads, 0, stream>>>(x, n, d, idx, m, rows, out);
  return cudaGetLastError();
}

cudaError_t ScatterCombine(cudaStream_t stream, int weight_fn, int scale_target, float* x,
                           int64_t n, int64_t d, const float* y, const int32_t* idx,
                           const float* s, int64_t m, const int32_t* rows) {
  if (m * d == 0) return cudaSuccess;
  ScatterCombineKernel<<<GridFor(m * d, kThreads), kThreads, 0, stream>>>(
      weight_fn, scale_target, x, n, d, y, idx, s, m, rows);
  return cudaGetLastError();
}

cudaError_t RouteSelect(cudaStream_t stream, const float* z, const float* z_cut, const float* s,
                        int64_t n, const int32_t* rows, float* probs, int32_t* idx, float* s_sel,
                        int32_t* count) {
  RouteSelectKernel<<<1, kRouteThreads, 0, stream>>>(z, z_cut, s, n, rows, probs, idx, s_sel, count);
  return cudaGetLastError();
}

cudaError_t RouteRows(cudaStream_t stream, const RouteRowsArgs& args) {
  if (args.m == 0) return cudaSuccess;
  RouteRowsKernel<<<GridFor(args.m, kThreads), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace modserve::backend::cuda::kernels
