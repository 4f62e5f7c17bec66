// Argument checks shared by every implementation of the backend ops: dtypes, ranks, shapes and
// devices. A failure is a caller bug, so they CHECK-fail; they never look at index values.
#ifndef MODSERVE_ENGINE_BACKEND_CPU_OP_CHECKS_H_
#define MODSERVE_ENGINE_BACKEND_CPU_OP_CHECKS_H_

#include <utility>

#include "absl/types/span.h"
#include "engine/backend/backend.h"
#include "engine/common/tensor_view.h"

namespace modserve::backend::cpu {

// Each function checks the arguments of the Backend op of the same name (see backend.h for the
// shapes) and that every tensor lives on `device`.
void CheckEmbedArgs(Device device, const TensorView& ids, const TensorView& table,
                    const TensorView& out);
void CheckRmsNormArgs(Device device, const TensorView& x, const TensorView& weight,
                      const TensorView& out);
void CheckGemmArgs(Device device, const TensorView& x, const TensorView& w, const TensorView& bias,
                   const TensorView& out);
void CheckRopeAndAppendKvArgs(Device device, const RopeParams& params, const TensorView& q,
                              const TensorView& k, const TensorView& v, const TensorView& positions,
                              const TensorView& slots, const TensorView& kv_pool);
void CheckAttentionArgs(Device device, const AttentionParams& params, const TensorView& q,
                        const TensorView& kv_pool, const TensorView& page_table,
                        const TensorView& row_seq, const TensorView& row_kv_len,
                        const TensorView& out);
// SwiGlu and Add: three [n, f] f32 tensors of one shape.
void CheckSameShapeF32Args(Device device, const TensorView& a, const TensorView& b,
                           const TensorView& out);
void CheckActivationArgs(Device device, const TensorView& x);
void CheckGatherRowsArgs(Device device, const TensorView& x, const TensorView& idx,
                         const TensorView& out);
void CheckScatterCombineArgs(Device device, const TensorView& x, const TensorView& y,
                             const TensorView& idx, const TensorView& s);
// z, tau, s, probs, s_sel [n] f32, idx [n] i32, count [1] i32 (Backend::RouteSelect).
void CheckRouteSelectArgs(Device device, const TensorView& z, const TensorView& z_cut,
                          const TensorView& s, const TensorView& probs, const TensorView& idx,
                          const TensorView& s_sel, const TensorView& count);
// idx and the four outputs [m] i32; row_seq, row_pos, cand_slots [N] i32; seq_first_row and
// seq_kv_base [S] i32 (Backend::RouteRows).
void CheckRouteRowsArgs(Device device, const TensorView& idx, const TensorView& row_seq,
                        const TensorView& row_pos, const TensorView& cand_slots,
                        const TensorView& seq_first_row, const TensorView& seq_kv_base,
                        const TensorView& out_pos, const TensorView& out_slots,
                        const TensorView& out_seq, const TensorView& out_kv_len);
// count [1] i32 (Backend::SetDeviceRowCount), or empty.
void CheckRowCountArg(Device device, const TensorView& count);
// kv_pool [num_pages, 2 * n_kv_heads, block_size, head_dim] of a KV storage type; every page id
// in range, src != dst, each dst once and never a src.
void CheckCopyKvPagesArgs(Device device, const TensorView& kv_pool,
                          absl::Span<const std::pair<int32_t, int32_t>> copies);

}  // namespace modserve::backend::cpu

#endif  // MODSERVE_ENGINE_BACKEND_CPU_OP_CHECKS_H_
