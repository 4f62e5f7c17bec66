// Host-side launchers of the CUDA backend's kernels (one .cu per family). Each enqueues on the
// given stream and returns the launch error (cudaSuccess when enqueued); none synchronises or
// allocates. They do no shape checks beyond what they need to pick a kernel: CudaBackend checks
// arguments.
#ifndef MODSERVE_ENGINE_BACKEND_CUDA_KERNELS_KERNELS_H_
#define MODSERVE_ENGINE_BACKEND_CUDA_KERNELS_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "engine/common/dtype.h"

namespace modserve::backend::cuda::kernels {

// Index arguments (ids, slots, pages, rows) were validated by the caller. A kernel that meets an
// out-of-range index anyway executes `trap`: the stream's context dies with
// cudaErrorLaunchFailure, which CudaBackend reports at the next Synchronize() as Internal.
//
// `rows` is the device row count of Backend::SetDeviceRowCount ([1] i32 in device memory), or null
// for none. With one, the row dimension named first below (n, or m for the ops over idx) is a
// capacity: grids are sized for it, and each kernel reads *rows when it runs and processes rows
// [0, clamp(*rows, 0, n)) only; index and metadata entries of later rows are never read, and
// nothing is written for them.

// out[i, :] = table[ids[i], :] as f32. table [vocab, d] of `dt`; out [n, d].
cudaError_t Embed(cudaStream_t stream, const int32_t* ids, int64_t n, const void* table, DType dt,
                  int64_t vocab, int64_t d, const int32_t* rows, float* out);

// out = x / sqrt(mean(x^2) + eps) * w per row; out may alias x. x, out [n, d]; w [d] of `dt`.
cudaError_t RmsNorm(cudaStream_t stream, const float* x, const void* w, DType dt, int64_t n,
                    int64_t d, float eps, const int32_t* rows, float* out);

// ---- Gemm pieces (gemv.cu, gemm_support.cu); CudaBackend::Gemm picks between them. ----
// Row counts up to this go to the hand-written GEMV; larger ones to cuBLAS.
inline constexpr int64_t kGemvMaxRows = 8;

// out[n, m] = x[n, k] @ w[m, k]^T (+ bias[m]) with f32 products and f32 sums; n <= kGemvMaxRows.
// w and bias have dtype `dt`; bias may be null. Under a row count of 0 no weight is read (the skip
// of a whole routed layer inside a graph).
cudaError_t Gemv(cudaStream_t stream, const float* x, const void* w, const void* bias, DType dt,
                 int64_t n, int64_t m, int64_t k, const int32_t* rows, float* out);

// The GEMV's launch shapes for modserve-cuda-gemv-bench (bf16 w, no bias, no row count): variant
// 0 is the one Gemv uses; the others trade threads, rows per CTA and loads in flight.
inline constexpr int kGemvVariants = 6;
const char* GemvVariantName(int variant);
cudaError_t GemvVariantBf16(int variant, cudaStream_t stream, const float* x, const void* w,
                            int64_t n, int64_t m, int64_t k, float* out);

// The helpers below serve the cuBLAS path, which takes its row count from the host: they have no
// `rows` and always run on all n rows.

// planes [3, n, k] bf16 with x == planes[0] + planes[1] + planes[2] exactly (each plane holds the
// next 8 significant bits of what the previous ones left; see docs/CUDA.md, "Gemm numerics").
cudaError_t SplitToBf16Planes(cudaStream_t stream, const float* x, int64_t n, int64_t k,
                              void* planes);

// out[i, r] = p[0, i, r] + (p[1, i, r] + p[2, i, r]) (+ bias[r]); p [3, n, m] f32, out [n, m];
// bias (dtype `bias_dt`) may be null.
cudaError_t CombinePlanes(cudaStream_t stream, const float* p, const void* bias, DType bias_dt,
                          int64_t n, int64_t m, float* out);

// dst[i] = f32(src[i]) for `count` elements of `dt`.
cudaError_t WidenToF32(cudaStream_t stream, const void* src, DType dt, int64_t count, float* dst);

// out[i, r] += bias[r]; out [n, m].
cudaError_t AddBias(cudaStream_t stream, const void* bias, DType dt, int64_t n, int64_t m,
                    float* out);

// ---- RoPE + KV append (rope_kv.cu). ----
struct RopeKvArgs {
  float* q = nullptr;                  // [n, n_heads, head_dim], rotated in place
  float* k = nullptr;                  // [n, n_kv_heads, head_dim], rotated in place
  const float* v = nullptr;            // [n, n_kv_heads, head_dim]
  const int32_t* positions = nullptr;  // [n]
  const int32_t* slots = nullptr;      // [n]
  const int32_t* rows = nullptr;       // device row count over n, or null
  void* kv_pool = nullptr;  // [num_pages, 2 * n_kv_heads, block_size, head_dim] of pool_dtype
  DType pool_dtype = DType::kF32;
  int64_t n = 0;
  int64_t num_pages = 0;
  int n_heads = 0, n_kv_heads = 0, head_dim = 0, block_size = 0;
  double rope_theta = 10000.0;
};
cudaError_t RopeAndAppendKv(cudaStream_t stream, const RopeKvArgs& args);

// ---- Paged attention (attention.cu). ----
inline constexpr int kAttentionMaxHeadDim = 256;

struct AttentionArgs {
  const float* q = nullptr;       // [n, n_heads, head_dim]
  const void* kv_pool = nullptr;  // as in RopeKvArgs, of pool_dtype
  DType pool_dtype = DType::kF32;
  const int32_t* page_table = nullptr;  // [num_seqs, max_pages]
  const int32_t* row_seq = nullptr;     // [n]
  const int32_t* row_kv_len = nullptr;  // [n]
  const int32_t* rows = nullptr;        // device row count over n, or null
  float* out = nullptr;                 // [n, n_heads * head_dim]
  int64_t n = 0, num_pages = 0, num_seqs = 0, max_pages = 0;
  int n_heads = 0, n_kv_heads = 0, head_dim = 0, block_size = 0;
  float scale = 0.0f;
  // true: a tile's scores one entry per lane; false: every lane on every entry, one warp-wide
  // reduction per score (the earlier kernel, kept for comparison: MODSERVE_CUDA_ATTENTION=warp).
  bool scores_per_lane = true;
};

// How the context is split across CTAs; a pure function of shapes (never of kv lengths, which live
// on the device), so one plan serves every replay of a captured graph.
struct AttentionPlan {
  int heads_per_cta = 1;  // query heads sharing one kv head that one CTA handles (<= 8)
  int head_chunks = 1;    // ceil(group / heads_per_cta)
  int splits = 1;         // context splits; 1 = no partials, no combine kernel
  int64_t split_len = 0;  // entries per split
  // Scratch the split path needs: partial accumulators + (max, sum) pairs, in bytes.
  size_t scratch_bytes = 0;
};

// Picks splits so that n * n_kv_heads * head_chunks * splits CTAs fill `num_sms` SMs a few times
// over, with at least kMinSplitLen entries per split and within `max_scratch_bytes`.
// With a device row count (args.rows) the kernels re-plan on the device for the count c, so that a
// counted row gets exactly the splits, and so the bits, of a call with c rows; the returned plan is
// then the one for a single row (the most splits and scratch any c in [1, n] can need), and the
// launch keeps the grid of n rows with plan-for-n splits, each CTA looping over its share of
// splits.
AttentionPlan PlanAttention(const AttentionArgs& args, int num_sms, size_t max_scratch_bytes);

// Runs the plan. `scratch` must hold plan.scratch_bytes (unused when plan.splits == 1).
// `num_sms` and `max_scratch_bytes` must be those given to PlanAttention (the device re-plans).
cudaError_t Attention(cudaStream_t stream, const AttentionArgs& args, const AttentionPlan& plan,
                      int num_sms, size_t max_scratch_bytes, void* scratch);

// ---- Elementwise and row ops (elementwise.cu); all f32 tensors [n, width] row-major. ----
cudaError_t SwiGlu(cudaStream_t stream, const float* gate, const float* up, int64_t n,
                   int64_t width, const int32_t* rows, float* out);
// kind: 0 = silu, 1 = gelu (erf), 2 = relu (ActivationKind's values).
cudaError_t Activation(cudaStream_t stream, int kind, int64_t n, int64_t width, const int32_t* rows,
                       float* x);
cudaError_t Add(cudaStream_t stream, const float* a, const float* b, int64_t n, int64_t width,
                const int32_t* rows, float* out);
// out[j, :] = x[idx[j], :]; x [n, d], out [m, d]; `rows` counts over m.
cudaError_t GatherRows(cudaStream_t stream, const float* x, int64_t n, int64_t d,
                       const int32_t* idx, int64_t m, const int32_t* rows, float* out);
// weight_fn: 0 identity, 1 sigmoid; scale_target: 0 update, 1 block output (backend.h enums).
// `rows` counts over m (idx, y, s).
cudaError_t ScatterCombine(cudaStream_t stream, int weight_fn, int scale_target, float* x,
                           int64_t n, int64_t d, const float* y, const int32_t* idx, const float* s,
                           int64_t m, const int32_t* rows);
// MoD routing decision (Backend::RouteSelect): probs[i] = f32(p), p = 1 / (1 + exp(-z[i])) in
// f64; rows with z[i] > z_cut[i] compacted in ascending order into idx / s_sel, their number into
// *count (always written, 0 under a row count of 0). One block of 1024 threads walks the rows in
// tiles (n is at most a step's tokens).
cudaError_t RouteSelect(cudaStream_t stream, const float* z, const float* z_cut, const float* s,
                        int64_t n, const int32_t* rows, float* probs, int32_t* idx, float* s_sel,
                        int32_t* count);

// KV metadata of the routed rows (Backend::RouteRows), one thread per j < m: with r = idx[j],
// s = row_seq[r] and rank = j - lower_bound(idx[0 .. j), seq_first_row[s]) (idx is ascending),
// out_pos[j] = row_pos[r], out_slots[j] = cand_slots[seq_first_row[s] + rank], out_seq[j] = s,
// out_kv_len[j] = seq_kv_base[s] + rank + 1. idx [m]; row_seq, row_pos, cand_slots [num_rows];
// seq_first_row, seq_kv_base [num_seqs]; outputs [m]; `rows` counts over m. Traps on a row or
// sequence index out of range.
struct RouteRowsArgs {
  const int32_t* idx = nullptr;
  const int32_t* row_seq = nullptr;
  const int32_t* row_pos = nullptr;
  const int32_t* cand_slots = nullptr;
  const int32_t* seq_first_row = nullptr;
  const int32_t* seq_kv_base = nullptr;
  int32_t* out_pos = nullptr;
  int32_t* out_slots = nullptr;
  int32_t* out_seq = nullptr;
  int32_t* out_kv_len = nullptr;
  const int32_t* rows = nullptr;
  int64_t m = 0, num_rows = 0, num_seqs = 0;
};
cudaError_t RouteRows(cudaStream_t stream, const RouteRowsArgs& args);

}  // namespace modserve::backend::cuda::kernels

#endif  // MODSERVE_ENGINE_BACKEND_CUDA_KERNELS_KERNELS_H_
