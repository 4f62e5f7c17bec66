// The AMX-INT8 prefill Gemms of the interleaved Q8_0, Q4_K and Q5_K copies (kernels.h) and of
// Q4_0 / Q4_1 weights in the file's layout (below), written against a tile-operations class T as
// amx_gemm_impl.h is. No include guard and no includes: its users,
// kernels_avx512vnni.cc (T = HwInt8Tiles) and the conformance suite's software model of the tiles
// (tests/engine/backend/amx_int8_emulated.cc), include it inside their x16 namespace after
// defining T and including x16_vector_impl.h (Load512, BytesTimes, UnpackScales). Its bits are
// tested against the VNNI kernels' (QuantizedGemmIsaTest in the conformance suite) on the model
// wherever the CPU has AVX512_VNNI, and on the unit where it has AMX-INT8.
//
// T provides, for tiles configured as kAmxInt8TileConfig says (C 0-3: 16 rows x 16 int32; A 4-5:
// 16 rows x 32 int8; B 6-7: 8 rows x 64 uint8):
//   static void Configure(); static void Release();
//   template <int kT> static void Zero();
//   template <int kT> static void Load(const void* base, int64_t stride);
//   template <int kT> static void Store(void* base, int64_t stride);
//   template <int kC, int kA, int kB> static void Dot();  // TDPBSUD: C += A (s8) . B (u8)
// Dot's contract (Intel SDM, TDPBSUD): C[m][n] += sum over p < 8 and i < 4 of
// A[m][4 p + i] * B[p][4 n + i], A signed and B unsigned bytes, in exact int32 arithmetic.
//
// The plan. A 64-byte level vector of the interleaved layouts holds 4 levels of each of 16 weight
// rows, one row per 32-bit lane: that is exactly a row of a B tile. So the 8 vectors of one
// 32-element block (Q8_0) or sub-block (Q4_K) are a B tile as they lie in the copy (Q4_K's after
// masking one nibble), and 16 x rows of the quantized activations' 32 bytes of that block are an
// A tile (row stride k). One TDPBSUD gives the exact integer sums of the block for 16 x rows by 16
// weight rows; a step runs 2 x 2 of them (32 x rows by two row groups). The f32 work after each
// block is the VNNI kernels' own, operation for operation (kernels_avx512vnni.cc, namespace x16):
// per x row and weight row, Q8_0: acc += (d_w * da[b]) * (isum - 128 * (sum of the block's
// activations)); Q4_K: acc += (d * sc[s] * da[b]) * isum and acc_min -= (dmin * mn[s]) * ds[b],
// high sub-blocks with the levels 16 times their value (the nibble in place) against d / 16.
// Integer sums are exact whichever unit forms them, so every output has the VNNI kernels' bits,
// and an x row's result does not depend on the rows beside it. 16 to 31 x rows left after the
// whole steps take a half step (NA = 1: 16 x rows by two row groups, C 0-1 and A 4 only); fewer
// x rows, and weight rows that do not fill a step, are left to the VNNI kernels.

inline constexpr int64_t kAmxInt8XRows = 32;  // x rows per step: two A tiles
inline constexpr int64_t kAmxInt8WRows = 32;  // weight rows per step: two row groups
inline constexpr int64_t kAmxInt8HalfXRows = 16;  // x rows of a half step: one A tile

// Row i of the int32 C tile `c` plus `corr` (Q8_0's correction; 0 for the other types, where
// the add folds away), as f32 (exact: |sum| < 2^24).
inline __m512 AmxInt8RowF32(const int32_t* c, int i, int32_t corr) {
  return _mm512_cvtepi32_ps(
      _mm512_add_epi32(_mm512_load_si512(c + 16 * i), _mm512_set1_epi32(corr)));
}

// The VNNI kernels' f32 update of one block: acc + (scale * da) * sum (scale: the weight rows'
// block scale, da: the x row's; sum: the block's exact integer sums as f32).
inline __m512 AmxInt8BlockUpdate(__m512 acc, __m512 scale, float da, __m512 sum) {
  return _mm512_fmadd_ps(_mm512_mul_ps(scale, _mm512_set1_ps(da)), sum, acc);
}

// The products of one block into C 0 .. 2 NA - 1 (C tile t: A tile t / 2, B tile t % 2): NA A
// tiles at x rows xa (stride k), B tiles at wb0 and wb1 (stride 64). A full step has NA = 2 (32
// x rows), a half step NA = 1 (16 x rows: C 0-1, A 4).
template <class T, int NA>
inline void AmxInt8Issue(const int8_t* xa, int64_t k, const uint8_t* wb0, const uint8_t* wb1) {
  T::template Zero<0>();
  T::template Zero<1>();
  if constexpr (NA == 2) {
    T::template Zero<2>();
    T::template Zero<3>();
  }
  __asm__ volatile("" ::: "memory");  // stores of the B tiles' bytes before the tile loads
  T::template Load<4>(xa, k);
  if constexpr (NA == 2) T::template Load<5>(xa + 16 * k, k);
  T::template Load<6>(wb0, 64);
  T::template Load<7>(wb1, 64);
  T::template Dot<0, 4, 6>();
  T::template Dot<1, 4, 7>();
  if constexpr (NA == 2) {
    T::template Dot<2, 5, 6>();
    T::template Dot<3, 5, 7>();
  }
}

template <class T, int NA>
inline void AmxInt8StoreC(int32_t (*c)[256]) {
  T::template Store<0>(c[0], 64);
  T::template Store<1>(c[1], 64);
  if constexpr (NA == 2) {
    T::template Store<2>(c[2], 64);
    T::template Store<3>(c[3], 64);
  }
  __asm__ volatile("" ::: "memory");  // the tile stores' asm does not say that it writes c
}

// out[x, r0 + 16 g + j] = acc + bias (+ acc_min) for the step's 16 NA x rows from x0.
template <int NA>
inline void AmxInt8WriteOut(const float (*acc)[256], const float (*acc_min)[256], const float* bias,
                            float* out, int64_t ldo, int64_t x0, int64_t r0) {
  for (int t = 0; t < 2 * NA; ++t) {
    const int64_t col = r0 + 16 * (t % 2);
    const __m512 bv = bias != nullptr ? _mm512_loadu_ps(bias + col) : _mm512_setzero_ps();
    for (int i = 0; i < 16; ++i) {
      const int64_t x = x0 + 16 * (t / 2) + i;
      __m512 v = _mm512_load_ps(acc[t] + 16 * i);
      if (acc_min != nullptr) v = _mm512_add_ps(v, _mm512_load_ps(acc_min[t] + 16 * i));
      _mm512_storeu_ps(out + x * ldo + col, _mm512_add_ps(v, bv));
    }
  }
}

// The gathers' offsets of 16 consecutive rows nb elements apart: lane i holds i * nb.
inline __m512i AmxInt8RowOffsets(int64_t nb) {
  return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                            _mm512_set1_epi32(static_cast<int32_t>(nb)));
}

// Per-row values of block b for the step's 16 NA x rows from x0 ([x, b] at x * nb + b), gathered
// into dst[0 .. 16 NA) so that the f32 work broadcasts them from fixed offsets.
template <int NA>
inline void AmxInt8GatherRows(const float* v, int64_t nb, int64_t x0, int64_t b, float* dst) {
  const __m512i index = AmxInt8RowOffsets(nb);
  const float* base = v + x0 * nb + b;
  _mm512_store_ps(dst, _mm512_i32gather_ps(index, base, 4));
  if constexpr (NA == 2) _mm512_store_ps(dst + 16, _mm512_i32gather_ps(index, base + 16 * nb, 4));
}

// -128 times the sum of block b's activations (its two 16-element sums) for the step's 16 NA x
// rows.
template <int NA>
inline void AmxInt8GatherCorrections(const int16_t* sum16, int64_t nb, int64_t x0, int64_t b,
                                     int32_t* dst) {
  const __m512i index = AmxInt8RowOffsets(nb);  // int32 pairs: rows are nb pairs apart
  const int16_t* base = sum16 + x0 * 2 * nb + 2 * b;
  const __m512i minus128 = _mm512_set1_epi16(-128);
  _mm512_store_si512(dst, _mm512_madd_epi16(_mm512_i32gather_epi32(index, base, 4), minus128));
  if constexpr (NA == 2) {
    _mm512_store_si512(
        dst + 16, _mm512_madd_epi16(_mm512_i32gather_epi32(index, base + 32 * nb, 4), minus128));
  }
}

// One step of the Q8_0 copy: x rows [x0, x0 + 16 NA) by the row groups at wg0 and wg1 (units of
// the whole k), into out (columns r0 .. r0 + 32) with the bias (or zeros). Software-pipelined by
// unit (two blocks): unit u + 1's tile products are issued before unit u's f32 work, so the unit
// and the vector code overlap (a unit's f32 work is more instructions than the reorder window),
// and the f32 work reads the C tiles a whole unit after storing them. The two blocks of a unit
// update each accumulator row in one load and store (the same two FMAs in the same order).
template <class T, int NA>
void AmxInt8StepQ8_0(const QuantizedActs& a, int64_t x0, const uint8_t* wg0, const uint8_t* wg1,
                     const float* bias, float* out, int64_t ldo, int64_t r0) {
  constexpr int kC = 2 * NA;  // C tiles
  const int64_t k = a.k, nb = k / 32, nu = k / kQ8_0X16UnitElems;
  alignas(64) int32_t c[2][2][kC][256];  // [unit parity][block of the unit][tile][16 x 16]
  alignas(64) float acc[kC][256];
  for (int t = 0; t < kC; ++t) {
    for (int i = 0; i < 16; ++i) _mm512_store_ps(acc[t] + 16 * i, _mm512_setzero_ps());
  }
  const uint8_t* wg[2] = {wg0, wg1};
  // Block b's 8 level vectors in a row group's units.
  auto levels = [](const uint8_t* g, int64_t b) {
    return g + b / 2 * kQ8_0X16UnitBytes + 64 + 512 * (b % 2);
  };
  const int8_t* xa = a.q + x0 * k;
  auto issue = [&](int64_t b) {
    AmxInt8Issue<T, NA>(xa + 32 * b, k, levels(wg0, b), levels(wg1, b));
  };
  alignas(64) float da[2][16 * NA];
  alignas(64) int32_t corr[2][16 * NA];
  auto finish = [&](int64_t u) {
    for (int h = 0; h < 2; ++h) {
      AmxInt8GatherRows<NA>(a.d, nb, x0, 2 * u + h, da[h]);
      AmxInt8GatherCorrections<NA>(a.sum16, nb, x0, 2 * u + h, corr[h]);
    }
    for (int t = 0; t < kC; ++t) {
      const int xt = 16 * (t / 2);
      const uint8_t* unit = wg[t % 2] + u * kQ8_0X16UnitBytes;
      const __m512 d0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit)));
      const __m512 d1 =
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit + 32)));
      const int32_t* c0 = c[u % 2][0][t];
      const int32_t* c1 = c[u % 2][1][t];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        __m512 v = _mm512_load_ps(acc[t] + 16 * i);
        v = AmxInt8BlockUpdate(v, d0, da[0][xt + i], AmxInt8RowF32(c0, i, corr[0][xt + i]));
        v = AmxInt8BlockUpdate(v, d1, da[1][xt + i], AmxInt8RowF32(c1, i, corr[1][xt + i]));
        _mm512_store_ps(acc[t] + 16 * i, v);
      }
    }
  };
  issue(0);
  for (int64_t u = 0; u < nu; ++u) {
    AmxInt8StoreC<T, NA>(c[u % 2][0]);
    issue(2 * u + 1);
    AmxInt8StoreC<T, NA>(c[u % 2][1]);
    if (u + 1 < nu) issue(2 * u + 2);
    if (u > 0) finish(u - 1);
  }
  finish(nu - 1);
  AmxInt8WriteOut<NA>(acc, nullptr, bias, out, ldo, x0, r0);
}

// One step of the Q4_K copy (Q5_K's with kQ5), as AmxInt8StepQ8_0's, over 32-element sub-blocks
// b = 8 u + s in pairs (2 p, 2 p + 1): the low and high nibbles of the same level vectors (Q5_K:
// with their fifth bits merged in by Q5Levels, the high sub-block's levels 8 times their value
// against d / 8, as the VNNI kernel takes them).
template <class T, int NA, bool kQ5 = false>
void AmxInt8StepQ4_K(const QuantizedActs& a, int64_t x0, const uint8_t* wg0, const uint8_t* wg1,
                     const float* bias, float* out, int64_t ldo, int64_t r0) {
  constexpr int64_t kUnitBytes = kQ5 ? kQ5KX16UnitBytes : kQ4KX16UnitBytes;
  constexpr int kC = 2 * NA;  // C tiles
  const int64_t k = a.k, nb = k / 32, npairs = nb / 2;
  alignas(64) int32_t c[2][2][kC][256];  // [pair parity][sub-block of the pair][tile][16 x 16]
  alignas(64) float acc[kC][256], acc_min[kC][256];
  for (int t = 0; t < kC; ++t) {
    for (int i = 0; i < 16; ++i) {
      _mm512_store_ps(acc[t] + 16 * i, _mm512_setzero_ps());
      _mm512_store_ps(acc_min[t] + 16 * i, _mm512_setzero_ps());
    }
  }
  // The two groups' levels of one sub-block pair as B tiles: [group][low, high nibbles][8 x 64].
  alignas(64) uint8_t levels[2][2][512];
  alignas(64) uint8_t scales[2][256];
  const uint8_t* wg[2] = {wg0, wg1};
  const int8_t* xa = a.q + x0 * k;
  // Pair p's levels of unit `unit` for one group into lv[0] (low) and lv[1] (high sub-block).
  auto unpack = [&]<int p>(const uint8_t* unit, uint8_t(*lv)[512]) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      __m512i lo, hi;
      X16KLevels<kQ5, p>(unit, j, &lo, &hi);
      _mm512_store_si512(lv[0] + 64 * j, lo);
      _mm512_store_si512(lv[1] + 64 * j, hi);
    }
  };
  // Unpacks pair q's levels (vectors p = q % 4 of unit q / 4) and issues its low sub-block.
  auto issue_low = [&](int64_t q) {
    for (int g = 0; g < 2; ++g) {
      const uint8_t* unit = wg[g] + q / 4 * kUnitBytes;
      switch (q % 4) {
        case 0:
          unpack.template operator()<0>(unit, levels[g]);
          break;
        case 1:
          unpack.template operator()<1>(unit, levels[g]);
          break;
        case 2:
          unpack.template operator()<2>(unit, levels[g]);
          break;
        default:
          unpack.template operator()<3>(unit, levels[g]);
          break;
      }
    }
    AmxInt8Issue<T, NA>(xa + 64 * q, k, levels[0][0], levels[1][0]);
  };
  __m512 d[2], d_hi[2], dmin[2];
  alignas(64) float da[2][16 * NA], ds[2][16 * NA];
  auto finish = [&](int64_t q) {
    const int p = static_cast<int>(q % 4);
    if (p == 0) {
      for (int g = 0; g < 2; ++g) {
        const uint8_t* unit = wg[g] + q / 4 * kUnitBytes;
        UnpackScales(unit, scales[g]);
        d[g] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit)));
        d_hi[g] = _mm512_mul_ps(d[g], _mm512_set1_ps(kQ5 ? 0.125f : 0.0625f));
        dmin[g] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit + 32)));
      }
    }
    for (int h = 0; h < 2; ++h) {
      AmxInt8GatherRows<NA>(a.d, nb, x0, 2 * q + h, da[h]);
      AmxInt8GatherRows<NA>(a.ds, nb, x0, 2 * q + h, ds[h]);
    }
    for (int t = 0; t < kC; ++t) {
      const int g = t % 2;
      const int xt = 16 * (t / 2);
      const __m512 s0 = BytesTimes(scales[g] + 16 * (2 * p), d[g]);
      const __m512 s1 = BytesTimes(scales[g] + 16 * (2 * p + 1), d_hi[g]);
      const __m512 m0 = BytesTimes(scales[g] + 128 + 16 * (2 * p), dmin[g]);
      const __m512 m1 = BytesTimes(scales[g] + 128 + 16 * (2 * p + 1), dmin[g]);
      const int32_t* c0 = c[q % 2][0][t];
      const int32_t* c1 = c[q % 2][1][t];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        __m512 v = _mm512_load_ps(acc[t] + 16 * i);
        v = AmxInt8BlockUpdate(v, s0, da[0][xt + i], AmxInt8RowF32(c0, i, 0));
        v = AmxInt8BlockUpdate(v, s1, da[1][xt + i], AmxInt8RowF32(c1, i, 0));
        _mm512_store_ps(acc[t] + 16 * i, v);
        __m512 vm = _mm512_load_ps(acc_min[t] + 16 * i);
        vm = _mm512_fnmadd_ps(m0, _mm512_set1_ps(ds[0][xt + i]), vm);
        vm = _mm512_fnmadd_ps(m1, _mm512_set1_ps(ds[1][xt + i]), vm);
        _mm512_store_ps(acc_min[t] + 16 * i, vm);
      }
    }
  };
  issue_low(0);
  for (int64_t q = 0; q < npairs; ++q) {
    AmxInt8StoreC<T, NA>(c[q % 2][0]);
    AmxInt8Issue<T, NA>(xa + 64 * q + 32, k, levels[0][1], levels[1][1]);
    AmxInt8StoreC<T, NA>(c[q % 2][1]);
    if (q + 1 < npairs) issue_low(q + 1);
    if (q > 0) finish(q - 1);
  }
  finish(npairs - 1);
  AmxInt8WriteOut<NA>(acc, acc_min, bias, out, ldo, x0, r0);
}

// The part of a QuantGemmFn call that the tiles take, and the rest: x rows in whole steps of 32,
// then one half step of 16 where 16 or more are left (so that a decode batch of 16 to 31 rows
// runs on the tiles too), by weight rows in steps of 32. run(r0, x_full, half) runs weight step
// r0 (whole x steps up to x_full, then the half step if `half`) with the tiles configured; the
// x rows and weight rows left over go to `rest` (the VNNI kernel of the same layout). Which rows
// go where does not change any output: every path gives the VNNI kernels' bits.
template <class T, class Run>
void AmxInt8Split(const QuantizedActs& a, int64_t x_begin, int64_t x_end, const void* w,
                  const float* bias, float* out, int64_t ldo, int64_t row_begin, int64_t row_end,
                  QuantGemmFn rest, Run run) {
  const int64_t x_full = x_begin + (x_end - x_begin) / kAmxInt8XRows * kAmxInt8XRows;
  const bool half = x_end - x_full >= kAmxInt8HalfXRows;
  const int64_t x_mid = half ? x_full + kAmxInt8HalfXRows : x_full;
  const int64_t w_steps = (row_end - row_begin) / kAmxInt8WRows;
  const int64_t row_mid = row_begin + w_steps * kAmxInt8WRows;
  if (x_mid == x_begin || w_steps == 0) {
    return rest(a, x_begin, x_end, w, bias, out, ldo, row_begin, row_end);
  }
  T::Configure();
  for (int64_t r0 = row_begin; r0 < row_mid; r0 += kAmxInt8WRows) run(r0, x_full, half);
  T::Release();
  if (row_mid < row_end) rest(a, x_begin, x_mid, w, bias, out, ldo, row_mid, row_end);
  if (x_mid < x_end) rest(a, x_mid, x_end, w, bias, out, ldo, row_begin, row_end);
}

// A step function: x rows from x0 by the row groups at wg0 and wg1 into out's columns from r0.
using AmxInt8StepFn = void (*)(const QuantizedActs&, int64_t, const uint8_t*, const uint8_t*,
                               const float*, float*, int64_t, int64_t);

// A QuantGemmFn over the interleaved copy with unit bytes kUnitBytes and kUnitElems elements per
// unit: whole steps by kStep (32 x rows), the half step by kHalfStep (16), as AmxInt8Split splits.
template <class T, int64_t kUnitBytes, int64_t kUnitElems, AmxInt8StepFn kStep,
          AmxInt8StepFn kHalfStep>
void AmxInt8Gemm(const QuantizedActs& a, int64_t x_begin, int64_t x_end, const void* w,
                 const float* bias, float* out, int64_t ldo, int64_t row_begin, int64_t row_end,
                 QuantGemmFn rest) {
  const int64_t group_bytes = a.k / kUnitElems * kUnitBytes;
  const uint8_t* wp = static_cast<const uint8_t*>(w);
  AmxInt8Split<T>(a, x_begin, x_end, w, bias, out, ldo, row_begin, row_end, rest,
                  [&](int64_t r0, int64_t x_full, bool half) {
                    const uint8_t* wg0 = wp + r0 / kQ4KX16Rows * group_bytes;
                    for (int64_t x0 = x_begin; x0 < x_full; x0 += kAmxInt8XRows) {
                      kStep(a, x0, wg0, wg0 + group_bytes, bias, out, ldo, r0);
                    }
                    if (half) kHalfStep(a, x_full, wg0, wg0 + group_bytes, bias, out, ldo, r0);
                  });
}

// ---- Q4_0 / Q4_1 in their own row layout ----------------------------------------------------
// These weights keep the file's layout (the row kernels read it at batch 1 faster than an
// interleaved copy would be read), so a call packs each step's 32 weight rows into B tiles for the
// whole k once (AmxInt8PackQ4) and runs every x step of the call against them. The f32 work is
// the panel kernels' (quant_kernels_avx2_impl.h, PanelSlots and FinishRows) operation for
// operation: block b's update goes to accumulator b % 8 of its output (or the ninth, for the
// blocks past the last whole 256-element chunk), blocks in increasing order within each, and the
// nine are summed in HorizontalSum's tree, then the tail, then the bias or zero. So the outputs
// are the VNNI table's bits, and a row's result does not depend on the rows beside it.
// Q4_1: acc = fma(d * da, isum, acc); acc = fma(m, ds, acc). Q4_0: acc = fma(d, da * isum - 8 ds,
// acc) (fmsub, the panel kernels' kKind 3).

inline constexpr int kAmxInt8Q4Slots = 9;

// One thread's packed weights for one step: per block, [group][8 x 64] levels, then [group][16]
// scales d and offsets m (Q4_1) as f32.
struct AmxInt8Q4Pack {
  uint8_t* levels;  // [nb][2][512]
  float* scale;     // [nb][2][16]
  float* offset;    // [nb][2][16]
};

// A per-thread buffer for AmxInt8Q4Pack, grown to the largest k seen, 64-byte aligned (tile loads
// of a split cache line run at half rate).
inline AmxInt8Q4Pack AmxInt8Q4Scratch(int64_t nb) {
  struct Buffer {
    void* data = nullptr;
    int64_t nb = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local Buffer buf;
  constexpr int64_t kBlockBytes = 2 * 512 + 2 * 2 * 16 * 4;
  if (buf.nb < nb) {
    std::free(buf.data);
    buf.data = std::aligned_alloc(64, static_cast<size_t>(nb * kBlockBytes));
    MODSERVE_CHECK(buf.data != nullptr) << "cannot allocate " << nb * kBlockBytes << " bytes";
    buf.nb = nb;
  }
  uint8_t* p = static_cast<uint8_t*>(buf.data);
  return {p, reinterpret_cast<float*>(p + nb * 1024),
          reinterpret_cast<float*>(p + nb * 1024 + nb * 128)};
}

// Packs weight rows [r0, r0 + 32) (row_bytes apart from w) into pack: B tile row p < 4 of block b
// holds levels 4 p .. 4 p + 3 of each of the group's 16 rows (the low nibbles of quant bytes 4 p ..
// 4 p + 3), rows 4 .. 7 the same of the high nibbles (levels 16 + 4 (p - 4) ...), one row per
// 32-bit lane. Blocks are kBlockBytes long, quant bytes from kQs, d at 0 and m (Q4_1) at 2.
template <int64_t kBlockBytes, int64_t kQs>
void AmxInt8PackQ4(const uint8_t* w, int64_t row_bytes, int64_t nb, const AmxInt8Q4Pack& pack) {
  const __m512i rows = AmxInt8RowOffsets(row_bytes);
  const __m512i m0f = _mm512_set1_epi8(0x0f);
  for (int64_t b = 0; b < nb; ++b) {
    for (int g = 0; g < 2; ++g) {
      const uint8_t* base = w + 16 * g * row_bytes + b * kBlockBytes;
      uint8_t* lv = pack.levels + (2 * b + g) * 512;
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p) {
        const __m512i v = _mm512_i32gather_epi32(rows, base + kQs + 4 * p, 1);
        _mm512_store_si512(lv + 64 * p, _mm512_and_si512(v, m0f));
        _mm512_store_si512(lv + 64 * (p + 4), _mm512_and_si512(_mm512_srli_epi32(v, 4), m0f));
      }
      // d in the low 16 bits of each lane, m (Q4_1; Q4_0's quant bytes, unused) in the high.
      const __m512i dm = _mm512_i32gather_epi32(rows, base, 1);
      _mm512_store_ps(pack.scale + (2 * b + g) * 16, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm)));
      _mm512_store_ps(pack.offset + (2 * b + g) * 16,
                      _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16))));
    }
  }
}

// One step over a packed Q4_0 / Q4_1 step: x rows [x0, x0 + 16 NA) by the 32 weight rows in pack,
// into out (columns r0 .. r0 + 32) with the bias (or zeros). The blocks run slot by slot (slot j
// < 8: blocks j, j + 8, ... of the whole chunks; then the tail blocks), two a unit, software-
// pipelined a unit apart as AmxInt8StepQ8_0; a unit whose two blocks share a slot updates each
// accumulator row in one load and store.
template <class T, int NA, bool kHasMin>
void AmxInt8StepQ4(const QuantizedActs& a, int64_t x0, const AmxInt8Q4Pack& pack, const float* bias,
                   float* out, int64_t ldo, int64_t r0) {
  constexpr int kC = 2 * NA;  // C tiles
  const int64_t k = a.k, nb = k / 32, nb_main = k / 256 * 8, chunks = nb_main / 8;
  alignas(64) int32_t c[2][2][kC][256];  // [unit parity][block of the unit][tile][16 x 16]
  // A slot's first update starts from +0 in a register (the panel kernels' zeroed accumulator)
  // instead of a zeroed row in memory; slots 0-7 are zeroed here only when k has no whole chunk.
  alignas(64) float acc[kAmxInt8Q4Slots][kC][256];
  if (nb_main == 0) {
    for (int s = 0; s < 8; ++s) {
      for (int t = 0; t < kC; ++t) {
        for (int i = 0; i < 16; ++i) _mm512_store_ps(acc[s][t] + 16 * i, _mm512_setzero_ps());
      }
    }
  }
  // Position i of the run: its block and slot, and whether it is its slot's first.
  auto block_at = [&](int64_t i) { return i < nb_main ? i / chunks + 8 * (i % chunks) : i; };
  auto slot_at = [&](int64_t i) { return i < nb_main ? static_cast<int>(i / chunks) : 8; };
  auto first_at = [&](int64_t i) { return i < nb_main ? i % chunks == 0 : i == nb_main; };
  const int8_t* xa = a.q + x0 * k;
  auto issue = [&](int64_t i) {
    const int64_t b = block_at(i);
    const uint8_t* lv = pack.levels + 2 * b * 512;
    AmxInt8Issue<T, NA>(xa + 32 * b, k, lv, lv + 512);
  };
  alignas(64) float da[2][16 * NA], ds[2][16 * NA];
  const int64_t nu = (nb + 1) / 2;
  auto finish = [&](int64_t u) {
    const int64_t i0 = 2 * u;
    const bool two = i0 + 1 < nb;
    const int64_t blk[2] = {block_at(i0), two ? block_at(i0 + 1) : 0};
    for (int h = 0; h < (two ? 2 : 1); ++h) {
      AmxInt8GatherRows<NA>(a.d, nb, x0, blk[h], da[h]);
      AmxInt8GatherRows<NA>(a.ds, nb, x0, blk[h], ds[h]);
    }
    const int s0 = slot_at(i0), s1 = two ? slot_at(i0 + 1) : -1;
    // Block h's update of one accumulator row (tile t, row i) of v.
    auto update = [&](int h, int t, int i, __m512 v) {
      const int g = t % 2, xt = 16 * (t / 2);
      const __m512 sc = _mm512_load_ps(pack.scale + (2 * blk[h] + g) * 16);
      const __m512 s = AmxInt8RowF32(c[u % 2][h][t], i, 0);
      if constexpr (kHasMin) {
        v = AmxInt8BlockUpdate(v, sc, da[h][xt + i], s);
        return _mm512_fmadd_ps(_mm512_load_ps(pack.offset + (2 * blk[h] + g) * 16),
                               _mm512_set1_ps(ds[h][xt + i]), v);
      } else {
        return _mm512_fmadd_ps(
            sc,
            _mm512_fmsub_ps(_mm512_set1_ps(da[h][xt + i]), s,
                            _mm512_mul_ps(_mm512_set1_ps(8.0f), _mm512_set1_ps(ds[h][xt + i]))),
            v);
      }
    };
    const bool first0 = first_at(i0), first1 = two && first_at(i0 + 1);
    auto start = [](bool first, const float* row) {
      return first ? _mm512_setzero_ps() : _mm512_load_ps(row);
    };
    for (int t = 0; t < kC; ++t) {
      if (s0 == s1) {
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) {
          float* row = acc[s0][t] + 16 * i;
          _mm512_store_ps(row, update(1, t, i, update(0, t, i, start(first0, row))));
        }
      } else {
        for (int h = 0; h < (two ? 2 : 1); ++h) {
          const int slot = h == 0 ? s0 : s1;
          const bool first = h == 0 ? first0 : first1;
#pragma GCC unroll 16
          for (int i = 0; i < 16; ++i) {
            float* row = acc[slot][t] + 16 * i;
            _mm512_store_ps(row, update(h, t, i, start(first, row)));
          }
        }
      }
    }
  };
  issue(0);
  for (int64_t u = 0; u < nu; ++u) {
    AmxInt8StoreC<T, NA>(c[u % 2][0]);
    if (2 * u + 1 < nb) {
      issue(2 * u + 1);
      AmxInt8StoreC<T, NA>(c[u % 2][1]);
    }
    if (2 * u + 2 < nb) issue(2 * u + 2);
    if (u > 0) finish(u - 1);
  }
  finish(nu - 1);
  // FinishRows: ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)), then the tail, then the bias or zero.
  const bool tail = nb > nb_main;
  for (int t = 0; t < kC; ++t) {
    const int64_t col = r0 + 16 * (t % 2);
    const __m512 bv = bias != nullptr ? _mm512_loadu_ps(bias + col) : _mm512_setzero_ps();
    for (int i = 0; i < 16; ++i) {
      auto s = [&](int j) { return _mm512_load_ps(acc[j][t] + 16 * i); };
      __m512 v = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(s(0), s(4)), _mm512_add_ps(s(2), s(6))),
                               _mm512_add_ps(_mm512_add_ps(s(1), s(5)), _mm512_add_ps(s(3), s(7))));
      if (tail) v = _mm512_add_ps(v, s(8));
      _mm512_storeu_ps(out + (x0 + 16 * (t / 2) + i) * ldo + col, _mm512_add_ps(v, bv));
    }
  }
}

// A QuantGemmFn over Q4_0 (kHasMin false) or Q4_1 weights in the file's layout: each weight step's
// 32 rows packed once, then its x steps on the tiles, as AmxInt8Split splits.
template <class T, bool kHasMin>
void AmxInt8GemmQ4(const QuantizedActs& a, int64_t x_begin, int64_t x_end, const void* w,
                   const float* bias, float* out, int64_t ldo, int64_t row_begin, int64_t row_end,
                   QuantGemmFn rest) {
  constexpr int64_t kBlockBytes = kHasMin ? sizeof(quant::BlockQ4_1) : sizeof(quant::BlockQ4_0);
  constexpr int64_t kQs = kHasMin ? 4 : 2;
  const int64_t nb = a.k / 32, row_bytes = nb * kBlockBytes;
  const uint8_t* wp = static_cast<const uint8_t*>(w);
  AmxInt8Split<T>(a, x_begin, x_end, w, bias, out, ldo, row_begin, row_end, rest,
                  [&](int64_t r0, int64_t x_full, bool half) {
                    const AmxInt8Q4Pack pack = AmxInt8Q4Scratch(nb);
                    AmxInt8PackQ4<kBlockBytes, kQs>(wp + r0 * row_bytes, row_bytes, nb, pack);
                    for (int64_t x0 = x_begin; x0 < x_full; x0 += kAmxInt8XRows) {
                      AmxInt8StepQ4<T, 2, kHasMin>(a, x0, pack, bias, out, ldo, r0);
                    }
                    if (half) AmxInt8StepQ4<T, 1, kHasMin>(a, x_full, pack, bias, out, ldo, r0);
                  });
}
