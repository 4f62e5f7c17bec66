// Paged attention for prefill and decode rows alike (flash-decoding style).
//
// Grid: x = row, y = (kv head, slice of its query-head group), z = context split. One CTA of
// kWarps warps handles up to kMaxHeadsPerCta query heads that share one kv head, so each K/V entry
// is read once per group, not once per head. Its warps take the split's entries round-robin; for
// each entry a warp reads the K and V vectors coalesced (lane l owns elements l, l + 32, ...),
// forms the scores of its heads with one shuffle reduction each, and updates an online softmax
// (running max, running sum, rescaled accumulator) in registers. The warps are merged through
// shared memory. With one split the CTA writes the normalised output; otherwise it writes an
// unnormalised partial (acc, max, sum) and a combine kernel merges the splits of each (row, head).
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

struct KernelArgs {
  AttentionArgs a;
  AttentionPlan plan;
  float* part_acc;  // [n, n_heads, splits, head_dim]
  float* part_ml;   // [n, n_heads, splits, 2]: running max, running sum
};

// kT = ceil(head_dim / 32): elements of a head vector per lane.
template <typename T, int kT>
__global__ void __launch_bounds__(kThreads) AttentionKernel(KernelArgs ka) {
  const AttentionArgs& a = ka.a;
  const AttentionPlan& plan = ka.plan;
  constexpr int kDim = kT * 32;
  __shared__ float q_s[kMaxHeadsPerCta][kDim];
  __shared__ float acc_s[kWarps][kMaxHeadsPerCta][kDim];
  __shared__ float ml_s[kWarps][kMaxHeadsPerCta][2];

  const int64_t row = blockIdx.x;
  const int group = a.n_heads / a.n_kv_heads;
  const int g = blockIdx.y / plan.head_chunks;
  const int chunk = blockIdx.y % plan.head_chunks;
  const int h_first = g * group + chunk * plan.heads_per_cta;  // first query head of this CTA
  const int hg = min(plan.heads_per_cta, group - chunk * plan.heads_per_cta);
  const int hd = a.head_dim;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  const int32_t seq = a.row_seq[row];
  const int32_t kv_len = a.row_kv_len[row];
  TrapUnless(seq >= 0 && seq < a.num_seqs && kv_len >= 1 &&
             kv_len <= a.max_pages * int64_t{a.block_size});
  const int64_t begin = static_cast<int64_t>(blockIdx.z) * plan.split_len;
  if (begin >= kv_len) return;  // an empty split: the combine kernel never reads it
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
  for (int64_t j = begin + warp; j < end; j += kWarps) {
    const int32_t page = pages[j / a.block_size];
    TrapUnless(page >= 0 && page < a.num_pages);
    const T* k_ptr =
        pool + (static_cast<int64_t>(page) * 2 * a.n_kv_heads + g) * plane + (j % a.block_size) * hd;
    const T* v_ptr = k_ptr + a.n_kv_heads * plane;
    float kf[kT], vf[kT];
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      const int d = lane + 32 * t;
      kf[t] = d < hd ? ToF32(k_ptr[d]) : 0.0f;
      vf[t] = d < hd ? ToF32(v_ptr[d]) : 0.0f;
    }
#pragma unroll
    for (int h = 0; h < kMaxHeadsPerCta; ++h) {
      if (h >= hg) break;  // uniform across the CTA
      float dot = 0.0f;
#pragma unroll
      for (int t = 0; t < kT; ++t) dot = fmaf(q_s[h][lane + 32 * t], kf[t], dot);
      const float s = WarpSum(dot) * a.scale;
      const float m_new = fmaxf(m[h], s);
      const float correction = expf(m[h] - m_new);  // 0 on the first entry (m = -inf)
      const float p = expf(s - m_new);
      l[h] = l[h] * correction + p;
#pragma unroll
      for (int t = 0; t < kT; ++t) acc[h][t] = fmaf(p, vf[t], acc[h][t] * correction);
      m[h] = m_new;
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
    for (int t = 0; t < kT; ++t) acc_s[warp][h][lane + 32 * t] = acc[h][t];
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
      const int64_t slot = (row * a.n_heads + head) * plan.splits + blockIdx.z;
      ka.part_acc[slot * hd + d] = val;
      if (d == 0) {
        ka.part_ml[2 * slot] = mx;
        ka.part_ml[2 * slot + 1] = sum;
      }
    }
  }
}

// One CTA per (row, head): merges the non-empty splits (those starting below kv_len).
__global__ void CombineKernel(KernelArgs ka) {
  const AttentionArgs& a = ka.a;
  const int64_t row = blockIdx.x;
  const int head = blockIdx.y;
  const int64_t used = (a.row_kv_len[row] + ka.plan.split_len - 1) / ka.plan.split_len;
  const int64_t base = (row * a.n_heads + head) * ka.plan.splits;
  float mx = -INFINITY;
  for (int64_t s = 0; s < used; ++s) mx = fmaxf(mx, ka.part_ml[2 * (base + s)]);
  float sum = 0.0f;
  for (int64_t s = 0; s < used; ++s) {
    sum += ka.part_ml[2 * (base + s) + 1] * expf(ka.part_ml[2 * (base + s)] - mx);
  }
  for (int d = threadIdx.x; d < a.head_dim; d += blockDim.x) {
    float val = 0.0f;
    for (int64_t s = 0; s < used; ++s) {
      val += ka.part_acc[(base + s) * a.head_dim + d] * expf(ka.part_ml[2 * (base + s)] - mx);
    }
    a.out[(row * a.n_heads + head) * a.head_dim + d] = val / sum;
  }
}

template <typename T>
cudaError_t LaunchMain(cudaStream_t stream, const KernelArgs& ka, dim3 grid) {
  const int hd = ka.a.head_dim;
  if (hd <= 32) {
    AttentionKernel<T, 1><<<grid, kThreads, 0, stream>>>(ka);
  } else if (hd <= 64) {
    AttentionKernel<T, 2><<<grid, kThreads, 0, stream>>>(ka);
  } else if (hd <= 128) {
    AttentionKernel<T, 4><<<grid, kThreads, 0, stream>>>(ka);
  } else if (hd <= kAttentionMaxHeadDim) {
    AttentionKernel<T, 8><<<grid, kThreads, 0, stream>>>(ka);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

AttentionPlan PlanAttention(const AttentionArgs& a, int num_sms, size_t max_scratch_bytes) {
  AttentionPlan plan;
  const int group = a.n_heads / a.n_kv_heads;
  plan.heads_per_cta = std::min(group, kMaxHeadsPerCta);
  plan.head_chunks = (group + plan.heads_per_cta - 1) / plan.heads_per_cta;
  const int64_t ctx_cap = std::max<int64_t>(1, a.max_pages * a.block_size);
  const int64_t base_ctas = std::max<int64_t>(1, a.n * a.n_kv_heads * plan.head_chunks);
  const int64_t target_ctas = int64_t{kCtasPerSm} * std::max(num_sms, 1);
  int64_t splits = (target_ctas + base_ctas - 1) / base_ctas;
  splits = std::min(splits, (ctx_cap + kMinSplitLen - 1) / kMinSplitLen);
  // Partials: head_dim + 2 floats per (row, head, split).
  const size_t per_split = static_cast<size_t>(a.n) * a.n_heads * (a.head_dim + 2) * sizeof(float);
  if (per_split > 0) {
    splits = std::min<int64_t>(splits, static_cast<int64_t>(max_scratch_bytes / per_split));
  }
  splits = std::clamp<int64_t>(splits, 1, 65535);
  plan.split_len = (ctx_cap + splits - 1) / splits;
  plan.splits = static_cast<int>((ctx_cap + plan.split_len - 1) / plan.split_len);
  plan.scratch_bytes = plan.splits > 1 ? per_split * plan.splits : 0;
  return plan;
}

cudaError_t Attention(cudaStream_t stream, const AttentionArgs& args, const AttentionPlan& plan,
                      void* scratch) {
  if (args.n == 0) return cudaSuccess;
  KernelArgs ka{args, plan, nullptr, nullptr};
  if (plan.splits > 1) {
    ka.part_acc = static_cast<float*>(scratch);
    ka.part_ml = ka.part_acc + args.n * args.n_heads * int64_t{plan.splits} * args.head_dim;
  }
  const dim3 grid(static_cast<unsigned int>(args.n),
                  static_cast<unsigned int>(args.n_kv_heads * plan.head_chunks),
                  static_cast<unsigned int>(plan.splits));
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
      break;
  }
  if (err != cudaSuccess || plan.splits == 1) return err;
  CombineKernel<<<dim3(static_cast<unsigned int>(args.n), static_cast<unsigned int>(args.n_heads)),
                  std::min(kAttentionMaxHeadDim, 128), 0, stream>>>(ka);
  return cudaGetLastError();
}

}  // namespace modserve::backend::cuda::kernels
