// The AMX BF16 prefill Gemm on the matrix unit. Compiled with -mamx-tile -mamx-bf16 and AVX-512
// for this file only, so nothing here may run before kernels.cc's probe (baseline code) has found
// the unit, the OS tile state and this process's tile permission: even a struct copy in this file
// may be an AVX-512 instruction.
#include <immintrin.h>

#include <cstdint>

#include "engine/backend/cpu/kernels.h"

namespace modserve::backend::cpu {
namespace {

#include "engine/backend/cpu/amx_tile_regs.h"

// The tile registers: configuration, loads and stores from amx_tile_regs.h, and the BF16 products.
struct HwTiles : AmxTileRegs<kAmxTileConfig> {
  template <int kC, int kA, int kB>
  static void Dot() {
    static_assert((kC == 0 && kA == 4 && kB == 6) || (kC == 1 && kA == 4 && kB == 7) ||
                      (kC == 2 && kA == 5 && kB == 6) || (kC == 3 && kA == 5 && kB == 7) ||
                      (kC == 2 && kA == 4 && kB == 6) || (kC == 3 && kA == 4 && kB == 7),
                  "only the products of GemmAmxBf16's 2 x 2 block and of GemmAmxBf16DecodeWide's "
                  "1 x 4 row have an instruction here");
    if constexpr (kC == 0 && kA == 4 && kB == 6) _tile_dpbf16ps(0, 4, 6);
    if constexpr (kC == 1 && kA == 4 && kB == 7) _tile_dpbf16ps(1, 4, 7);
    if constexpr (kC == 2 && kA == 5 && kB == 6) _tile_dpbf16ps(2, 5, 6);
    if constexpr (kC == 3 && kA == 5 && kB == 7) _tile_dpbf16ps(3, 5, 7);
    if constexpr (kC == 2 && kA == 4 && kB == 6) _tile_dpbf16ps(2, 4, 6);
    if constexpr (kC == 3 && kA == 4 && kB == 7) _tile_dpbf16ps(3, 4, 7);
  }
  static void PackW(const uint16_t* w, int64_t k, int64_t c0, int64_t nc, int64_t ctiles,
                    int64_t s0, int64_t ns, uint32_t* bp);
  static void WriteOutTransposed(const float* c, int64_t cs, int64_t nr, int64_t nc,
                                 const float* bias, float* out, int64_t ldo, int64_t r0,
                                 int64_t c0);
};

#include "engine/backend/cpu/amx_gemm_impl.h"
#include "engine/backend/cpu/bf16_avx512_impl.h"

// PackWBf16 with whole tiles transposed in registers; a column tile past nc and a step past k go
// through PackWBf16 itself.
void HwTiles::PackW(const uint16_t* w, int64_t k, int64_t c0, int64_t nc, int64_t ctiles,
                    int64_t s0, int64_t ns, uint32_t* bp) {
  constexpr int64_t kTileWords = kAmxTileRows * kAmxTileRows;
  for (int64_t ct = 0; ct < ctiles; ++ct) {
    uint32_t* col_tiles = bp + ct * kAmxSliceSteps * kTileWords;
    if ((ct + 1) * kAmxTileRows > nc) {
      PackWBf16(w, k, c0 + ct * kAmxTileRows, nc - ct * kAmxTileRows, 1, s0, ns, col_tiles);
      continue;
    }
    const uint16_t* rows = w + (c0 + ct * kAmxTileRows) * k;
    for (int64_t s = 0; s < ns; ++s) {
      if ((s0 + s + 1) * kAmxStepK <= k) {
        PackWTile16x16(rows + (s0 + s) * kAmxStepK, k, col_tiles + s * kTileWords);
      } else {
        PackWBf16(w, k, c0 + ct * kAmxTileRows, kAmxTileRows, 1, s0 + s, 1,
                  col_tiles + s * kTileWords);
      }
    }
  }
}

// AmxWriteOutTransposed a 16 x 16 block at a time: PackWTile16x16 (a transpose of 32-bit words)
// turns 16 weight rows of the staging into 16 x rows of 16 outputs, which take the bias (or 0.0f,
// as the plain loop adds) in one vector add and go out in one masked store each. A decode loop's
// staging holds at least 16 weight rows and 16 x rows per block, so the reads stay inside it.
void HwTiles::WriteOutTransposed(const float* c, int64_t cs, int64_t nr, int64_t nc,
                                 const float* bias, float* out, int64_t ldo, int64_t r0,
                                 int64_t c0) {
  alignas(64) uint32_t block[kAmxTileRows * kAmxTileRows];
  for (int64_t j0 = 0; j0 < nc; j0 += kAmxTileRows) {
    const int64_t cols = nc - j0 < kAmxTileRows ? nc - j0 : kAmxTileRows;
    const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
    const __m512 b =
        bias != nullptr ? _mm512_maskz_loadu_ps(mask, bias + c0 + j0) : _mm512_setzero_ps();
    for (int64_t i0 = 0; i0 < nr; i0 += kAmxTileRows) {
      PackWTile16x16(reinterpret_cast<const uint16_t*>(c + j0 * cs + i0), 2 * cs, block);
      const int64_t rows = nr - i0 < kAmxTileRows ? nr - i0 : kAmxTileRows;
      for (int64_t i = 0; i < rows; ++i) {
        const __m512 v = _mm512_castsi512_ps(_mm512_load_si512(block + i * kAmxTileRows));
        _mm512_mask_storeu_ps(out + (r0 + i0 + i) * ldo + c0 + j0, mask, _mm512_add_ps(v, b));
      }
    }
  }
}

static_assert(kAmxScratchFloats == kAmxStagingFloats + kAmxBTilesWords);
// One row of x pads to two row tiles of (at most) three 1 KiB terms.
static_assert(AmxPackedXBytes(1, 1) == 2 * kAmxMaxTerms * kAmxTileBf16 * 2);

// The first kTerms bf16 terms of 32 floats (two vectors), as 32-word rows of the tiles at
// dst + t * tile_words.
template <int kTerms>
inline void StoreTerms32(__m512 lo, __m512 hi, uint16_t* dst, int64_t tile_words) {
  __m512i terms[2][3];
  SplitX16(lo, &terms[0][0], &terms[0][1], &terms[0][2]);
  SplitX16(hi, &terms[1][0], &terms[1][1], &terms[1][2]);
  for (int t = 0; t < kTerms; ++t) {
    const __m256i a = _mm512_cvtepi32_epi16(terms[0][t]);
    const __m256i b = _mm512_cvtepi32_epi16(terms[1][t]);
    _mm512_storeu_si512(dst + t * tile_words, _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
  }
}

// PackXBf16<kTerms> with 16 elements split at a time, and the transposes of a Gemm of at most
// kAmxFewRows rows in registers; the same bits.
template <int kTerms>
void PackXBf16Vec(const float* x, int64_t n, int64_t k, int64_t row_begin, int64_t row_end,
                  uint16_t* packed) {
  const int64_t steps = AmxRoundUp(k, kAmxStepK) / kAmxStepK;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t rt = r / kAmxTileRows, rr = r % kAmxTileRows;
    for (int64_t s = 0; s < steps; ++s) {
      uint16_t* tiles = packed + (rt * steps + s) * kTerms * kAmxTileBf16 + rr * kAmxStepK;
      __m512 v[2];
      for (int half = 0; half < 2; ++half) {
        const int64_t k0 = s * kAmxStepK + 16 * half;
        const int64_t left = r < n ? k - k0 : 0;
        const __mmask16 mask = left >= 16  ? static_cast<__mmask16>(0xffff)
                               : left <= 0 ? static_cast<__mmask16>(0)
                                           : static_cast<__mmask16>((1u << left) - 1);
        v[half] = _mm512_maskz_loadu_ps(mask, x + (r < n ? r * k + k0 : 0));
      }
      StoreTerms32<kTerms>(v[0], v[1], tiles, kAmxTileBf16);
    }
  }
  if (n <= kAmxFewRows) {
    alignas(64) uint32_t transposed[kAmxTileRows * kAmxTileRows];
    for (int64_t i = row_begin / kAmxTileRows * steps * kTerms;
         i < row_end / kAmxTileRows * steps * kTerms; ++i) {
      uint16_t* tile = packed + i * kAmxTileBf16;
      PackWTile16x16(tile, kAmxStepK, transposed);
      __builtin_memcpy(tile, transposed, sizeof(transposed));
    }
  }
}

// ---- Attention of a prefill block on the tiles (KernelTable::attn_block_bf16) ----------------
// Per kv head and split (at most kAmxAttnKeys keys): the split's K vectors transposed into B
// tiles (16 keys x 32 dims, PackWTile16x16) and its V vectors interleaved by key pairs into B
// tiles (32 keys x 16 dims), once; then for each tile of 16 q-rows: the q terms as A tiles, the
// scores S = Q . K^T into C tiles 0-3 (four key tiles at a time) and out to a 16 x 256 staging,
// the exact softmax of each q-row over the keys it sees (max, e^(s - max) with VecExp, zero past
// them), its terms as A tiles, and O = P . V into C tiles 0-3 (four 16-dim tiles at a time).
// Every q-row takes the same operations on its own tile row, so its outputs do not depend on the
// other q-rows of its tile (a tile product computes each output from its own A row and B column).

// VecExp's operations on 16 lanes.
struct ExpOps {
  using V = __m512;
  static V Set1(float v) { return _mm512_set1_ps(v); }
  static V Min(V a, V b) { return _mm512_min_ps(a, b); }
  static V Max(V a, V b) { return _mm512_max_ps(a, b); }
  static V Round(V v) {
    return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Ldexp(V p, V n) { return _mm512_scalef_ps(p, n); }
};

#include "engine/backend/cpu/vec_exp_impl.h"

// C tile kC (0-3) += A tile 4 . B tile 6 (even kC) or 7 (odd kC), the B tile kC multiplies.
template <int kC>
inline void AttnDot() {
  if constexpr (kC == 0) _tile_dpbf16ps(0, 4, 6);
  if constexpr (kC == 1) _tile_dpbf16ps(1, 4, 7);
  if constexpr (kC == 2) _tile_dpbf16ps(2, 4, 6);
  if constexpr (kC == 3) _tile_dpbf16ps(3, 4, 7);
}
constexpr int AttnB(int c) { return 6 + c % 2; }
// f.template operator()<c>() for c < count (at most 4 C tiles).
template <class F>
inline void ForEachC(int64_t count, F&& f) {
  if (count > 0) f.template operator()<0>();
  if (count > 1) f.template operator()<1>();
  if (count > 2) f.template operator()<2>();
  if (count > 3) f.template operator()<3>();
}

// C tiles c < count (at most 4) = the sum over steps s and terms t of A(s, t) . B(s, c) (A in
// tile 4, B in tile 6 or 7), each then stored at out + 16 c (rows `stride` bytes apart): a(s, t)
// and b(s, c) give the tiles' addresses.
template <int kTerms, class A, class B>
inline void AttnTileSums(int64_t count, int64_t steps, A&& a, B&& b, float* out, int64_t stride) {
  ForEachC(count, []<int kC>() { HwTiles::Zero<kC>(); });
  for (int64_t s = 0; s < steps; ++s) {
    for (int t = 0; t < kTerms; ++t) {
      HwTiles::Load<4>(a(s, t), 64);
      ForEachC(count, [&]<int kC>() {
        HwTiles::Load<AttnB(kC)>(b(s, kC), 64);
        AttnDot<kC>();
      });
    }
  }
  ForEachC(count, [&]<int kC>() { HwTiles::Store<kC>(out + 16 * kC, stride); });
}

// StoreTerms32 for the probabilities, which are finite and not negative: AmxSplit's terms without
// its non-finite and overflow cases (the same bits for such values), each term's 32 words picked
// from the two vectors' low halves in one permute.
template <int kTerms>
inline void StoreProbTerms32(__m512 lo, __m512 hi, uint16_t* dst, int64_t tile_words) {
  alignas(64) static constexpr uint16_t kLowWords[32] = {0,  2,  4,  6,  8,  10, 12, 14, 16, 18, 20,
                                                         22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 42,
                                                         44, 46, 48, 50, 52, 54, 56, 58, 60, 62};
  const __m512i pick = _mm512_load_si512(kLowWords);
  __m512 rest[2] = {lo, hi};
  for (int t = 0; t < kTerms; ++t) {
    __m512i bits[2];
    for (int h = 0; h < 2; ++h) {
      bits[h] = Bf16BitsX16(_mm512_castps_si512(rest[h]));
      if (t + 1 < kTerms) {
        rest[h] = _mm512_sub_ps(rest[h], _mm512_castsi512_ps(_mm512_slli_epi32(bits[h], 16)));
      }
    }
    _mm512_storeu_si512(dst + t * tile_words, _mm512_permutex2var_epi16(bits[0], pick, bits[1]));
  }
}

template <int kTerms>
void AttnBlockBf16(const AmxAttnBlock& b) {
  constexpr int64_t kTileWords = kAmxTileBf16;  // 512 bf16 = 1 KiB
  const int64_t hd = b.head_dim, steps = hd / 32, dtiles = hd / 16;
  const int64_t nkt = (b.num_keys + 15) / 16, nvs = (b.num_keys + 31) / 32;
  uint16_t* ktiles = static_cast<uint16_t*>(b.scratch);
  uint16_t* vtiles = ktiles + kAmxAttnKeys / 16 * steps * kTileWords;
  uint16_t* qtiles = vtiles + kAmxAttnKeys / 32 * dtiles * kTileWords;
  uint16_t* ptiles = qtiles + steps * 3 * kTileWords;
  uint16_t* gather = ptiles + kAmxAttnKeys / 32 * 3 * kTileWords;
  float* scores = reinterpret_cast<float*>(gather + kTileWords);  // [16][kAmxAttnKeys]
  float* o = scores + 16 * kAmxAttnKeys;                          // [16][hd]

  // K: tile (kt, s) holds keys 16 kt .. 16 kt + 15, dims 32 s .. 32 s + 31; keys past num_keys 0.
  for (int64_t kt = 0; kt < nkt; ++kt) {
    for (int64_t s = 0; s < steps; ++s) {
      for (int64_t n = 0; n < 16; ++n) {
        const int64_t j = 16 * kt + n;
        const __m512i v =
            j < b.num_keys ? _mm512_loadu_si512(b.keys[j] + 32 * s) : _mm512_setzero_si512();
        _mm512_store_si512(gather + 32 * n, v);
      }
      PackWTile16x16(gather, 32,
                     reinterpret_cast<uint32_t*>(ktiles + (kt * steps + s) * kTileWords));
    }
  }
  // V: tile (vs, dt) row p holds, for dims 16 dt + n, the pair (key 32 vs + 2 p, key 32 vs + 2 p
  // + 1); keys past num_keys 0 (their probabilities are 0, and 0 * garbage could be a NaN).
  alignas(64) static constexpr uint16_t kInterleave[32] = {
      0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i interleave = _mm512_load_si512(kInterleave);
  for (int64_t vs = 0; vs < nvs; ++vs) {
    for (int64_t p = 0; p < 16; ++p) {
      const int64_t j0 = 32 * vs + 2 * p, j1 = j0 + 1;
      for (int64_t dt = 0; dt < dtiles; ++dt) {
        const __m256i a =
            j0 < b.num_keys
                ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.values[j0] + 16 * dt))
                : _mm256_setzero_si256();
        const __m256i c =
            j1 < b.num_keys
                ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.values[j1] + 16 * dt))
                : _mm256_setzero_si256();
        _mm512_store_si512(vtiles + (vs * dtiles + dt) * kTileWords + 32 * p,
                           _mm512_permutexvar_epi16(
                               interleave, _mm512_inserti64x4(_mm512_castsi256_si512(a), c, 1)));
      }
    }
  }

  const int64_t f_count = b.rows * b.group;
  const __m512 scale = _mm512_set1_ps(b.scale);
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  HwTiles::Configure();
  for (int64_t f0 = 0; f0 < f_count; f0 += 16) {
    // q terms: tile (s, t) row i = term t of q-row f0 + i, dims 32 s ..; rows past f_count 0.
    for (int64_t i = 0; i < 16; ++i) {
      const int64_t f = f0 + i;
      if (f >= f_count) {
        for (int64_t t = 0; t < steps * kTerms; ++t) {
          _mm512_store_si512(qtiles + t * kTileWords + 32 * i, _mm512_setzero_si512());
        }
        continue;
      }
      const float* src = b.q + f / b.group * b.ldq + f % b.group * hd;
      for (int64_t s = 0; s < steps; ++s) {
        StoreTerms32<kTerms>(_mm512_loadu_ps(src + 32 * s), _mm512_loadu_ps(src + 32 * s + 16),
                             qtiles + s * kTerms * kTileWords + 32 * i, kTileWords);
      }
    }
    // Scores, four key tiles at a time.
    for (int64_t kt0 = 0; kt0 < nkt; kt0 += 4) {
      AttnTileSums<kTerms>(
          nkt - kt0 < 4 ? nkt - kt0 : 4, steps,
          [&](int64_t s, int t) { return qtiles + (s * kTerms + t) * kTileWords; },
          [&](int64_t s, int64_t c) { return ktiles + ((kt0 + c) * steps + s) * kTileWords; },
          scores + 16 * kt0, kAmxAttnKeys * sizeof(float));
    }
    // The softmax of each q-row over the keys it sees; its probabilities' terms as A tiles
    // (vs, t): row i = keys 32 vs .. 32 vs + 31 of q-row f0 + i.
    for (int64_t i = 0; i < 16; ++i) {
      const int64_t f = f0 + i;
      int64_t seen = 0;
      if (f < f_count) {
        seen = b.kv_len0 + f / b.group - b.key_begin;
        seen = seen < 0 ? 0 : seen > b.num_keys ? b.num_keys : seen;
      }
      if (seen == 0) {  // past the block's q-rows, or no key of the split yet
        for (int64_t t = 0; t < nvs * kTerms; ++t) {
          _mm512_store_si512(ptiles + t * kTileWords + 32 * i, _mm512_setzero_si512());
        }
        if (f < f_count) {
          b.m[f] = -__builtin_inff();
          b.l[f] = 0.0f;
        }
        continue;
      }
      float* row = scores + i * kAmxAttnKeys;
      __m512 vmax = neg_inf;
      for (int64_t j = 0; j < seen; j += 16) {
        const __mmask16 k = seen - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (seen - j)) - 1);
        const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, row + j), scale);
        vmax = _mm512_mask_max_ps(vmax, k, vmax, v);
      }
      const float mx = _mm512_reduce_max_ps(vmax);
      const __m512 vm = _mm512_set1_ps(mx);
      __m512 vsum = _mm512_setzero_ps();
      for (int64_t j = 0; j < 32 * nvs; j += 32) {
        __m512 p[2];
        for (int h = 0; h < 2; ++h) {
          const int64_t left = seen - j - 16 * h;
          const __mmask16 k = left >= 16  ? __mmask16(0xffff)
                              : left <= 0 ? __mmask16(0)
                                          : __mmask16((1u << left) - 1);
          const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, row + j + 16 * h), scale);
          p[h] = _mm512_maskz_mov_ps(k, VecExp<ExpOps>(_mm512_sub_ps(v, vm)));
          vsum = _mm512_add_ps(vsum, p[h]);
        }
        StoreProbTerms32<kTerms>(p[0], p[1], ptiles + j / 32 * kTerms * kTileWords + 32 * i,
                                 kTileWords);
      }
      b.m[f] = mx;
      b.l[f] = _mm512_reduce_add_ps(vsum);
    }
    // O = P . V, four 16-dim tiles at a time.
    for (int64_t dt0 = 0; dt0 < dtiles; dt0 += 4) {
      AttnTileSums<kTerms>(
          dtiles - dt0 < 4 ? dtiles - dt0 : 4, nvs,
          [&](int64_t vs, int t) { return ptiles + (vs * kTerms + t) * kTileWords; },
          [&](int64_t vs, int64_t c) { return vtiles + (vs * dtiles + dt0 + c) * kTileWords; },
          o + 16 * dt0, hd * static_cast<int64_t>(sizeof(float)));
    }
    for (int64_t i = 0; i < 16 && f0 + i < f_count; ++i) {
      __builtin_memcpy(b.acc + (f0 + i) * hd, o + i * hd, hd * sizeof(float));
    }
  }
  HwTiles::Release();
}

}  // namespace

namespace internal {

void AmxPackX(const float* x, int64_t n, int64_t k, int64_t row_begin, int64_t row_end,
              void* packed, int terms) {
  uint16_t* p = static_cast<uint16_t*>(packed);
  switch (terms) {
    case 1:
      return PackXBf16Vec<1>(x, n, k, row_begin, row_end, p);
    case 2:
      return PackXBf16Vec<2>(x, n, k, row_begin, row_end, p);
    default:
      return PackXBf16Vec<3>(x, n, k, row_begin, row_end, p);
  }
}

void AmxPackW(const bf16_t* w, int64_t k, int64_t c0, int64_t nc, int64_t ctiles, int64_t s0,
              int64_t ns, uint32_t* tiles) {
  HwTiles::PackW(reinterpret_cast<const uint16_t*>(w), k, c0, nc, ctiles, s0, ns, tiles);
}

void AmxGemmBf16(const void* packed_x, int64_t n, int64_t k, int64_t x_begin, int64_t x_end,
                 const bf16_t* w, const float* bias, float* out, int64_t ldo, int64_t row_begin,
                 int64_t row_end, float* scratch, int terms) {
  GemmAmxBf16Terms<HwTiles>(terms, static_cast<const uint16_t*>(packed_x), n, k, x_begin, x_end,
                            reinterpret_cast<const uint16_t*>(w), bias, out, ldo, row_begin,
                            row_end, scratch);
}

void AmxAttnBlockBf16(const AmxAttnBlock& block) {
  switch (block.terms) {
    case 1:
      return AttnBlockBf16<1>(block);
    case 2:
      return AttnBlockBf16<2>(block);
    default:
      return AttnBlockBf16<3>(block);
  }
}

}  // namespace internal

}  // namespace modserve::backend::cpu
