// Plain loops over the contracts of backend.h; every op is written for readability, not speed.
#include "engine/backend/cpu/reference_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/backend/cpu/op_checks.h"
#include "engine/backend/cpu/scalar_convert.h"
#include "engine/common/logging.h"
#include "engine/common/quant.h"

namespace modserve::backend::cpu::reference {
namespace {

constexpr Device kHost = Device::kCpu;

template <typename W>
void EmbedT(const TensorView& ids, const TensorView& table, const TensorView& out) {
  const int64_t n = ids.dim(0), vocab = table.dim(0), d = table.dim(1);
  const int32_t* id = ids.as<int32_t>();
  const W* t = table.as<W>();
  float* o = out.as<float>();
  for (int64_t i = 0; i < n; ++i) {
    MODSERVE_CHECK(id[i] >= 0 && id[i] < vocab) << "token id " << id[i] << " vocab " << vocab;
    for (int64_t c = 0; c < d; ++c) o[i * d + c] = ToF32(t[id[i] * d + c]);
  }
}

// Block-quantized tables: each looked-up row is dequantized exactly.
void EmbedQuantized(const TensorView& ids, const TensorView& table, const TensorView& out) {
  const int64_t n = ids.dim(0), vocab = table.dim(0), d = table.dim(1);
  const int32_t* id = ids.as<int32_t>();
  const size_t row_bytes = DTypeRowBytes(table.dtype, d);
  float* o = out.as<float>();
  for (int64_t i = 0; i < n; ++i) {
    MODSERVE_CHECK(id[i] >= 0 && id[i] < vocab) << "token id " << id[i] << " vocab " << vocab;
    quant::DequantizeRow(table.dtype, static_cast<const char*>(table.data) + id[i] * row_bytes, d,
                         o + i * d);
  }
}

template <typename W>
void RmsNormT(float eps, const TensorView& x, const TensorView& weight, const TensorView& out) {
  const int64_t n = x.dim(0), d = x.dim(1);
  const float* xp = x.as<float>();
  const W* w = weight.as<W>();
  float* o = out.as<float>();
  for (int64_t i = 0; i < n; ++i) {
    float sum_sq = 0.0f;
    for (int64_t c = 0; c < d; ++c) sum_sq += xp[i * d + c] * xp[i * d + c];
    const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(d) + eps);
    for (int64_t c = 0; c < d; ++c) o[i * d + c] = xp[i * d + c] * inv_rms * ToF32(w[c]);
  }
}

template <typename W>
void GemmT(const TensorView& x, const TensorView& w, const TensorView& bias,
           const TensorView& out) {
  const int64_t n = x.dim(0), k = x.dim(1), m = w.dim(0);
  const float* xp = x.as<float>();
  const W* wp = w.as<W>();
  // The bias is F32 or w's dtype (backend.h).
  const bool bias_f32 = !bias.empty() && bias.dtype == DType::kF32;
  const W* bp = bias.empty() || bias_f32 ? nullptr : bias.as<W>();
  const float* bp32 = bias_f32 ? bias.as<float>() : nullptr;
  float* o = out.as<float>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t r = 0; r < m; ++r) {
      float sum = 0.0f;
      for (int64_t c = 0; c < k; ++c) sum += xp[i * k + c] * ToF32(wp[r * k + c]);
      if (bp != nullptr) sum += ToF32(bp[r]);
      if (bp32 != nullptr) sum += bp32[r];
      o[i * m + r] = sum;
    }
  }
}

// Block-quantized w: each weight row is dequantized to f32, then the same f32 dot product as
// GemmT; the bias is F32.
void GemmQuantized(const TensorView& x, const TensorView& w, const TensorView& bias,
                   const TensorView& out) {
  const int64_t n = x.dim(0), k = x.dim(1), m = w.dim(0);
  const float* xp = x.as<float>();
  const float* bp = bias.empty() ? nullptr : bias.as<float>();
  const size_t row_bytes = DTypeRowBytes(w.dtype, k);
  float* o = out.as<float>();
  std::vector<float> w_row(k);
  for (int64_t r = 0; r < m; ++r) {
    quant::DequantizeRow(w.dtype, static_cast<const char*>(w.data) + r * row_bytes, k,
                         w_row.data());
    for (int64_t i = 0; i < n; ++i) {
      float sum = 0.0f;
      for (int64_t c = 0; c < k; ++c) sum += xp[i * k + c] * w_row[c];
      if (bp != nullptr) sum += bp[r];
      o[i * m + r] = sum;
    }
  }
}

// Rotate-half RoPE of one head vector in place, with cos/sin already rounded to f32.
void RotateHalf(float* v, int64_t head_dim, const float* cos, const float* sin) {
  const int64_t half = head_dim / 2;
  for (int64_t j = 0; j < half; ++j) {
    const float a = v[j], b = v[j + half];
    v[j] = a * cos[j] - b * sin[j];
    v[j + half] = b * cos[j] + a * sin[j];
  }
}

template <typename T>
void RopeAndAppendKvT(const RopeParams& p, const TensorView& q, const TensorView& k,
                      const TensorView& v, const TensorView& positions, const TensorView& slots,
                      const TensorView& kv_pool) {
  const int64_t n = q.dim(0), hd = p.head_dim, half = hd / 2, kv = p.n_kv_heads;
  const int64_t bs = p.block_size, num_slots = kv_pool.dim(0) * bs;
  float* qp = q.as<float>();
  float* kp = k.as<float>();
  const float* vp = v.as<float>();
  T* pool = kv_pool.as<T>();
  std::vector<float> cos(half), sin(half);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t pos = positions.as<int32_t>()[i];
    MODSERVE_CHECK(pos >= 0) << "position " << pos;
    for (int64_t j = 0; j < half; ++j) {
      // fp64 angle, as the PyTorch reference forms it.
      const double inv_freq = 1.0 / std::pow(p.rope_theta, static_cast<double>(2 * j) / hd);
      const double angle = static_cast<double>(pos) * inv_freq;
      cos[j] = static_cast<float>(std::cos(angle));
      sin[j] = static_cast<float>(std::sin(angle));
    }
    for (int64_t h = 0; h < p.n_heads; ++h)
      RotateHalf(qp + (i * p.n_heads + h) * hd, hd, cos.data(), sin.data());
    for (int64_t h = 0; h < kv; ++h) RotateHalf(kp + (i * kv + h) * hd, hd, cos.data(), sin.data());

    const int32_t slot = slots.as<int32_t>()[i];
    MODSERVE_CHECK(slot >= 0 && slot < num_slots) << "slot " << slot << " of " << num_slots;
    const int64_t page = slot / bs, offset = slot % bs;
    for (int64_t h = 0; h < kv; ++h) {
      T* k_dst = pool + ((page * 2 * kv + h) * bs + offset) * hd;
      T* v_dst = pool + ((page * 2 * kv + kv + h) * bs + offset) * hd;
      for (int64_t d = 0; d < hd; ++d) {
        k_dst[d] = FromF32<T>(kp[(i * kv + h) * hd + d]);
        v_dst[d] = FromF32<T>(vp[(i * kv + h) * hd + d]);
      }
    }
  }
}

template <typename T>
void AttentionT(const AttentionParams& p, const TensorView& q, const TensorView& kv_pool,
                const TensorView& page_table, const TensorView& row_seq,
                const TensorView& row_kv_len, const TensorView& out) {
  const int64_t n = q.dim(0), hd = p.head_dim, kv = p.n_kv_heads, bs = p.block_size;
  const int64_t group = p.n_heads / p.n_kv_heads;
  const int64_t num_seqs = page_table.dim(0), max_pages = page_table.dim(1);
  const int64_t num_pages = kv_pool.dim(0);
  const float* qp = q.as<float>();
  const T* pool = kv_pool.as<T>();
  const int32_t* pt = page_table.as<int32_t>();
  float* o = out.as<float>();
  std::vector<float> scores;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t seq = row_seq.as<int32_t>()[i];
    const int32_t kv_len = row_kv_len.as<int32_t>()[i];
    MODSERVE_CHECK(seq >= 0 && seq < num_seqs) << "row_seq " << seq << " of " << num_seqs;
    MODSERVE_CHECK(kv_len >= 1 && kv_len <= max_pages * bs) << "row_kv_len " << kv_len;
    scores.assign(kv_len, 0.0f);
    for (int64_t h = 0; h < p.n_heads; ++h) {
      const int64_t g = h / group;
      const float* qh = qp + (i * p.n_heads + h) * hd;
      auto entry = [&](int64_t j, int64_t which) {  // which: 0 = K, 1 = V
        const int32_t page = pt[seq * max_pages + j / bs];
        MODSERVE_CHECK(page >= 0 && page < num_pages) << "page " << page << " of " << num_pages;
        return pool + ((page * 2 * kv + which * kv + g) * bs + j % bs) * hd;
      };
      float max_score = -INFINITY;
      for (int64_t j = 0; j < kv_len; ++j) {
        const T* kj = entry(j, 0);
        float dot = 0.0f;
        for (int64_t d = 0; d < hd; ++d) dot += qh[d] * ToF32(kj[d]);
        scores[j] = dot * p.scale;
        max_score = std::max(max_score, scores[j]);
      }
      float denom = 0.0f;
      for (int64_t j = 0; j < kv_len; ++j) {
        scores[j] = std::exp(scores[j] - max_score);
        denom += scores[j];
      }
      float* oh = o + (i * p.n_heads + h) * hd;
      for (int64_t d = 0; d < hd; ++d) oh[d] = 0.0f;
      for (int64_t j = 0; j < kv_len; ++j) {
        const T* vj = entry(j, 1);
        for (int64_t d = 0; d < hd; ++d) oh[d] += scores[j] * ToF32(vj[d]);
      }
      for (int64_t d = 0; d < hd; ++d) oh[d] /= denom;
    }
  }
}

float Sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

}  // namespace

void Embed(const TensorView& ids, const TensorView& table, const TensorView& out) {
  CheckEmbedArgs(kHost, ids, table, out);
  switch (table.dtype) {
    case DType::kF32:
      return EmbedT<float>(ids, table, out);
    case DType::kF16:
      return EmbedT<f16_t>(ids, table, out);
    case DType::kBF16:
      return EmbedT<bf16_t>(ids, table, out);
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ4_K:
    case DType::kQ6_K:
    case DType::kQ5_K:
    case DType::kQ5_0:
    case DType::kQ5_1:
      return EmbedQuantized(ids, table, out);
    case DType::kI32:
      break;
  }
  MODSERVE_CHECK(false) << "Embed table dtype " << DTypeName(table.dtype);
}

void RmsNorm(const RmsNormParams& params, const TensorView& x, const TensorView& weight,
             const TensorView& out) {
  CheckRmsNormArgs(kHost, x, weight, out);
  switch (weight.dtype) {
    case DType::kF32:
      return RmsNormT<float>(params.eps, x, weight, out);
    case DType::kF16:
      return RmsNormT<f16_t>(params.eps, x, weight, out);
    case DType::kBF16:
      return RmsNormT<bf16_t>(params.eps, x, weight, out);
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
  MODSERVE_CHECK(false) << "RmsNorm weight dtype " << DTypeName(weight.dtype);
}

void Gemm(const TensorView& x, const TensorView& w, const TensorView& bias, const TensorView& out) {
  CheckGemmArgs(kHost, x, w, bias, out);
  switch (w.dtype) {
    case DType::kF32:
      return GemmT<float>(x, w, bias, out);
    case DType::kF16:
      return GemmT<f16_t>(x, w, bias, out);
    case DType::kBF16:
      return GemmT<bf16_t>(x, w, bias, out);
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ4_K:
    case DType::kQ6_K:
    case DType::kQ5_K:
    case DType::kQ5_0:
    case DType::kQ5_1:
      return GemmQuantized(x, w, bias, out);
    case DType::kI32:
      break;
  }
  MODSERVE_CHECK(false) << "Gemm w dtype " << DTypeName(w.dtype);
}

void RopeAndAppendKv(const RopeParams& params, const TensorView& q, const TensorView& k,
                     const TensorView& v, const TensorView& positions, const TensorView& slots,
                     const TensorView& kv_pool) {
  CheckRopeAndAppendKvArgs(kHost, params, q, k, v, positions, slots, kv_pool);
  switch (kv_pool.dtype) {
    case DType::kF32:
      return RopeAndAppendKvT<float>(params, q, k, v, positions, slots, kv_pool);
    case DType::kF16:
      return RopeAndAppendKvT<f16_t>(params, q, k, v, positions, slots, kv_pool);
    case DType::kBF16:
      return RopeAndAppendKvT<bf16_t>(params, q, k, v, positions, slots, kv_pool);
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
  MODSERVE_CHECK(false) << "kv_pool dtype " << DTypeName(kv_pool.dtype);
}

void Attention(const AttentionParams& params, const TensorView& q, const TensorView& kv_pool,
               const TensorView& page_table, const TensorView& row_seq,
               const TensorView& row_kv_len, const TensorView& out) {
  CheckAttentionArgs(kHost, params, q, kv_pool, page_table, row_seq, row_kv_len, out);
  switch (kv_pool.dtype) {
    case DType::kF32:
      return AttentionT<float>(params, q, kv_pool, page_table, row_seq, row_kv_len, out);
    case DType::kF16:
      return AttentionT<f16_t>(params, q, kv_pool, page_table, row_seq, row_kv_len, out);
    case DType::kBF16:
      return AttentionT<bf16_t>(params, q, kv_pool, page_table, row_seq, row_kv_len, out);
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
  MODSERVE_CHECK(false) << "kv_pool dtype " << DTypeName(kv_pool.dtype);
}

void SwiGlu(const TensorView& gate, const TensorView& up, const TensorView& out) {
  CheckSameShapeF32Args(kHost, gate, up, out);
  const float* g = gate.as<float>();
  const float* u = up.as<float>();
  float* o = out.as<float>();
  for (int64_t i = 0; i < gate.numel(); ++i) o[i] = g[i] * Sigmoid(g[i]) * u[i];
}

void Activation(const ActivationParams& params, const TensorView& x) {
  CheckActivationArgs(kHost, x);
  float* v = x.as<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    switch (params.kind) {
      case ActivationKind::kSilu:
        v[i] = v[i] * Sigmoid(v[i]);
        break;
      case ActivationKind::kGelu:
        v[i] = 0.5f * v[i] * (1.0f + std::erf(v[i] * static_cast<float>(M_SQRT1_2)));
        break;
      case ActivationKind::kRelu:
        v[i] = v[i] > 0.0f ? v[i] : 0.0f;
        break;
    }
  }
}

void Add(const TensorView& a, const TensorView& b, const TensorView& out) {
  CheckSameShapeF32Args(kHost, a, b, out);
  for (int64_t i = 0; i < a.numel(); ++i) out.as<float>()[i] = a.as<float>()[i] + b.as<float>()[i];
}

void GatherRows(const TensorView& x, const TensorView& idx, const TensorView& out) {
  CheckGatherRowsArgs(kHost, x, idx, out);
  const int64_t n = x.dim(0), d = x.dim(1);
  for (int64_t j = 0; j < idx.dim(0); ++j) {
    const int32_t r = idx.as<int32_t>()[j];
    MODSERVE_CHECK(r >= 0 && r < n) << "row index " << r << " of " << n;
    for (int64_t c = 0; c < d; ++c) out.as<float>()[j * d + c] = x.as<float>()[r * d + c];
  }
}

void ScatterCombine(const ScatterCombineParams& params, const TensorView& x, const TensorView& y,
                    const TensorView& idx, const TensorView& s) {
  CheckScatterCombineArgs(kHost, x, y, idx, s);
  const int64_t n = x.dim(0), d = x.dim(1);
  float* xp = x.as<float>();
  const float* yp = y.as<float>();
  for (int64_t j = 0; j < idx.dim(0); ++j) {
    const int32_t r = idx.as<int32_t>()[j];
    MODSERVE_CHECK(r >= 0 && r < n) << "row index " << r << " of " << n;
    const float score = s.as<float>()[j];
    float g = 0.0f;
    switch (params.weight_fn) {
      case WeightFn::kIdentity:
        g = score;
        break;
      case WeightFn::kSigmoid:
        g = Sigmoid(score);
        break;
      case WeightFn::kOne:
        for (int64_t c = 0; c < d; ++c) xp[r * d + c] = yp[j * d + c];
        continue;
    }
    for (int64_t c = 0; c < d; ++c) {
      float& xc = xp[r * d + c];
      switch (params.scale_target) {
        case ScaleTarget::kUpdate:
          xc = xc + g * (yp[j * d + c] - xc);
          break;
        case ScaleTarget::kBlockOutput:
          xc = g * yp[j * d + c];
          break;
      }
    }
  }
}

void CopyKvPages(const TensorView& kv_pool, absl::Span<const std::pair<int32_t, int32_t>> copies) {
  CheckCopyKvPagesArgs(kHost, kv_pool, copies);
  // Element by element through the page's coordinates, independently of the optimized memcpy.
  const int64_t rows = kv_pool.dim(1), bs = kv_pool.dim(2), hd = kv_pool.dim(3);
  const size_t elem = DTypeBytes(kv_pool.dtype);
  char* base = static_cast<char*>(kv_pool.data);
  for (const auto& [src, dst] : copies) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t t = 0; t < bs; ++t) {
        for (int64_t e = 0; e < hd; ++e) {
          const int64_t offset = ((r * bs) + t) * hd + e;
          std::memcpy(base + static_cast<size_t>((dst * rows * bs * hd + offset)) * elem,
                      base + static_cast<size_t>((src * rows * bs * hd + offset)) * elem, elem);
        }
      }
    }
  }
}

void RouteSelect(const TensorView& z, const TensorView& z_cut, const TensorView& s,
                 const TensorView& probs, const TensorView& idx, const TensorView& s_sel,
                 const TensorView& count) {
  CheckRouteSelectArgs(kHost, z, z_cut, s, probs, idx, s_sel, count);
  int32_t m = 0;
  for (int64_t i = 0; i < z.dim(0); ++i) {
    const float zi = z.as<float>()[i];
    probs.as<float>()[i] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(zi))));
    if (zi > z_cut.as<float>()[i]) {
      idx.as<int32_t>()[m] = static_cast<int32_t>(i);
      s_sel.as<float>()[m] = s.as<float>()[i];
      ++m;
    }
  }
  count.as<int32_t>()[0] = m;
}

void RouteRows(const TensorView& idx, const TensorView& row_seq, const TensorView& row_pos,
               const TensorView& cand_slots, const TensorView& seq_first_row,
               const TensorView& seq_kv_base, const TensorView& out_pos,
               const TensorView& out_slots, const TensorView& out_seq,
               const TensorView& out_kv_len) {
  CheckRouteRowsArgs(kHost, idx, row_seq, row_pos, cand_slots, seq_first_row, seq_kv_base,
                     out_pos, out_slots, out_seq, out_kv_len);
  const int64_t m = idx.dim(0), n = row_seq.dim(0), num_seqs = seq_first_row.dim(0);
  const int32_t* rows = idx.as<int32_t>();
  for (int64_t j = 0; j < m; ++j) {
    const int32_t r = rows[j];
    MODSERVE_CHECK(r >= 0 && r < n) << "routed row " << r << " of " << n;
    MODSERVE_CHECK(j == 0 || rows[j - 1] < r) << "routed rows not ascending at " << j;
    const int32_t s = row_seq.as<int32_t>()[r];
    MODSERVE_CHECK(s >= 0 && s < num_seqs) << "row " << r << " of sequence " << s;
    const int32_t first = seq_first_row.as<int32_t>()[s];
    // The routed rows before j that belong to earlier sequences: all those below `first`.
    int64_t before = 0;
    while (before < j && rows[before] < first) ++before;
    const int64_t rank = j - before;
    MODSERVE_CHECK(first >= 0 && first + rank < n) << "candidate slot " << first + rank;
    out_pos.as<int32_t>()[j] = row_pos.as<int32_t>()[r];
    out_slots.as<int32_t>()[j] = cand_slots.as<int32_t>()[first + rank];
    out_seq.as<int32_t>()[j] = s;
    out_kv_len.as<int32_t>()[j] = seq_kv_base.as<int32_t>()[s] + static_cast<int32_t>(rank) + 1;
  }
}

}  // namespace modserve::backend::cpu::reference
