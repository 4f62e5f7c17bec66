// Portable quantized-weight Gemm kernels: activations rounded to int8 per 32-element block, exact
// integer dot products per weight block, then the blocks' f32 scales; one element at a time.
// They define the arithmetic the SIMD versions (quant_kernels_avx2_impl.h) reproduce, up to the
// order of the f32 additions. No include guard and no includes: kernels_scalar.cc includes this
// inside its anonymous namespace (see simd_kernels_impl.h for why), after <cmath>, <type_traits>
// and quant.h.

namespace qscalar {

using quant::BlockQ4_0;
using quant::BlockQ4_1;
using quant::BlockQ4_K;
using quant::BlockQ5_K;
using quant::BlockQ6_K;
using quant::BlockQ8_0;

// Where element j (< 32) of block b of a row of nb blocks sits in the row's q array.
inline int64_t ActIndex(ActLayout layout, int64_t nb, int64_t b, int j) {
  if (layout == ActLayout::kNatural || (b % 2 == 0 && b + 1 == nb)) return 32 * b + j;
  const int64_t base = 32 * (b - b % 2);
  const int64_t half = b % 2 == 0 ? 0 : 16;  // the odd block's halves follow the even one's
  return base + half + (j < 16 ? j : 32 + (j - 16));
}

void QuantizeActs(const float* x, int64_t row_begin, int64_t row_end, const QuantizedActs& acts) {
  const int64_t k = acts.k, nb = k / 32;
  const ActLayout layout = acts.layout;
  for (int64_t i = row_begin; i < row_end; ++i) {
    const float* xi = x + i * k;
    int8_t* q = acts.q + i * k;
    for (int64_t b = 0; b < nb; ++b) {
      float amax = 0.0f;
      bool finite = true;
      for (int j = 0; j < 32; ++j) {
        amax = std::fmax(amax, std::fabs(xi[32 * b + j]));
        finite = finite && std::isfinite(xi[32 * b + j]);
      }
      if (!finite) {  // NaN scales carry the NaN or infinity into every output, as the reference
        for (int j = 0; j < 32; ++j) q[ActIndex(layout, nb, b, j)] = 0;
        acts.d[i * nb + b] = acts.ds[i * nb + b] = std::nanf("");
        acts.sum16[i * 2 * nb + 2 * b] = acts.sum16[i * 2 * nb + 2 * b + 1] = 0;
        continue;
      }
      // The SIMD versions compute the same f32 products and round them the same way (to
      // nearest even), so every ISA produces the same q and the same integer sums.
      const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
      int sums[2] = {0, 0};
      for (int j = 0; j < 32; ++j) {
        const int v = static_cast<int>(__builtin_nearbyintf(xi[32 * b + j] * id));
        q[ActIndex(layout, nb, b, j)] = static_cast<int8_t>(v);
        sums[j / 16] += v;
      }
      acts.d[i * nb + b] = amax / 127.0f;
      acts.sum16[i * 2 * nb + 2 * b] = static_cast<int16_t>(sums[0]);
      acts.sum16[i * 2 * nb + 2 * b + 1] = static_cast<int16_t>(sums[1]);
      acts.ds[i * nb + b] = acts.d[i * nb + b] * static_cast<float>(sums[0] + sums[1]);
    }
  }
}

// Dot of weight row `w` with activation row i, per type.
float DotQ8_0(const QuantizedActs& a, int64_t i, const void* w) {
  const int64_t nb = a.k / 32;
  const BlockQ8_0* blk = static_cast<const BlockQ8_0*>(w);
  const int8_t* q = a.q + i * a.k;
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    int32_t isum = 0;
    for (int j = 0; j < 32; ++j) isum += blk[b].qs[j] * q[32 * b + j];
    acc += F16ToF32(blk[b].d) * a.d[i * nb + b] * static_cast<float>(isum);
  }
  return acc;
}

// Q4_0 and Q4_1, and Q5_0 and Q5_1 (kQ5: the fifth bit of level j is bit j of qh): the levels
// stay unsigned (0..15 or 0..31) in the integer sum; Q4_0's -8, Q5_0's -16 and the minimum of
// Q4_1 and Q5_1 come back through the activation block sums: sum (q - 8) a = sum q a - 8 sum a.
template <bool kHasMin, bool kQ5 = false>
float DotQ4(const QuantizedActs& a, int64_t i, const void* w) {
  const int64_t nb = a.k / 32;
  const int8_t* q = a.q + i * a.k;
  const uint8_t* base = static_cast<const uint8_t*>(w);
  const size_t head_bytes = (kHasMin ? 4 : 2) + (kQ5 ? 4 : 0);
  const size_t block_bytes = head_bytes + 16;
  const float offset = kQ5 ? 16.0f : 8.0f;
  float acc = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = base + b * block_bytes;
    f16_t dh, mh{0};
    __builtin_memcpy(&dh, blk, 2);
    if (kHasMin) __builtin_memcpy(&mh, blk + 2, 2);
    uint32_t qh = 0;
    if (kQ5) __builtin_memcpy(&qh, blk + (kHasMin ? 4 : 2), 4);
    const uint8_t* qs = blk + head_bytes;
    int32_t isum = 0;
    for (int j = 0; j < 16; ++j) {
      const int lo = (qs[j] & 15) | static_cast<int>(((qh >> j) & 1) << 4);
      const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
      isum += lo * q[ActIndex(a.layout, nb, b, j)];
      isum += hi * q[ActIndex(a.layout, nb, b, 16 + j)];
    }
    const float dw = F16ToF32(dh), da = a.d[i * nb + b], ds = a.ds[i * nb + b];
    if (kHasMin) {
      acc += dw * da * static_cast<float>(isum) + F16ToF32(mh) * ds;
    } else {
      acc += dw * (da * static_cast<float>(isum) - offset * ds);
    }
  }
  return acc;
}

// Q4_K, and Q5_K (kQ5: the same sums with the fifth bit of each level from qh).
template <bool kQ5>
float DotQ4_5K(const QuantizedActs& a, int64_t i, const void* w) {
  using Block = std::conditional_t<kQ5, BlockQ5_K, BlockQ4_K>;
  const int64_t nsb = a.k / 256, nb = a.k / 32;
  const Block* blk = static_cast<const Block*>(w);
  const int8_t* q = a.q + i * a.k;
  float acc = 0.0f;
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const float d = F16ToF32(blk[sb].d), dmin = F16ToF32(blk[sb].dmin);
    for (int s = 0; s < 8; ++s) {
      uint8_t sc, mn;
      quant::Q4KScaleMin(blk[sb].scales, s, &sc, &mn);
      int32_t isum = 0;
      for (int l = 0; l < 32; ++l) {
        const uint8_t byte = blk[sb].qs[32 * (s / 2) + l];
        int level = s % 2 == 0 ? byte & 15 : byte >> 4;
        if constexpr (kQ5) level |= ((blk[sb].qh[l] >> s) & 1) << 4;
        isum += level * q[256 * sb + 32 * s + l];
      }
      const int64_t b = 8 * sb + s;
      acc += d * static_cast<float>(sc) * a.d[i * nb + b] * static_cast<float>(isum) -
             dmin * static_cast<float>(mn) * a.ds[i * nb + b];
    }
  }
  return acc;
}

// Q6_K: 6-bit levels stay unsigned (0..63) in the sums; the -32 comes back through the 16-element
// activation sums, weighted by the same sub-block scales.
float DotQ6_K(const QuantizedActs& a, int64_t i, const void* w) {
  const int64_t nsb = a.k / 256, nb = a.k / 32;
  const BlockQ6_K* blk = static_cast<const BlockQ6_K*>(w);
  const int8_t* q = a.q + i * a.k;
  const int16_t* sum16 = a.sum16 + i * 2 * nb;
  float acc = 0.0f;
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const float d = F16ToF32(blk[sb].d);
    for (int c = 0; c < 8; ++c) {  // 32-element chunk c: sub-blocks 2c and 2c + 1
      int32_t isum = 0;
      for (int half = 0; half < 2; ++half) {
        const int s = 2 * c + half;
        int32_t part = 0;
        for (int l16 = 0; l16 < 16; ++l16) {
          const int e = 32 * c + 16 * half + l16;
          const int h = e / 128, r = (e % 128) / 32, l = e % 32;
          const uint8_t lo_byte = blk[sb].ql[64 * h + 32 * (r & 1) + l];
          const int lo = r < 2 ? (lo_byte & 15) : (lo_byte >> 4);
          const int hi = (blk[sb].qh[32 * h + l] >> (2 * r)) & 3;
          part += (lo | (hi << 4)) * q[256 * sb + e];
        }
        isum += blk[sb].scales[s] * (part - 32 * sum16[16 * sb + s]);
      }
      acc += d * a.d[i * nb + 8 * sb + c] * static_cast<float>(isum);
    }
  }
  return acc;
}

template <float (*Dot)(const QuantizedActs&, int64_t, const void*), size_t kRowBytesPer256>
void Gemm(const QuantizedActs& a, int64_t x_begin, int64_t x_end, const void* w, const float* bias,
          float* out, int64_t ldo, int64_t row_begin, int64_t row_end) {
  const size_t row_bytes = static_cast<size_t>(a.k / 256) * kRowBytesPer256 +
                           static_cast<size_t>(a.k % 256 / 32) * (kRowBytesPer256 / 8);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const void* wr = static_cast<const uint8_t*>(w) + r * row_bytes;
    for (int64_t i = x_begin; i < x_end; ++i) {
      out[i * ldo + r] = Dot(a, i, wr) + (bias != nullptr ? bias[r] : 0.0f);
    }
  }
}

}  // namespace qscalar

// Adds the portable quantized kernels to a kernel table.
constexpr KernelTable WithQuantKernels(KernelTable t) {
  t.quantize_acts = &qscalar::QuantizeActs;
  t.gemm_q8_0 = &qscalar::Gemm<&qscalar::DotQ8_0, 8 * sizeof(quant::BlockQ8_0)>;
  t.gemm_q4_0 = &qscalar::Gemm<&qscalar::DotQ4<false>, 8 * sizeof(quant::BlockQ4_0)>;
  t.gemm_q4_1 = &qscalar::Gemm<&qscalar::DotQ4<true>, 8 * sizeof(quant::BlockQ4_1)>;
  t.gemm_q4_k = &qscalar::Gemm<&qscalar::DotQ4_5K<false>, sizeof(quant::BlockQ4_K)>;
  t.gemm_q6_k = &qscalar::Gemm<&qscalar::DotQ6_K, sizeof(quant::BlockQ6_K)>;
  t.gemm_q5_k = &qscalar::Gemm<&qscalar::DotQ4_5K<true>, sizeof(quant::BlockQ5_K)>;
  t.gemm_q5_0 = &qscalar::Gemm<&qscalar::DotQ4<false, true>, 8 * sizeof(quant::BlockQ5_0)>;
  t.gemm_q5_1 = &qscalar::Gemm<&qscalar::DotQ4<true, true>, 8 * sizeof(quant::BlockQ5_1)>;
  return t;
}
