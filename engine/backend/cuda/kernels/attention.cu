// Paged attention for prefill and decode rows alike (flash-decoding style).
//
// Grid: x = (row, context split) items, y = (kv head, slice of its query-head group). One CTA of
// kWarps warps handles up to kMaxHeadsPerCta query heads that share one kv head, so each K/V entry
// is read once per group, not once per head. Its warps take the split's entries in tiles of kTile
// consecutive entries, round-robin; for a tile a warp reads the K and V vectors (lane l owns
// elements [l kT, l kT + kT), one vector load each), forms the tile's scores of its heads with
// one interleaved shuffle reduction, and updates an online softmax (running max, running sum,
// rescaled accumulator) in registers once per tile. The warps are merged through
// shared memory. With one split the CTA writes the normalised output; otherwise it writes an
// unnormalised partial (acc, max, sum) and a combine kernel merges the splits of each (row, head).
// Without a device row count each CTA owns one (row, split) item. With one, the count c is known
// only on the device: the kernels re-plan for c (PlanFor, the host's arithmetic) and the CTAs
// stride over the c * splits items, so a counted row is computed exactly as in a call of c rows.
//
// Prefill rows are handled row by row (K/V re-read per row from L2); a tiled flash-attention
// prefill kernel that shares K/V tiles across the rows of one sequence is the next step.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "engine/backend/cuda/kernels/device_utils.cuh"
#include "engine/backend/cuda/kernels/kernels.h"

namespace modserve::backend::cuda::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxHeadsPerCta = 8;
constexpr int64_t kMinSplitLen = 128;  // entries; shorter splits cost more in combine than they win
constexpr int kCtasPerSm = 4;          // target occupancy for choosing splits

// What the plan depends on besides the row count.
struct PlanShape {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t ctx_cap = 1;  // entries a row may attend over: max_pages * block_size
  int num_sms = 1;
  size_t max_scratch_bytes = 0;
};

__host__ __device__ __forceinline__ int64_t MinI64(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ int64_t MaxI64(int64_t a, int64_t b) { return a > b ? a : b; }

// The split plan for n rows (PlanAttention's contract); host and device run the same arithmetic.
__host__ __device__ AttentionPlan PlanFor(int64_t n, const PlanShape& ps) {
  AttentionPlan plan;
  const int group = ps.n_heads / ps.n_kv_heads;
  plan.heads_per_cta = group < kMaxHeadsPerCta ? group : kMaxHeadsPerCta;
  plan.head_chunks = (group + plan.heads_per_cta - 1) / plan.heads_per_cta;
  const int64_t base_ctas = MaxI64(1, n * ps.n_kv_heads * plan.head_chunks);
  const int64_t target_ctas = int64_t{kCtasPerSm} * MaxI64(ps.num_sms, 1);
  int64_t splits = (target_ctas + base_ctas - 1) / base_ctas;
  splits = MinI64(splits, (ps.ctx_cap + kMinSplitLen - 1) / kMinSplitLen);
  // Partials: head_dim + 2 floats per (row, head, split).
  const size_t per_split = static_cast<size_t>(n) * ps.n_heads * (ps.head_dim + 2) * sizeof(float);
  if (per_split > 0) {
    splits = MinI64(splits, static_cast<int64_t>(ps.max_scratch_bytes / per_split));
  }
  splits = MaxI64(1, MinI64(splits, 65535));
  plan.split_len = (ps.ctx_cap + splits - 1) / splits;
  plan.splits = static_cast<int>((ps.ctx_cap + plan.split_len - 1) / plan.split_len);
  plan.scratch_bytes = plan.splits > 1 ? per_split * plan.splits : 0;
  return plan;
}

PlanShape ShapeOf(const AttentionArgs& a, int num_sms, size_t max_scratch_bytes) {
  PlanShape ps;
  ps.n_heads = a.n_heads;
  ps.n_kv_heads = a.n_kv_heads;
  ps.head_dim = a.head_dim;
  ps.ctx_cap = std::max<int64_t>(1, a.max_pages * a.block_size);
  ps.num_sms = num_sms;
  ps.max_scratch_bytes = max_scratch_bytes;
  return ps;
}

struct KernelArgs {
  AttentionArgs a;
  AttentionPlan plan;  // the host's plan for all n rows (used when a.rows is null)
  PlanShape shape;     // to re-plan for the device row count
  float* scratch;      // partials (layout in RowPlan), or null when no plan can split
};

// The plan of the rows this launch processes and where its partials live:
// part_acc [rows, n_heads, splits, head_dim], then part_ml [rows, n_heads, splits, 2] (running
// max, running sum).
struct RowPlan {
  int64_t rows;
  AttentionPlan plan;
  float* part_acc;
  float* part_ml;
};

__device__ __forceinline__ RowPlan ResolvePlan(const KernelArgs& ka) {
  RowPlan rp;
  rp.rows = EffectiveRows(ka.a.rows, ka.a.n);
  rp.plan = ka.a.rows == nullptr ? ka.plan : PlanFor(rp.rows, ka.shape);
  rp.part_acc = ka.scratch;
  rp.part_ml = ka.scratch == nullptr
                   ? nullptr
                   : ka.scratch + rp.rows * ka.a.n_heads * int64_t{rp.plan.splits} * ka.a.head_dim;
  return rp;
}

// A bf16 / f16 element from its 16 bits.
template <typename T>
__device__ __forceinline__ float Bits16ToF32(uint32_t b);
template <>
__device__ __forceinline__ float Bits16ToF32<__nv_bfloat16>(uint32_t b) {
  return __uint_as_float(b << 16);
}
template <>
__device__ __forceinline__ float Bits16ToF32<__half>(uint32_t b) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
}

// f[t] = p[d0 + t] for t < kT (0 past hd): one load of kT elements when `vec` (hd % kT == 0, so
// every lane's elements are aligned to their size), else element by element.
template <typename T, int kT>
__device__ __forceinline__ void LoadLane(const T* p, int d0, int hd, bool vec, float (&f)[kT]) {
  constexpr int kBytes = kT * static_cast<int>(sizeof(T));
  if constexpr (kBytes < 4) {
    f[0] = d0 < hd ? ToF32(p[d0]) : 0.0f;  // one 16-bit element: nothing to widen
  } else if (vec) {
    if (d0 >= hd) {
#pragma unroll
      for (int t = 0; t < kT; ++t) f[t] = 0.0f;
      return;
    }
    const T* src = p + d0;
    if constexpr (kBytes % 16 == 0) {
#pragma unroll
      for (int c = 0; c < kBytes / 16; ++c) {
        Unpack16(reinterpret_cast<const uint4*>(src)[c], f + c * (16 / sizeof(T)), src);
      }
    } else {  // 4 or 8 bytes: one or two words
      uint32_t w[kBytes / 4];
      if constexpr (kBytes == 4) {
        w[0] = *reinterpret_cast<const uint32_t*>(src);
      } else {
        const uint2 v = *reinterpret_cast<const uint2*>(src);
        w[0] = v.x;
        w[1] = v.y;
      }
#pragma unroll
      for (int t = 0; t < kT; ++t) {
        if constexpr (sizeof(T) == 4) {
          f[t] = __uint_as_float(w[t]);
        } else {
          f[t] = Bits16ToF32<T>((w[t / 2] >> (16 * (t % 2))) & 0xffffu);  // little-endian
        }
      }
    }
  } else {
#pragma unroll
    for (int t = 0; t < kT; ++t) f[t] = d0 + t < hd ? ToF32(p[d0 + t]) : 0.0f;
  }
}

// f[0..8) = p[0..8): one 16-byte load of a 16-bit pool, two of an f32 one (p 16-byte aligned).
template <typename T>
__device__ __forceinline__ void Load8(const T* p, float (&f)[8]) {
  const uint4* q = reinterpret_cast<const uint4*>(p);
  Unpack16(q[0], f, p);
  if constexpr (sizeof(T) == 4) Unpack16(q[1], f + 4, p);
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// kT = ceil(head_dim / 32): elements of a head vector per lane (lane l owns [l kT, l kT + kT)).
// kLanes: the scores of a tile of 32 entries are formed one entry per lane (full dot products, q
// broadcast from shared memory), the softmax bookkeeping runs once per (tile, head) and the
// values are accumulated with the probabilities shuffled from their lanes. Otherwise every lane
// works on every entry of a kTile-entry tile and each score is a warp-wide shuffle reduction
// (every lane then repeats each entry's exp).
template <typename T, int kT, bool kLanes>
__global__ void __launch_bounds__(kThreads) AttentionKernel(KernelArgs ka) {
  const AttentionArgs& a = ka.a;
  // Every thread resolves the same plan (one load of the row count), so all loop bounds below are
  // uniform across the CTA and its barriers are reached by every thread.
  const RowPlan rp = ResolvePlan(ka);
  const AttentionPlan& plan = rp.plan;
  constexpr int kDim = kT * 32;
  constexpr int kTile = kT <= 4 ? 4 : 2;  // entries per warp per step (registers: kTile x kT x 2)
  // Whole-lane vector loads of K and V need every lane's kT elements aligned: hd % kT == 0.
  const bool vec = a.head_dim % kT == 0;
  // Row loads of 8 elements (kLanes): every 8-element chunk of a K row aligned, i.e. hd % 8 == 0.
  const bool vec8 = a.head_dim % 8 == 0;
  __shared__ __align__(16) float q_s[kMaxHeadsPerCta][kDim];
  __shared__ float acc_s[kWarps][kMaxHeadsPerCta][kDim];
  __shared__ float ml_s[kWarps][kMaxHeadsPerCta][2];

  const int group = a.n_heads / a.n_kv_heads;
  const int g = blockIdx.y / plan.head_chunks;
  const int chunk = blockIdx.y % plan.head_chunks;
  const int h_first = g * group + chunk * plan.heads_per_cta;  // first query head of this CTA
  const int hg = min(plan.heads_per_cta, group - chunk * plan.heads_per_cta);
  const int hd = a.head_dim;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  // Item = (row item / splits, split item % splits); rows past the count are never reached.
  const int64_t items = rp.rows * plan.splits;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t row = item / plan.splits;
    const int64_t split = item % plan.splits;
    __syncthreads();  // the previous item's reads of q_s, acc_s and ml_s are done

    const int32_t seq = a.row_seq[row];
    const int32_t kv_len = a.row_kv_len[row];
    TrapUnless(seq >= 0 && seq < a.num_seqs && kv_len >= 1 &&
               kv_len <= a.max_pages * int64_t{a.block_size});
    const int64_t begin = split * plan.split_len;
    if (begin >= kv_len) continue;  // an empty split: the combine kernel never reads it
    const int64_t end = min(static_cast<int64_t>(kv_len), begin + plan.split_len);

    for (int e = threadIdx.x; e < kMaxHeadsPerCta * kDim; e += kThreads) {
      const int h = e / kDim, d = e % kDim;
      q_s[h][d] = h < hg && d < hd ? a.q[(row * a.n_heads + h_first + h) * hd + d] : 0.0f;
    }
    __syncthreads();

    float m[kMaxHeadsPerCta], l[kMaxHeadsPerCta], acc[kMaxHeadsPerCta][kT];
#pragma unroll
    for (int h = 0; h < kMaxHeadsPerCta; ++h) {
      m[h] = -INFINITY;
      l[h] = 0.0f;
#pragma unroll
      for (int t = 0; t < kT; ++t) acc[h][t] = 0.0f;
    }

    const T* pool = static_cast<const T*>(a.kv_pool);
    const int32_t* pages = a.page_table + static_cast<int64_t>(seq) * a.max_pages;
    const int64_t plane = int64_t{a.block_size} * hd;  // elements of one (page, kv plane)
    const int d0 = lane * kT;                          // this lane's dims: [d0, d0 + kT)
    if constexpr (kLanes) {
      // Tiles of 32 consecutive entries per warp; lane e scores entry j0 + e.
      for (int64_t j0 = begin + int64_t{warp} * 32; j0 < end; j0 += int64_t{kWarps} * 32) {
        const int64_t j = j0 + lane;
        const bool valid = j < end;
        int32_t page = 0;
        if (valid) {
          page = pages[j / a.block_size];
          TrapUnless(page >= 0 && page < a.num_pages);
        }
        const int64_t entry = valid ? (static_cast<int64_t>(page) * 2 * a.n_kv_heads + g) * plane +
                                          (j % a.block_size) * hd
                                    : 0;
        float sc[kMaxHeadsPerCta];
#pragma unroll
        for (int h = 0; h < kMaxHeadsPerCta; ++h) sc[h] = 0.0f;
        if (valid) {
          const T* k_ptr = pool + entry;
          if (vec8) {
            // 8 elements (16 bytes of a 16-bit pool, 32 of an f32 one) per step, all of a row's
            // loads unrolled so they are in flight together.
#pragma unroll
            for (int c = 0; c < kDim / 8; ++c) {
              if (c * 8 >= hd) break;
              float kv8[8];
              Load8(k_ptr + c * 8, kv8);
#pragma unroll
              for (int h = 0; h < kMaxHeadsPerCta; ++h) {
                if (h >= hg) break;
                const float4 qa = *reinterpret_cast<const float4*>(&q_s[h][c * 8]);
                const float4 qb = *reinterpret_cast<const float4*>(&q_s[h][c * 8 + 4]);
                float d = sc[h];
                d = fmaf(qa.x, kv8[0], d);
                d = fmaf(qa.y, kv8[1], d);
                d = fmaf(qa.z, kv8[2], d);
                d = fmaf(qa.w, kv8[3], d);
                d = fmaf(qb.x, kv8[4], d);
                d = fmaf(qb.y, kv8[5], d);
                d = fmaf(qb.z, kv8[6], d);
                d = fmaf(qb.w, kv8[7], d);
                sc[h] = d;
              }
            }
          } else {
            for (int d = 0; d < hd; ++d) {
              const float kd = ToF32(k_ptr[d]);
#pragma unroll
              for (int h = 0; h < kMaxHeadsPerCta; ++h) {
                if (h >= hg) break;
                sc[h] = fmaf(q_s[h][d], kd, sc[h]);
              }
            }
          }
        }
        float p[kMaxHeadsPerCta];
#pragma unroll
        for (int h = 0; h < kMaxHeadsPerCta; ++h) {
          if (h >= hg) break;
          const float sh = valid ? sc[h] * a.scale : -INFINITY;
          const float m_new = fmaxf(m[h], WarpMax(sh));  // finite: lane 0's entry is valid
          const float correction = expf(m[h] - m_new);   // 0 on the first tile (m = -inf)
          p[h] = expf(sh - m_new);                       // 0 for lanes past the end
          l[h] = l[h] * correction + WarpSum(p[h]);
#pragma unroll
          for (int t = 0; t < kT; ++t) acc[h][t] *= correction;
          m[h] = m_new;
        }
        // Values: lanes own dims again; 8 entries' V loads in flight per step.
        const int tile = static_cast<int>(min(int64_t{32}, end - j0));
        const int64_t v_off = int64_t{a.n_kv_heads} * plane;
        for (int e0 = 0; e0 < tile; e0 += 8) {
          float vf[8][kT];
#pragma unroll
          for (int u = 0; u < 8; ++u) {
            const int64_t ent = __shfl_sync(0xffffffffu, entry, (e0 + u) & 31);
            if (e0 + u < tile) {
              LoadLane<T, kT>(pool + ent + v_off, d0, hd, vec, vf[u]);
            } else {
#pragma unroll
              for (int t = 0; t < kT; ++t) vf[u][t] = 0.0f;
            }
          }
#pragma unroll
          for (int u = 0; u < 8; ++u) {
#pragma unroll
            for (int h = 0; h < kMaxHeadsPerCta; ++h) {
              if (h >= hg) break;
              const float pe = __shfl_sync(0xffffffffu, p[h], (e0 + u) & 31);  // 0 past the end
#pragma unroll
              for (int t = 0; t < kT; ++t) acc[h][t] = fmaf(pe, vf[u][t], acc[h][t]);
            }
          }
        }
      }
    } else {
      // A warp takes kTile consecutive entries at a time: their loads are all in flight together,
      // and their kTile x heads scores are reduced in one interleaved pass of shuffles, so the
      // latency of one entry no longer serialises the next (one entry at a time ran at a tenth of
      // the KV read bandwidth on an H200).
      for (int64_t j0 = begin + int64_t{warp} * kTile; j0 < end; j0 += int64_t{kWarps} * kTile) {
        float kf[kTile][kT], vf[kTile][kT];
#pragma unroll
        for (int u = 0; u < kTile; ++u) {
          const int64_t j = j0 + u;
          if (j < end) {
            const int32_t page = pages[j / a.block_size];
            TrapUnless(page >= 0 && page < a.num_pages);
            const T* k_ptr = pool + (static_cast<int64_t>(page) * 2 * a.n_kv_heads + g) * plane +
                             (j % a.block_size) * hd;
            LoadLane<T, kT>(k_ptr, d0, hd, vec, kf[u]);
            LoadLane<T, kT>(k_ptr + a.n_kv_heads * plane, d0, hd, vec, vf[u]);
          } else {
#pragma unroll
            for (int t = 0; t < kT; ++t) kf[u][t] = vf[u][t] = 0.0f;
          }
        }
        float s[kMaxHeadsPerCta][kTile];
#pragma unroll
        for (int h = 0; h < kMaxHeadsPerCta; ++h) {
          if (h >= hg) break;
#pragma unroll
          for (int u = 0; u < kTile; ++u) {
            float dot = 0.0f;
#pragma unroll
            for (int t = 0; t < kT; ++t) dot = fmaf(q_s[h][d0 + t], kf[u][t], dot);
            s[h][u] = dot;
          }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
          for (int h = 0; h < kMaxHeadsPerCta; ++h) {
            if (h >= hg) break;
#pragma unroll
            for (int u = 0; u < kTile; ++u) s[h][u] += __shfl_xor_sync(0xffffffffu, s[h][u], off);
          }
        }
#pragma unroll
        for (int h = 0; h < kMaxHeadsPerCta; ++h) {
          if (h >= hg) break;  // uniform across the CTA
          float m_tile = -INFINITY;
#pragma unroll
          for (int u = 0; u < kTile; ++u) {
            s[h][u] = j0 + u < end ? s[h][u] * a.scale : -INFINITY;
            m_tile = fmaxf(m_tile, s[h][u]);
          }
          const float m_new = fmaxf(m[h], m_tile);      // finite: entry j0 is < end
          const float correction = expf(m[h] - m_new);  // 0 on the first tile (m = -inf)
          l[h] *= correction;
#pragma unroll
          for (int t = 0; t < kT; ++t) acc[h][t] *= correction;
#pragma unroll
          for (int u = 0; u < kTile; ++u) {
            const float p = expf(s[h][u] - m_new);  // 0 past the end
            l[h] += p;
#pragma unroll
            for (int t = 0; t < kT; ++t) acc[h][t] = fmaf(p, vf[u][t], acc[h][t]);
          }
          m[h] = m_new;
        }
      }
    }

    // Merge the warps: each publishes (max, sum, acc) per head.
#pragma unroll
    for (int h = 0; h < kMaxHeadsPerCta; ++h) {
      if (h >= hg) break;
      if (lane == 0) {
        ml_s[warp][h][0] = m[h];
        ml_s[warp][h][1] = l[h];
      }
#pragma unroll
      for (int t = 0; t < kT; ++t) acc_s[warp][h][d0 + t] = acc[h][t];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < hg * hd; e += kThreads) {
      const int h = e / hd, d = e % hd;
      float mx = -INFINITY;
      for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, ml_s[w][h][0]);
      float sum = 0.0f, val = 0.0f;
      for (int w = 0; w < kWarps; ++w) {
        if (ml_s[w][h][1] == 0.0f) continue;  // a warp that saw no entry
        const float f = expf(ml_s[w][h][0] - mx);
        sum += ml_s[w][h][1] * f;
        val += acc_s[w][h][d] * f;
      }
      const int head = h_first + h;
      if (plan.splits == 1) {
        a.out[(row * a.n_heads + head) * hd + d] = val / sum;
      } else {
        const int64_t slot = (row * a.n_heads + head) * plan.splits + split;
        rp.part_acc[slot * hd + d] = val;
        if (d == 0) {
          rp.part_ml[2 * slot] = mx;
          rp.part_ml[2 * slot + 1] = sum;
        }
      }
    }
  }
}

// One CTA per (row, head): merges the non-empty splits (those starting below kv_len). Launched
// whenever the host plan splits; under a device row count the re-plan may not, and then the main
// kernel has written the output itself.
__global__ void CombineKernel(KernelArgs ka) {
  const AttentionArgs& a = ka.a;
  const RowPlan rp = ResolvePlan(ka);
  const int64_t row = blockIdx.x;
  const int head = blockIdx.y;
  if (row >= rp.rows || rp.plan.splits == 1) return;
  const int64_t used = (a.row_kv_len[row] + rp.plan.split_len - 1) / rp.plan.split_len;
  const int64_t base = (row * a.n_heads + head) * rp.plan.splits;
  const float* part_ml = rp.part_ml;
  const float* part_acc = rp.part_acc;
  float mx = -INFINITY;
  for (int64_t s = 0; s < used; ++s) mx = fmaxf(mx, part_ml[2 * (base + s)]);
  float sum = 0.0f;
  for (int64_t s = 0; s < used; ++s) {
    sum += part_ml[2 * (base + s) + 1] * expf(part_ml[2 * (base + s)] - mx);
  }
  for (int d = threadIdx.x; d < a.head_dim; d += blockDim.x) {
    float val = 0.0f;
    for (int64_t s = 0; s < used; ++s) {
      val += part_acc[(base + s) * a.head_dim + d] * expf(part_ml[2 * (base + s)] - mx);
    }
    a.out[(row * a.n_heads + head) * a.head_dim + d] = val / sum;
  }
}

template <typename T, bool kLanes>
cudaError_t LaunchMainAs(cudaStream_t stream, const KernelArgs& ka, dim3 grid) {
  const int hd = ka.a.head_dim;
  if (hd <= 32) {
    AttentionKernel<T, 1, kLanes><<<grid, kThreads, 0, stream>>>(ka);
  } else if (hd <= 64) {
    AttentionKernel<T, 2, kLanes><<<grid, kThreads, 0, stream>>>(ka);
  } else if (hd <= 128) {
    AttentionKernel<T, 4, kLanes><<<grid, kThreads, 0, stream>>>(ka);
  } else if (hd <= kAttentionMaxHeadDim) {
    AttentionKernel<T, 8, kLanes><<<grid, kThreads, 0, stream>>>(ka);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchMain(cudaStream_t stream, const KernelArgs& ka, dim3 grid) {
  return ka.a.scores_per_lane ? LaunchMainAs<T, true>(stream, ka, grid)
                              : LaunchMainAs<T, false>(stream, ka, grid);
}

}  // namespace

AttentionPlan PlanAttention(const AttentionArgs& a, int num_sms, size_t max_scratch_bytes) {
  // Splits never grow with the row count, so one row's plan bounds every count's splits and
  // scratch.
  return PlanFor(a.rows == nullptr ? a.n : std::min<int64_t>(a.n, 1),
                 ShapeOf(a, num_sms, max_scratch_bytes));
}

cudaError_t Attention(cudaStream_t stream, const AttentionArgs& args, const AttentionPlan& plan,
                      int num_sms, size_t max_scratch_bytes, void* scratch) {
  if (args.n == 0) return cudaSuccess;
  const PlanShape shape = ShapeOf(args, num_sms, max_scratch_bytes);
  KernelArgs ka{args, plan, shape, plan.splits > 1 ? static_cast<float*>(scratch) : nullptr};
  // One CTA per item without a count. With one, c * splits(c) <= target / base + c for every
  // count c <= n (splits(c) <= ceil(target / (c * base))), so n + ceil(target / base) CTAs give
  // every item of any count its own CTA while rows past the count cost few idle CTAs.
  int64_t items = args.n * int64_t{plan.splits};
  if (args.rows != nullptr) {
    const int64_t base = std::max<int64_t>(1, int64_t{args.n_kv_heads} * plan.head_chunks);
    const int64_t target = int64_t{kCtasPerSm} * std::max(num_sms, 1);
    items = std::min(items, args.n + (target + base - 1) / base);
  }
  const dim3 grid(static_cast<unsigned int>(items),
                  static_cast<unsigned int>(args.n_kv_heads * plan.head_chunks));
  cudaError_t err = cudaErrorInvalidValue;
  switch (args.pool_dtype) {
    case DType::kF32:
      err = LaunchMain<float>(stream, ka, grid);
      break;
    case DType::kF16:
      err = LaunchMain<__half>(stream, ka, grid);
      break;
    case DType::kBF16:
      err = LaunchMain<__nv_bfloat16>(stream, ka, grid);
      break;
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
  if (err != cudaSuccess || plan.splits == 1) return err;
  CombineKernel<<<dim3(static_cast<unsigned int>(args.n), static_cast<unsigned int>(args.n_heads)),
                  std::min(kAttentionMaxHeadDim, 128), 0, stream>>>(ka);
  return cudaGetLastError();
}

}  // namespace modserve::backend::cuda::kernels
