// The quantized-weight Gemm kernels of the kAvx512Vnni table; compiled with -mavx512vnni and
// AVX-512 F/BW/VL for this file only. Only reachable through KernelsFor(Isa::kAvx512Vnni) (or
// kAmx) after CpuHasIsa() said yes; everything else in that table is kernels_avx512.cc's.
//
// vpdpbusd multiplies 4 unsigned bytes by 4 signed bytes and adds the 4 products to an i32 lane in
// one instruction. The AVX2 kernels spend three (vpmaddubsw, vpmaddwd, vpaddd) on the same work,
// and Q8_0 two more for the signs; on Zen 4 vpdpbusd issues two ymm per cycle, 64 multiply-adds,
// four times the f32 FMA rate. Same integer sums as every other ISA (exact), same f32 operations
// as the AVX2 kernels in the same order: the results are those of the kAvx512 table, bit for bit.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "engine/backend/cpu/kernels.h"
#include "engine/common/logging.h"
#include "engine/common/quant.h"

namespace modserve::backend::cpu {
namespace {

#include "engine/backend/cpu/quant_kernels_avx2_impl.h"

namespace qvnni {

using qavx2::LoadI;
using qavx2::Panel;
using qavx2::QMin;

// 4 activation bytes at p in every 32-bit lane (an embedded-broadcast operand of vpdpbusd).
inline __m256i Broadcast4(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// acc[x] += blocks b0 .. b0 + count - 1 of panel rows against activation row x0 + x, each into
// its slot: qavx2::PanelDot with vpdpbusd for the integer sums. Each block's integer sum is the
// same as there, and its f32 update is qavx2::BlockUpdate, so the bits are qavx2::PanelDot's (and
// so the decode kernels').
// kKind 0, 3, 4, 5: levels 0..15 (0..31 for 4 and 5): 8 vpdpbusd per block and x row.
// kKind 1: signed levels (Q8_0). vpdpbusd wants the weight bytes unsigned: w + 128 (w ^ 0x80,
//   once per panel vector for all x rows), and the 128 * sum(a) that adds is taken back from the
//   activation block sums in one vpdpwssd: (sum16[2b], sum16[2b + 1]) . (-128, -128).
// kKind 2: levels 0..63 (Q6_K): 4 vpdpbusd per 16-element half.
template <int kKind, int NX>
void PanelDot(const Panel& p, int64_t count, const QuantizedActs& a, int64_t x0, int64_t b0,
              int64_t nb_main, __m256 (*acc)[qavx2::kAccSlots]) {
  const qavx2::TileActs<NX> t(a, x0, b0);
  const auto& q = t.q;
  const auto& sum16 = t.sum16;
  qavx2::PanelSlots<kKind, NX>(p, count, b0, nb_main, t, acc, [&](int64_t bi, __m256i* isum) {
    if constexpr (kKind != 2) {
      // Two chains per x row (even and odd j): vpdpbusd's latency is 4 cycles on Zen 4.
      __m256i t32[NX];
      for (int x = 0; x < NX; ++x) isum[x] = t32[x] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        __m256i w = LoadI(p.lv[bi][j]);
        if constexpr (kKind == 1) {
          w = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
        }
#pragma GCC unroll 8
        for (int x = 0; x < NX; ++x) {
          if (j % 2 == 0) {
            isum[x] = _mm256_dpbusd_epi32(isum[x], w, Broadcast4(q[x] + 32 * bi + 4 * j));
          } else {
            t32[x] = _mm256_dpbusd_epi32(t32[x], w, Broadcast4(q[x] + 32 * bi + 4 * j));
          }
        }
      }
      for (int x = 0; x < NX; ++x) isum[x] = _mm256_add_epi32(isum[x], t32[x]);
      if constexpr (kKind == 1) {
        const __m256i minus128 = _mm256_set1_epi16(-128);
        for (int x = 0; x < NX; ++x) {
          int32_t pair;
          __builtin_memcpy(&pair, sum16[x] + 2 * bi, 4);
          isum[x] = _mm256_dpwssd_epi32(isum[x], _mm256_set1_epi32(pair), minus128);
        }
      }
    } else {
      __m256i dot[2][NX];
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        for (int x = 0; x < NX; ++x) dot[h][x] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int j = 4 * h; j < 4 * h + 4; ++j) {
          const __m256i w = LoadI(p.lv[bi][j]);
#pragma GCC unroll 8
          for (int x = 0; x < NX; ++x) {
            dot[h][x] = _mm256_dpbusd_epi32(dot[h][x], w, Broadcast4(q[x] + 32 * bi + 4 * j));
          }
        }
      }
      for (int x = 0; x < NX; ++x) {
        isum[x] = qavx2::Q6KBlockSum(p, bi, dot[0][x], dot[1][x], sum16[x] + 2 * bi);
      }
    }
  });
}

// x rows per PanelDot call: 8 integer sums (and 8 second chains) beside the panel vector fit the
// 32 vector registers (the AVX2 kernel has 16 and stops at 4).
inline constexpr int kPanelTile = 8;

template <int kKind>
void PanelDotRows(const Panel& p, int64_t count, const QuantizedActs& a, int64_t x0, int nx,
                  int64_t b0, int64_t nb_main, __m256 (*acc)[qavx2::kAccSlots]) {
  switch (nx) {
    case 8:
      return qvnni::PanelDot<kKind, 8>(p, count, a, x0, b0, nb_main, acc);
    case 7:
      return qvnni::PanelDot<kKind, 7>(p, count, a, x0, b0, nb_main, acc);
    case 6:
      return qvnni::PanelDot<kKind, 6>(p, count, a, x0, b0, nb_main, acc);
    case 5:
      return qvnni::PanelDot<kKind, 5>(p, count, a, x0, b0, nb_main, acc);
    case 4:
      return qvnni::PanelDot<kKind, 4>(p, count, a, x0, b0, nb_main, acc);
    case 3:
      return qvnni::PanelDot<kKind, 3>(p, count, a, x0, b0, nb_main, acc);
    case 2:
      return qvnni::PanelDot<kKind, 2>(p, count, a, x0, b0, nb_main, acc);
    default:
      return qvnni::PanelDot<kKind, 1>(p, count, a, x0, b0, nb_main, acc);
  }
}

// ---- decode: qavx2's row kernels with vpdpbusd in the pair dot products ----------------------
// Each trait below is qavx2's with PairDot (and what it needs) replaced; the i32 lanes it returns
// hold the same values as qavx2's, so Merge, Finish and Apply are unchanged and so are the bits.

// Q8_0: the weight bytes go in as w + 128 (unsigned), and Apply takes the 128 * sum(a) back per
// block from the activation half-block sums: one vpmaddwd per chunk instead of two vpsignb per
// 32 bytes.
struct Q8_0V : qavx2::Q8_0K {
  struct Pair {
    __m256i w0, w1;
  };
  static Pair LoadPair(const uint8_t* chunk, int p) {
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    return {_mm256_xor_si256(LoadI(chunk + 2 * p * kBlockBytes + 2), flip),
            _mm256_xor_si256(LoadI(chunk + (2 * p + 1) * kBlockBytes + 2), flip)};
  }
  static __m256i PairDot(const Pair& w, const int8_t* a) {
    const __m256i zero = _mm256_setzero_si256();
    return _mm256_hadd_epi32(_mm256_dpbusd_epi32(zero, w.w0, LoadI(a)),
                             _mm256_dpbusd_epi32(zero, w.w1, LoadI(a + 32)));
  }
  static __m256 Apply(const Scales& sc, __m256i isum, const float* da, const float* ds,
                      const int16_t* sum16, __m256 acc) {
    // Lane j: -128 * (sum16[2j] + sum16[2j + 1]), the sum of block j's activations.
    const __m256i corr = _mm256_madd_epi16(LoadI(sum16), _mm256_set1_epi16(-128));
    return qavx2::Q8_0K::Apply(sc, _mm256_add_epi32(isum, corr), da, ds, sum16, acc);
  }
};

// Q4_0 / Q4_1 (and Q5_0 / Q5_1, kQ5): both nibble halves of the pair into one i32 vector in two
// vpdpbusd (qavx2: two vpmaddubsw, a vpaddw and a vpmaddwd).
template <bool kHasMin, bool kQ5 = false>
struct Q4K32V : qavx2::Q4K32<kHasMin, kQ5> {
  using Pair = typename qavx2::Q4K32<kHasMin, kQ5>::Pair;
  static __m256i PairDot(const Pair& w, const int8_t* a) {
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), w.lo, LoadI(a)), w.hi,
                               LoadI(a + 32));
  }
};

// Q4_K: one vpdpbusd per 32-element sub-block (qavx2: vpmaddubsw and vpmaddwd).
struct Q4_KV : qavx2::Q4_KK {
  static __m256i PairDot(const Pair& w, const int8_t* a) {
    const __m256i zero = _mm256_setzero_si256();
    return qavx2::HaddSmall(_mm256_dpbusd_epi32(zero, w.lo, LoadI(a)),
                            _mm256_dpbusd_epi32(zero, w.hi, LoadI(a + 32)));
  }
};

// Q5_K: Q4_KV's dot over Q5_KK's levels (0..31: a vpdpbusd lane holds 4 products, < 2^14).
struct Q5_KV : qavx2::Q5_KK {
  static __m256i PairDot(const Pair& w, const int8_t* a) { return Q4_KV::PairDot(w, a); }
};

// x rows per RowDot call: qavx2 stops at 4 for its 16 registers; with 32, 8 rows keep their
// partial sums and accumulators beside the unpacked pair, so a weight pair is unpacked once for
// twice as many rows.
inline constexpr int kDecodeRowsPerTile = 8;

template <class T>
void RowTile(const QuantizedActs& a, int64_t x0, int nx, const uint8_t* wrow, float* res) {
  switch (nx) {
    case 8:
      return qavx2::RowDot<T, 8>(a, x0, wrow, res);
    case 7:
      return qavx2::RowDot<T, 7>(a, x0, wrow, res);
    case 6:
      return qavx2::RowDot<T, 6>(a, x0, wrow, res);
    case 5:
      return qavx2::RowDot<T, 5>(a, x0, wrow, res);
    default:
      return qavx2::RowTile<T>(a, x0, nx, wrow, res);
  }
}

// Decode (n <= kQuantSmallNMax): weight rows outer, each read once for all x rows, as in qavx2;
// prefill: the VNNI panels.
template <class T, class P, int kKind>
void Gemm(const QuantizedActs& a, int64_t x_begin, int64_t x_end, const void* w, const float* bias,
          float* out, int64_t ldo, int64_t row_begin, int64_t row_end) {
  const int64_t row_bytes = a.k / 256 * T::kChunkBytes + (a.k % 256) / 32 * (T::kChunkBytes / 8);
  const uint8_t* wp = static_cast<const uint8_t*>(w);
  if (a.n > kQuantSmallNMax) {
    return qavx2::GemmPacked<P, kPanelTile, &PanelDotRows<kKind>>(
        a, x_begin, x_end, wp, row_bytes, bias, out, ldo, row_begin, row_end);
  }
  float res[kDecodeRowsPerTile];
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t i = x_begin; i < x_end; i += kDecodeRowsPerTile) {
      const int nx = static_cast<int>(QMin(kDecodeRowsPerTile, x_end - i));
      RowTile<T>(a, i, nx, wp + r * row_bytes, res);
      const float b = bias != nullptr ? bias[r] : 0.0f;
      for (int x = 0; x < nx; ++x) out[(i + x) * ldo + r] = res[x] + b;
    }
  }
}

// ---- Q4_K and Q5_K in the interleaved 16-row layouts (kernels.h, RepackQ4_KX16, RepackQ5_KX16) -
// A 64-byte level vector holds 4 levels of each of 16 weight rows, one row per 32-bit lane, so one
// vpdpbusd against 4 activation bytes broadcast to every lane adds 4 products to all 16 rows, and
// a sub-block's integer sums for the 16 rows end in the 16 lanes of one vector: no per-row
// reduction, and each f32 update (scale * da, minimum * ds) serves 16 rows. The row kernels above
// spend about four times the instructions per weight byte on unpacking, reducing and scaling one
// row at a time, which at one x row is what bounds them, not the memory.
//
// The high nibbles go in as they lie (v & 0xf0 = 16 * level; |sum| < 32 * 240 * 128 < 2^20, so its
// f32 conversion is exact) and their sub-block's scale carries the 1/16: d * 2^-4 * sc * da rounds
// to the same significand as d * sc * da, so the update is the one the shifted level would give.
// Per x row and sub-block s, in order: acc += (d * sc[s] * da[s]) * isum[s] (f32 FMA) and
// acc_min -= (dmin * mn[s]) * ds[s]; the row's output is acc + acc_min + bias. Every x row takes
// the same operations whatever the tile it shares, so its result does not depend on the rows
// beside it (CpuBackend::MaxRowInvariantRows). Q5_K's units (RepackQ5_KX16) run the same kernel
// with their fifth bits merged into the levels (Q5Levels), the high sub-blocks' at 8 times.
namespace x16 {

// Unit bytes of the two K-quant layouts (kernels.h).
template <bool kQ5>
inline constexpr int64_t kUnit = kQ5 ? kQ5KX16UnitBytes : kQ4KX16UnitBytes;

// A thread's units lie back to back, one sequential stream that the hardware prefetchers follow.
// K-quant tiles of 2 or more x rows also prefetch each unit's lines into L2 (prefetcht1) 2 units
// ahead (measured on Q4_K's; Q5_K's and Q6_K's do the same, not timed without it): 4 x rows 25-30%
// faster from DRAM on Zen 4 (kernel_bench quant-decode, 2 threads, alternating runs),
// TinyLlama-shape batch-4 decode end to end 130-139 -> 167-177 tok/s. One x row goes without by
// default (OneRow::kNone): on Zen 4, into L1 (prefetcht0, as the row kernels do) the prefetch cut
// its decode from DRAM from 26 to 22 GB/s, and into L2 TinyLlama-shape batch-1 decode from 53-56
// to 43-44 tok/s. Q8_0 units gained nothing from it at batch 4 (two alternating pairs), so they
// go without. Prefetches never fault: reaching past the end of the copy from the last units is
// harmless.
// OneRow::kL2 (the K-quant tiles of kFarPrefetchQuantGemms, which the VNNI table takes on AMD
// family 1Ah, Zen 5): one x row prefetches into L2 as the tiles of more rows do, 2 units ahead
// (Q6_K's larger units 1, kOneRowL2Units below).
// On Zen 5 (2 threads, `QUANT_ROWS=1 kernel_bench 2 best quant-decode`, four alternating rounds
// at the three TinyLlama shapes) Q4_K's one-row copy read 46-69 GB/s from DRAM against 32-43
// without, Q5_K's and Q6_K's 35-64 and 39-57 against 26-39 and 33-36 (three rounds); 4 units
// ahead gained no more, 8 less, and Q8_0's one-row tile nothing (docs/PERFORMANCE.md, "One-row
// K-quant decode on Zen 5").
// OneRow::kL1Near (the AMX table's Q6_K and Q8_0 tiles, i.e. Xeons with AMX): one x row prefetches
// each unit's lines 1 KiB ahead into L1 (prefetcht0). On such a Xeon (2 threads, read bandwidth
// steady at 33-34 GB/s) `kernel_bench quant-decode`'s one-row Q8_0 and Q6_K copies read 13-18%
// faster from DRAM (Q4_K and Q5_K level, so they go without), and TinyLlama-shape batch-1 decode
// of a Q8_0 file ran 22.1-22.3 -> 25.5-25.6 tok/s against the VNNI table's tiles (two alternating
// pairs); 512 B, 2 KiB or 4 KiB ahead gained less. Zen 4 keeps the VNNI table, measured without.
// The one-row L2 prefetch goes the fewest whole units ahead that make at least 3 KiB: 2 for
// Q4_K's and Q5_K's units (2304 and 2816 bytes), 1 for Q6_K's (3360). On Zen 5 (`QUANT_TYPES=Q6_K
// kernel_bench 2 best quant-pairs`, seven alternating rounds) Q6_K's one-row tile kept 88-94% of
// the read-only pass's rate 1 unit ahead against 85-89% 2 units ahead when that pass read 45-51
// GB/s, and 82-83% against 75-78% when it read 77-81; 3 and 5 units ahead kept less still. Q5_K's
// kept 94-98% either way, and Q4_K's 91-101% at 45-51 GB/s either way (docs/PERFORMANCE.md,
// "Zen 5's two bandwidth states").
enum class OneRow { kNone, kL1Near, kL2 };

template <int64_t kBytes>
inline constexpr int64_t kOneRowL2Units = (3072 + kBytes - 1) / kBytes;

template <int NX, int64_t kBytes, OneRow kOneRow>
inline void PrefetchAhead(const uint8_t* unit) {
  if constexpr (NX > 1 || kOneRow == OneRow::kL2) {
    constexpr int64_t kAhead = NX > 1 ? 2 : kOneRowL2Units<kBytes>;
    for (int64_t off = 0; off < kBytes; off += 64)
      __builtin_prefetch(unit + kAhead * kBytes + off, 0, 2);
  } else if constexpr (kOneRow == OneRow::kL1Near) {
    for (int64_t off = 0; off < kBytes; off += 64) __builtin_prefetch(unit + 1024 + off, 0, 3);
  }
}

#include "engine/backend/cpu/x16_vector_impl.h"

inline __m512i Broadcast4(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The quantized activations of x rows x0 .. x0 + NX - 1 of a tile, row by row.
template <int NX>
struct TileRows {
  const int8_t* q[NX];
  const float* da[NX];
  const float* ds[NX];
  const int16_t* sum16[NX];
  TileRows(const QuantizedActs& a, int64_t x0) {
    const int64_t k = a.k, nb = k / 32;
    for (int x = 0; x < NX; ++x) {
      q[x] = a.q + (x0 + x) * k;
      da[x] = a.d + (x0 + x) * nb;
      ds[x] = a.ds + (x0 + x) * nb;
      sum16[x] = a.sum16 + (x0 + x) * 2 * nb;
    }
  }
};

// out[x0 + x, r0 .. r0 + 16) for x < NX, from the group's nsb units at wg (Q5_K's when kQ5).
template <int NX, bool kQ5, OneRow kOneRow = OneRow::kNone>
void Tile(const QuantizedActs& a, int64_t x0, const uint8_t* wg, int64_t nsb, __m512 bias,
          float* out, int64_t ldo, int64_t r0) {
  const TileRows<NX> rows(a, x0);
  __m512 acc[NX], acc_min[NX];
  for (int x = 0; x < NX; ++x) acc[x] = acc_min[x] = _mm512_setzero_ps();
  alignas(64) uint8_t scales[256];
  for (int64_t c = 0; c < nsb; ++c) {
    const uint8_t* unit = wg + c * kUnit<kQ5>;
    PrefetchAhead<NX, kUnit<kQ5>, kOneRow>(unit);
    UnpackScales(unit, scales);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit)));
    // The high sub-blocks' levels come 16 (Q4_K) or 8 (Q5_K) times their value: exact powers of
    // two, so their products round as the levels' own would.
    const __m512 d_hi = _mm512_mul_ps(d, _mm512_set1_ps(kQ5 ? 0.125f : 0.0625f));
    const __m512 dmin =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit + 32)));
    auto pass = [&]<int p>() {
      __m512i lo[NX], hi[NX];
      for (int x = 0; x < NX; ++x) lo[x] = hi[x] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        __m512i wl, wh;
        X16KLevels<kQ5, p>(unit, j, &wl, &wh);
#pragma GCC unroll 8
        for (int x = 0; x < NX; ++x) {
          const int8_t* qa = rows.q[x] + 256 * c + 64 * p + 4 * j;
          lo[x] = _mm512_dpbusd_epi32(lo[x], wl, Broadcast4(qa));
          hi[x] = _mm512_dpbusd_epi32(hi[x], wh, Broadcast4(qa + 32));
        }
      }
      const int64_t b = 8 * c + 2 * p;
      const __m512 s0 = BytesTimes(scales + 16 * (2 * p), d);
      const __m512 s1 = BytesTimes(scales + 16 * (2 * p + 1), d_hi);
      const __m512 m0 = BytesTimes(scales + 128 + 16 * (2 * p), dmin);
      const __m512 m1 = BytesTimes(scales + 128 + 16 * (2 * p + 1), dmin);
#pragma GCC unroll 8
      for (int x = 0; x < NX; ++x) {
        acc[x] = _mm512_fmadd_ps(_mm512_mul_ps(s0, _mm512_set1_ps(rows.da[x][b])),
                                 _mm512_cvtepi32_ps(lo[x]), acc[x]);
        acc_min[x] = _mm512_fnmadd_ps(m0, _mm512_set1_ps(rows.ds[x][b]), acc_min[x]);
        acc[x] = _mm512_fmadd_ps(_mm512_mul_ps(s1, _mm512_set1_ps(rows.da[x][b + 1])),
                                 _mm512_cvtepi32_ps(hi[x]), acc[x]);
        acc_min[x] = _mm512_fnmadd_ps(m1, _mm512_set1_ps(rows.ds[x][b + 1]), acc_min[x]);
      }
    };
    pass.template operator()<0>();
    pass.template operator()<1>();
    pass.template operator()<2>();
    pass.template operator()<3>();
  }
  for (int x = 0; x < NX; ++x) {
    _mm512_storeu_ps(out + (x0 + x) * ldo + r0,
                     _mm512_add_ps(_mm512_add_ps(acc[x], acc_min[x]), bias));
  }
}

// x rows per Tile: each holds two sums and two accumulators beside the level vectors.
inline constexpr int kTileRows = 5;
using TileFn = void (*)(const QuantizedActs&, int64_t, const uint8_t*, int64_t, __m512, float*,
                        int64_t, int64_t);
inline constexpr TileFn kTiles[kTileRows + 1] = {nullptr,         &Tile<1, false>, &Tile<2, false>,
                                                 &Tile<3, false>, &Tile<4, false>, &Tile<5, false>};
inline constexpr TileFn kTilesQ5_K[kTileRows + 1] = {
    nullptr, &Tile<1, true>, &Tile<2, true>, &Tile<3, true>, &Tile<4, true>, &Tile<5, true>};
// The same with the one-row tile prefetching into L2 (OneRow::kL2).
inline constexpr TileFn kTilesFar[kTileRows + 1] = {
    nullptr, &Tile<1, false, OneRow::kL2>, kTiles[2], kTiles[3], kTiles[4], kTiles[5]};
inline constexpr TileFn kTilesQ5_KFar[kTileRows + 1] = {nullptr,       &Tile<1, true, OneRow::kL2>,
                                                        kTilesQ5_K[2], kTilesQ5_K[3],
                                                        kTilesQ5_K[4], kTilesQ5_K[5]};

// ---- Q6_K in the interleaved 16-row layout (kernels.h, RepackQ6_KX16) -------------------------
// Q4_K's plan with Q6_K's sub-blocks of 16 and signed 8-bit scales. Level vectors are built from a
// low-bits vector and its high-bits vector (Q6Levels): q in 0..63, unsigned for vpdpbusd. Per x
// row and 16-element sub-block s the integer sum is exact: sum(q * a) - 32 * sum(a) (vpdpwssd of
// the activations' 16-element sum against -32), |sum| < 2^16. Per x row and unit, in order:
// u += (sc[s] * da[b]) * isum[s] (f32 FMA, sub-blocks in the order the passes take them), then
// acc += d * u; the row's output is acc + bias. Each x row takes the same operations whatever the
// tile it shares (row invariance, as above).

// Levels of vector (h, i, j) from its low bits v and high bits u (vector (h, j)): low nibbles with
// bits 2 i, 2 i + 1 of u above them, high nibbles with bits 2 i + 4, 2 i + 5. vpternlogd 0xf8 is
// a | (b & c).
template <int I>
inline void Q6Levels(__m512i v, __m512i u, __m512i* lo, __m512i* hi) {
  const __m512i m0f = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
  // The high bits of the low nibbles to bits 4-5 (i = 0: from 0-1, i = 1: from 2-3), those of the
  // high nibbles likewise (from 4-5, or 6-7); 16-bit shifts, the mask keeps each byte's own.
  const __m512i lo_bits = _mm512_slli_epi16(u, I == 0 ? 4 : 2);
  const __m512i hi_bits = I == 0 ? u : _mm512_srli_epi16(u, 2);
  const __m512i lo4 = _mm512_and_si512(v, m0f);
  const __m512i hi4 = _mm512_and_si512(_mm512_srli_epi16(v, 4), m0f);
  *lo = _mm512_ternarylogic_epi32(lo4, lo_bits, m30, 0xf8);
  *hi = _mm512_ternarylogic_epi32(hi4, hi_bits, m30, 0xf8);
}

inline __m512 ScalesQ6(const uint8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

template <int NX, OneRow kOneRow = OneRow::kNone>
void TileQ6_K(const QuantizedActs& a, int64_t x0, const uint8_t* wg, int64_t nsb, __m512 bias,
              float* out, int64_t ldo, int64_t r0) {
  const TileRows<NX> rows(a, x0);
  __m512 acc[NX];
  for (int x = 0; x < NX; ++x) acc[x] = _mm512_setzero_ps();
  // vpdpwssd's 16-bit factor -32 against the first (low half) or second 16-element sum of a block.
  const __m512i minus32[2] = {_mm512_set1_epi32(0x0000ffe0),
                              _mm512_set1_epi32(static_cast<int32_t>(0xffe00000u))};
  for (int64_t c = 0; c < nsb; ++c) {
    const uint8_t* unit = wg + c * kQ6KX16UnitBytes;
    PrefetchAhead<NX, kQ6KX16UnitBytes, kOneRow>(unit);
    const bool d_first = Q6KX16DFirst(unit);
    const uint8_t* body = unit + (d_first ? 32 : 0);
    __m512 u[NX];
    for (int x = 0; x < NX; ++x) u[x] = _mm512_setzero_ps();
    // Elements 128 h + 32 i + [0, 32) (low nibbles, activation block 4 h + i) and 64 more (high
    // nibbles, block 4 h + i + 2); sub-block half f < 2 of each from vectors j = 4 f .. 4 f + 3.
    auto pass = [&]<int h, int i>() {
      const uint8_t* half = body + h * kQ6KX16HalfBytes;
#pragma GCC unroll 2
      for (int f = 0; f < 2; ++f) {
        // The scales first: on the first pass of a half they are its first lines.
        const __m512 sc_lo = ScalesQ6(half + 16 * (2 * i + f));
        const __m512 sc_hi = ScalesQ6(half + 16 * (2 * i + f + 4));
        __m512i lo[NX], hi[NX];
        for (int x = 0; x < NX; ++x) lo[x] = hi[x] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int j = 4 * f; j < 4 * f + 4; ++j) {
          __m512i wl, wh;
          Q6Levels<i>(Load512(half + (i == 0 ? 192 + 128 * j : 1152 + 64 * j)),
                      Load512(half + 128 + 128 * j), &wl, &wh);
#pragma GCC unroll 8
          for (int x = 0; x < NX; ++x) {
            const int8_t* qa = rows.q[x] + 256 * c + 128 * h + 32 * i + 4 * j;
            lo[x] = _mm512_dpbusd_epi32(lo[x], wl, Broadcast4(qa));
            hi[x] = _mm512_dpbusd_epi32(hi[x], wh, Broadcast4(qa + 64));
          }
        }
        const int64_t b = 8 * c + 4 * h + i;
#pragma GCC unroll 8
        for (int x = 0; x < NX; ++x) {
          int32_t pair_lo, pair_hi;
          __builtin_memcpy(&pair_lo, rows.sum16[x] + 2 * b, 4);
          __builtin_memcpy(&pair_hi, rows.sum16[x] + 2 * (b + 2), 4);
          const __m512i il = _mm512_dpwssd_epi32(lo[x], _mm512_set1_epi32(pair_lo), minus32[f]);
          const __m512i ih = _mm512_dpwssd_epi32(hi[x], _mm512_set1_epi32(pair_hi), minus32[f]);
          u[x] = _mm512_fmadd_ps(_mm512_mul_ps(sc_lo, _mm512_set1_ps(rows.da[x][b])),
                                 _mm512_cvtepi32_ps(il), u[x]);
          u[x] = _mm512_fmadd_ps(_mm512_mul_ps(sc_hi, _mm512_set1_ps(rows.da[x][b + 2])),
                                 _mm512_cvtepi32_ps(ih), u[x]);
        }
      }
    };
    pass.template operator()<0, 0>();
    pass.template operator()<0, 1>();
    pass.template operator()<1, 0>();
    pass.template operator()<1, 1>();
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(d_first ? unit : unit + kQ6KX16BodyBytes)));
    for (int x = 0; x < NX; ++x) acc[x] = _mm512_fmadd_ps(d, u[x], acc[x]);
  }
  for (int x = 0; x < NX; ++x) {
    _mm512_storeu_ps(out + (x0 + x) * ldo + r0, _mm512_add_ps(acc[x], bias));
  }
}

inline constexpr TileFn kTilesQ6_K[kTileRows + 1] = {nullptr,      &TileQ6_K<1>, &TileQ6_K<2>,
                                                     &TileQ6_K<3>, &TileQ6_K<4>, &TileQ6_K<5>};
inline constexpr TileFn kTilesQ6_KNear[kTileRows + 1] = {
    nullptr,      &TileQ6_K<1, OneRow::kL1Near>, kTilesQ6_K[2], kTilesQ6_K[3], kTilesQ6_K[4],
    kTilesQ6_K[5]};
inline constexpr TileFn kTilesQ6_KFar[kTileRows + 1] = {
    nullptr, &TileQ6_K<1, OneRow::kL2>, kTilesQ6_K[2], kTilesQ6_K[3], kTilesQ6_K[4], kTilesQ6_K[5]};

// ---- Q8_0 in the interleaved 16-row layout (kernels.h, RepackQ8_0X16) -------------------------
// The same plan as Q4_K's: one vpdpbusd of a level vector against 4 broadcast activation bytes
// adds 4 products to each of the 16 rows. The levels are stored plus 128 (unsigned), and the
// 128 * sum(q) that adds to a block's sum is taken back in integers (one vpdpwssd of the block's
// two 16-element activation sums against -128), so each block's integer sum is the exact
// sum(w * q) that every other kernel computes. Per x row and block b, in order:
// acc += (d_w * da[b]) * isum (f32 FMA); the row's output is acc + bias. Every x row takes the
// same operations whatever the tile it shares (row invariance, as above).
template <int NX, OneRow kOneRow = OneRow::kNone>
void TileQ8_0(const QuantizedActs& a, int64_t x0, const uint8_t* wg, int64_t nu, __m512 bias,
              float* out, int64_t ldo, int64_t r0) {
  const TileRows<NX> rows(a, x0);
  __m512 acc[NX];
  for (int x = 0; x < NX; ++x) acc[x] = _mm512_setzero_ps();
  const __m512i minus128 = _mm512_set1_epi16(-128);
  for (int64_t c = 0; c < nu; ++c) {
    const uint8_t* unit = wg + c * kQ8_0X16UnitBytes;
    PrefetchAhead<NX, kQ8_0X16UnitBytes, kOneRow>(unit);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512 d =
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit + 32 * h)));
      // Two chains per x row (even and odd j): vpdpbusd's latency is 4 cycles on Zen 4.
      __m512i s0[NX], s1[NX];
      for (int x = 0; x < NX; ++x) s0[x] = s1[x] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const __m512i v = Load512(unit + 64 + (8 * h + j) * 64);
#pragma GCC unroll 8
        for (int x = 0; x < NX; ++x) {
          const int8_t* qa = rows.q[x] + 64 * c + 32 * h + 4 * j;
          if (j % 2 == 0) {
            s0[x] = _mm512_dpbusd_epi32(s0[x], v, Broadcast4(qa));
          } else {
            s1[x] = _mm512_dpbusd_epi32(s1[x], v, Broadcast4(qa));
          }
        }
      }
      const int64_t b = 2 * c + h;
#pragma GCC unroll 8
      for (int x = 0; x < NX; ++x) {
        int32_t pair;
        __builtin_memcpy(&pair, rows.sum16[x] + 2 * b, 4);
        const __m512i isum =
            _mm512_dpwssd_epi32(_mm512_add_epi32(s0[x], s1[x]), _mm512_set1_epi32(pair), minus128);
        acc[x] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(rows.da[x][b])),
                                 _mm512_cvtepi32_ps(isum), acc[x]);
      }
    }
  }
  for (int x = 0; x < NX; ++x) {
    _mm512_storeu_ps(out + (x0 + x) * ldo + r0, _mm512_add_ps(acc[x], bias));
  }
}

inline constexpr TileFn kTilesQ8_0[kTileRows + 1] = {nullptr,      &TileQ8_0<1>, &TileQ8_0<2>,
                                                     &TileQ8_0<3>, &TileQ8_0<4>, &TileQ8_0<5>};
inline constexpr TileFn kTilesQ8_0Near[kTileRows + 1] = {
    nullptr,      &TileQ8_0<1, OneRow::kL1Near>, kTilesQ8_0[2], kTilesQ8_0[3], kTilesQ8_0[4],
    kTilesQ8_0[5]};

// ---- Q4_0, Q4_1, Q5_0 and Q5_1 in the interleaved 16-row layouts (kernels.h, RepackQ4X16) -----
// Q8_0's plan with 4- or 5-bit levels. A level vector's low nibbles go in as levels (Q5: with the
// fifth bit at bit 4), its high nibbles as 16 times their level (Q5: 8 times, Q5LevelsFromBits),
// each against its 16 elements' activation bytes, in two integer sums per x row and block; then
// isum = (lo << 4) + hi (<< 3 for Q5), which is 16 (8) times the block's sum(q * a), exact
// (|isum| < 2^21). Q4_0's -8 and Q5_0's -16 come back as Q8_0's 128 does: 16 * 8 = 8 * 16 = 128
// times the activations' sum, one vpdpwssd of the block's two 16-element sums against -128. Per
// x row and block b, in order: acc += ((d / 16 or d / 8) * da[b]) * isum (f32 FMA; d times a
// power of two is exact, so this is d * da[b] times the true sum, rounded as that would be), and
// with a minimum acc_min += m * ds[b]; the row's output is acc + acc_min + bias. Every x row takes
// the same operations whatever the tile it shares (row invariance, as above).
template <int NX, DType kT, OneRow kOneRow = OneRow::kNone>
void TileQ4(const QuantizedActs& a, int64_t x0, const uint8_t* wg, int64_t nu, __m512 bias,
            float* out, int64_t ldo, int64_t r0) {
  constexpr bool kHasMin = Q4X16HasMin(kT), kQ5 = Q4X16HasFifthBits(kT);
  constexpr int64_t kBytes = Q4X16UnitBytes(kT);
  constexpr int64_t kHead = Q4X16HeadBytes(kT), kPart = Q4X16PartBytes(kT);
  constexpr int kHiShift = kQ5 ? 3 : 4;
  const TileRows<NX> rows(a, x0);
  __m512 acc[NX], acc_min[NX];
  for (int x = 0; x < NX; ++x) acc[x] = acc_min[x] = _mm512_setzero_ps();
  const __m512i minus128 = _mm512_set1_epi16(-128);
  const __m512 hi_scale = _mm512_set1_ps(kQ5 ? 0.125f : 0.0625f);
  for (int64_t c = 0; c < nu; ++c) {
    const uint8_t* unit = wg + c * kBytes;
    PrefetchAhead<NX, kBytes, kOneRow>(unit);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512 d = _mm512_mul_ps(
          _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit + 32 * h))),
          hi_scale);
      const uint8_t* part = unit + kHead + kPart * h;
      const uint8_t* levels = part + (kQ5 ? 64 : 0);
      __m512i qh = _mm512_setzero_si512();
      if constexpr (kQ5) qh = Load512(part);
      __m512i lo[NX], hi[NX];
      for (int x = 0; x < NX; ++x) lo[x] = hi[x] = _mm512_setzero_si512();
      auto step = [&]<int j>() {
        const __m512i v = Load512(levels + 64 * j);
        __m512i wl, wh;
        if constexpr (kQ5) {
          Q5LevelsFromBits<j, 4 + j>(v, qh, &wl, &wh);
        } else {
          wl = _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
          wh = _mm512_and_si512(v, _mm512_set1_epi8(static_cast<char>(0xf0)));
        }
#pragma GCC unroll 8
        for (int x = 0; x < NX; ++x) {
          const int8_t* qa = rows.q[x] + 64 * c + 32 * h + 4 * j;
          lo[x] = _mm512_dpbusd_epi32(lo[x], wl, Broadcast4(qa));
          hi[x] = _mm512_dpbusd_epi32(hi[x], wh, Broadcast4(qa + 16));
        }
      };
      step.template operator()<0>();
      step.template operator()<1>();
      step.template operator()<2>();
      step.template operator()<3>();
      const int64_t b = 2 * c + h;
      __m512 m = _mm512_setzero_ps();
      if constexpr (kHasMin) {
        m = _mm512_cvtph_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit + 64 + 32 * h)));
      }
#pragma GCC unroll 8
      for (int x = 0; x < NX; ++x) {
        __m512i isum = _mm512_add_epi32(_mm512_slli_epi32(lo[x], kHiShift), hi[x]);
        if constexpr (!kHasMin) {
          int32_t pair;
          __builtin_memcpy(&pair, rows.sum16[x] + 2 * b, 4);
          isum = _mm512_dpwssd_epi32(isum, _mm512_set1_epi32(pair), minus128);
        }
        acc[x] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(rows.da[x][b])),
                                 _mm512_cvtepi32_ps(isum), acc[x]);
        if constexpr (kHasMin) {
          acc_min[x] = _mm512_fmadd_ps(m, _mm512_set1_ps(rows.ds[x][b]), acc_min[x]);
        }
      }
    }
  }
  for (int x = 0; x < NX; ++x) {
    _mm512_storeu_ps(out + (x0 + x) * ldo + r0,
                     _mm512_add_ps(_mm512_add_ps(acc[x], acc_min[x]), bias));
  }
}

template <DType kT>
inline constexpr TileFn kTilesQ4[kTileRows + 1] = {nullptr,        &TileQ4<1, kT>, &TileQ4<2, kT>,
                                                   &TileQ4<3, kT>, &TileQ4<4, kT>, &TileQ4<5, kT>};

// Rows [row_begin, row_end) (whole groups) for x rows [x_begin, x_end) in tiles of kTable's
// kernels: groups of 16 weight rows, each k / kUnitElems units of kUnitBytes.
template <const TileFn* kTable, int64_t kUnitElems, int64_t kUnitBytes>
void Gemm(const QuantizedActs& a, int64_t x_begin, int64_t x_end, const void* w, const float* bias,
          float* out, int64_t ldo, int64_t row_begin, int64_t row_end) {
  const int64_t nu = a.k / kUnitElems;
  const uint8_t* wp = static_cast<const uint8_t*>(w);
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kQ4KX16Rows) {
    const uint8_t* wg = wp + r0 / kQ4KX16Rows * nu * kUnitBytes;
    const __m512 b = bias != nullptr ? _mm512_loadu_ps(bias + r0) : _mm512_setzero_ps();
    for (int64_t i = x_begin; i < x_end; i += kTileRows) {
      kTable[QMin(kTileRows, x_end - i)](a, i, wg, nu, b, out, ldo, r0);
    }
  }
}

// ---- AMX-INT8 steps over the Q8_0 and Q4_K copies (amx_int8_impl.h) ---------------------------
// Only the AMX tables take these (kernels.cc checks AMX-INT8 and the tile permission first).
// Configuration, loads and stores come from amx_tile_regs.h; GCC's tile intrinsics paste the tile
// number into the instruction text, hence the chain in Zero.
#include "engine/backend/cpu/amx_tile_regs.h"

struct HwInt8Tiles : AmxTileRegs<kAmxInt8TileConfig> {
  template <int kT>
  static void Zero() {
    if constexpr (kT == 0) _tile_zero(0);
    if constexpr (kT == 1) _tile_zero(1);
    if constexpr (kT == 2) _tile_zero(2);
    if constexpr (kT == 3) _tile_zero(3);
  }
  template <int kC, int kA, int kB>
  static void Dot() {
    static_assert((kC == 0 && kA == 4 && kB == 6) || (kC == 1 && kA == 4 && kB == 7) ||
                      (kC == 2 && kA == 5 && kB == 6) || (kC == 3 && kA == 5 && kB == 7),
                  "only the four products of a 2 x 2 step have an instruction here");
    if constexpr (kC == 0) _tile_dpbsud(0, 4, 6);
    if constexpr (kC == 1) _tile_dpbsud(1, 4, 7);
    if constexpr (kC == 2) _tile_dpbsud(2, 5, 6);
    if constexpr (kC == 3) _tile_dpbsud(3, 5, 7);
  }
};

#include "engine/backend/cpu/amx_int8_impl.h"

void AmxGemmQ8_0(const QuantizedActs& a, int64_t x_begin, int64_t x_end, const void* w,
                 const float* bias, float* out, int64_t ldo, int64_t row_begin, int64_t row_end) {
  AmxInt8Gemm<HwInt8Tiles, kQ8_0X16UnitBytes, kQ8_0X16UnitElems, &AmxInt8StepQ8_0<HwInt8Tiles, 2>,
              &AmxInt8StepQ8_0<HwInt8Tiles, 1>>(
      a, x_begin, x_end, w, bias, out, ldo, row_begin, row_end,
      &Gemm<kTilesQ8_0Near, kQ8_0X16UnitElems, kQ8_0X16UnitBytes>);
}

void AmxGemmQ4_K(const QuantizedActs& a, int64_t x_begin, int64_t x_end, const void* w,
                 const float* bias, float* out, int64_t ldo, int64_t row_begin, int64_t row_end) {
  AmxInt8Gemm<HwInt8Tiles, kQ4KX16UnitBytes, 256, &AmxInt8StepQ4_K<HwInt8Tiles, 2>,
              &AmxInt8StepQ4_K<HwInt8Tiles, 1>>(a, x_begin, x_end, w, bias, out, ldo, row_begin,
                                                row_end, &Gemm<kTiles, 256, kQ4KX16UnitBytes>);
}

void AmxGemmQ5_K(const QuantizedActs& a, int64_t x_begin, int64_t x_end, const void* w,
                 const float* bias, float* out, int64_t ldo, int64_t row_begin, int64_t row_end) {
  AmxInt8Gemm<HwInt8Tiles, kQ5KX16UnitBytes, 256, &AmxInt8StepQ4_K<HwInt8Tiles, 2, true>,
              &AmxInt8StepQ4_K<HwInt8Tiles, 1, true>>(a, x_begin, x_end, w, bias, out, ldo,
                                                      row_begin, row_end,
                                                      &Gemm<kTilesQ5_K, 256, kQ5KX16UnitBytes>);
}

template <bool kHasMin>
void AmxGemmQ4(const QuantizedActs& a, int64_t x_begin, int64_t x_end, const void* w,
               const float* bias, float* out, int64_t ldo, int64_t row_begin, int64_t row_end) {
  AmxInt8GemmQ4<HwInt8Tiles, kHasMin>(a, x_begin, x_end, w, bias, out, ldo, row_begin, row_end,
                                      &qvnni::Gemm < qvnni::Q4K32V<kHasMin>, qavx2::Q4Pack<kHasMin>,
                                      kHasMin ? 0 : 3 >);
}

}  // namespace x16
}  // namespace qvnni
}  // namespace

namespace internal {
constinit const KernelTable kAvx512VnniQuantGemms = {
    .isa = Isa::kAvx512Vnni,
    .gemm_q8_0 = &qvnni::Gemm<qvnni::Q8_0V, qavx2::Q8_0Pack, 1>,
    .gemm_q4_0 = &qvnni::Gemm<qvnni::Q4K32V<false>, qavx2::Q4Pack<false>, 3>,
    .gemm_q4_1 = &qvnni::Gemm<qvnni::Q4K32V<true>, qavx2::Q4Pack<true>, 0>,
    .gemm_q4_k = &qvnni::Gemm<qvnni::Q4_KV, qavx2::Q4_KPack, 0>,
    .gemm_q6_k = &qvnni::Gemm<qavx2::Q6_KK, qavx2::Q6_KPack, 2>,
    .gemm_q5_k = &qvnni::Gemm<qvnni::Q5_KV, qavx2::Q5_KPack, 4>,
    .gemm_q5_0 = &qvnni::Gemm<qvnni::Q4K32V<false, true>, qavx2::Q4Pack<false, true>, 5>,
    .gemm_q5_1 = &qvnni::Gemm<qvnni::Q4K32V<true, true>, qavx2::Q4Pack<true, true>, 4>,
    .gemm_q4_k_x16 = &qvnni::x16::Gemm<qvnni::x16::kTiles, 256, kQ4KX16UnitBytes>,
    .gemm_q5_k_x16 = &qvnni::x16::Gemm<qvnni::x16::kTilesQ5_K, 256, kQ5KX16UnitBytes>,
    .gemm_q6_k_x16 = &qvnni::x16::Gemm<qvnni::x16::kTilesQ6_K, 256, kQ6KX16UnitBytes>,
    .gemm_q8_0_x16 =
        &qvnni::x16::Gemm<qvnni::x16::kTilesQ8_0, kQ8_0X16UnitElems, kQ8_0X16UnitBytes>,
    .gemm_q4_0_x16 = &qvnni::x16::Gemm<qvnni::x16::kTilesQ4<DType::kQ4_0>, kQ4X16UnitElems,
                                       Q4X16UnitBytes(DType::kQ4_0)>,
    .gemm_q4_1_x16 = &qvnni::x16::Gemm<qvnni::x16::kTilesQ4<DType::kQ4_1>, kQ4X16UnitElems,
                                       Q4X16UnitBytes(DType::kQ4_1)>,
    .gemm_q5_0_x16 = &qvnni::x16::Gemm<qvnni::x16::kTilesQ4<DType::kQ5_0>, kQ4X16UnitElems,
                                       Q4X16UnitBytes(DType::kQ5_0)>,
    .gemm_q5_1_x16 = &qvnni::x16::Gemm<qvnni::x16::kTilesQ4<DType::kQ5_1>, kQ4X16UnitElems,
                                       Q4X16UnitBytes(DType::kQ5_1)>,
};
constinit const KernelTable kAmxInt8QuantGemms = {
    .isa = Isa::kAmx,
    .gemm_q4_0 = &qvnni::x16::AmxGemmQ4<false>,
    .gemm_q4_1 = &qvnni::x16::AmxGemmQ4<true>,
    .gemm_q4_k_x16 = &qvnni::x16::AmxGemmQ4_K,
    .gemm_q5_k_x16 = &qvnni::x16::AmxGemmQ5_K,
    .gemm_q8_0_x16 = &qvnni::x16::AmxGemmQ8_0,
};
constinit const KernelTable kFarPrefetchQuantGemms = {
    .isa = Isa::kAvx512Vnni,
    .gemm_q4_k_x16 = &qvnni::x16::Gemm<qvnni::x16::kTilesFar, 256, kQ4KX16UnitBytes>,
    .gemm_q5_k_x16 = &qvnni::x16::Gemm<qvnni::x16::kTilesQ5_KFar, 256, kQ5KX16UnitBytes>,
    .gemm_q6_k_x16 = &qvnni::x16::Gemm<qvnni::x16::kTilesQ6_KFar, 256, kQ6KX16UnitBytes>,
};
constinit const KernelTable kAmxHostQuantGemms = {
    .isa = Isa::kAmx,
    .gemm_q6_k_x16 = &qvnni::x16::Gemm<qvnni::x16::kTilesQ6_KNear, 256, kQ6KX16UnitBytes>,
    .gemm_q8_0_x16 =
        &qvnni::x16::Gemm<qvnni::x16::kTilesQ8_0Near, kQ8_0X16UnitElems, kQ8_0X16UnitBytes>,
};
}  // namespace internal

}  // namespace modserve::backend::cpu
