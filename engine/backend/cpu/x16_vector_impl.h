// The AVX-512 helpers that the interleaved-copy kernels (kernels_avx512vnni.cc, namespace x16) and
// the AMX-INT8 Gemms (amx_int8_impl.h) share. No include guard and no includes, like the impl
// headers beside it: a file built with AVX-512 F/BW/VL includes it inside its own namespace
// (kernels_avx512vnni.cc, and the emulated-tile test of the AMX-INT8 Gemms).

// One load, whatever uses the vector. The empty asm keeps the compiler from folding the load into
// each instruction that reads it: the level vectors' two masks (v & 0x0f, v & 0xf0) had become two
// vpandd with the same memory operand, 64 loads of weight bytes per Q4_K unit instead of 32. One
// core on Zen 5 issues two loads a cycle, as many as vpdpbusd (kernel_bench isa-rates), and the
// one-row tiles issue about as many loads as vpdpbusd (each of which also takes a broadcast of 4
// activation bytes), so the extra loads cost time: `QUANT_ROWS=1,4 kernel_bench 1 best
// quant-compute` (weights in L2, two alternating rounds) ran one x row of Q4_K 67-68 -> 72-73 GB/s
// per core-second, Q5_K 63-64 -> 66, Q6_K 67 -> 69-70, Q4_0 and Q4_1 85-86 -> 97-100, and four x
// rows 2-10% faster; Q8_0, whose levels are used as loaded, is level (docs/PERFORMANCE.md, "One
// load per level vector").
inline __m512i Load512(const uint8_t* p) {
  __m512i v = _mm512_loadu_si512(p);
  asm("" : "+v"(v));
  return v;
}

// The 16 rows' sc (scales[0..128)) and mn (scales[128..256)) of sub-blocks 0..7 as bytes
// 16 s + r, from the unit's packed low nibbles and top bits (kernels.h).
inline void UnpackScales(const uint8_t* unit, uint8_t* scales) {
  const __m512i lo0 = Load512(unit + 64), lo1 = Load512(unit + 128), hi = Load512(unit + 192);
  const __m512i m0f = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
  // 16-bit shifts move bits across the bytes of a pair; the masks keep each byte's own.
  auto pick = [&](__m512i low4, __m512i top2) {
    return _mm512_or_si512(_mm512_and_si512(low4, m0f), _mm512_and_si512(top2, m30));
  };
  _mm512_store_si512(scales, pick(lo0, _mm512_slli_epi16(hi, 4)));
  _mm512_store_si512(scales + 64, pick(lo1, _mm512_slli_epi16(hi, 2)));
  _mm512_store_si512(scales + 128, pick(_mm512_srli_epi16(lo0, 4), hi));
  _mm512_store_si512(scales + 192, pick(_mm512_srli_epi16(lo1, 4), _mm512_srli_epi16(hi, 2)));
}

// 16 bytes as f32 lanes, times f.
inline __m512 BytesTimes(const uint8_t* p, __m512 f) {
  return _mm512_mul_ps(
      _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(p)))),
      f);
}

// Bit s (< 8) of every byte of v moved to bit t (4 or 7) by a 16-bit shift: bit t of each byte
// then comes from the same byte for every s (the shift is at most 7 places, toward t).
template <int kS, int kT>
inline __m512i BitTo(__m512i v) {
  if constexpr (kS < kT) {
    return _mm512_slli_epi16(v, kT - kS);
  } else if constexpr (kS > kT) {
    return _mm512_srli_epi16(v, kS - kT);
  } else {
    return v;
  }
}

// 5-bit levels from the nibbles of v and the fifth bits in h: *lo = (v & 15) + 16 * bit kLo of
// h, as bytes; *hi = eight times (v >> 4) + 16 * bit kHi of h (bytes up to 248; the scale of
// those levels carries the 1/8). vpternlogd 0xf8 is a | (b & c).
template <int kLo, int kHi>
inline void Q5LevelsFromBits(__m512i v, __m512i h, __m512i* lo, __m512i* hi) {
  const __m512i m0f = _mm512_set1_epi8(0x0f), m10 = _mm512_set1_epi8(0x10);
  const __m512i m78 = _mm512_set1_epi8(0x78), m80 = _mm512_set1_epi8(static_cast<char>(0x80));
  // (Operands named first: some compilers define the intrinsic as a macro, and a template
  // argument list's comma would split its arguments.)
  const __m512i lo_bits = BitTo<kLo, 4>(h), hi_bits = BitTo<kHi, 7>(h);
  const __m512i lo4 = _mm512_and_si512(v, m0f);
  const __m512i hi4 = _mm512_and_si512(_mm512_srli_epi16(v, 1), m78);
  *lo = _mm512_ternarylogic_epi32(lo4, lo_bits, m10, 0xf8);
  *hi = _mm512_ternarylogic_epi32(hi4, hi_bits, m80, 0xf8);
}

// Q5_K's levels of vector (p, j): sub-block 2p's from bit 2p of h, 2p + 1's (eight times) from
// bit 2p + 1.
template <int P>
inline void Q5Levels(__m512i v, __m512i h, __m512i* lo, __m512i* hi) {
  Q5LevelsFromBits<2 * P, 2 * P + 1>(v, h, lo, hi);
}

// Level vector j (< 8) of sub-block pair P of a Q4_K (Q5_K with kQ5) unit of the interleaved
// copies: *lo the low sub-block's levels (0..15, Q5_K 0..31), *hi the high one's, 16 (Q5_K 8)
// times their value, as the kernels take them (their scale carries the 1/16 or 1/8).
template <bool kQ5, int P>
inline void X16KLevels(const uint8_t* unit, int j, __m512i* lo, __m512i* hi) {
  const __m512i v = Load512(unit + (kQ5 ? 768 : 256) + (8 * P + j) * 64);
  if constexpr (kQ5) {
    Q5Levels<P>(v, Load512(unit + 256 + 64 * j), lo, hi);
  } else {
    *lo = _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
    *hi = _mm512_and_si512(v, _mm512_set1_epi8(static_cast<char>(0xf0)));
  }
}
