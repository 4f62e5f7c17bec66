// AVX2 quantized-weight Gemm kernels: activations rounded to int8 per 32-element block once per
// call, then integer dot products per weight block (vpmaddubsw: unsigned weight levels times
// signed activations, pairs summed to i16; vpmaddwd: to i32) and the blocks' f32 scales applied
// eight blocks at a time. Same arithmetic as quant_kernels_scalar_impl.h up to the order of the
// f32 additions. No include guard and no includes: kernels_avx2.cc and kernels_avx512.cc include
// this inside their anonymous namespace after <immintrin.h> and quant.h (see
// simd_kernels_impl.h); it calls only intrinsics and builtins.
//
// Why eight blocks at a time: a block's integer dot ends as 8 i32 lanes that need one f32 scale
// (weight scale times activation scale). Scaling each block on its own costs a conversion, a
// broadcast and an FMA per 32 weights; instead the 8 lane vectors of 8 blocks are reduced into one
// vector whose lane j is block j (three or four vphaddd levels), then one conversion and one FMA
// scale all 8 with a vector of their scales. On AVX2 the weight bytes arrive faster than a
// per-block epilogue could retire (decode is bound by reading w only if the instructions per
// block stay few).

namespace qavx2 {

using quant::BlockQ4_0;
using quant::BlockQ4_1;
using quant::BlockQ4_K;
using quant::BlockQ6_K;
using quant::BlockQ8_0;

inline int64_t QMin(int64_t a, int64_t b) { return a < b ? a : b; }

inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  __builtin_memcpy(&v, p, 2);
  return v;
}
inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}
inline float HalfToFloat(uint16_t bits) { return _cvtsh_ss(bits); }

// The f16 at p + j * stride for j < count as 8 f32 lanes (0 beyond count). Assembled in
// general-purpose registers: the vector ports are the scarce ones here.
inline __m256 GatherHalves(const uint8_t* p, int64_t stride, int count) {
  uint64_t lo = 0, hi = 0;
  for (int j = 0; j < count && j < 4; ++j)
    lo |= static_cast<uint64_t>(LoadU16(p + j * stride)) << (16 * j);
  for (int j = 4; j < count; ++j)
    hi |= static_cast<uint64_t>(LoadU16(p + j * stride)) << (16 * (j - 4));
  return _mm256_cvtph_ps(_mm_set_epi64x(static_cast<long long>(hi), static_cast<long long>(lo)));
}

// Lane j of the result = the sum of the 8 i32 lanes of v[j].
inline __m256i SumLanes8(__m256i v0, __m256i v1, __m256i v2, __m256i v3, __m256i v4, __m256i v5,
                         __m256i v6, __m256i v7) {
  // Per 128-bit half: [v0 v0 v1 v1], then [v0 v1 v2 v3] of that half's lanes.
  const __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(v0, v1), _mm256_hadd_epi32(v2, v3));
  const __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(v4, v5), _mm256_hadd_epi32(v6, v7));
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x20),
                          _mm256_permute2x128_si256(h0123, h4567, 0x31));
}

inline float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline int32_t HorizontalSumI32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// ---- activations -----------------------------------------------------------------------------
// A block with a NaN or infinity: q = 0 (any order), sums 0, scales NaN. Same on every ISA.
void NonFiniteBlock(int64_t i, int64_t b, int64_t nb, ActLayout layout, const QuantizedActs& acts) {
  int8_t* q = acts.q + i * acts.k;
  if (layout == ActLayout::kNatural || (b % 2 == 0 && b + 1 == nb)) {
    __builtin_memset(q + 32 * b, 0, 32);
  } else {
    int8_t* base = q + 32 * (b - b % 2) + (b % 2 == 0 ? 0 : 16);
    __builtin_memset(base, 0, 16);
    __builtin_memset(base + 32, 0, 16);
  }
  acts.d[i * nb + b] = __builtin_nanf("");
  acts.ds[i * nb + b] = __builtin_nanf("");
  acts.sum16[i * 2 * nb + 2 * b] = 0;
  acts.sum16[i * 2 * nb + 2 * b + 1] = 0;
}

void QuantizeActs(const float* x, int64_t row_begin, int64_t row_end, ActLayout layout,
                  const QuantizedActs& acts) {
  const int64_t k = acts.k, nb = k / 32;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t i = row_begin; i < row_end; ++i) {
    const float* xi = x + i * k;
    int8_t* q = acts.q + i * k;
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = xi + 32 * b;
      const __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8);
      const __m256 x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
      __m256 m =
          _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(x0, abs_mask), _mm256_and_ps(x1, abs_mask)),
                        _mm256_max_ps(_mm256_and_ps(x2, abs_mask), _mm256_and_ps(x3, abs_mask)));
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
      const float amax = _mm_cvtss_f32(m4);
      // A NaN or infinity anywhere makes the sum NaN (inf - inf included): the block then
      // carries NaN scales, so the outputs it touches are NaN, as in the reference.
      const __m256 sum = _mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3));
      const __m256 nan_test = _mm256_mul_ps(sum, _mm256_setzero_ps());
      if (_mm256_movemask_ps(_mm256_cmp_ps(nan_test, nan_test, _CMP_UNORD_Q)) != 0) {
        NonFiniteBlock(i, b, nb, layout, acts);
        continue;
      }
      const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
      const __m256 vid = _mm256_set1_ps(id);
      // cvtps rounds to nearest even (the default MXCSR mode), as the scalar nearbyint does.
      const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(x0, vid));
      const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(x1, vid));
      const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(x2, vid));
      const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(x3, vid));
      const int32_t s0 = HorizontalSumI32(_mm256_add_epi32(i0, i1));
      const int32_t s1 = HorizontalSumI32(_mm256_add_epi32(i2, i3));
      // Packing works within 128-bit halves; the final permute restores element order.
      const __m256i packed = _mm256_permutevar8x32_epi32(
          _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3)), order);
      if (layout == ActLayout::kNatural || (b % 2 == 0 && b + 1 == nb)) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * b), packed);
      } else {
        // Pair layout (kernels.h): this block's halves go to base + half and base + 32 + half.
        int8_t* base = q + 32 * (b - b % 2) + (b % 2 == 0 ? 0 : 16);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(base), _mm256_castsi256_si128(packed));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(base + 32),
                         _mm256_extracti128_si256(packed, 1));
      }
      const float d = amax / 127.0f;
      acts.d[i * nb + b] = d;
      acts.sum16[i * 2 * nb + 2 * b] = static_cast<int16_t>(s0);
      acts.sum16[i * 2 * nb + 2 * b + 1] = static_cast<int16_t>(s1);
      acts.ds[i * nb + b] = d * static_cast<float>(s0 + s1);
    }
  }
}

// ---- Q8_0 ------------------------------------------------------------------------------------
// Signed weights times signed activations: vpmaddubsw needs one unsigned operand, so it gets
// |w| and the activation takes w's sign (|w| <= 128 and |a| <= 127 keep pair sums below 2^15).
inline __m256i DotQ8Block(const int8_t* w, const int8_t* a) {
  const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(av, wv));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

float DotQ8_0(const QuantizedActs& a, int64_t i, const uint8_t* wrow) {
  const int64_t nb = a.k / 32;
  const BlockQ8_0* w = reinterpret_cast<const BlockQ8_0*>(wrow);
  const int8_t* q = a.q + i * a.k;
  const float* da = a.d + i * nb;
  __m256 acc = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    const __m256i s = SumLanes8(
        DotQ8Block(w[b].qs, q + 32 * b), DotQ8Block(w[b + 1].qs, q + 32 * b + 32),
        DotQ8Block(w[b + 2].qs, q + 32 * b + 64), DotQ8Block(w[b + 3].qs, q + 32 * b + 96),
        DotQ8Block(w[b + 4].qs, q + 32 * b + 128), DotQ8Block(w[b + 5].qs, q + 32 * b + 160),
        DotQ8Block(w[b + 6].qs, q + 32 * b + 192), DotQ8Block(w[b + 7].qs, q + 32 * b + 224));
    const __m256 scale =
        _mm256_mul_ps(GatherHalves(reinterpret_cast<const uint8_t*>(&w[b].d), sizeof(BlockQ8_0), 8),
                      _mm256_loadu_ps(da + b));
    acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(s), acc);
  }
  float sum = HorizontalSum(acc);
  for (; b < nb; ++b) {  // at most 7 blocks when k is not a multiple of 256
    sum += HalfToFloat(w[b].d.bits) * da[b] *
           static_cast<float>(HorizontalSumI32(DotQ8Block(w[b].qs, q + 32 * b)));
  }
  return sum;
}

// ---- Q4_0 / Q4_1 -----------------------------------------------------------------------------
// Two blocks side by side: [qs(b) | qs(b+1)] gives the low nibbles (first halves of both blocks)
// and the high nibbles (second halves); the pair-interleaved activations match them byte for
// byte. Unsigned levels 0..15 times |a| <= 127: each i16 lane of the two products' sum stays below
// 2 * 2 * 15 * 127 < 2^15. Result: i32 lanes 0..3 hold block b's partial sums, 4..7 block b+1's.
template <size_t kBlockBytes, size_t kQsOffset>
inline __m256i DotQ4Pair(const uint8_t* blk, const int8_t* a) {
  const __m256i raw = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQsOffset))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kBlockBytes + kQsOffset)), 1);
  const __m256i m4 = _mm256_set1_epi8(15);
  const __m256i lo = _mm256_and_si256(raw, m4);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
  const __m256i p = _mm256_add_epi16(
      _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
      _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32))));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

// A lone last block (odd block count) with natural-order activations: its i32 sum.
template <size_t kQsOffset>
inline int32_t DotQ4Single(const uint8_t* blk, const int8_t* a) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQsOffset));
  const __m256i m4 = _mm256_set1_epi8(15);
  const __m256i w = _mm256_and_si256(
      _mm256_inserti128_si256(_mm256_castsi128_si256(raw), _mm_srli_epi16(raw, 4), 1), m4);
  const __m256i p =
      _mm256_maddubs_epi16(w, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
  return HorizontalSumI32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

template <bool kHasMin>
float DotQ4(const QuantizedActs& a, int64_t i, const uint8_t* wrow) {
  constexpr size_t kBytes = kHasMin ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0);
  constexpr size_t kQs = kHasMin ? 4 : 2;
  const int64_t nb = a.k / 32;
  const int8_t* q = a.q + i * a.k;
  const float* da = a.d + i * nb;
  const float* ds = a.ds + i * nb;
  // Three vphaddd levels over 4 pair vectors leave lane order [0 2 4 6 1 3 5 7].
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  __m256 acc = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= nb; b += 8) {
    const uint8_t* blk = wrow + b * kBytes;
    const int8_t* qa = q + 32 * b;
    const __m256i h =
        _mm256_hadd_epi32(_mm256_hadd_epi32(DotQ4Pair<kBytes, kQs>(blk, qa),
                                            DotQ4Pair<kBytes, kQs>(blk + 2 * kBytes, qa + 64)),
                          _mm256_hadd_epi32(DotQ4Pair<kBytes, kQs>(blk + 4 * kBytes, qa + 128),
                                            DotQ4Pair<kBytes, kQs>(blk + 6 * kBytes, qa + 192)));
    const __m256 s = _mm256_cvtepi32_ps(_mm256_permutevar8x32_epi32(h, order));
    const __m256 dw = GatherHalves(blk, kBytes, 8);
    const __m256 va = _mm256_loadu_ps(da + b), vs = _mm256_loadu_ps(ds + b);
    if constexpr (kHasMin) {
      acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, va), s, acc);
      acc = _mm256_fmadd_ps(GatherHalves(blk + 2, kBytes, 8), vs, acc);
    } else {
      acc =
          _mm256_fmadd_ps(dw, _mm256_fmsub_ps(va, s, _mm256_mul_ps(_mm256_set1_ps(8.0f), vs)), acc);
    }
  }
  float sum = HorizontalSum(acc);
  // Up to 7 remaining blocks: pairs, then perhaps a lone one.
  for (; b < nb; b += 2) {
    const uint8_t* blk = wrow + b * kBytes;
    int32_t isum[2];
    int count = 2;
    if (b + 1 < nb) {
      const __m256i p = DotQ4Pair<kBytes, kQs>(blk, q + 32 * b);
      isum[0] = HorizontalSumI32(_mm256_blend_epi32(p, _mm256_setzero_si256(), 0xf0));
      isum[1] = HorizontalSumI32(_mm256_blend_epi32(p, _mm256_setzero_si256(), 0x0f));
    } else {
      isum[0] = DotQ4Single<kQs>(blk, q + 32 * b);
      count = 1;
    }
    for (int t = 0; t < count; ++t) {
      const uint8_t* bt = blk + t * kBytes;
      const float dw = HalfToFloat(LoadU16(bt));
      if constexpr (kHasMin) {
        sum +=
            dw * da[b + t] * static_cast<float>(isum[t]) + HalfToFloat(LoadU16(bt + 2)) * ds[b + t];
      } else {
        sum += dw * (da[b + t] * static_cast<float>(isum[t]) - 8.0f * ds[b + t]);
      }
    }
  }
  return sum;
}

// ---- Q4_K ------------------------------------------------------------------------------------
// The 8 six-bit scales and minimums of a block as 8 bytes each (GGML's packing, quant.h).
inline void UnpackQ4KScales(const uint8_t* scales, uint64_t* sc, uint64_t* mn) {
  const uint32_t u0 = LoadU32(scales), u1 = LoadU32(scales + 4), u2 = LoadU32(scales + 8);
  const uint32_t sc_lo = u0 & 0x3f3f3f3fu, mn_lo = u1 & 0x3f3f3f3fu;
  const uint32_t sc_hi = (u2 & 0x0f0f0f0fu) | (((u0 >> 6) & 0x03030303u) << 4);
  const uint32_t mn_hi = ((u2 >> 4) & 0x0f0f0f0fu) | (((u1 >> 6) & 0x03030303u) << 4);
  *sc = sc_lo | (static_cast<uint64_t>(sc_hi) << 32);
  *mn = mn_lo | (static_cast<uint64_t>(mn_hi) << 32);
}

inline __m256 BytesToFloats(uint64_t bytes) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(bytes))));
}

float DotQ4_K(const QuantizedActs& a, int64_t i, const uint8_t* wrow) {
  const int64_t nsb = a.k / 256, nb = a.k / 32;
  const BlockQ4_K* w = reinterpret_cast<const BlockQ4_K*>(wrow);
  const int8_t* q = a.q + i * a.k;
  const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const int8_t* qa = q + 256 * sb;
    __m256i v[8];
    for (int g = 0; g < 4; ++g) {
      // 32 bytes: sub-block 2g in the low nibbles, 2g + 1 in the high ones. 15 * 127 * 2 < 2^15.
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[sb].qs + 32 * g));
      const __m256i lo = _mm256_and_si256(raw, m4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      v[2 * g] = _mm256_madd_epi16(
          _mm256_maddubs_epi16(lo,
                               _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa + 64 * g))),
          ones);
      v[2 * g + 1] = _mm256_madd_epi16(
          _mm256_maddubs_epi16(
              hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa + 64 * g + 32))),
          ones);
    }
    const __m256 s = _mm256_cvtepi32_ps(SumLanes8(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]));
    uint64_t sc, mn;
    UnpackQ4KScales(w[sb].scales, &sc, &mn);
    const __m256 d = _mm256_set1_ps(HalfToFloat(w[sb].d.bits));
    const __m256 dmin = _mm256_set1_ps(HalfToFloat(w[sb].dmin.bits));
    const __m256 va = _mm256_loadu_ps(a.d + i * nb + 8 * sb);
    const __m256 vs = _mm256_loadu_ps(a.ds + i * nb + 8 * sb);
    acc = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_mul_ps(d, BytesToFloats(sc)), va), s, acc);
    acc = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, BytesToFloats(mn)), vs, acc);
  }
  return HorizontalSum(acc);
}

// ---- Q6_K ------------------------------------------------------------------------------------
// Levels stay unsigned (0..63; 63 * 127 * 2 < 2^15) and vpmaddwd multiplies the i16 pair sums by
// the sub-block scales directly, so each 32-element chunk ends as one scaled i32 sum; the -32
// comes back as 32 * sum over the chunk's two sub-blocks of scale * (activation sum of 16).
float DotQ6_K(const QuantizedActs& a, int64_t i, const uint8_t* wrow) {
  const int64_t nsb = a.k / 256, nb = a.k / 32;
  const BlockQ6_K* w = reinterpret_cast<const BlockQ6_K*>(wrow);
  const int8_t* q = a.q + i * a.k;
  const int16_t* sum16 = a.sum16 + i * 2 * nb;
  const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
  // Per chunk c (sub-blocks 2c, 2c + 1): byte shuffles that spread i16 scale 2c' over the low
  // 128-bit half and 2c' + 1 over the high half, c' = c % 4 within the 8 scales held per half.
  const __m256i spread[4] = {
      _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3,
                       2, 3, 2, 3, 2, 3),
      _mm256_setr_epi8(4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7,
                       6, 7, 6, 7, 6, 7),
      _mm256_setr_epi8(8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10,
                       11, 10, 11, 10, 11, 10, 11, 10, 11),
      _mm256_setr_epi8(12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 14, 15, 14,
                       15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15)};
  __m256 acc = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const BlockQ6_K& blk = w[sb];
    const int8_t* qa = q + 256 * sb;
    // Scales 0..15 as i16; sc_lo holds 0..7 in both halves, sc_hi 8..15.
    const __m256i sc16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.scales)));
    const __m256i sc_lo = _mm256_permute2x128_si256(sc16, sc16, 0x00);
    const __m256i sc_hi = _mm256_permute2x128_si256(sc16, sc16, 0x11);
    __m256i v[8];
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.ql + 64 * h));
      const __m256i ql1 =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.ql + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh + 32 * h));
      // Chunk r of this half: low 4 bits from ql0/ql1 (low nibbles for r < 2), high 2 bits from
      // bits 2r..2r+1 of qh, moved to bits 4..5.
      const __m256i q0 = _mm256_or_si256(_mm256_and_si256(ql0, m4),
                                         _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
      const __m256i q1 = _mm256_or_si256(_mm256_and_si256(ql1, m4),
                                         _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
      const __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                         _mm256_and_si256(qh, m30));
      const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                                         _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
      const __m256i scales = h == 0 ? sc_lo : sc_hi;
      const __m256i qs[4] = {q0, q1, q2, q3};
      for (int r = 0; r < 4; ++r) {
        const __m256i p = _mm256_maddubs_epi16(
            qs[r], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa + 128 * h + 32 * r)));
        v[4 * h + r] = _mm256_madd_epi16(p, _mm256_shuffle_epi8(scales, spread[r]));
      }
    }
    // Lane c: sum over the chunk's two sub-blocks of scale * activation sum of 16.
    const __m256i corr = _mm256_madd_epi16(
        sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sum16 + 16 * sb)));
    const __m256i isum = _mm256_sub_epi32(SumLanes8(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]),
                                          _mm256_slli_epi32(corr, 5));
    const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(HalfToFloat(blk.d.bits)),
                                       _mm256_loadu_ps(a.d + i * nb + 8 * sb));
    acc = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(isum), acc);
  }
  return HorizontalSum(acc);
}

// ---- the Gemm loops --------------------------------------------------------------------------
template <float (*Dot)(const QuantizedActs&, int64_t, const uint8_t*), size_t kBytesPer256>
void Gemm(const QuantizedActs& a, int64_t x_begin, int64_t x_end, const void* w, const float* bias,
          float* out, int64_t ldo, int64_t row_begin, int64_t row_end) {
  const size_t row_bytes = static_cast<size_t>(a.k / 256) * kBytesPer256 +
                           static_cast<size_t>(a.k % 256 / 32) * (kBytesPer256 / 8);
  const uint8_t* wp = static_cast<const uint8_t*>(w);
  // Weight rows outer: each is read from memory once and stays in L1 for every x row.
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* wr = wp + r * row_bytes;
    const float b = bias != nullptr ? bias[r] : 0.0f;
    for (int64_t i = x_begin; i < x_end; ++i) out[i * ldo + r] = Dot(a, i, wr) + b;
  }
}

}  // namespace qavx2

// Adds the AVX2 quantized kernels to a kernel table.
constexpr KernelTable WithQuantKernels(KernelTable t) {
  t.quantize_acts = &qavx2::QuantizeActs;
  t.gemm_q8_0 = &qavx2::Gemm<&qavx2::DotQ8_0, 8 * sizeof(quant::BlockQ8_0)>;
  t.gemm_q4_0 = &qavx2::Gemm<&qavx2::DotQ4<false>, 8 * sizeof(quant::BlockQ4_0)>;
  t.gemm_q4_1 = &qavx2::Gemm<&qavx2::DotQ4<true>, 8 * sizeof(quant::BlockQ4_1)>;
  t.gemm_q4_k = &qavx2::Gemm<&qavx2::DotQ4_K, sizeof(quant::BlockQ4_K)>;
  t.gemm_q6_k = &qavx2::Gemm<&qavx2::DotQ6_K, sizeof(quant::BlockQ6_K)>;
  return t;
}
