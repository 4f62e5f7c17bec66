// The oracle: plain-loop, single-threaded versions of every backend op with fp32 accumulation in
// the obvious order. Correctness only; the CPU backend's fast ops are tested against these.
#ifndef MODSERVE_ENGINE_BACKEND_CPU_REFERENCE_OPS_H_
#define MODSERVE_ENGINE_BACKEND_CPU_REFERENCE_OPS_H_

#include <utility>

#include "engine/backend/backend.h"
#include "engine/common/tensor_view.h"

// Same signatures and contracts as the Backend ops in backend.h; all tensors are host (kCpu)
// tensors. Thread-safe (no shared state). Bad shapes and out-of-range indices CHECK-fail.
namespace modserve::backend::cpu::reference {

void Embed(const TensorView& ids, const TensorView& table, const TensorView& out);
void RmsNorm(const RmsNormParams& params, const TensorView& x, const TensorView& weight,
             const TensorView& out);
void Gemm(const TensorView& x, const TensorView& w, const TensorView& bias, const TensorView& out);
void RopeAndAppendKv(const RopeParams& params, const TensorView& q, const TensorView& k,
                     const TensorView& v, const TensorView& positions, const TensorView& slots,
                     const TensorView& kv_pool);
void Attention(const AttentionParams& params, const TensorView& q, const TensorView& kv_pool,
               const TensorView& page_table, const TensorView& row_seq,
               const TensorView& row_kv_len, const TensorView& out);
void SwiGlu(const TensorView& gate, const TensorView& up, const TensorView& out);
void Activation(const ActivationParams& params, const TensorView& x);
void Add(const TensorView& a, const TensorView& b, const TensorView& out);
void GatherRows(const TensorView& x, const TensorView& idx, const TensorView& out);
void ScatterCombine(const ScatterCombineParams& params, const TensorView& x, const TensorView& y,
                    const TensorView& idx, const TensorView& s);
void CopyKvPages(const TensorView& kv_pool, absl::Span<const std::pair<int32_t, int32_t>> copies);
void RouteSelect(const TensorView& z, const TensorView& z_cut, const TensorView& s,
                 const TensorView& probs, const TensorView& idx, const TensorView& s_sel,
                 const TensorView& count);
void RouteRows(const TensorView& idx, const TensorView& row_seq, const TensorView& row_pos,
               const TensorView& cand_slots, const TensorView& seq_first_row,
               const TensorView& seq_kv_base, const TensorView& out_pos,
               const TensorView& out_slots, const TensorView& out_seq,
               const TensorView& out_kv_len);

}  // namespace modserve::backend::cpu::reference

#endif  // MODSERVE_ENGINE_BACKEND_CPU_REFERENCE_OPS_H_
