// Scalar reference (de)quantizers of the GGML block layouts (see quant.h). Written for clarity;
// they run at load and conversion time, never inside a forward pass.
#include "engine/common/quant.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "engine/common/logging.h"
#include "engine/common/status_macros.h"

namespace modserve::quant {
namespace {

// The largest finite f16; a block scale beyond it cannot be stored.
constexpr float kF16Max = 65504.0f;

// Round half away from zero, as C's roundf (and GGML's nearest_int for in-range values).
int RoundToInt(float v) { return static_cast<int>(std::round(v)); }

absl::Status ScaleFits(float scale, int64_t first_elem) {
  if (std::fabs(scale) > kF16Max) {
    return absl::OutOfRangeError(absl::StrCat("block starting at element ", first_elem,
                                              " needs scale ", scale,
                                              ", beyond the f16 range of the format"));
  }
  return absl::OkStatus();
}

// ---- dequantize ------------------------------------------------------------------------------
void DequantQ8_0(const BlockQ8_0* b, int64_t num_blocks, float* y) {
  for (int64_t i = 0; i < num_blocks; ++i, y += kBlockElems) {
    const float d = F16ToF32(b[i].d);
    for (int j = 0; j < kBlockElems; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

// Q4_0 and Q4_1, and Q5_0 and Q5_1 (kQ5: level j's fifth bit is bit j of qh). With a minimum
// (kHasMin) x = q * d + m, else x = (q - 8) * d (Q5_0: q - 16).
template <bool kHasMin, bool kQ5, class B>
void DequantQ4Like(const B* b, int64_t num_blocks, float* y) {
  constexpr int kOffset = kQ5 ? 16 : 8;
  for (int64_t i = 0; i < num_blocks; ++i, y += kBlockElems) {
    uint32_t qh = 0;
    if constexpr (kQ5) std::memcpy(&qh, b[i].qh, 4);
    const float d = F16ToF32(b[i].d);
    for (int j = 0; j < 16; ++j) {
      const int q0 = (b[i].qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1) << 4);
      const int q1 = (b[i].qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
      if constexpr (kHasMin) {
        const float m = F16ToF32(b[i].m);
        y[j] = static_cast<float>(q0) * d + m;
        y[j + 16] = static_cast<float>(q1) * d + m;
      } else {
        y[j] = static_cast<float>(q0 - kOffset) * d;
        y[j + 16] = static_cast<float>(q1 - kOffset) * d;
      }
    }
  }
}

// Q4_K, and Q5_K (B = BlockQ5_K: the fifth bit of each level from qh), in GGML's order of f32
// operations: d * sc, then times the level, minus dmin * mn.
template <class B>
void DequantQ4_5K(const B* b, int64_t num_blocks, float* y) {
  for (int64_t i = 0; i < num_blocks; ++i, y += kSuperBlockElems) {
    const float d = F16ToF32(b[i].d), dmin = F16ToF32(b[i].dmin);
    for (int s = 0; s < 8; ++s) {
      uint8_t sc, mn;
      Q4KScaleMin(b[i].scales, s, &sc, &mn);
      const float ds = d * sc, ms = dmin * mn;
      const uint8_t* q = b[i].qs + 32 * (s / 2);
      for (int l = 0; l < 32; ++l) {
        int level = s % 2 == 0 ? (q[l] & 0x0f) : (q[l] >> 4);
        if constexpr (std::is_same_v<B, BlockQ5_K>) level |= ((b[i].qh[l] >> s) & 1) << 4;
        y[32 * s + l] = ds * static_cast<float>(level) - ms;
      }
    }
  }
}

void DequantQ6_K(const BlockQ6_K* b, int64_t num_blocks, float* y) {
  for (int64_t i = 0; i < num_blocks; ++i, y += kSuperBlockElems) {
    const float d = F16ToF32(b[i].d);
    for (int e = 0; e < kSuperBlockElems; ++e) {
      const int h = e / 128, r = (e % 128) / 32, l = e % 32;
      const uint8_t lo_byte = b[i].ql[64 * h + 32 * (r & 1) + l];
      const int lo = r < 2 ? (lo_byte & 0x0f) : (lo_byte >> 4);
      const int hi = (b[i].qh[32 * h + l] >> (2 * r)) & 3;
      const float ds = d * static_cast<float>(b[i].scales[e / 16]);
      y[e] = ds * static_cast<float>((lo | (hi << 4)) - 32);
    }
  }
}

// ---- quantize: GGML's simple reference rounding for the 32-element types ----------------------
void QuantQ8_0(const float* x, int64_t num_blocks, BlockQ8_0* b) {
  for (int64_t i = 0; i < num_blocks; ++i, x += kBlockElems) {
    float amax = 0.0f;
    for (int j = 0; j < kBlockElems; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = F32ToF16(d);
    for (int j = 0; j < kBlockElems; ++j) b[i].qs[j] = static_cast<int8_t>(RoundToInt(x[j] * id));
  }
}

// Q4_0 and Q4_1, and Q5_0 and Q5_1 (kQ5: 32 levels, the fifth bits gathered into qh). Without a
// minimum the signed value of largest magnitude maps to level 0 (-8, or -16), so the full range is
// used; with one (kHasMin) the block's minimum maps to level 0 and its maximum to the top level.
template <bool kHasMin, bool kQ5, class B>
void QuantQ4Like(const float* x, int64_t num_blocks, B* b) {
  constexpr int kTop = kQ5 ? 31 : 15;
  constexpr float kOffset = kQ5 ? 16.0f : 8.0f;
  for (int64_t i = 0; i < num_blocks; ++i, x += kBlockElems) {
    float d = 0.0f, lo = 0.0f;
    if constexpr (kHasMin) {
      float hi = x[0];
      lo = x[0];
      for (int j = 1; j < kBlockElems; ++j) {
        lo = std::min(lo, x[j]);
        hi = std::max(hi, x[j]);
      }
      d = (hi - lo) / static_cast<float>(kTop);
      b[i].m = F32ToF16(lo);
    } else {
      float amax = 0.0f, max = 0.0f;
      for (int j = 0; j < kBlockElems; ++j) {
        if (std::fabs(x[j]) > amax) {
          amax = std::fabs(x[j]);
          max = x[j];
        }
      }
      d = max / -kOffset;
    }
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = F32ToF16(d);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      // Truncation of a value >= 0.5 is round-to-nearest.
      const int q0 = kHasMin ? std::min(kTop, static_cast<int>((x[j] - lo) * id + 0.5f))
                             : std::min(kTop, static_cast<int>(x[j] * id + (kOffset + 0.5f)));
      const int q1 = kHasMin ? std::min(kTop, static_cast<int>((x[j + 16] - lo) * id + 0.5f))
                             : std::min(kTop, static_cast<int>(x[j + 16] * id + (kOffset + 0.5f)));
      b[i].qs[j] = static_cast<uint8_t>((q0 & 0x0f) | ((q1 & 0x0f) << 4));
      qh |= static_cast<uint32_t>(q0 >> 4) << j;
      qh |= static_cast<uint32_t>(q1 >> 4) << (j + 16);
    }
    if constexpr (kQ5) std::memcpy(b[i].qh, &qh, 4);
  }
}

// ---- quantize: K-quants with a per-sub-block scale search -------------------------------------
// Least-squares fit of x ~ scale * q + offset with q in 0..nmax and offset <= 0 (Q4_K keeps the
// minimum's magnitude, dmin * mn >= 0, and subtracts it). Tries 21 candidate step sizes around
// (max - min) / nmax and keeps the one whose refitted (scale, offset) has the least weighted
// squared error. Returns scale (>= 0) and writes -offset to *neg_offset.
float FitScaleOffset(const float* x, const float* w, int n, int nmax, float* neg_offset) {
  float lo = x[0], hi = x[0];
  for (int j = 1; j < n; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  lo = std::min(lo, 0.0f);  // the offset may only lower values
  if (hi <= lo) {           // constant non-positive block: the offset alone represents it
    *neg_offset = -lo;
    return 0.0f;
  }
  float sum_w = 0.0f, sum_x = 0.0f;
  for (int j = 0; j < n; ++j) {
    sum_w += w[j];
    sum_x += w[j] * x[j];
  }
  auto error_of = [&](float scale, float offset) {
    double err = 0.0;
    for (int j = 0; j < n; ++j) {
      const int q = std::clamp(RoundToInt((x[j] - offset) / (scale > 0 ? scale : 1.0f)), 0, nmax);
      const double diff = scale * q + offset - x[j];
      err += w[j] * diff * diff;
    }
    return err;
  };
  float best_scale = (hi - lo) / nmax, best_offset = lo;
  double best_err = error_of(best_scale, best_offset);
  for (int step = 0; step <= 20; ++step) {
    const float iscale = (nmax - 1.0f + 0.1f * step) / (hi - lo);
    float s_l = 0.0f, s_l2 = 0.0f, s_xl = 0.0f;
    for (int j = 0; j < n; ++j) {
      const int q = std::clamp(RoundToInt(iscale * (x[j] - lo)), 0, nmax);
      s_l += w[j] * q;
      s_l2 += w[j] * q * q;
      s_xl += w[j] * q * x[j];
    }
    const float det = sum_w * s_l2 - s_l * s_l;
    if (!(det > 0.0f)) continue;
    float scale = (sum_w * s_xl - sum_x * s_l) / det;
    float offset = (s_l2 * sum_x - s_l * s_xl) / det;
    if (offset > 0.0f) {  // not allowed: refit the scale alone with no offset
      offset = 0.0f;
      scale = s_l2 > 0.0f ? s_xl / s_l2 : 0.0f;
    }
    if (!(scale > 0.0f)) continue;
    const double err = error_of(scale, offset);
    if (err < best_err) {
      best_err = err;
      best_scale = scale;
      best_offset = offset;
    }
  }
  *neg_offset = -best_offset;
  return best_scale;
}

// Symmetric fit x ~ scale * q with q in -nmax..nmax-1 and the weights w: tries 19 candidate
// step sizes around max / nmax (the signed value of largest magnitude maps to -nmax, which uses
// the one extra negative level) and keeps the least-squares scale of least error. May be negative.
float FitScaleSymmetric(const float* x, const float* w, int n, int nmax) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  if (amax == 0.0f) return 0.0f;
  float best_scale = max / -nmax;
  double best_err = -1.0;
  for (int step = -9; step <= 9; ++step) {
    const float iscale = -(nmax + 0.1f * step) / max;
    double s_xl = 0.0, s_l2 = 0.0;
    for (int j = 0; j < n; ++j) {
      const int q = std::clamp(RoundToInt(iscale * x[j]), -nmax, nmax - 1);
      s_xl += w[j] * x[j] * q;
      s_l2 += w[j] * q * q;
    }
    if (!(s_l2 > 0.0)) continue;
    const float scale = static_cast<float>(s_xl / s_l2);
    double err = 0.0;
    for (int j = 0; j < n; ++j) {
      const int q = scale != 0.0f ? std::clamp(RoundToInt(x[j] / scale), -nmax, nmax - 1) : 0;
      const double diff = static_cast<double>(scale) * q - x[j];
      err += w[j] * diff * diff;
    }
    if (best_err < 0.0 || err < best_err) {
      best_err = err;
      best_scale = scale;
    }
  }
  return best_scale;
}

// The super-block part of Q4_K and Q5_K (B): fits each 32-element sub-block of x to levels
// 0..nmax, stores the 6-bit scales and minimums and the f16 d and dmin in `head`, and writes each
// element's level, fitted against the stored (rounded) scales, to q.
template <class B>
absl::Status QuantScaledMinSuperBlock(const float* x, int nmax, int64_t first_elem, B* head,
                                      uint8_t q[kSuperBlockElems]) {
  float scales[8], offsets[8], w[32];
  for (int s = 0; s < 8; ++s) {
    const float* xs = x + 32 * s;
    // Weigh each element by its magnitude plus the sub-block's RMS: large weights matter most,
    // but small ones are not ignored.
    float sum_x2 = 0.0f;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float rms = std::sqrt(sum_x2 / 32.0f);
    for (int l = 0; l < 32; ++l) w[l] = rms + std::fabs(xs[l]);
    scales[s] = FitScaleOffset(xs, w, 32, nmax, &offsets[s]);
  }
  float max_scale = 0.0f, max_offset = 0.0f;
  for (int s = 0; s < 8; ++s) {
    max_scale = std::max(max_scale, scales[s]);
    max_offset = std::max(max_offset, offsets[s]);
  }
  MODSERVE_RETURN_IF_ERROR(ScaleFits(max_scale / 63.0f, first_elem));
  MODSERVE_RETURN_IF_ERROR(ScaleFits(max_offset / 63.0f, first_elem));
  const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
  const float inv_offset = max_offset > 0.0f ? 63.0f / max_offset : 0.0f;
  uint8_t sc[8], mn[8];
  for (int s = 0; s < 8; ++s) {
    sc[s] = static_cast<uint8_t>(std::min(63, RoundToInt(inv_scale * scales[s])));
    mn[s] = static_cast<uint8_t>(std::min(63, RoundToInt(inv_offset * offsets[s])));
  }
  std::memset(head->scales, 0, sizeof(head->scales));
  for (int s = 0; s < 4; ++s) {
    head->scales[s] = static_cast<uint8_t>(sc[s] | ((sc[s + 4] >> 4) << 6));
    head->scales[s + 4] = static_cast<uint8_t>(mn[s] | ((mn[s + 4] >> 4) << 6));
    head->scales[s + 8] = static_cast<uint8_t>((sc[s + 4] & 0x0f) | ((mn[s + 4] & 0x0f) << 4));
  }
  head->d = F32ToF16(max_scale / 63.0f);
  head->dmin = F32ToF16(max_offset / 63.0f);
  // Requantize against the stored (rounded) scales, so q is the best choice for what the
  // dequantizer will actually compute.
  const float d = F16ToF32(head->d), dmin = F16ToF32(head->dmin);
  for (int s = 0; s < 8; ++s) {
    const float ds = d * sc[s], ms = dmin * mn[s];
    for (int l = 0; l < 32; ++l) {
      q[32 * s + l] =
          ds > 0.0f
              ? static_cast<uint8_t>(std::clamp(RoundToInt((x[32 * s + l] + ms) / ds), 0, nmax))
              : 0;
    }
  }
  return absl::OkStatus();
}

absl::Status QuantQ4_K(const float* x, int64_t num_blocks, BlockQ4_K* b) {
  for (int64_t i = 0; i < num_blocks; ++i, x += kSuperBlockElems) {
    uint8_t q[kSuperBlockElems];
    MODSERVE_RETURN_IF_ERROR(QuantScaledMinSuperBlock(x, 15, i * kSuperBlockElems, &b[i], q));
    for (int g = 0; g < 4; ++g) {
      for (int l = 0; l < 32; ++l) {
        b[i].qs[32 * g + l] = static_cast<uint8_t>(q[64 * g + l] | (q[64 * g + 32 + l] << 4));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status QuantQ5_K(const float* x, int64_t num_blocks, BlockQ5_K* b) {
  for (int64_t i = 0; i < num_blocks; ++i, x += kSuperBlockElems) {
    uint8_t q[kSuperBlockElems];
    MODSERVE_RETURN_IF_ERROR(QuantScaledMinSuperBlock(x, 31, i * kSuperBlockElems, &b[i], q));
    std::memset(b[i].qh, 0, sizeof(b[i].qh));
    for (int g = 0; g < 4; ++g) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t q0 = q[64 * g + l], q1 = q[64 * g + 32 + l];
        b[i].qs[32 * g + l] = static_cast<uint8_t>((q0 & 0x0f) | ((q1 & 0x0f) << 4));
        b[i].qh[l] |= static_cast<uint8_t>(((q0 >> 4) << (2 * g)) | ((q1 >> 4) << (2 * g + 1)));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status QuantQ6_K(const float* x, int64_t num_blocks, BlockQ6_K* b) {
  for (int64_t i = 0; i < num_blocks; ++i, x += kSuperBlockElems) {
    float scales[16], w[16];
    for (int s = 0; s < 16; ++s) {
      // Weigh by x^2: the error of the large elements dominates the dot products.
      for (int l = 0; l < 16; ++l) w[l] = x[16 * s + l] * x[16 * s + l];
      scales[s] = FitScaleSymmetric(x + 16 * s, w, 16, 32);
    }
    float amax = 0.0f, max = 0.0f;
    for (int s = 0; s < 16; ++s) {
      if (std::fabs(scales[s]) > amax) {
        amax = std::fabs(scales[s]);
        max = scales[s];
      }
    }
    std::memset(&b[i], 0, sizeof(b[i]));
    if (amax == 0.0f) {  // all zeros: q = 32 everywhere stands for 0
      for (int e = 0; e < kSuperBlockElems; ++e) {
        const int h = e / 128, r = (e % 128) / 32, l = e % 32;
        b[i].qh[32 * h + l] |= static_cast<uint8_t>(2 << (2 * r));
      }
      continue;
    }
    // The sub-block scale of largest magnitude maps to -128, the extra negative int8 level.
    const float iscale = -128.0f / max;
    MODSERVE_RETURN_IF_ERROR(ScaleFits(1.0f / iscale, i * kSuperBlockElems));
    for (int s = 0; s < 16; ++s) {
      b[i].scales[s] = static_cast<int8_t>(std::min(127, RoundToInt(iscale * scales[s])));
    }
    b[i].d = F32ToF16(1.0f / iscale);
    const float d = F16ToF32(b[i].d);
    for (int e = 0; e < kSuperBlockElems; ++e) {
      const float ds = d * static_cast<float>(b[i].scales[e / 16]);
      const int q = ds != 0.0f ? std::clamp(RoundToInt(x[e] / ds), -32, 31) + 32 : 32;
      const int h = e / 128, r = (e % 128) / 32, l = e % 32;
      uint8_t& lo_byte = b[i].ql[64 * h + 32 * (r & 1) + l];
      lo_byte |= static_cast<uint8_t>(r < 2 ? (q & 0x0f) : ((q & 0x0f) << 4));
      b[i].qh[32 * h + l] |= static_cast<uint8_t>((q >> 4) << (2 * r));
    }
  }
  return absl::OkStatus();
}

}  // namespace

void DequantizeRow(DType t, const void* src, int64_t num_elems, float* dst) {
  MODSERVE_CHECK(num_elems >= 0 && num_elems % DTypeBlockElems(t) == 0)
      << DTypeName(t) << " row of " << num_elems << " elements";
  const int64_t num_blocks = num_elems / DTypeBlockElems(t);
  switch (t) {
    case DType::kF32:
      if (num_elems > 0) std::memcpy(dst, src, num_elems * sizeof(float));
      return;
    case DType::kF16:
      for (int64_t i = 0; i < num_elems; ++i) dst[i] = F16ToF32(static_cast<const f16_t*>(src)[i]);
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < num_elems; ++i) {
        dst[i] = Bf16ToF32(static_cast<const bf16_t*>(src)[i]);
      }
      return;
    case DType::kQ8_0:
      return DequantQ8_0(static_cast<const BlockQ8_0*>(src), num_blocks, dst);
    case DType::kQ4_0:
      return DequantQ4Like<false, false>(static_cast<const BlockQ4_0*>(src), num_blocks, dst);
    case DType::kQ4_1:
      return DequantQ4Like<true, false>(static_cast<const BlockQ4_1*>(src), num_blocks, dst);
    case DType::kQ4_K:
      return DequantQ4_5K(static_cast<const BlockQ4_K*>(src), num_blocks, dst);
    case DType::kQ6_K:
      return DequantQ6_K(static_cast<const BlockQ6_K*>(src), num_blocks, dst);
    case DType::kQ5_K:
      return DequantQ4_5K(static_cast<const BlockQ5_K*>(src), num_blocks, dst);
    case DType::kQ5_0:
      return DequantQ4Like<false, true>(static_cast<const BlockQ5_0*>(src), num_blocks, dst);
    case DType::kQ5_1:
      return DequantQ4Like<true, true>(static_cast<const BlockQ5_1*>(src), num_blocks, dst);
    case DType::kI32:
      break;
  }
  MODSERVE_CHECK(false) << "DequantizeRow of " << DTypeName(t);
}

absl::Status QuantizeRow(DType t, const float* src, int64_t num_elems, void* dst) {
  if (t == DType::kI32) return absl::InvalidArgumentError("QuantizeRow: I32 is not a weight type");
  if (num_elems < 0 || num_elems % DTypeBlockElems(t) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("QuantizeRow: a ", std::string(DTypeName(t)),
                                                   " row needs a multiple of ", DTypeBlockElems(t),
                                                   " elements, got ", num_elems));
  }
  for (int64_t i = 0; i < num_elems; ++i) {
    if (!std::isfinite(src[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("QuantizeRow: element ", i, " is ", src[i], ", not a finite number"));
    }
  }
  const int64_t num_blocks = num_elems / DTypeBlockElems(t);
  switch (t) {
    case DType::kF32:
      if (num_elems > 0) std::memcpy(dst, src, num_elems * sizeof(float));
      return absl::OkStatus();
    case DType::kF16:
      for (int64_t i = 0; i < num_elems; ++i) {
        if (std::fabs(src[i]) > kF16Max) {
          return absl::OutOfRangeError(
              absl::StrCat("QuantizeRow: element ", i, " = ", src[i], " is beyond the F16 range"));
        }
        static_cast<f16_t*>(dst)[i] = F32ToF16(src[i]);
      }
      return absl::OkStatus();
    case DType::kBF16:
      for (int64_t i = 0; i < num_elems; ++i) static_cast<bf16_t*>(dst)[i] = F32ToBf16(src[i]);
      return absl::OkStatus();
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
      // One check up front keeps the simple quantizers free of early exits.
      for (int64_t b = 0; b < num_blocks; ++b) {
        const float* x = src + b * kBlockElems;
        float lo = x[0], hi = x[0];
        for (int j = 1; j < kBlockElems; ++j) {
          lo = std::min(lo, x[j]);
          hi = std::max(hi, x[j]);
        }
        const float amax = std::max(std::fabs(lo), std::fabs(hi));
        const float scale = t == DType::kQ8_0   ? amax / 127.0f
                            : t == DType::kQ4_0 ? amax / 8.0f
                            : t == DType::kQ5_0 ? amax / 16.0f
                            : t == DType::kQ4_1 ? std::max((hi - lo) / 15.0f, amax)
                                                : std::max((hi - lo) / 31.0f, amax);
        MODSERVE_RETURN_IF_ERROR(ScaleFits(scale, b * kBlockElems));
      }
      if (t == DType::kQ8_0) QuantQ8_0(src, num_blocks, static_cast<BlockQ8_0*>(dst));
      if (t == DType::kQ4_0)
        QuantQ4Like<false, false>(src, num_blocks, static_cast<BlockQ4_0*>(dst));
      if (t == DType::kQ4_1)
        QuantQ4Like<true, false>(src, num_blocks, static_cast<BlockQ4_1*>(dst));
      if (t == DType::kQ5_0)
        QuantQ4Like<false, true>(src, num_blocks, static_cast<BlockQ5_0*>(dst));
      if (t == DType::kQ5_1) QuantQ4Like<true, true>(src, num_blocks, static_cast<BlockQ5_1*>(dst));
      return absl::OkStatus();
    case DType::kQ4_K:
      return QuantQ4_K(src, num_blocks, static_cast<BlockQ4_K*>(dst));
    case DType::kQ6_K:
      return QuantQ6_K(src, num_blocks, static_cast<BlockQ6_K*>(dst));
    case DType::kQ5_K:
      return QuantQ5_K(src, num_blocks, static_cast<BlockQ5_K*>(dst));
    case DType::kI32:
      break;
  }
  return absl::InternalError("QuantizeRow: unhandled dtype");
}

}  // namespace modserve::quant
