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
using quant::BlockQ5_K;
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

// The 8 f16 at p + j * stride (j < 8) as f32 lanes. Eight 32-bit loads (the 2 bytes after each
// f16 are part of the same block, so they are always readable) and an unpack tree: cheaper on
// Zen 3 than eight vpinsrw, which each take the vector load pipe for 3 cycles in its model.
template <int64_t kStride>
inline __m256 GatherHalves8(const uint8_t* p) {
  auto ld = [&](int j) { return _mm_cvtsi32_si128(static_cast<int>(LoadU32(p + j * kStride))); };
  const __m128i a = _mm_unpacklo_epi16(ld(0), ld(1)), b = _mm_unpacklo_epi16(ld(2), ld(3));
  const __m128i c = _mm_unpacklo_epi16(ld(4), ld(5)), d = _mm_unpacklo_epi16(ld(6), ld(7));
  return _mm256_cvtph_ps(_mm_unpacklo_epi64(_mm_unpacklo_epi32(a, b), _mm_unpacklo_epi32(c, d)));
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

void QuantizeActs(const float* x, int64_t row_begin, int64_t row_end, const QuantizedActs& acts) {
  const int64_t k = acts.k, nb = k / 32;
  const ActLayout layout = acts.layout;
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

// ---- per-type pieces ---------------------------------------------------------------------------
// Each weight type T provides, for one 256-element chunk of a weight row (8 blocks of 32, or one
// K-quant super-block): Pair, the unpacked weights of elements [64p, 64p + 64) (p < 4), loaded
// once and used for every x row; PairDot, that pair against one x row's 64 activations, as i32
// lanes; Finish, which reduces hadd(P0, P1) and hadd(P2, P3) to one vector whose lane j is
// 32-element block j of the chunk; Scales, the chunk's f32 scales (shared by the x rows); and
// Apply, which scales a row's 8 block sums into its f32 accumulator. The 32-element types also
// have Tail for the at most 7 blocks past the last whole chunk, which adds them one after another
// with Apply's operations (explicit fmaf: the prefill panels repeat them lane by lane).

inline __m256i Ones16() { return _mm256_set1_epi16(1); }

// vphaddd(a, b) for vectors whose lanes all fit in i16 (|lane| < 2^15): vpackssdw, then vpmaddwd
// by ones. Same result at about half the cost on Zen 3, where vphaddd is 3-4 uops.
inline __m256i HaddSmall(__m256i a, __m256i b) {
  return _mm256_madd_epi16(_mm256_packs_epi32(a, b), Ones16());
}
inline __m256i LoadI(const void* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// hadd(P0, P1), hadd(P2, P3) of vectors that each hold two blocks' i32 partials (one block per
// 64-bit pair of lanes in each 128-bit half, as vphaddd of two blocks' madd results leaves them)
// -> lane j = block j.
inline __m256i FinishByHalves(__m256i s0, __m256i s1) {
  return _mm256_add_epi32(_mm256_permute2x128_si256(s0, s1, 0x20),
                          _mm256_permute2x128_si256(s0, s1, 0x31));
}

// Q8_0: vpmaddubsw needs one unsigned operand, so it gets |w| and the activation takes w's sign
// (|w| <= 128 and |a| <= 127 keep each pair sum below 2^15).
struct Q8_0K {
  static constexpr int64_t kBlockBytes = sizeof(BlockQ8_0);
  static constexpr int64_t kChunkBytes = 8 * kBlockBytes;
  struct Pair {
    __m256i w0, w1, abs0, abs1;
  };
  static Pair LoadPair(const uint8_t* chunk, int p) {
    const __m256i w0 = LoadI(chunk + 2 * p * kBlockBytes + 2);
    const __m256i w1 = LoadI(chunk + (2 * p + 1) * kBlockBytes + 2);
    return {w0, w1, _mm256_sign_epi8(w0, w0), _mm256_sign_epi8(w1, w1)};
  }
  static __m256i PairDot(const Pair& w, const int8_t* a) {
    const __m256i v0 =
        _mm256_madd_epi16(_mm256_maddubs_epi16(w.abs0, _mm256_sign_epi8(LoadI(a), w.w0)), Ones16());
    const __m256i v1 = _mm256_madd_epi16(
        _mm256_maddubs_epi16(w.abs1, _mm256_sign_epi8(LoadI(a + 32), w.w1)), Ones16());
    return _mm256_hadd_epi32(v0, v1);
  }
  static __m256i Merge(__m256i a, __m256i b) { return _mm256_hadd_epi32(a, b); }
  static __m256i Finish(__m256i s0, __m256i s1) { return FinishByHalves(s0, s1); }
  struct Scales {
    __m256 dw;
  };
  static Scales LoadScales(const uint8_t* chunk) { return {GatherHalves8<kBlockBytes>(chunk)}; }
  static __m256 Apply(const Scales& sc, __m256i isum, const float* da, const float* /*ds*/,
                      const int16_t* /*sum16*/, __m256 acc) {
    return _mm256_fmadd_ps(_mm256_mul_ps(sc.dw, _mm256_loadu_ps(da)), _mm256_cvtepi32_ps(isum),
                           acc);
  }
  static float Tail(const uint8_t* blocks, int64_t count, const int8_t* a, const float* da,
                    const float* /*ds*/) {
    float sum = 0.0f;
    for (int64_t b = 0; b < count; ++b) {
      const uint8_t* blk = blocks + b * kBlockBytes;
      const __m256i w = LoadI(blk + 2);
      const __m256i v = _mm256_madd_epi16(
          _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(LoadI(a + 32 * b), w)),
          Ones16());
      sum = __builtin_fmaf(HalfToFloat(LoadU16(blk)) * da[b],
                           static_cast<float>(HorizontalSumI32(v)), sum);
    }
    return sum;
  }
};

// The 32 bits of m as 32 bytes: byte i is 0x10 (a level's fifth bit) where bit i of m is set, else
// 0. With AVX512BW and VL (the AVX-512 and VNNI tables compile this file with them) m is a byte
// mask: one masked move. Otherwise each 128-bit half of the broadcast holds m's 4 bytes, so the
// shuffle gives byte i a copy of byte i / 8, and the compare keeps its bit i % 8. The same bytes
// either way.
inline __m256i FifthBits(uint32_t m) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  return _mm256_maskz_mov_epi8(static_cast<__mmask32>(m), _mm256_set1_epi8(0x10));
#else
  const __m256i bytes =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(m)),
                          _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                           2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit),
                          _mm256_set1_epi8(0x10));
#endif
}

// Q4_0 / Q4_1, and Q5_0 / Q5_1 (kQ5): two blocks side by side, [qs(b) | qs(b+1)], give the low
// nibbles (first halves of both blocks) and the high nibbles (second halves); the pair-interleaved
// activations match them byte for byte. kQ5 ORs in each level's fifth bit from the blocks' qh
// (bit j of block b's for its element j). Levels stay unsigned (0..15 or 0..31): the two
// products' i16 sum is below 2 * 2 * 31 * 127 < 2^15. PairDot's lanes 0..3 hold block 2p, lanes
// 4..7 block 2p + 1; three hadd levels leave lane order [0 2 4 6 1 3 5 7], which Finish undoes.
template <bool kHasMin, bool kQ5 = false>
struct Q4K32 {
  static constexpr int64_t kQh = kHasMin ? 4 : 2;  // Q5_0 / Q5_1: qh after d (and m)
  static constexpr int64_t kQs = kQh + (kQ5 ? 4 : 0);
  static constexpr int64_t kBlockBytes = kQs + 16;
  static constexpr int64_t kChunkBytes = 8 * kBlockBytes;
  // Q4_0's levels are q - 8, Q5_0's q - 16.
  static constexpr float kOffset = kQ5 ? 16.0f : 8.0f;
  static_assert(kBlockBytes ==
                (kQ5 ? (kHasMin ? sizeof(quant::BlockQ5_1) : sizeof(quant::BlockQ5_0))
                     : (kHasMin ? sizeof(BlockQ4_1) : sizeof(BlockQ4_0))));
  struct Pair {
    __m256i lo, hi;
  };
  static Pair LoadPair(const uint8_t* chunk, int p) {
    const uint8_t* blk = chunk + 2 * p * kBlockBytes;
    const __m256i raw = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQs))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kBlockBytes + kQs)), 1);
    const __m256i m4 = _mm256_set1_epi8(15);
    Pair w{_mm256_and_si256(raw, m4), _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4)};
    if constexpr (kQ5) {
      // The low nibbles are elements 0..15 of both blocks, the high ones 16..31.
      const uint32_t h0 = LoadU32(blk + kQh), h1 = LoadU32(blk + kBlockBytes + kQh);
      w.lo = _mm256_or_si256(w.lo, FifthBits((h0 & 0xffffu) | (h1 << 16)));
      w.hi = _mm256_or_si256(w.hi, FifthBits((h0 >> 16) | (h1 & 0xffff0000u)));
    }
    return w;
  }
  static __m256i PairDot(const Pair& w, const int8_t* a) {
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(w.lo, LoadI(a)),
                                              _mm256_maddubs_epi16(w.hi, LoadI(a + 32))),
                             Ones16());
  }
  // Pair sums < 2^15 (8 products of at most 31 * 127): HaddSmall's i16 packing fits. Merged pairs
  // are < 2^15 for 4-bit levels only; 5-bit ones take vphaddd.
  static __m256i Merge(__m256i a, __m256i b) { return HaddSmall(a, b); }
  static __m256i Finish(__m256i s0, __m256i s1) {
    const __m256i h = kQ5 ? _mm256_hadd_epi32(s0, s1) : HaddSmall(s0, s1);
    return _mm256_permutevar8x32_epi32(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  }
  struct Scales {
    __m256 dw, m;
  };
  static Scales LoadScales(const uint8_t* chunk) {
    return {GatherHalves8<kBlockBytes>(chunk),
            kHasMin ? GatherHalves8<kBlockBytes>(chunk + 2) : _mm256_setzero_ps()};
  }
  static __m256 Apply(const Scales& sc, __m256i isum, const float* da, const float* ds,
                      const int16_t* /*sum16*/, __m256 acc) {
    const __m256 s = _mm256_cvtepi32_ps(isum);
    if constexpr (kHasMin) {
      acc = _mm256_fmadd_ps(_mm256_mul_ps(sc.dw, _mm256_loadu_ps(da)), s, acc);
      return _mm256_fmadd_ps(sc.m, _mm256_loadu_ps(ds), acc);
    } else {
      // dw * (da * isum - 8 * ds): the -8 (or -16) of every level, through the activation sum.
      return _mm256_fmadd_ps(
          sc.dw,
          _mm256_fmsub_ps(_mm256_loadu_ps(da), s,
                          _mm256_mul_ps(_mm256_set1_ps(kOffset), _mm256_loadu_ps(ds))),
          acc);
    }
  }
  // sum plus one block, in Apply's operations (so a tail block adds as a lane of Apply would).
  static float Accumulate(float sum, const uint8_t* blk, int32_t isum, float da, float ds) {
    const float dw = HalfToFloat(LoadU16(blk)), s = static_cast<float>(isum);
    if constexpr (kHasMin) {
      return __builtin_fmaf(HalfToFloat(LoadU16(blk + 2)), ds, __builtin_fmaf(dw * da, s, sum));
    } else {
      return __builtin_fmaf(dw, __builtin_fmaf(da, s, -(kOffset * ds)), sum);
    }
  }
  // Pairs (interleaved activations), then perhaps a lone block (natural order).
  static float Tail(const uint8_t* blocks, int64_t count, const int8_t* a, const float* da,
                    const float* ds) {
    float sum = 0.0f;
    int64_t b = 0;
    for (; b + 2 <= count; b += 2) {
      const __m256i v = PairDot(LoadPair(blocks + b * kBlockBytes, 0), a + 32 * b);
      sum = Accumulate(sum, blocks + b * kBlockBytes,
                       HorizontalSumI32(_mm256_blend_epi32(v, _mm256_setzero_si256(), 0xf0)), da[b],
                       ds[b]);
      sum = Accumulate(sum, blocks + (b + 1) * kBlockBytes,
                       HorizontalSumI32(_mm256_blend_epi32(v, _mm256_setzero_si256(), 0x0f)),
                       da[b + 1], ds[b + 1]);
    }
    if (b < count) {
      const uint8_t* blk = blocks + b * kBlockBytes;
      __m256i w = LoneLevels(blk);
      const __m256i v = _mm256_madd_epi16(_mm256_maddubs_epi16(w, LoadI(a + 32 * b)), Ones16());
      sum = Accumulate(sum, blk, HorizontalSumI32(v), da[b], ds[b]);
    }
    return sum;
  }
  // One block's 32 levels in natural order.
  static __m256i LoneLevels(const uint8_t* blk) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQs));
    const __m256i w = _mm256_and_si256(
        _mm256_inserti128_si256(_mm256_castsi128_si256(raw), _mm_srli_epi16(raw, 4), 1),
        _mm256_set1_epi8(15));
    if constexpr (kQ5) return _mm256_or_si256(w, FifthBits(LoadU32(blk + kQh)));
    return w;
  }
};

// The 8 six-bit scales and minimums of a Q4_K block, one byte each (GGML's packing, quant.h).
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

// Q4_K: pair p is the 32 bytes qs[32p ..]: sub-block 2p in the low nibbles, 2p + 1 in the high
// ones (15 * 127 * 2 < 2^15). Its minimums come back through the activation block sums.
struct Q4_KK {
  static constexpr int64_t kChunkBytes = sizeof(BlockQ4_K);
  struct Pair {
    __m256i lo, hi;
  };
  static Pair LoadPair(const uint8_t* chunk, int p) {
    const __m256i raw = LoadI(chunk + offsetof(BlockQ4_K, qs) + 32 * p);
    const __m256i m4 = _mm256_set1_epi8(15);
    return {_mm256_and_si256(raw, m4), _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4)};
  }
  // Lanes hold 4 products (< 2^13), 8 after PairDot, 16 after Merge (< 2^15): HaddSmall fits.
  static __m256i PairDot(const Pair& w, const int8_t* a) {
    return HaddSmall(_mm256_madd_epi16(_mm256_maddubs_epi16(w.lo, LoadI(a)), Ones16()),
                     _mm256_madd_epi16(_mm256_maddubs_epi16(w.hi, LoadI(a + 32)), Ones16()));
  }
  static __m256i Merge(__m256i a, __m256i b) { return HaddSmall(a, b); }
  static __m256i Finish(__m256i s0, __m256i s1) { return FinishByHalves(s0, s1); }
  struct Scales {
    __m256 d_sc, dmin_mn;  // per sub-block: d * sc[s], dmin * mn[s]
  };
  static Scales LoadScales(const uint8_t* chunk) {
    const BlockQ4_K* blk = reinterpret_cast<const BlockQ4_K*>(chunk);
    uint64_t sc, mn;
    UnpackQ4KScales(blk->scales, &sc, &mn);
    return {_mm256_mul_ps(_mm256_set1_ps(HalfToFloat(blk->d.bits)), BytesToFloats(sc)),
            _mm256_mul_ps(_mm256_set1_ps(HalfToFloat(blk->dmin.bits)), BytesToFloats(mn))};
  }
  static __m256 Apply(const Scales& sc, __m256i isum, const float* da, const float* ds,
                      const int16_t* /*sum16*/, __m256 acc) {
    acc =
        _mm256_fmadd_ps(_mm256_mul_ps(sc.d_sc, _mm256_loadu_ps(da)), _mm256_cvtepi32_ps(isum), acc);
    return _mm256_fnmadd_ps(sc.dmin_mn, _mm256_loadu_ps(ds), acc);
  }
};

// Bit `s` (< 8) of each byte of qh moved to bit 4 (0x10), the fifth bit of a Q5_K level. The
// 16-bit shifts bring bit 4 of each byte from the same byte for every s: left by 4 - s or right by
// s - 4, at most 4 places. (Counts in a register: callers' s is a constant once their loops are
// unrolled, and the compiler then uses the immediate forms.)
inline __m256i Q5HighBits(__m256i qh, int s) {
  const __m256i v = s < 4 ? _mm256_sll_epi16(qh, _mm_cvtsi32_si128(4 - s))
                          : _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s - 4));
  return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

// Q5_K: Q4_K's pairs with the fifth bit of each level from qh, bit 2p for sub-block 2p and 2p + 1
// for 2p + 1. Levels 0..31: PairDot's lanes hold 8 products (< 2^15, so its HaddSmall fits), and
// Merge's HaddSmall packs those before it adds them in i32. d, dmin and the scales lie where
// Q4_K's do, so LoadScales and Apply are Q4_K's.
struct Q5_KK : Q4_KK {
  static constexpr int64_t kChunkBytes = sizeof(BlockQ5_K);
  static Pair LoadPair(const uint8_t* chunk, int p) {
    const __m256i raw = LoadI(chunk + offsetof(BlockQ5_K, qs) + 32 * p);
    const __m256i qh = LoadI(chunk + offsetof(BlockQ5_K, qh));
    const __m256i m4 = _mm256_set1_epi8(15);
    return {_mm256_or_si256(_mm256_and_si256(raw, m4), Q5HighBits(qh, 2 * p)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4),
                            Q5HighBits(qh, 2 * p + 1))};
  }
};

// Q6_K: pair p is 32-element chunks 2p, 2p + 1 = r, r + 1 of half h = p / 2 (quant.h's element
// numbering). Levels stay unsigned (0..63; 63 * 127 * 2 < 2^15) and vpmaddwd multiplies the i16
// pair sums by the 16-element sub-block scales directly, so each 32-element chunk ends as one
// scaled i32 sum; the -32 comes back as 32 * (scale * activation sum of 16) over its two
// sub-blocks.
struct Q6_KK {
  static constexpr int64_t kChunkBytes = sizeof(BlockQ6_K);
  struct Pair {
    __m256i q0, q1, s0, s1;
  };
  // Byte shuffles that spread i16 scale 2j over the low 128-bit half and 2j + 1 over the high
  // one, j < 4, within a vector holding 8 scales in each half.
  static __m256i Spread(int j) {
    const char b0 = static_cast<char>(4 * j), b1 = static_cast<char>(4 * j + 1);
    const char b2 = static_cast<char>(4 * j + 2), b3 = static_cast<char>(4 * j + 3);
    return _mm256_setr_epi8(b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b2, b3,
                            b2, b3, b2, b3, b2, b3, b2, b3, b2, b3, b2, b3, b2, b3);
  }
  static Pair LoadPair(const uint8_t* chunk, int p) {
    const BlockQ6_K* blk = reinterpret_cast<const BlockQ6_K*>(chunk);
    const int h = p / 2;
    const __m256i ql0 = LoadI(blk->ql + 64 * h), ql1 = LoadI(blk->ql + 64 * h + 32);
    const __m256i qh = LoadI(blk->qh + 32 * h);
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    // Scales 0..15 as i16, then the 8 of this half in both 128-bit halves.
    const __m256i sc16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->scales)));
    // The immediate must be a literal: some compilers do not fold a conditional into it.
    const __m256i sc = h == 0 ? _mm256_permute2x128_si256(sc16, sc16, 0x00)
                              : _mm256_permute2x128_si256(sc16, sc16, 0x11);
    if (p % 2 == 0) {  // r = 0, 1: low nibbles; qh bits 0..1 and 2..3 moved to bits 4..5
      return {_mm256_or_si256(_mm256_and_si256(ql0, m4),
                              _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)),
              _mm256_or_si256(_mm256_and_si256(ql1, m4),
                              _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)),
              _mm256_shuffle_epi8(sc, Spread(0)), _mm256_shuffle_epi8(sc, Spread(1))};
    }
    // r = 2, 3: high nibbles; qh bits 4..5 and 6..7.
    return {
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                        _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30)),
        _mm256_shuffle_epi8(sc, Spread(2)), _mm256_shuffle_epi8(sc, Spread(3))};
  }
  static __m256i PairDot(const Pair& w, const int8_t* a) {
    return _mm256_hadd_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(w.q0, LoadI(a)), w.s0),
                             _mm256_madd_epi16(_mm256_maddubs_epi16(w.q1, LoadI(a + 32)), w.s1));
  }
  static __m256i Merge(__m256i a, __m256i b) { return _mm256_hadd_epi32(a, b); }
  static __m256i Finish(__m256i s0, __m256i s1) { return FinishByHalves(s0, s1); }
  struct Scales {
    __m256 d;
    __m256i sc16;  // the 16 sub-block scales as i16
  };
  static Scales LoadScales(const uint8_t* chunk) {
    const BlockQ6_K* blk = reinterpret_cast<const BlockQ6_K*>(chunk);
    return {_mm256_set1_ps(HalfToFloat(blk->d.bits)),
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->scales)))};
  }
  static __m256 Apply(const Scales& sc, __m256i isum, const float* da, const float* /*ds*/,
                      const int16_t* sum16, __m256 acc) {
    // Lane c: sc[2c] * sum16[2c] + sc[2c + 1] * sum16[2c + 1] (|.| < 2^20; times 32 < 2^25).
    const __m256i corr = _mm256_madd_epi16(sc.sc16, LoadI(sum16));
    const __m256i total = _mm256_sub_epi32(isum, _mm256_slli_epi32(corr, 5));
    return _mm256_fmadd_ps(_mm256_mul_ps(sc.d, _mm256_loadu_ps(da)), _mm256_cvtepi32_ps(total),
                           acc);
  }
};

// x rows per RowDot call. Four rows keep 8 partial-sum and 4 accumulator registers live beside
// the unpacked pair.
inline constexpr int kRowsPerTile = 4;

// ---- prefill: packed 8-row panels ------------------------------------------------------------
// For many x rows the decode kernels' per-row reductions dominate. Prefill instead repacks 8
// weight rows at a time (a panel) so that 32-bit lane r of a vector holds 4 consecutive levels
// of weight row r: a vpmaddubsw against 4 activation bytes broadcast to every lane then yields
// partial dot products for all 8 rows at once, and a block's sum for the 8 rows ends in lane r
// with no horizontal reduction; scales and offsets are stored as 8-row vectors. The panel covers
// kPanelBlocks blocks of k at a time (k-chunks), so it stays in L1 while every x tile of the call
// streams past it; that reuse pays for the packing (a transpose per block of 8 rows).
//
// Same bits as the decode kernels, for every row: a block's integer sum is exact either way, and
// its f32 update is the one Apply makes in decode lane j = block % 8, made here in accumulator
// j of the row (lane r = weight row r); blocks past the last whole 256-element chunk go to a
// ninth accumulator as Tail adds them. At the end the eight are summed in HorizontalSum's tree,
// then the tail, then the bias, as decode does. So a row's output does not depend on how many
// rows share the call (CpuBackend::MaxRowInvariantRows).
inline constexpr int64_t kPanelRows = 8;
// 64 blocks = 2048 elements: 16 KiB of levels plus 8 KiB of scales, on the stack and in L1.
inline constexpr int64_t kPanelBlocks = 64;

struct Panel {
  // lv[b][j]: levels of elements 4j .. 4j + 3 of block b for the 8 rows, 4 bytes per row.
  alignas(32) uint8_t lv[kPanelBlocks][8][32];
  // Per block (and 16-element half, for Q6_K's integer sub-block scales), per row, as the
  // type's kKind uses them (BlockUpdate, Q6KBlockSum).
  alignas(32) float scale[kPanelBlocks][8];
  alignas(32) float offset[kPanelBlocks][8];
  alignas(32) int32_t iscale[kPanelBlocks][2][8];
};

// rows[r] (r < 8): 32 levels of row r; transposed in place so that rows[j] lane r = the old
// rows[r] dword j.
inline void Transpose8x8(__m256i rows[8]) {
  __m256i t[8], u[8];
  for (int r = 0; r < 8; r += 2) {
    t[r] = _mm256_unpacklo_epi32(rows[r], rows[r + 1]);
    t[r + 1] = _mm256_unpackhi_epi32(rows[r], rows[r + 1]);
  }
  for (int r = 0; r < 8; r += 4) {
    u[r] = _mm256_unpacklo_epi64(t[r], t[r + 2]);
    u[r + 1] = _mm256_unpackhi_epi64(t[r], t[r + 2]);
    u[r + 2] = _mm256_unpacklo_epi64(t[r + 1], t[r + 3]);
    u[r + 3] = _mm256_unpackhi_epi64(t[r + 1], t[r + 3]);
  }
  // u[j] (j < 4) holds dword j of rows 0..3 in its low half and dword j + 4 in its high half;
  // u[j + 4] the same for rows 4..7. The 128-bit halves are swapped into place.
  for (int j = 0; j < 4; ++j) {
    rows[j] = _mm256_permute2x128_si256(u[j], u[j + 4], 0x20);
    rows[j + 4] = _mm256_permute2x128_si256(u[j], u[j + 4], 0x31);
  }
}

// Levels and the scale, offset and integer half scales of one 32-element block of one weight
// row, per type, as that type's Apply uses them. `unit` points at the row's data for the block:
// the block itself for the 32-element types, the super-block for the K-quants (`sub` is then the
// block's index within it). Levels gives the block's levels; Scales8 the scale, offset and
// integer half scales of the 8 blocks of a group (8 consecutive blocks from a multiple of 8: one
// K-quant super-block, or 8 units side by side) as vectors whose lane j is block j. The
// 32-element types also have Scales, the same numbers of one block with the same single
// roundings, for a row's last group of fewer than 8 blocks (a K-quant row is whole super-blocks,
// so it has none). kOffset and kIntScales say which of them the type's BlockUpdate reads
// (PackPanel stores only those).
struct Q8_0Pack {
  static constexpr int64_t kBlocksPerUnit = 1, kUnitBytes = sizeof(BlockQ8_0);
  static constexpr bool kOffset = false, kIntScales = false;
  static __m256i Levels(const uint8_t* unit, int /*sub*/) { return LoadI(unit + 2); }
  static void Scales(const uint8_t* unit, float* sc, float* off, int32_t isc[2]) {
    *sc = HalfToFloat(LoadU16(unit));
    *off = 0.0f;
    isc[0] = isc[1] = 0;
  }
  static void Scales8(const uint8_t* unit, __m256* sc, __m256* off, __m256i isc[2]) {
    *sc = GatherHalves8<kUnitBytes>(unit);
    *off = _mm256_setzero_ps();
    isc[0] = isc[1] = _mm256_setzero_si256();
  }
};
template <bool kHasMin, bool kQ5 = false>
struct Q4Pack {
  static constexpr int64_t kBlocksPerUnit = 1;
  static constexpr int64_t kUnitBytes = Q4K32<kHasMin, kQ5>::kBlockBytes;
  static constexpr bool kOffset = kHasMin, kIntScales = false;
  static __m256i Levels(const uint8_t* unit, int /*sub*/) {
    return Q4K32<kHasMin, kQ5>::LoneLevels(unit);
  }
  static void Scales(const uint8_t* unit, float* sc, float* off, int32_t isc[2]) {
    *sc = HalfToFloat(LoadU16(unit));
    *off = kHasMin ? HalfToFloat(LoadU16(unit + 2)) : 0.0f;  // -8 / -16: BlockUpdate's
    isc[0] = isc[1] = 0;
  }
  static void Scales8(const uint8_t* unit, __m256* sc, __m256* off, __m256i isc[2]) {
    *sc = GatherHalves8<kUnitBytes>(unit);
    *off = kHasMin ? GatherHalves8<kUnitBytes>(unit + 2) : _mm256_setzero_ps();
    isc[0] = isc[1] = _mm256_setzero_si256();
  }
};
struct Q4_KPack {
  static constexpr int64_t kBlocksPerUnit = 8, kUnitBytes = sizeof(BlockQ4_K);
  static constexpr bool kOffset = true, kIntScales = false;
  static __m256i Levels(const uint8_t* unit, int sub) {
    const __m256i raw = LoadI(reinterpret_cast<const BlockQ4_K*>(unit)->qs + 32 * (sub / 2));
    return _mm256_and_si256(sub % 2 == 0 ? raw : _mm256_srli_epi16(raw, 4), _mm256_set1_epi8(15));
  }
  static void Scales8(const uint8_t* unit, __m256* sc, __m256* off, __m256i isc[2]) {
    const BlockQ4_K* blk = reinterpret_cast<const BlockQ4_K*>(unit);
    uint64_t scs, mns;
    UnpackQ4KScales(blk->scales, &scs, &mns);
    // Q4_KK::LoadScales' d * sc and -(dmin * mn): fma(-(dmin * mn), ds, acc) is Apply's fnmadd.
    // The sign is flipped by xor, an exact negation (-0 included).
    *sc = _mm256_mul_ps(_mm256_set1_ps(HalfToFloat(blk->d.bits)), BytesToFloats(scs));
    const __m256 dmin_mn =
        _mm256_mul_ps(_mm256_set1_ps(HalfToFloat(blk->dmin.bits)), BytesToFloats(mns));
    *off = _mm256_xor_ps(dmin_mn, _mm256_set1_ps(-0.0f));
    isc[0] = isc[1] = _mm256_setzero_si256();
  }
};
struct Q5_KPack : Q4_KPack {
  static constexpr int64_t kUnitBytes = sizeof(BlockQ5_K);
  static __m256i Levels(const uint8_t* unit, int sub) {
    const BlockQ5_K* blk = reinterpret_cast<const BlockQ5_K*>(unit);
    const __m256i raw = LoadI(blk->qs + 32 * (sub / 2));
    const __m256i lo =
        _mm256_and_si256(sub % 2 == 0 ? raw : _mm256_srli_epi16(raw, 4), _mm256_set1_epi8(15));
    return _mm256_or_si256(lo, Q5HighBits(LoadI(blk->qh), sub));
  }
};
struct Q6_KPack {
  static constexpr int64_t kBlocksPerUnit = 8, kUnitBytes = sizeof(BlockQ6_K);
  static constexpr bool kOffset = false, kIntScales = true;
  static __m256i Levels(const uint8_t* unit, int sub) {
    const BlockQ6_K* blk = reinterpret_cast<const BlockQ6_K*>(unit);
    // quant.h's numbering: 32-element chunk `sub` is r = sub % 4 of half h = sub / 4.
    const int h = sub / 4, r = sub % 4;
    const __m256i ql = LoadI(blk->ql + 64 * h + 32 * (r & 1));
    const __m256i qh = LoadI(blk->qh + 32 * h);
    const __m256i lo =
        _mm256_and_si256(r < 2 ? ql : _mm256_srli_epi16(ql, 4), _mm256_set1_epi8(15));
    // Bits 2r .. 2r + 1 of qh moved to bits 4 .. 5.
    const __m256i hi2 = r == 0   ? _mm256_slli_epi16(qh, 4)
                        : r == 1 ? _mm256_slli_epi16(qh, 2)
                        : r == 2 ? qh
                                 : _mm256_srli_epi16(qh, 2);
    return _mm256_or_si256(lo, _mm256_and_si256(hi2, _mm256_set1_epi8(0x30)));
  }
  static void Scales8(const uint8_t* unit, __m256* sc, __m256* off, __m256i isc[2]) {
    const BlockQ6_K* blk = reinterpret_cast<const BlockQ6_K*>(unit);
    *sc = _mm256_set1_ps(HalfToFloat(blk->d.bits));
    *off = _mm256_setzero_ps();
    // Lane j of the 16 i16 scales as 8 i32: scales[2j] in its low half, scales[2j + 1] high.
    const __m256i s16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->scales)));
    isc[0] = _mm256_srai_epi32(_mm256_slli_epi32(s16, 16), 16);
    isc[1] = _mm256_srai_epi32(s16, 16);
  }
};

// Packs blocks [b0, b0 + count) (b0 a multiple of 8) of weight rows 0 .. num_rows - 1 of `w`
// (num_rows <= 8; missing rows are zero, so they contribute nothing, and their outputs are never
// stored). Scales 8 blocks by 8 rows at a time through an 8 x 8 transpose (a K-quant
// super-block's scales are unpacked once, not once per block); a last group of fewer than 8
// blocks one by one. `ahead` (0: none) is how far the next pack's bytes lie from this one's: each
// group's bytes that far ahead are prefetched into L2, so the next pack finds them there (the
// hardware prefetcher does not follow 8 rows read a group at a time, and the panel kernels work
// long enough on a pack to hide the next one's DRAM latency).
template <class P>
void PackPanel(const uint8_t* w, int64_t row_bytes, int num_rows, int64_t b0, int64_t count,
               Panel* panel, int64_t ahead = 0) {
  auto unit_of = [&](int r, int64_t b) {
    return w + r * row_bytes + b / P::kBlocksPerUnit * P::kUnitBytes;
  };
  constexpr int64_t kGroupBytes = 8 / P::kBlocksPerUnit * P::kUnitBytes;
  int64_t bi = 0;
  for (; bi + 8 <= count; bi += 8) {
    __m256i sc[8], off[8], isc[2][8];
    for (int r = 0; r < 8; ++r) {
      if (r >= num_rows) {
        sc[r] = off[r] = isc[0][r] = isc[1][r] = _mm256_setzero_si256();
        continue;
      }
      if (ahead != 0) {
        const uintptr_t first = reinterpret_cast<uintptr_t>(unit_of(r, b0 + bi)) + ahead;
        for (uintptr_t line = first & ~uintptr_t{63}; line < first + kGroupBytes; line += 64) {
          __builtin_prefetch(reinterpret_cast<const void*>(line), 0, 2);
        }
      }
      __m256 s, o;
      __m256i is[2];
      P::Scales8(unit_of(r, b0 + bi), &s, &o, is);
      sc[r] = _mm256_castps_si256(s);
      off[r] = _mm256_castps_si256(o);
      isc[0][r] = is[0];
      isc[1][r] = is[1];
    }
    Transpose8x8(sc);
    for (int j = 0; j < 8; ++j) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(panel->scale[bi + j]), sc[j]);
    }
    if constexpr (P::kOffset) {
      Transpose8x8(off);
      for (int j = 0; j < 8; ++j) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(panel->offset[bi + j]), off[j]);
      }
    }
    if constexpr (P::kIntScales) {
      for (int h = 0; h < 2; ++h) {
        Transpose8x8(isc[h]);
        for (int j = 0; j < 8; ++j) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(panel->iscale[bi + j][h]), isc[h][j]);
        }
      }
    }
  }
  if constexpr (P::kBlocksPerUnit == 1) {
    for (; bi < count; ++bi) {
      for (int r = 0; r < 8; ++r) {
        float sc = 0.0f, off = 0.0f;
        int32_t isc[2] = {0, 0};
        if (r < num_rows) P::Scales(unit_of(r, b0 + bi), &sc, &off, isc);
        panel->scale[bi][r] = sc;
        panel->offset[bi][r] = off;
        panel->iscale[bi][0][r] = isc[0];
        panel->iscale[bi][1][r] = isc[1];
      }
    }
  }
  for (bi = 0; bi < count; ++bi) {
    const int64_t b = b0 + bi;
    const int sub = static_cast<int>(b % P::kBlocksPerUnit);
    __m256i rows[8];
    for (int r = 0; r < 8; ++r) {
      rows[r] = r < num_rows ? P::Levels(unit_of(r, b), sub) : _mm256_setzero_si256();
    }
    Transpose8x8(rows);
    for (int j = 0; j < 8; ++j) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(panel->lv[bi][j]), rows[j]);
    }
  }
}

inline __m256i Broadcast4(const int8_t* p) {
  return _mm256_set1_epi32(static_cast<int>(LoadU32(reinterpret_cast<const uint8_t*>(p))));
}

// The panel kinds: how a block's integer sums are formed, and its f32 update, per type, in the
// operations and order of that type's Apply (lane r = weight row r; scale, offset as PackPanel
// stores them; da, ds the activation block's scale and scaled sum).
// kKind 0 (Q4_1, Q4_K): levels 0..15; acc = fma(scale * da, isum, acc); acc = fma(offset, ds, acc).
// kKind 1 (Q8_0): signed levels; acc = fma(scale * da, isum, acc).
// kKind 2 (Q6_K): levels 0..63, integer scales per 16-element half: isum = sum over halves h of
//   iscale[h] * (dot_h - 32 * asum16_h) (exact, as Q6_KK's madd and correction); acc =
//   fma(scale * da, isum, acc) with scale = d.
// kKind 3 (Q4_0): levels 0..15; acc = fma(scale, da * isum - 8 * ds, acc).
// kKind 4 (Q5_K, Q5_1): levels 0..31; the update is kKind 0's.
// kKind 5 (Q5_0): levels 0..31; acc = fma(scale, da * isum - 16 * ds, acc).
template <int kKind>
inline __m256 BlockUpdate(const Panel& p, int64_t bi, __m256i isum, float da, float ds,
                          __m256 acc) {
  const __m256 s = _mm256_cvtepi32_ps(isum), sc = _mm256_load_ps(p.scale[bi]);
  if constexpr (kKind == 3 || kKind == 5) {
    const __m256 offset = _mm256_set1_ps(kKind == 3 ? 8.0f : 16.0f);
    return _mm256_fmadd_ps(
        sc, _mm256_fmsub_ps(_mm256_set1_ps(da), s, _mm256_mul_ps(offset, _mm256_set1_ps(ds))), acc);
  } else {
    acc = _mm256_fmadd_ps(_mm256_mul_ps(sc, _mm256_set1_ps(da)), s, acc);
    if constexpr (kKind == 0 || kKind == 4) {
      acc = _mm256_fmadd_ps(_mm256_load_ps(p.offset[bi]), _mm256_set1_ps(ds), acc);
    }
    return acc;
  }
}

// Q6_K's isum of one block from the two halves' level-times-activation sums.
inline __m256i Q6KBlockSum(const Panel& p, int64_t bi, __m256i dot0, __m256i dot1,
                           const int16_t* asum16) {
  const __m256i c0 = _mm256_slli_epi32(_mm256_set1_epi32(asum16[0]), 5);
  const __m256i c1 = _mm256_slli_epi32(_mm256_set1_epi32(asum16[1]), 5);
  return _mm256_add_epi32(
      _mm256_mullo_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(p.iscale[bi][0])),
                         _mm256_sub_epi32(dot0, c0)),
      _mm256_mullo_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(p.iscale[bi][1])),
                         _mm256_sub_epi32(dot1, c1)));
}

// Accumulators of one x row against one panel: [0, 8) block % 8 of the whole 256-element chunks,
// [8] the blocks past them.
inline constexpr int kAccSlots = 9;

// Activation rows x0 .. x0 + NX - 1 from block b0 on: their levels, scales, scaled sums and
// 16-element sums, as the panel kernels read them.
template <int NX>
struct TileActs {
  const int8_t* q[NX];
  const float* da[NX];
  const float* ds[NX];
  const int16_t* sum16[NX];
  TileActs(const QuantizedActs& a, int64_t x0, int64_t b0) {
    const int64_t k = a.k, nb = k / 32;
    for (int x = 0; x < NX; ++x) {
      q[x] = a.q + (x0 + x) * k + 32 * b0;
      da[x] = a.d + (x0 + x) * nb + b0;
      ds[x] = a.ds + (x0 + x) * nb + b0;
      sum16[x] = a.sum16 + (x0 + x) * 2 * nb + 2 * b0;
    }
  }
};

// Runs blocks b0 .. b0 + count - 1 (b0 a multiple of 8) of a panel for NX x rows, slot by slot so
// that each slot's accumulators stay in registers: slot j < 8 takes blocks j, j + 8, ... of the
// whole chunks in order (a decode lane's order), slot 8 the blocks past them.
// sums(bi, isum) leaves block bi's integer sums of the NX rows in isum.
template <int kKind, int NX, class Sums>
inline void PanelSlots(const Panel& p, int64_t count, int64_t b0, int64_t nb_main,
                       const TileActs<NX>& t, __m256 (*acc)[kAccSlots], Sums sums) {
  const int64_t main_count = QMin(count, nb_main > b0 ? nb_main - b0 : 0);
  for (int slot = 0; slot < kAccSlots; ++slot) {
    const int64_t first = slot < 8 ? slot : main_count, end = slot < 8 ? main_count : count;
    const int64_t step = slot < 8 ? 8 : 1;
    if (first >= end) continue;
    __m256 r[NX];
    for (int x = 0; x < NX; ++x) r[x] = acc[x][slot];
    for (int64_t bi = first; bi < end; bi += step) {
      __m256i isum[NX];
      sums(bi, isum);
#pragma GCC unroll 8
      for (int x = 0; x < NX; ++x) {
        r[x] = BlockUpdate<kKind>(p, bi, isum[x], t.da[x][bi], t.ds[x][bi], r[x]);
      }
    }
    for (int x = 0; x < NX; ++x) acc[x][slot] = r[x];
  }
}

// Keeps v in a register as an opaque value: stops GCC from re-associating a chain of integer adds
// into a tree, which would hold every product live at once and spill them.
inline void Opaque(__m256i& v) { __asm__("" : "+x"(v)); }

// sums[x] += the products of panel vectors j and j + 1 of block bi with activation row x's bytes
// (q[x] at the panel's first block): two vpmaddubsw per i16 sum, for levels up to 63
// (4 * 63 * 127 < 2^15), then to i32.
template <int NX>
inline void AddLevelPair(const Panel& p, int64_t bi, int j, const int8_t* const* q,
                         __m256i* sums) {
  const __m256i w0 = LoadI(p.lv[bi][j]), w1 = LoadI(p.lv[bi][j + 1]);
#pragma GCC unroll 4
  for (int x = 0; x < NX; ++x) {
    const int8_t* qx = q[x] + 32 * bi + 4 * j;
    const __m256i t = _mm256_add_epi16(_mm256_maddubs_epi16(w0, Broadcast4(qx)),
                                       _mm256_maddubs_epi16(w1, Broadcast4(qx + 4)));
    sums[x] = _mm256_add_epi32(sums[x], _mm256_madd_epi16(t, Ones16()));
    Opaque(sums[x]);
  }
}

// acc[x] += the blocks b0 .. b0 + count - 1 of panel rows against activation row x0 + x, each
// into its slot (PanelSlots). Integer sums: kKind 0 and 3, a lane's 16 products summed in i16 stay
// below 8 * 2 * 15 * 127 < 2^15; kKind 1, |w| times the activation with w's sign, each
// vpmaddubsw to i32 at once (2 * 128 * 127 < 2^15 leaves no room for a second); kKind 2, 4 and
// 5, two vpmaddubsw per i16 sum (4 * 63 * 127 < 2^15).
template <int kKind, int NX>
void PanelDot(const Panel& p, int64_t count, const QuantizedActs& a, int64_t x0, int64_t b0,
              int64_t nb_main, __m256 (*acc)[kAccSlots]) {
  const __m256i ones = Ones16();
  const TileActs<NX> t(a, x0, b0);
  const auto& q = t.q;
  const auto& sum16 = t.sum16;
  PanelSlots<kKind, NX>(p, count, b0, nb_main, t, acc, [&](int64_t bi, __m256i* isum) {
    if constexpr (kKind == 0 || kKind == 3) {
      __m256i s16[NX];
      for (int x = 0; x < NX; ++x) s16[x] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m256i w = LoadI(p.lv[bi][j]);
#pragma GCC unroll 4
        for (int x = 0; x < NX; ++x) {
          s16[x] =
              _mm256_add_epi16(s16[x], _mm256_maddubs_epi16(w, Broadcast4(q[x] + 32 * bi + 4 * j)));
          Opaque(s16[x]);
        }
      }
      for (int x = 0; x < NX; ++x) isum[x] = _mm256_madd_epi16(s16[x], ones);
    } else if constexpr (kKind == 4 || kKind == 5) {
      for (int x = 0; x < NX; ++x) isum[x] = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int j = 0; j < 8; j += 2) AddLevelPair<NX>(p, bi, j, q, isum);
    } else if constexpr (kKind == 1) {
      for (int x = 0; x < NX; ++x) isum[x] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m256i w = LoadI(p.lv[bi][j]);
        const __m256i aw = _mm256_sign_epi8(w, w);
#pragma GCC unroll 4
        for (int x = 0; x < NX; ++x) {
          const __m256i prod =
              _mm256_maddubs_epi16(aw, _mm256_sign_epi8(Broadcast4(q[x] + 32 * bi + 4 * j), w));
          isum[x] = _mm256_add_epi32(isum[x], _mm256_madd_epi16(prod, ones));
          Opaque(isum[x]);
        }
      }
    } else {
      __m256i dot[2][NX];
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        for (int x = 0; x < NX; ++x) dot[h][x] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int j = 4 * h; j < 4 * h + 4; j += 2) AddLevelPair<NX>(p, bi, j, q, dot[h]);
      }
      for (int x = 0; x < NX; ++x) {
        isum[x] = Q6KBlockSum(p, bi, dot[0][x], dot[1][x], sum16[x] + 2 * bi);
      }
    }
  });
}

// x rows per PanelDot call: four keep the partial sums beside the panel vectors in 16 registers.
inline constexpr int kPanelTile = 4;

template <int kKind>
void PanelDotRows(const Panel& p, int64_t count, const QuantizedActs& a, int64_t x0, int nx,
                  int64_t b0, int64_t nb_main, __m256 (*acc)[kAccSlots]) {
  switch (nx) {
    case 4:
      return PanelDot<kKind, 4>(p, count, a, x0, b0, nb_main, acc);
    case 3:
      return PanelDot<kKind, 3>(p, count, a, x0, b0, nb_main, acc);
    case 2:
      return PanelDot<kKind, 2>(p, count, a, x0, b0, nb_main, acc);
    default:
      return PanelDot<kKind, 1>(p, count, a, x0, b0, nb_main, acc);
  }
}

// x rows whose accumulators one pass over the panels keeps when k spans several k-chunks (on the
// stack: 18 KiB); such a call packs each panel once per block of this many rows.
inline constexpr int64_t kAccRows = 64;

using PanelDotFn = void (*)(const Panel&, int64_t, const QuantizedActs&, int64_t, int, int64_t,
                            int64_t, __m256 (*)[kAccSlots]);

// out rows x0 .. x0 + count - 1, weight rows r0 .. r0 + num_rows - 1, from their accumulators:
// HorizontalSum's tree lane-wise, ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)), then the tail
// slot if there are tail blocks, then the bias, as the decode kernels finish a row.
inline void FinishRows(const __m256 (*acc)[kAccSlots], int64_t count, bool tail,
                       const float* bias_rows, float* out, int64_t ldo, int64_t x0, int64_t r0,
                       int num_rows) {
  for (int64_t i = 0; i < count; ++i) {
    const __m256* s = acc[i];
    __m256 v = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(s[0], s[4]), _mm256_add_ps(s[2], s[6])),
                             _mm256_add_ps(_mm256_add_ps(s[1], s[5]), _mm256_add_ps(s[3], s[7])));
    if (tail) v = _mm256_add_ps(v, s[8]);
    v = _mm256_add_ps(v, _mm256_load_ps(bias_rows));
    float* o = out + (x0 + i) * ldo + r0;
    if (num_rows == 8) {
      _mm256_storeu_ps(o, v);
    } else {
      alignas(32) float tmp[8];
      _mm256_store_ps(tmp, v);
      for (int r = 0; r < num_rows; ++r) o[r] = tmp[r];
    }
  }
}

// Prefill: per panel of 8 weight rows, each k-chunk packed once and run through every x tile of
// kTile rows by kDot; then each row's accumulators are summed as the decode kernels sum theirs.
// With k in one k-chunk (up to 2048) a tile is finished as soon as it is done; with more, the
// accumulators of kAccRows x rows wait for the last k-chunk.
template <class P, int kTile, PanelDotFn kDot>
void GemmPacked(const QuantizedActs& a, int64_t x_begin, int64_t x_end, const uint8_t* w,
                int64_t row_bytes, const float* bias, float* out, int64_t ldo, int64_t row_begin,
                int64_t row_end) {
  const int64_t nb = a.k / 32, nb_main = a.k / 256 * 8;
  Panel panel;
  alignas(32) __m256 acc[kAccRows][kAccSlots];
  static_assert(kTile <= kAccRows);
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kPanelRows) {
    const int num_rows = static_cast<int>(QMin(kPanelRows, row_end - r0));
    const uint8_t* wp = w + r0 * row_bytes;
    alignas(32) float bias_rows[8] = {};
    for (int r = 0; r < num_rows; ++r) bias_rows[r] = bias != nullptr ? bias[r0 + r] : 0.0f;
    auto zero = [&](int64_t rows) {
      for (int64_t i = 0; i < rows; ++i) {
        for (int s = 0; s < kAccSlots; ++s) acc[i][s] = _mm256_setzero_ps();
      }
    };
    // The next panel's rows start 8 rows on (none after the last).
    const int64_t next_panel = r0 + kPanelRows < row_end ? kPanelRows * row_bytes : 0;
    if (nb <= kPanelBlocks) {
      PackPanel<P>(wp, row_bytes, num_rows, 0, nb, &panel, next_panel);
      for (int64_t i = x_begin; i < x_end; i += kTile) {
        const int nx = static_cast<int>(QMin(kTile, x_end - i));
        zero(nx);
        kDot(panel, nb, a, i, nx, 0, nb_main, acc);
        FinishRows(acc, nx, nb > nb_main, bias_rows, out, ldo, i, r0, num_rows);
      }
      continue;
    }
    for (int64_t xb = x_begin; xb < x_end; xb += kAccRows) {
      const int64_t xe = QMin(x_end, xb + kAccRows);
      zero(xe - xb);
      for (int64_t b0 = 0; b0 < nb; b0 += kPanelBlocks) {
        const int64_t count = QMin(kPanelBlocks, nb - b0);
        // Next: this panel's next k-chunk, else (after the last x rows) the next panel's first.
        const int64_t chunk_bytes = kPanelBlocks / P::kBlocksPerUnit * P::kUnitBytes;
        const int64_t ahead = b0 + count < nb ? chunk_bytes
                              : xe == x_end && next_panel != 0
                                  ? next_panel - b0 / P::kBlocksPerUnit * P::kUnitBytes
                                  : 0;
        PackPanel<P>(wp, row_bytes, num_rows, b0, count, &panel, ahead);
        for (int64_t i = xb; i < xe; i += kTile) {
          kDot(panel, count, a, i, static_cast<int>(QMin(kTile, xe - i)), b0, nb_main,
               &acc[i - xb]);
        }
      }
      FinishRows(acc, xe - xb, nb > nb_main, bias_rows, out, ldo, xb, r0, num_rows);
    }
  }
}

// ---- the Gemm loops --------------------------------------------------------------------------
// How far ahead of the chunk in use the decode loop prefetches its weight row, in bytes. Decode
// reads each weight byte once, from DRAM; the hardware prefetcher alone kept only 4-7 GB/s of one
// core's ~11 GB/s in flight on Zen 3 (Q8_0 rows worst: 4.25 cache lines per chunk, of which the
// earlier two-lines-per-chunk prefetch covered half). Every line, 2 KiB ahead: about
// DRAM latency times one core's share of bandwidth (1-4 KiB measured about the same).
constexpr int64_t kPrefetchAhead = 2048;

// res[x] = dot(weight row, activation row x0 + x) for x < NX. Per chunk, each weight pair is
// unpacked once and multiplied into all NX rows, whose partial reductions (two vectors per row)
// and accumulators stay in registers.
template <class T, int NX>
void RowDot(const QuantizedActs& a, int64_t x0, const uint8_t* wrow, float* res) {
  const int64_t k = a.k, nb = k / 32, num_chunks = k / 256;
  __m256 acc[NX];
  for (int x = 0; x < NX; ++x) acc[x] = _mm256_setzero_ps();
  for (int64_t c = 0; c < num_chunks; ++c) {
    const uint8_t* wc = wrow + c * T::kChunkBytes;
    // Software prefetch of every cache line kPrefetchAhead bytes ahead (see there).
    for (int64_t off = 0; off < T::kChunkBytes; off += 64) {
      __builtin_prefetch(wc + kPrefetchAhead + off, 0, 3);
    }
    __m256i s0[NX], s1[NX];
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      const typename T::Pair w = T::LoadPair(wc, p);
#pragma GCC unroll 4
      for (int x = 0; x < NX; ++x) {
        const __m256i v = T::PairDot(w, a.q + (x0 + x) * k + 256 * c + 64 * p);
        if (p == 0) s0[x] = v;
        if (p == 1) s0[x] = T::Merge(s0[x], v);
        if (p == 2) s1[x] = v;
        if (p == 3) s1[x] = T::Merge(s1[x], v);
      }
    }
    const typename T::Scales sc = T::LoadScales(wc);
#pragma GCC unroll 4
    for (int x = 0; x < NX; ++x) {
      const int64_t row = x0 + x;
      acc[x] = T::Apply(sc, T::Finish(s0[x], s1[x]), a.d + row * nb + 8 * c,
                        a.ds + row * nb + 8 * c, a.sum16 + row * 2 * nb + 16 * c, acc[x]);
    }
  }
  for (int x = 0; x < NX; ++x) res[x] = HorizontalSum(acc[x]);
  if constexpr (requires { T::Tail; }) {
    const int64_t tail = nb - 8 * num_chunks;
    if (tail > 0) {
      const uint8_t* wt = wrow + num_chunks * T::kChunkBytes;
      for (int x = 0; x < NX; ++x) {
        const int64_t row = x0 + x, b0 = 8 * num_chunks;
        res[x] +=
            T::Tail(wt, tail, a.q + row * k + 32 * b0, a.d + row * nb + b0, a.ds + row * nb + b0);
      }
    }
  }
}

template <class T>
void RowTile(const QuantizedActs& a, int64_t x0, int nx, const uint8_t* wrow, float* res) {
  switch (nx) {
    case 4:
      return RowDot<T, 4>(a, x0, wrow, res);
    case 3:
      return RowDot<T, 3>(a, x0, wrow, res);
    case 2:
      return RowDot<T, 2>(a, x0, wrow, res);
    default:
      return RowDot<T, 1>(a, x0, wrow, res);
  }
}

template <class T, class P, int kKind>
void Gemm(const QuantizedActs& a, int64_t x_begin, int64_t x_end, const void* w, const float* bias,
          float* out, int64_t ldo, int64_t row_begin, int64_t row_end) {
  const int64_t row_bytes = a.k / 256 * T::kChunkBytes + (a.k % 256) / 32 * (T::kChunkBytes / 8);
  const uint8_t* wp = static_cast<const uint8_t*>(w);
  if (a.n > kQuantSmallNMax) {
    return GemmPacked<P, kPanelTile, &PanelDotRows<kKind>>(a, x_begin, x_end, wp, row_bytes, bias,
                                                           out, ldo, row_begin, row_end);
  }
  float res[kRowsPerTile];
  auto tile = [&](int64_t r, int64_t i) {
    const int nx = static_cast<int>(QMin(kRowsPerTile, x_end - i));
    RowTile<T>(a, i, nx, wp + r * row_bytes, res);
    const float b = bias != nullptr ? bias[r] : 0.0f;
    for (int x = 0; x < nx; ++x) out[(i + x) * ldo + r] = res[x] + b;
  };
  // Decode: weight rows outer, so each is read from memory once for all x rows.
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t i = x_begin; i < x_end; i += kRowsPerTile) tile(r, i);
  }
}

}  // namespace qavx2

// Adds the AVX2 quantized kernels to a kernel table.
constexpr KernelTable WithQuantKernels(KernelTable t) {
  t.quantize_acts = &qavx2::QuantizeActs;
  t.gemm_q8_0 = &qavx2::Gemm<qavx2::Q8_0K, qavx2::Q8_0Pack, 1>;
  t.gemm_q4_0 = &qavx2::Gemm<qavx2::Q4K32<false>, qavx2::Q4Pack<false>, 3>;
  t.gemm_q4_1 = &qavx2::Gemm<qavx2::Q4K32<true>, qavx2::Q4Pack<true>, 0>;
  t.gemm_q4_k = &qavx2::Gemm<qavx2::Q4_KK, qavx2::Q4_KPack, 0>;
  t.gemm_q6_k = &qavx2::Gemm<qavx2::Q6_KK, qavx2::Q6_KPack, 2>;
  t.gemm_q5_k = &qavx2::Gemm<qavx2::Q5_KK, qavx2::Q5_KPack, 4>;
  t.gemm_q5_0 = &qavx2::Gemm<qavx2::Q4K32<false, true>, qavx2::Q4Pack<false, true>, 5>;
  t.gemm_q5_1 = &qavx2::Gemm<qavx2::Q4K32<true, true>, qavx2::Q4Pack<true, true>, 4>;
  return t;
}
