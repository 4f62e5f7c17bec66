// The AVX-512 pieces that the bf16 x bf16 Gemms share: the AMX tile Gemm (kernels_amx.cc) and
// the vdpbf16ps Gemm (kernels_avx512bf16.cc) transpose weight pairs the same way and split x into
// the same bf16 terms (amx_gemm_impl.h's AmxSplit, 16 lanes at a time). No include guard and no
// includes, like the impl headers beside it: a file built with AVX-512 F/BW/VL includes it inside
// its own anonymous namespace.

// One B tile from 16 whole weight rows and a whole k step: the 16 x 16 matrix of k pairs
// (row j, pair p; rows k bf16 apart) transposed into tile[p * stride + j] (stride 16: a tile), in
// three rounds of in-lane unpacks and lane shuffles.
inline void PackWTile16x16(const uint16_t* rows, int64_t k, uint32_t* tile, int64_t stride = 16) {
  __m512i r[16];
  for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_si512(rows + j * k);
  __m512i t[16];
  for (int j = 0; j < 16; j += 2) {  // rows j, j+1 interleaved by pair, per 128-bit lane
    t[j] = _mm512_unpacklo_epi32(r[j], r[j + 1]);
    t[j + 1] = _mm512_unpackhi_epi32(r[j], r[j + 1]);
  }
  __m512i u[16];
  for (int g = 0; g < 16; g += 4) {  // rows g..g+3: u[g + q] lane L holds pair 4L + q of each
    u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
    u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
    u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
    u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  for (int q = 0; q < 4; ++q) {
    const __m512i v = _mm512_shuffle_i32x4(u[q], u[4 + q], 0x88);  // lanes 0, 2 of each
    const __m512i x = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0x88);
    const __m512i y = _mm512_shuffle_i32x4(u[q], u[4 + q], 0xdd);  // lanes 1, 3 of each
    const __m512i z = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0xdd);
    _mm512_storeu_si512(tile + (q + 0) * stride, _mm512_shuffle_i32x4(v, x, 0x88));
    _mm512_storeu_si512(tile + (q + 8) * stride, _mm512_shuffle_i32x4(v, x, 0xdd));
    _mm512_storeu_si512(tile + (q + 4) * stride, _mm512_shuffle_i32x4(y, z, 0x88));
    _mm512_storeu_si512(tile + (q + 12) * stride, _mm512_shuffle_i32x4(y, z, 0xdd));
  }
}

// AmxBf16Bits of 16 lanes.
inline __m512i Bf16BitsX16(__m512i u) {
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  return _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb),
                           16);
}

// AmxSplit of 16 lanes: the same integer and float steps, lane by lane.
inline void SplitX16(__m512 v, __m512i* hi, __m512i* mid, __m512i* lo) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000);
  const __mmask16 nonfinite = _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, exp_mask), exp_mask);
  __m512i h = Bf16BitsX16(u);
  const __mmask16 to_inf = _mm512_cmpeq_epi32_mask(_mm512_and_si512(h, _mm512_set1_epi32(0x7f80)),
                                                   _mm512_set1_epi32(0x7f80));
  h = _mm512_mask_mov_epi32(h, to_inf, _mm512_srli_epi32(u, 16));
  const __m512 r1 = _mm512_sub_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
  const __m512i m = Bf16BitsX16(_mm512_castps_si512(r1));
  const __m512 r2 = _mm512_sub_ps(r1, _mm512_castsi512_ps(_mm512_slli_epi32(m, 16)));
  const __m512i l = Bf16BitsX16(_mm512_castps_si512(r2));
  // Non-finite: the top half alone, a NaN with its quiet bit set.
  const __mmask16 nan = _mm512_mask_test_epi32_mask(nonfinite, u, _mm512_set1_epi32(0x007fffff));
  __m512i top = _mm512_srli_epi32(u, 16);
  top = _mm512_mask_or_epi32(top, nan, top, _mm512_set1_epi32(0x0040));
  *hi = _mm512_mask_mov_epi32(h, nonfinite, top);
  *mid = _mm512_maskz_mov_epi32(static_cast<__mmask16>(~nonfinite), m);
  *lo = _mm512_maskz_mov_epi32(static_cast<__mmask16>(~nonfinite), l);
}
