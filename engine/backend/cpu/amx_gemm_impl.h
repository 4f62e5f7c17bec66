// The AMX BF16 prefill Gemm, written once against a tile-operations class T so that the same
// packing and loop code runs on the matrix unit (kernels_amx.cc) and on a software model of the
// tiles (tests/engine/backend/amx_gemm_test.cc, which runs on any CPU). Deliberately no include
// guard and no includes, like simd_kernels_impl.h: each user includes it inside its own anonymous
// namespace after defining T, so the two instantiations never meet at link time.
//
// T provides, for tiles 0-7 configured as 16 rows x 64 bytes:
//   static void Configure();                      // palette 1, every tile 16 x 64 B
//   template <int kT> static void Load(const void* base, int64_t stride);
//   template <int kT> static void Store(void* base, int64_t stride);
//   template <int kT> static void Zero();         // C tiles 0-3: every element +0.0f
//   template <int kC, int kA, int kB> static void Dot();  // TDPBF16PS: C += A . B
//   static void Release();
//   static void PackW(...);  // PackWBf16's arguments and result (a vector version may stand in)
//   static void WriteOutTransposed(...);  // AmxWriteOutTransposed's (likewise)
// Dot's contract (Intel SDM, TDPBF16PS): C is 16 x 16 f32, A 16 rows of 32 bf16, B 16 rows of
// 16 bf16 pairs; C[m][n] += A[m][2p] * B[p][2n] + A[m][2p + 1] * B[p][2n + 1] for p < 16.
//
// Precision. The unit multiplies bf16 by bf16, and w is exactly bf16, but x is f32. x is split
// into three bf16 terms, x = hi + mid + lo (each the round-to-nearest bf16 of what is left), whose
// sum is x to within 2^-24 relative: the same as x itself in f32. Each term is multiplied by the
// same w tile, so the products are exact and only the f32 accumulation order differs from the
// FMA kernels (the tolerance every Gemm kernel already meets). The price is three tile products
// per 32 k instead of one. The packer and the loops below take the number of terms kept, kTerms,
// as a template argument: 3 (the default, MatmulPrecision::kHighest), 2 (hi + mid, x to within
// 2^-16 relative, kHigh) or 1 (x rounded to bf16, within 2^-8, kMedium), each the first kTerms
// terms of the same split, one tile product per term.
//
// Layouts (kernels.h has the sizes):
// - packed x, written once per Gemm by PackXBf16: for row tile rt (16 rows), k step s (32 k)
//   and term t < kTerms (hi, mid, lo), one 1 KiB A tile of 16 rows x 32 bf16 at tile index
//   (rt * steps + s) * kTerms + t. Rows are padded with zeros to a multiple of 32, k to a multiple
//   of 32.
//   For a Gemm of at most kAmxFewRows x rows in all (decode batches) every such tile is stored
//   transposed instead, as a B tile: 16 rows (k pairs) x 16 columns (x rows) x 2 bf16, and
//   GemmAmxBf16Decode multiplies the weights, as A tiles, by them.
// - packed w, written by each call for its column chunk and k slice: for column tile ct
//   (16 weight rows) and k step s, one B tile of 16 rows (k pairs) x 16 columns x 2 bf16.
//   (GemmAmxBf16Decode packs none: its A tiles are 16 weight rows read where they lie.)

inline constexpr int64_t kAmxTileRows = 16;  // rows of an A or C tile, columns of a C tile
inline constexpr int64_t kAmxStepK = 32;     // k per A tile row (32 bf16 = 64 bytes)
inline constexpr int kAmxMaxTerms = 3;       // bf16 terms of each x, at most
inline constexpr int64_t kAmxTileBf16 = kAmxTileRows * kAmxStepK;  // 512 bf16 = 1 KiB
// A call works in chunks of kAmxChunkCols weight rows x kAmxChunkRows x rows (the backend's
// tiles are exactly one chunk) and k slices of kAmxSliceSteps steps: the slice's B tiles
// (32 x 8 KiB) and the chunk's C staging (512 KiB) are the call's scratch. A slice's A tiles
// (the x terms of 256 rows, 384 KiB) come from beyond L2 once and are then read by every column
// pair of the chunk from L2: 16 pairs at 512 columns; at 128 columns (4 pairs) the first reads
// cost the Gemm ~1.4x on a Xeon with AMX.
inline constexpr int64_t kAmxChunkCols = 512;
inline constexpr int64_t kAmxChunkRows = 256;
inline constexpr int64_t kAmxSliceSteps = 8;

inline int64_t AmxRoundUp(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// Round-to-nearest-even f32 -> bf16 bits, and back. The split below never feeds them a NaN
// (non-finite x is handled before).
inline uint16_t AmxBf16Bits(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float AmxBf16Value(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// x = hi + mid + lo. A finite x whose hi would round to infinity (|x| near FLT_MAX) takes the
// truncated hi instead, so every term stays finite; a non-finite x is carried by hi alone (a NaN
// keeps its quiet bit).
inline void AmxSplit(float v, uint16_t out[3]) {
  uint32_t u;
  __builtin_memcpy(&u, &v, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) {
    out[0] = static_cast<uint16_t>((u >> 16) | ((u & 0x007fffffu) != 0 ? 0x0040u : 0u));
    out[1] = out[2] = 0;
    return;
  }
  uint16_t hi = AmxBf16Bits(v);
  if ((hi & 0x7f80u) == 0x7f80u) hi = static_cast<uint16_t>(u >> 16);
  const float r1 = v - AmxBf16Value(hi);  // exact: r1 has at most 16 significant bits
  const uint16_t mid = AmxBf16Bits(r1);
  const float r2 = r1 - AmxBf16Value(mid);  // exact
  out[0] = hi;
  out[1] = mid;
  out[2] = AmxBf16Bits(r2);
}

// Gemms of at most this many x rows in all (decode batches) store packed x transposed and take
// GemmAmxBf16Decode; calls of at most this many rows of a larger Gemm take GemmAmxBf16FewRows.
inline constexpr int64_t kAmxFewRows = 64;

// The 16 x 16 32-bit words of a tile (16 rows of 64 bytes) transposed in place.
inline void AmxTransposeTileWords(uint16_t* tile) {
  uint32_t in[kAmxTileRows][kAmxTileRows], out[kAmxTileRows][kAmxTileRows];
  __builtin_memcpy(in, tile, sizeof(in));
  for (int64_t r = 0; r < kAmxTileRows; ++r) {
    for (int64_t p = 0; p < kAmxTileRows; ++p) out[p][r] = in[r][p];
  }
  __builtin_memcpy(tile, out, sizeof(out));
}

// Rows [row_begin, row_end) of packed x (row_end may run past n into the zero padding, up to
// AmxRoundUp(n, 32)). x [n, k] f32 row-major. For n <= kAmxFewRows the tiles are transposed, so
// row_begin and row_end must then be multiples of 16 (whole tiles).
template <int kTerms>
inline void PackXBf16(const float* x, int64_t n, int64_t k, int64_t row_begin, int64_t row_end,
                      uint16_t* packed) {
  const int64_t steps = AmxRoundUp(k, kAmxStepK) / kAmxStepK;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t rt = r / kAmxTileRows, rr = r % kAmxTileRows;
    for (int64_t s = 0; s < steps; ++s) {
      uint16_t* tiles = packed + (rt * steps + s) * kTerms * kAmxTileBf16 + rr * kAmxStepK;
      for (int64_t j = 0; j < kAmxStepK; ++j) {
        const int64_t kk = s * kAmxStepK + j;
        uint16_t t[3] = {0, 0, 0};
        if (r < n && kk < k) AmxSplit(x[r * k + kk], t);
        for (int term = 0; term < kTerms; ++term) tiles[term * kAmxTileBf16 + j] = t[term];
      }
    }
  }
  if (n <= kAmxFewRows) {
    for (int64_t i = row_begin / kAmxTileRows * steps * kTerms;
         i < row_end / kAmxTileRows * steps * kTerms; ++i) {
      AmxTransposeTileWords(packed + i * kAmxTileBf16);
    }
  }
}

// B tiles of weight rows [c0, c0 + nc) (ctiles column tiles, zero past nc) and k steps
// [s0, s0 + ns): tile (ct, s - s0) at bp + (ct * kAmxSliceSteps + s - s0) * 256 words; word
// [p][j] holds w[c0 + 16 ct + j] at k = 32 s + 2p (low half) and 2p + 1 (high half).
inline void PackWBf16(const uint16_t* w, int64_t k, int64_t c0, int64_t nc, int64_t ctiles,
                      int64_t s0, int64_t ns, uint32_t* bp) {
  for (int64_t ct = 0; ct < ctiles; ++ct) {
    for (int64_t j = 0; j < kAmxTileRows; ++j) {
      const int64_t col = ct * kAmxTileRows + j;
      const uint16_t* row = col < nc ? w + (c0 + col) * k : w;
      for (int64_t s = 0; s < ns; ++s) {
        uint32_t* tile = bp + (ct * kAmxSliceSteps + s) * kAmxTileRows * kAmxTileRows;
        const int64_t kb = (s0 + s) * kAmxStepK;
        if (col >= nc) {
          for (int64_t p = 0; p < kAmxTileRows; ++p) tile[p * kAmxTileRows + j] = 0;
        } else if (kb + kAmxStepK <= k) {
          for (int64_t p = 0; p < kAmxTileRows; ++p) {
            uint32_t pair;
            __builtin_memcpy(&pair, row + kb + 2 * p, 4);
            tile[p * kAmxTileRows + j] = pair;
          }
        } else {
          for (int64_t p = 0; p < kAmxTileRows; ++p) {
            const int64_t k0 = kb + 2 * p;
            const uint32_t lo = k0 < k ? row[k0] : 0u, hi = k0 + 1 < k ? row[k0 + 1] : 0u;
            tile[p * kAmxTileRows + j] = lo | (hi << 16);
          }
        }
      }
    }
  }
}

// Scratch floats one call needs: the C staging of a chunk and the B tiles of a slice.
inline constexpr int64_t kAmxStagingFloats = kAmxChunkRows * kAmxChunkCols;
inline constexpr int64_t kAmxBTilesWords =
    (kAmxChunkCols / kAmxTileRows) * kAmxSliceSteps * kAmxTileRows * kAmxTileRows;

// C tiles 0-3 of a 2 x 2 block loaded from (kStore false) or stored to a staging: tile 0 at c,
// 1 at c + 16, 2 at c_lower, 3 at c_lower + 16 (rows lds bytes apart).
template <class T, bool kStore>
inline void AmxMoveC(float* c, float* c_lower, int64_t lds) {
  auto move = [&]<int kT>(float* p) {
    if constexpr (kStore) {
      T::template Store<kT>(p, lds);
    } else {
      T::template Load<kT>(p, lds);
    }
  };
  move.template operator()<0>(c);
  move.template operator()<1>(c + kAmxTileRows);
  move.template operator()<2>(c_lower);
  move.template operator()<3>(c_lower + kAmxTileRows);
}
// C tiles 0-3 cleared (every element +0.0f).
template <class T>
inline void AmxZeroC() {
  T::template Zero<0>();
  T::template Zero<1>();
  T::template Zero<2>();
  T::template Zero<3>();
}
// The block's four products: C0 += A4 B6, C1 += A4 B7, C2 += A5 B6, C3 += A5 B7.
template <class T>
inline void AmxDot2x2() {
  T::template Dot<0, 4, 6>();
  T::template Dot<1, 4, 7>();
  T::template Dot<2, 5, 6>();
  T::template Dot<3, 5, 7>();
}

// One 2 x 2 block of C tiles, 32 x rows by 32 weight rows at c (rows lds bytes apart), plus the
// products of ns k steps: x row tiles a0, a1 (kTerms terms per step, PackXBf16's layout) against
// the B tiles b0, b1 (one per step). C goes from c into the tiles and back.
template <class T, int kTerms>
inline void AmxBlock(float* c, int64_t lds, const uint16_t* a0, const uint16_t* a1,
                     const uint32_t* b0, const uint32_t* b1, int64_t ns) {
  constexpr int64_t kTileStride = kAmxStepK * 2;  // 64 bytes per A / B tile row
  constexpr int64_t kBTileWords = kAmxTileRows * kAmxTileRows;
  float* c_lower = c + kAmxTileRows * (lds / static_cast<int64_t>(sizeof(float)));
  AmxMoveC<T, false>(c, c_lower, lds);
  for (int64_t s = 0; s < ns; ++s) {
    T::template Load<6>(b0 + s * kBTileWords, kTileStride);
    T::template Load<7>(b1 + s * kBTileWords, kTileStride);
    for (int term = 0; term < kTerms; ++term) {
      const int64_t at = (s * kTerms + term) * kAmxTileBf16;
      T::template Load<4>(a0 + at, kTileStride);
      T::template Load<5>(a1 + at, kTileStride);
      AmxDot2x2<T>();
    }
  }
  AmxMoveC<T, true>(c, c_lower, lds);
}

// out rows [r0, r0 + nr) and columns [c0, c0 + nc) = a C staging + bias, where out[r0 + i][c0 + j]
// is staging[i * row_stride + j * col_stride] (col_stride 1 for x rows by weight rows; the decode
// loop's weight rows by x rows are read transposed).
inline void AmxWriteOut(const float* staging, int64_t row_stride, int64_t col_stride, int64_t nr,
                        int64_t nc, const float* bias, float* out, int64_t ldo, int64_t r0,
                        int64_t c0) {
  for (int64_t i = 0; i < nr; ++i) {
    const float* src = staging + i * row_stride;
    float* dst = out + (r0 + i) * ldo + c0;
    for (int64_t j = 0; j < nc; ++j) {
      dst[j] = src[j * col_stride] + (bias != nullptr ? bias[c0 + j] : 0.0f);
    }
  }
}

// The decode loops' write-out: staging c[j * cs + i] holds weight row c0 + j by x row r0 + i, so
// out[r0 + i][c0 + j] = c[j * cs + i] + bias (AmxWriteOut with the staging read transposed). The
// tiles' version transposes 16 x 16 blocks in registers; both add the same numbers.
inline void AmxWriteOutTransposed(const float* c, int64_t cs, int64_t nr, int64_t nc,
                                  const float* bias, float* out, int64_t ldo, int64_t r0,
                                  int64_t c0) {
  AmxWriteOut(c, 1, cs, nr, nc, bias, out, ldo, r0, c0);
}

// Scratch floats GemmAmxBf16FewRows uses for k / 32 = steps: the B tiles of two column tiles for
// the whole k, then a 32 x 32 C staging.
inline constexpr int64_t AmxFewRowsScratchFloats(int64_t steps) {
  return 2 * steps * kAmxTileRows * kAmxTileRows + 4 * kAmxTileRows * kAmxTileRows;
}

// GemmAmxBf16 for a call of at most kAmxFewRows x rows of a larger Gemm. With so few rows every w
// tile feeds only 3-12 tile products, and the slice-by-slice packing of the general loop (each
// slice reads 512 weight rows' lines from DRAM, then computes) leaves the reads and the products
// apart. Here each pair of 16-row column tiles is packed for the whole k (32 weight rows read front
// to back, streams the hardware prefetcher follows) and every row pair then runs all k steps with C
// in the tile registers. The products are the general loop's in the same order (steps, then terms),
// so the outputs are the same bits. Needs AmxFewRowsScratchFloats(steps) of scratch (GemmAmxBf16
// checks).
template <class T, int kTerms>
void GemmAmxBf16FewRows(const uint16_t* packed_x, int64_t k, int64_t x_begin, int64_t x_end,
                        const uint16_t* w, const float* bias, float* out, int64_t ldo,
                        int64_t row_begin, int64_t row_end, float* scratch) {
  const int64_t steps = AmxRoundUp(k, kAmxStepK) / kAmxStepK;
  constexpr int64_t kBTileWords = kAmxTileRows * kAmxTileRows;
  constexpr int64_t kLds = 2 * kAmxTileRows * sizeof(float);  // the 32 x 32 staging
  const int64_t row_tile_bf16 = steps * kTerms * kAmxTileBf16;
  uint32_t* b0 = reinterpret_cast<uint32_t*>(scratch);
  uint32_t* b1 = b0 + steps * kBTileWords;
  float* c = scratch + 2 * steps * kBTileWords;
  const int64_t rtiles = AmxRoundUp(x_end - x_begin, 2 * kAmxTileRows) / kAmxTileRows;
  T::Configure();
  for (int64_t c0 = row_begin; c0 < row_end; c0 += 2 * kAmxTileRows) {
    const int64_t nc = row_end - c0 < 2 * kAmxTileRows ? row_end - c0 : 2 * kAmxTileRows;
    T::PackW(w, k, c0, nc, 1, 0, steps, b0);
    T::PackW(w, k, c0 + kAmxTileRows, nc - kAmxTileRows, 1, 0, steps, b1);
    for (int64_t rt = 0; rt < rtiles; rt += 2) {
      for (int64_t i = 0; i < 4 * kAmxTileRows * kAmxTileRows; ++i) c[i] = 0.0f;
      const uint16_t* a0 = packed_x + (x_begin / kAmxTileRows + rt) * row_tile_bf16;
      AmxBlock<T, kTerms>(c, kLds, a0, a0 + row_tile_bf16, b0, b1, steps);
      const int64_t r0 = x_begin + rt * kAmxTileRows;
      const int64_t nr = x_end - r0 < 2 * kAmxTileRows ? x_end - r0 : 2 * kAmxTileRows;
      AmxWriteOut(c, 2 * kAmxTileRows, 1, nr, nc, bias, out, ldo, r0, c0);
    }
  }
  T::Release();
}

// Scratch floats GemmAmxBf16Decode uses: a 32 x 32 C staging and one k step of 32 weight rows.
inline constexpr int64_t kAmxDecodeScratchFloats =
    4 * kAmxTileRows * kAmxTileRows + 2 * kAmxTileRows * kAmxStepK / 2;

// Weight rows [c0, c0 + nc) (nc <= 32) at k step s as two A tiles at dst (32 rows of 32 bf16,
// zero past nc and past k).
inline void AmxCopyWStep(const uint16_t* w, int64_t k, int64_t c0, int64_t nc, int64_t s,
                         uint16_t* dst) {
  for (int64_t j = 0; j < 2 * kAmxTileRows; ++j) {
    for (int64_t e = 0; e < kAmxStepK; ++e) {
      const int64_t kk = s * kAmxStepK + e;
      dst[j * kAmxStepK + e] = j < nc && kk < k ? w[(c0 + j) * k + kk] : uint16_t{0};
    }
  }
}

// GemmAmxBf16Decode for a call of 33 to 64 x rows (3 or 4 x tiles): one 16-row weight A tile
// against every x tile, C tiles 0-3 one per x tile, so each weight tile is loaded once and each
// x tile once per product. (The 2 x 2 blocks below load a weight pair once per pair of x tiles,
// from L2 the second time.) amx_decode_probe's "1 x 4" against "natural-A" at m = 5632, k =
// 2048, 64 x rows, 2 threads on a Xeon with AMX: 23.3-23.5 against 19.6-19.7 GB/s of weights at
// one term of x, 17.8 against 15.1 at two, 13.3 against 13.1 at three; 48 x rows: 24.5 against
// 20.2 at one term, 15.4 against 15.5 at three. Each output element gets the same products in
// the same order (steps, then terms, then the pairs of a step), so the same bits.
template <class T, int kTerms>
void GemmAmxBf16DecodeWide(const uint16_t* packed_x, int64_t k, int64_t x_begin, int64_t x_end,
                           const uint16_t* w, const float* bias, float* out, int64_t ldo,
                           int64_t row_begin, int64_t row_end, float* scratch) {
  const int64_t steps = AmxRoundUp(k, kAmxStepK) / kAmxStepK, whole = k / kAmxStepK;
  constexpr int64_t kTileStride = kAmxStepK * 2;
  constexpr int64_t kLds = 4 * kAmxTileRows * sizeof(float);  // 16 weight rows x 64 x rows
  const int64_t row_tile_bf16 = steps * kTerms * kAmxTileBf16;
  const int64_t w_stride = k * 2;
  const int64_t nr = x_end - x_begin, xtiles = (nr + kAmxTileRows - 1) / kAmxTileRows;
  float* c = scratch;  // c[j * 64 + i]: weight row c0 + j, x row x_begin + i
  uint16_t* w_step = reinterpret_cast<uint16_t*>(scratch + 4 * kAmxTileRows * kAmxTileRows);
  const uint16_t* b = packed_x + x_begin / kAmxTileRows * row_tile_bf16;
  T::Configure();
  for (int64_t c0 = row_begin; c0 < row_end; c0 += kAmxTileRows) {
    const int64_t nc = row_end - c0 < kAmxTileRows ? row_end - c0 : kAmxTileRows;
    const uint16_t* w0 = w + c0 * k;
    AmxZeroC<T>();
    for (int64_t s = 0; s < steps; ++s) {
      if (nc == kAmxTileRows && s < whole) {
        T::template Load<4>(w0 + s * kAmxStepK, w_stride);
      } else {
        AmxCopyWStep(w, k, c0, nc, s, w_step);
        T::template Load<4>(w_step, kTileStride);
      }
      for (int term = 0; term < kTerms; ++term) {
        const uint16_t* bt = b + (s * kTerms + term) * kAmxTileBf16;
        T::template Load<6>(bt, kTileStride);
        T::template Dot<0, 4, 6>();
        T::template Load<7>(bt + row_tile_bf16, kTileStride);
        T::template Dot<1, 4, 7>();
        T::template Load<6>(bt + 2 * row_tile_bf16, kTileStride);
        T::template Dot<2, 4, 6>();
        if (xtiles == 4) {
          T::template Load<7>(bt + 3 * row_tile_bf16, kTileStride);
          T::template Dot<3, 4, 7>();
        }
      }
    }
    T::template Store<0>(c, kLds);
    T::template Store<1>(c + kAmxTileRows, kLds);
    T::template Store<2>(c + 2 * kAmxTileRows, kLds);
    T::template Store<3>(c + 3 * kAmxTileRows, kLds);
    T::WriteOutTransposed(c, 4 * kAmxTileRows, nr, nc, bias, out, ldo, x_begin, c0);
  }
  T::Release();
}

// GemmAmxBf16 for a Gemm of at most kAmxFewRows x rows in all (decode batches), with x packed
// transposed (PackXBf16). The roles of the general loop are swapped: 16 weight rows form an A
// tile as they lie in w (a tile load takes their 64-byte pieces k * 2 bytes apart), the x terms
// are the B tiles, and C holds weight rows by x rows. No w is packed (only a group of fewer than
// 32 rows at the end of the range, and a last step that runs past k, are copied with zeros into
// whole tiles), so the weights go from memory straight into the tile loads, and the per-call
// transposes that the other loops spend a third of their time on at 64 rows are gone. Every
// output element gets the same products in the same order as in the general loop (steps, then
// terms, then the pairs of a step), so the outputs are the same bits. A call of more than 32 x
// rows takes GemmAmxBf16DecodeWide instead. Needs kAmxDecodeScratchFloats of scratch.
template <class T, int kTerms>
void GemmAmxBf16Decode(const uint16_t* packed_x, int64_t k, int64_t x_begin, int64_t x_end,
                       const uint16_t* w, const float* bias, float* out, int64_t ldo,
                       int64_t row_begin, int64_t row_end, float* scratch) {
  if (x_end - x_begin > 2 * kAmxTileRows) {
    return GemmAmxBf16DecodeWide<T, kTerms>(packed_x, k, x_begin, x_end, w, bias, out, ldo,
                                            row_begin, row_end, scratch);
  }
  const int64_t steps = AmxRoundUp(k, kAmxStepK) / kAmxStepK, whole = k / kAmxStepK;
  constexpr int64_t kTileStride = kAmxStepK * 2;
  constexpr int64_t kC = 2 * kAmxTileRows;      // the staging's side
  constexpr int64_t kLds = kC * sizeof(float);  // and its row stride in bytes
  const int64_t row_tile_bf16 = steps * kTerms * kAmxTileBf16;
  const int64_t w_stride = k * 2;
  float* c = scratch;
  float* c_lower = c + kAmxTileRows * kC;
  uint16_t* w_step = reinterpret_cast<uint16_t*>(scratch + kC * kC);
  const int64_t rtiles = AmxRoundUp(x_end - x_begin, 2 * kAmxTileRows) / kAmxTileRows;
  T::Configure();
  for (int64_t c0 = row_begin; c0 < row_end; c0 += kC) {
    const int64_t nc = row_end - c0 < kC ? row_end - c0 : kC;
    const uint16_t* w0 = w + c0 * k;
    for (int64_t rt = 0; rt < rtiles; rt += 2) {
      AmxZeroC<T>();
      const int64_t r0 = x_begin + rt * kAmxTileRows;
      const int64_t nr = x_end - r0 < kC ? x_end - r0 : kC;
      const uint16_t* b0 = packed_x + (x_begin / kAmxTileRows + rt) * row_tile_bf16;
      const uint16_t* b1 = b0 + row_tile_bf16;
      // At most 16 x rows left: their padding tile would only multiply zeros.
      const bool half = nr <= kAmxTileRows;
      for (int64_t s = 0; s < steps; ++s) {
        if (nc == kC && s < whole) {
          T::template Load<4>(w0 + s * kAmxStepK, w_stride);
          T::template Load<5>(w0 + kAmxTileRows * k + s * kAmxStepK, w_stride);
        } else {
          AmxCopyWStep(w, k, c0, nc, s, w_step);
          T::template Load<4>(w_step, kTileStride);
          T::template Load<5>(w_step + kAmxTileBf16, kTileStride);
        }
        for (int term = 0; term < kTerms; ++term) {
          const int64_t bt = (s * kTerms + term) * kAmxTileBf16;
          T::template Load<6>(b0 + bt, kTileStride);
          if (half) {
            T::template Dot<0, 4, 6>();
            T::template Dot<2, 5, 6>();
            continue;
          }
          T::template Load<7>(b1 + bt, kTileStride);
          AmxDot2x2<T>();
        }
      }
      AmxMoveC<T, true>(c, c_lower, kLds);
      // c[j][i]: weight row c0 + j, x row r0 + i.
      T::WriteOutTransposed(c, kC, nr, nc, bias, out, ldo, r0, c0);
    }
  }
  T::Release();
}

// Rows [row_begin, row_end) of out = x @ w^T + bias for the x rows [x_begin, x_end), x given as
// PackXBf16<kTerms> wrote it for all n rows. x_begin must be a multiple of 32. scratch:
// kAmxStagingFloats + kAmxBTilesWords floats. Tile loads take any address, but packed_x and
// scratch should be 64-byte aligned: a tile row that splits two cache lines halves the speed.
template <class T, int kTerms>
void GemmAmxBf16(const uint16_t* packed_x, int64_t n, int64_t k, int64_t x_begin, int64_t x_end,
                 const uint16_t* w, const float* bias, float* out, int64_t ldo, int64_t row_begin,
                 int64_t row_end, float* scratch) {
  static_assert(kAmxDecodeScratchFloats <= kAmxStagingFloats + kAmxBTilesWords);
  if (n <= kAmxFewRows) {
    return GemmAmxBf16Decode<T, kTerms>(packed_x, k, x_begin, x_end, w, bias, out, ldo, row_begin,
                                        row_end, scratch);
  }
  const int64_t steps = AmxRoundUp(k, kAmxStepK) / kAmxStepK;
  if (x_end - x_begin <= kAmxFewRows &&
      AmxFewRowsScratchFloats(steps) <= kAmxStagingFloats + kAmxBTilesWords) {
    return GemmAmxBf16FewRows<T, kTerms>(packed_x, k, x_begin, x_end, w, bias, out, ldo, row_begin,
                                         row_end, scratch);
  }
  float* staging = scratch;
  uint32_t* bp = reinterpret_cast<uint32_t*>(scratch + kAmxStagingFloats);
  constexpr int64_t kLds = kAmxChunkCols * sizeof(float);  // staging row stride in bytes
  constexpr int64_t kBTileWords = kAmxTileRows * kAmxTileRows;
  const int64_t row_tile_bf16 = steps * kTerms * kAmxTileBf16;  // one row tile of packed x
  T::Configure();
  for (int64_t c0 = row_begin; c0 < row_end; c0 += kAmxChunkCols) {
    const int64_t nc = row_end - c0 < kAmxChunkCols ? row_end - c0 : kAmxChunkCols;
    const int64_t ctiles = AmxRoundUp(nc, 2 * kAmxTileRows) / kAmxTileRows;
    for (int64_t r0 = x_begin; r0 < x_end; r0 += kAmxChunkRows) {
      const int64_t nr = x_end - r0 < kAmxChunkRows ? x_end - r0 : kAmxChunkRows;
      const int64_t rtiles = AmxRoundUp(nr, 2 * kAmxTileRows) / kAmxTileRows;
      for (int64_t i = 0; i < rtiles * kAmxTileRows * kAmxChunkCols; ++i) staging[i] = 0.0f;
      for (int64_t s0 = 0; s0 < steps; s0 += kAmxSliceSteps) {
        const int64_t ns = steps - s0 < kAmxSliceSteps ? steps - s0 : kAmxSliceSteps;
        T::PackW(w, k, c0, nc, ctiles, s0, ns, bp);
        // The B tiles of one column pair stay in L1 while the row pairs stream past them.
        for (int64_t ct = 0; ct < ctiles; ct += 2) {
          const uint32_t* b0 = bp + ct * kAmxSliceSteps * kBTileWords;
          const uint32_t* b1 = b0 + kAmxSliceSteps * kBTileWords;
          for (int64_t rt = 0; rt < rtiles; rt += 2) {
            const uint16_t* a0 =
                packed_x + (r0 / kAmxTileRows + rt) * row_tile_bf16 + s0 * kTerms * kAmxTileBf16;
            AmxBlock<T, kTerms>(staging + rt * kAmxTileRows * kAmxChunkCols + ct * kAmxTileRows,
                                kLds, a0, a0 + row_tile_bf16, b0, b1, ns);
          }
        }
      }
      AmxWriteOut(staging, kAmxChunkCols, 1, nr, nc, bias, out, ldo, r0, c0);
    }
  }
  T::Release();
}

// GemmAmxBf16<T, terms> for a run-time count of terms (1, 2 or 3; anything else is taken as 3),
// as the kernel table's entry takes it.
template <class T>
void GemmAmxBf16Terms(int terms, const uint16_t* packed_x, int64_t n, int64_t k, int64_t x_begin,
                      int64_t x_end, const uint16_t* w, const float* bias, float* out, int64_t ldo,
                      int64_t row_begin, int64_t row_end, float* scratch) {
  switch (terms) {
    case 1:
      return GemmAmxBf16<T, 1>(packed_x, n, k, x_begin, x_end, w, bias, out, ldo, row_begin,
                               row_end, scratch);
    case 2:
      return GemmAmxBf16<T, 2>(packed_x, n, k, x_begin, x_end, w, bias, out, ldo, row_begin,
                               row_end, scratch);
    default:
      return GemmAmxBf16<T, 3>(packed_x, n, k, x_begin, x_end, w, bias, out, ldo, row_begin,
                               row_end, scratch);
  }
}
