// Shape, dtype and device checks of the backend ops (see op_checks.h).
#include "engine/backend/cpu/op_checks.h"

#include <algorithm>
#include <vector>

#include "engine/common/logging.h"

namespace modserve::backend::cpu {
namespace {

bool IsWeightDType(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }
bool IsMatrixDType(DType t) { return IsWeightDType(t) || DTypeIsQuantized(t); }

void CheckTensor(Device device, const TensorView& t, DType dtype, int ndim, const char* name) {
  MODSERVE_CHECK(t.data != nullptr || t.numel() == 0) << name << " has no data";
  MODSERVE_CHECK(t.device == device) << name << " is on the wrong device";
  MODSERVE_CHECK(t.dtype == dtype)
      << name << " dtype " << DTypeName(t.dtype) << ", want " << DTypeName(dtype);
  MODSERVE_CHECK_EQ(t.ndim, ndim) << name << " " << t.ShapeString();
}

void CheckWeight(Device device, const TensorView& t, int ndim, const char* name) {
  MODSERVE_CHECK(IsWeightDType(t.dtype)) << name << " dtype " << DTypeName(t.dtype);
  CheckTensor(device, t, t.dtype, ndim, name);
}

// Embedding tables and Gemm weights may also be block-quantized: whole blocks per row.
void CheckMatrix(Device device, const TensorView& t, const char* name) {
  MODSERVE_CHECK(IsMatrixDType(t.dtype)) << name << " dtype " << DTypeName(t.dtype);
  CheckTensor(device, t, t.dtype, 2, name);
  MODSERVE_CHECK_EQ(t.dim(1) % DTypeBlockElems(t.dtype), 0)
      << name << " " << t.ShapeString() << " rows are not whole " << DTypeName(t.dtype)
      << " blocks";
}

}  // namespace

void CheckEmbedArgs(Device device, const TensorView& ids, const TensorView& table,
                    const TensorView& out) {
  CheckTensor(device, ids, DType::kI32, 1, "ids");
  CheckMatrix(device, table, "table");
  CheckTensor(device, out, DType::kF32, 2, "out");
  MODSERVE_CHECK_EQ(out.dim(0), ids.dim(0));
  MODSERVE_CHECK_EQ(out.dim(1), table.dim(1));
}

void CheckRmsNormArgs(Device device, const TensorView& x, const TensorView& weight,
                      const TensorView& out) {
  CheckTensor(device, x, DType::kF32, 2, "x");
  CheckWeight(device, weight, 1, "weight");
  CheckTensor(device, out, DType::kF32, 2, "out");
  MODSERVE_CHECK_EQ(weight.dim(0), x.dim(1));
  MODSERVE_CHECK(out.shape == x.shape) << out.ShapeString() << " vs " << x.ShapeString();
}

void CheckGemmArgs(Device device, const TensorView& x, const TensorView& w, const TensorView& bias,
                   const TensorView& out) {
  CheckTensor(device, x, DType::kF32, 2, "x");
  CheckMatrix(device, w, "w");
  CheckTensor(device, out, DType::kF32, 2, "out");
  MODSERVE_CHECK_EQ(x.dim(1), w.dim(1));
  MODSERVE_CHECK_EQ(out.dim(0), x.dim(0));
  MODSERVE_CHECK_EQ(out.dim(1), w.dim(0));
  if (!bias.empty()) {
    // A bias may be stored as F32 whatever w is (routers and predictors often mix dtypes); a
    // quantized matrix has no per-element dtype to share, so its bias is always F32.
    CheckTensor(device, bias,
                bias.dtype == DType::kF32 || DTypeIsQuantized(w.dtype) ? DType::kF32 : w.dtype, 1,
                "bias");
    MODSERVE_CHECK_EQ(bias.dim(0), w.dim(0));
  }
  MODSERVE_CHECK(out.data != x.data || x.numel() == 0) << "Gemm out must not alias x";
}

void CheckRopeAndAppendKvArgs(Device device, const RopeParams& p, const TensorView& q,
                              const TensorView& k, const TensorView& v, const TensorView& positions,
                              const TensorView& slots, const TensorView& kv_pool) {
  MODSERVE_CHECK(p.n_heads > 0 && p.n_kv_heads > 0 && p.block_size > 0);
  MODSERVE_CHECK(p.head_dim > 0 && p.head_dim % 2 == 0) << "head_dim " << p.head_dim;
  MODSERVE_CHECK(p.rope_theta > 0) << "rope_theta " << p.rope_theta;
  CheckTensor(device, q, DType::kF32, 3, "q");
  CheckTensor(device, k, DType::kF32, 3, "k");
  CheckTensor(device, v, DType::kF32, 3, "v");
  CheckTensor(device, positions, DType::kI32, 1, "positions");
  CheckTensor(device, slots, DType::kI32, 1, "slots");
  CheckWeight(device, kv_pool, 4, "kv_pool");
  const int64_t n = q.dim(0);
  MODSERVE_CHECK(q.dim(1) == p.n_heads && q.dim(2) == p.head_dim) << q.ShapeString();
  MODSERVE_CHECK(k.shape == v.shape) << k.ShapeString() << " vs " << v.ShapeString();
  MODSERVE_CHECK(k.dim(0) == n && k.dim(1) == p.n_kv_heads && k.dim(2) == p.head_dim)
      << k.ShapeString();
  MODSERVE_CHECK(positions.dim(0) == n && slots.dim(0) == n);
  MODSERVE_CHECK(kv_pool.dim(1) == 2 * p.n_kv_heads && kv_pool.dim(2) == p.block_size &&
                 kv_pool.dim(3) == p.head_dim)
      << "kv_pool " << kv_pool.ShapeString();
}

void CheckAttentionArgs(Device device, const AttentionParams& p, const TensorView& q,
                        const TensorView& kv_pool, const TensorView& page_table,
                        const TensorView& row_seq, const TensorView& row_kv_len,
                        const TensorView& out) {
  MODSERVE_CHECK(p.n_heads > 0 && p.n_kv_heads > 0 && p.head_dim > 0 && p.block_size > 0);
  MODSERVE_CHECK(p.n_heads % p.n_kv_heads == 0) << p.n_heads << " heads, " << p.n_kv_heads;
  CheckTensor(device, q, DType::kF32, 3, "q");
  CheckWeight(device, kv_pool, 4, "kv_pool");
  CheckTensor(device, page_table, DType::kI32, 2, "page_table");
  CheckTensor(device, row_seq, DType::kI32, 1, "row_seq");
  CheckTensor(device, row_kv_len, DType::kI32, 1, "row_kv_len");
  CheckTensor(device, out, DType::kF32, 2, "out");
  const int64_t n = q.dim(0);
  MODSERVE_CHECK(q.dim(1) == p.n_heads && q.dim(2) == p.head_dim) << q.ShapeString();
  MODSERVE_CHECK(kv_pool.dim(1) == 2 * p.n_kv_heads && kv_pool.dim(2) == p.block_size &&
                 kv_pool.dim(3) == p.head_dim)
      << "kv_pool " << kv_pool.ShapeString();
  MODSERVE_CHECK(row_seq.dim(0) == n && row_kv_len.dim(0) == n);
  MODSERVE_CHECK(out.dim(0) == n && out.dim(1) == int64_t{p.n_heads} * p.head_dim)
      << out.ShapeString();
}

void CheckSameShapeF32Args(Device device, const TensorView& a, const TensorView& b,
                           const TensorView& out) {
  CheckTensor(device, a, DType::kF32, 2, "a");
  CheckTensor(device, b, DType::kF32, 2, "b");
  CheckTensor(device, out, DType::kF32, 2, "out");
  MODSERVE_CHECK(a.shape == b.shape && a.shape == out.shape)
      << a.ShapeString() << " " << b.ShapeString() << " " << out.ShapeString();
}

void CheckActivationArgs(Device device, const TensorView& x) {
  CheckTensor(device, x, DType::kF32, 2, "x");
}

void CheckGatherRowsArgs(Device device, const TensorView& x, const TensorView& idx,
                         const TensorView& out) {
  CheckTensor(device, x, DType::kF32, 2, "x");
  CheckTensor(device, idx, DType::kI32, 1, "idx");
  CheckTensor(device, out, DType::kF32, 2, "out");
  MODSERVE_CHECK(out.dim(0) == idx.dim(0) && out.dim(1) == x.dim(1)) << out.ShapeString();
}

void CheckScatterCombineArgs(Device device, const TensorView& x, const TensorView& y,
                             const TensorView& idx, const TensorView& s) {
  CheckTensor(device, x, DType::kF32, 2, "x");
  CheckTensor(device, y, DType::kF32, 2, "y");
  CheckTensor(device, idx, DType::kI32, 1, "idx");
  CheckTensor(device, s, DType::kF32, 1, "s");
  MODSERVE_CHECK(y.dim(0) == idx.dim(0) && s.dim(0) == idx.dim(0) && y.dim(1) == x.dim(1))
      << "y " << y.ShapeString() << " idx " << idx.ShapeString() << " s " << s.ShapeString();
}

void CheckRouteSelectArgs(Device device, const TensorView& z, const TensorView& z_cut,
                          const TensorView& s, const TensorView& probs, const TensorView& idx,
                          const TensorView& s_sel, const TensorView& count) {
  CheckTensor(device, z, DType::kF32, 1, "z");
  CheckTensor(device, z_cut, DType::kF32, 1, "z_cut");
  CheckTensor(device, s, DType::kF32, 1, "s");
  CheckTensor(device, probs, DType::kF32, 1, "probs");
  CheckTensor(device, idx, DType::kI32, 1, "idx");
  CheckTensor(device, s_sel, DType::kF32, 1, "s_sel");
  CheckTensor(device, count, DType::kI32, 1, "count");
  const int64_t n = z.dim(0);
  MODSERVE_CHECK(n >= 1 && z_cut.dim(0) == n && s.dim(0) == n && probs.dim(0) == n &&
                 idx.dim(0) == n && s_sel.dim(0) == n && count.dim(0) == 1)
      << "z " << z.ShapeString() << " z_cut " << z_cut.ShapeString() << " s " << s.ShapeString()
      << " probs " << probs.ShapeString() << " idx " << idx.ShapeString() << " s_sel "
      << s_sel.ShapeString() << " count " << count.ShapeString();
}

void CheckRouteRowsArgs(Device device, const TensorView& idx, const TensorView& row_seq,
                        const TensorView& row_pos, const TensorView& cand_slots,
                        const TensorView& seq_first_row, const TensorView& seq_kv_base,
                        const TensorView& out_pos, const TensorView& out_slots,
                        const TensorView& out_seq, const TensorView& out_kv_len) {
  CheckTensor(device, idx, DType::kI32, 1, "idx");
  CheckTensor(device, row_seq, DType::kI32, 1, "row_seq");
  CheckTensor(device, row_pos, DType::kI32, 1, "row_pos");
  CheckTensor(device, cand_slots, DType::kI32, 1, "cand_slots");
  CheckTensor(device, seq_first_row, DType::kI32, 1, "seq_first_row");
  CheckTensor(device, seq_kv_base, DType::kI32, 1, "seq_kv_base");
  CheckTensor(device, out_pos, DType::kI32, 1, "out_pos");
  CheckTensor(device, out_slots, DType::kI32, 1, "out_slots");
  CheckTensor(device, out_seq, DType::kI32, 1, "out_seq");
  CheckTensor(device, out_kv_len, DType::kI32, 1, "out_kv_len");
  const int64_t m = idx.dim(0), n = row_seq.dim(0), s = seq_first_row.dim(0);
  MODSERVE_CHECK(row_pos.dim(0) == n && cand_slots.dim(0) == n && seq_kv_base.dim(0) == s &&
                 out_pos.dim(0) == m && out_slots.dim(0) == m && out_seq.dim(0) == m &&
                 out_kv_len.dim(0) == m && s >= 1)
      << "idx " << idx.ShapeString() << " row_seq " << row_seq.ShapeString() << " row_pos "
      << row_pos.ShapeString() << " cand_slots " << cand_slots.ShapeString() << " seq_first_row "
      << seq_first_row.ShapeString() << " seq_kv_base " << seq_kv_base.ShapeString()
      << " outputs " << out_pos.ShapeString() << " " << out_slots.ShapeString() << " "
      << out_seq.ShapeString() << " " << out_kv_len.ShapeString();
}

void CheckRowCountArg(Device device, const TensorView& count) {
  if (count.empty()) return;
  CheckTensor(device, count, DType::kI32, 1, "row count");
  MODSERVE_CHECK(count.dim(0) == 1) << "row count " << count.ShapeString();
}

void CheckCopyKvPagesArgs(Device device, const TensorView& kv_pool,
                          absl::Span<const std::pair<int32_t, int32_t>> copies) {
  MODSERVE_CHECK(kv_pool.device == device) << "kv_pool is not on this backend's device";
  MODSERVE_CHECK(kv_pool.dtype == DType::kF32 || kv_pool.dtype == DType::kF16 ||
                 kv_pool.dtype == DType::kBF16)
      << "kv_pool dtype " << DTypeName(kv_pool.dtype);
  MODSERVE_CHECK(kv_pool.ndim == 4) << "kv_pool " << kv_pool.ShapeString();
  const int64_t num_pages = kv_pool.dim(0);
  std::vector<int32_t> dsts;
  dsts.reserve(copies.size());
  for (const auto& [src, dst] : copies) {
    MODSERVE_CHECK(src >= 0 && src < num_pages && dst >= 0 && dst < num_pages && src != dst)
        << "page copy " << src << " -> " << dst << " of " << num_pages << " pages";
    dsts.push_back(dst);
  }
  std::sort(dsts.begin(), dsts.end());
  MODSERVE_CHECK(std::adjacent_find(dsts.begin(), dsts.end()) == dsts.end())
      << "a page is the destination of two copies";
  for (const auto& [src, dst] : copies) {
    MODSERVE_CHECK(!std::binary_search(dsts.begin(), dsts.end(), src))
        << "page " << src << " is both copied from and to";
  }
}

}  // namespace modserve::backend::cpu
