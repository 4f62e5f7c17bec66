// The BF16-weight Gemm on AVX512_BF16's vdpbf16ps, for MatmulPrecision kMedium on CPUs with
// AVX512_BF16 and no usable AMX (AMD Zen 4 and 5; Xeons with AMX refused): prefill and decode
// batches of more than kDpBf16SmallNMax rows. Compiled with -mavx512bf16 for this file only;
// reachable through the AVX-512 tables' gemm_dpbf16 entry, which kernels.cc sets only where
// CpuHasAvx512Bf16().
//
// vdpbf16ps multiplies 16 pairs of bf16 by 16 pairs of bf16 and adds each lane's two products to
// an f32 lane: 32 multiply-adds per instruction against an f32 FMA's 16, and the weights stay
// bf16 (no widening, half the packed panel's bytes). x is f32, so it is split as the AMX tile Gemm
// splits it (kernels.h: DpBf16 layout; amx_gemm_impl.h's AmxSplit): one bf16 term (x rounded to
// bf16, kMedium), or two or three, each multiplied by the same weight pair, so every product is
// exact and only the f32 sums round. The backend passes one: two terms (x to within 2^-16) take
// as many instructions per product as the FMA kernel and three 1.5 times as many, and measured
// slower (KernelTable::gemm_dpbf16), so kHigh and kHighest stay on the FMA units; tests run all
// three.
//
// The BF16 weights that CpuBackend::PrepareGemmWeight copies into the panels once, at load
// (repack_dpbf16), take every Gemm of every row count from them: gemm_dpbf16_panels on this
// micro-kernel at kMedium, gemm_bf16_panels on an f32 FMA micro-kernel over the same panels at
// kHigh and kHighest (FmaMicroKernel below; it needs only AVX-512 F).
//
// The instruction flushes denormal inputs and outputs to zero (it ignores MXCSR): a bf16 term
// below 2^-126 counts as 0, which is within every precision's bound.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "engine/backend/cpu/kernels.h"

namespace modserve::backend::cpu {
namespace {

#include "engine/backend/cpu/bf16_avx512_impl.h"

inline int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }

// ---- x: f32 rows to bf16 terms (SplitX16, AmxSplit's split) ------------------------------------
template <int kTerms>
void PackXTerms(const float* x, int64_t k, int64_t row_begin, int64_t row_end, uint16_t* packed) {
  const int64_t kp = DpBf16PackedK(k);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* xr = x + r * k;
    uint16_t* dst = packed + r * kTerms * kp;
    for (int64_t kk = 0; kk < kp; kk += 16) {
      const __mmask16 m = kk + 16 <= k ? static_cast<__mmask16>(0xffff)
                                       : static_cast<__mmask16>((1u << (k - kk)) - 1u);
      const __mmask16 out = kk + 16 <= kp ? static_cast<__mmask16>(0xffff)
                                          : static_cast<__mmask16>((1u << (kp - kk)) - 1u);
      __m512i t[3];
      SplitX16(_mm512_maskz_loadu_ps(m, xr + kk), &t[0], &t[1], &t[2]);
#pragma GCC unroll 3
      for (int term = 0; term < kTerms; ++term) {
        _mm256_mask_storeu_epi16(dst + term * kp + kk, out, _mm512_cvtepi32_epi16(t[term]));
      }
    }
  }
}

// ---- w: bf16 pair panels ---------------------------------------------------------------------
// A k slice of kKc elements (kKc / 2 pairs) of 32 weight rows is one panel: panel[q][j] (32-bit)
// = the pair w[j, 2q], w[j, 2q + 1] of row j, zero past the block's rows or the slice's k. 32 KiB:
// it stays in L1 while kMr x rows stream past it. A block's kNcPanels panels (128 KiB) sit in L2
// and serve every x row of the call.
constexpr int64_t kNr = kDpBf16PanelRows;
constexpr int64_t kKc = kDpBf16PanelK;
constexpr int64_t kNcPanels = 4;

// Panels of weight rows [0, nc) of w (row stride ldw elements) over k elements [0, kc). Whole
// groups of 16 rows and 32 k are transposed in registers; the rest (odd row counts, a k tail, the
// zero rows past nc) word by word.
void PackPanels(const bf16_t* w, int64_t ldw, int64_t nc, int64_t kc, uint32_t* packed) {
  const int64_t pairs = (kc + 1) / 2;
  const int64_t panels = (nc + kNr - 1) / kNr;
  const int64_t kc_vec = kc / 32 * 32;
  const int64_t nc_vec = nc / 16 * 16;
  const uint16_t* wb = reinterpret_cast<const uint16_t*>(w);
  for (int64_t j0 = 0; j0 < nc_vec; j0 += 16) {
    uint32_t* dst = packed + (j0 / kNr) * pairs * kNr + j0 % kNr;
    for (int64_t kk = 0; kk < kc_vec; kk += 32) {
      PackWTile16x16(wb + j0 * ldw + kk, ldw, dst + kk / 2 * kNr, kNr);
    }
  }
  auto word = [&](int64_t j, int64_t q) -> uint32_t {
    if (j >= nc) return 0;
    const uint16_t* row = wb + j * ldw;
    const uint32_t lo = row[2 * q];
    const uint32_t hi = 2 * q + 1 < kc ? row[2 * q + 1] : 0u;
    return lo | hi << 16;
  };
  for (int64_t j = 0; j < panels * kNr; ++j) {
    uint32_t* dst = packed + (j / kNr) * pairs * kNr + j % kNr;
    const int64_t q0 = j < nc_vec ? kc_vec / 2 : 0;
    for (int64_t q = q0; q < pairs; ++q) dst[q * kNr] = word(j, q);
  }
}

// ---- the micro-kernel -----------------------------------------------------------------------
// c[r, 0..nr) (+)= sum over the slice of x[r] . w for r < kMr: a[r] points at row r's term 0 at
// the slice's first pair (term t kp elements further on). On the first slice c starts from the
// bias (or zero) instead of being read. Each row's sums take the same operations whatever kMr,
// so a row gets the same bits in a tile of any height.
constexpr int kMr = 8;
// Lines of each next-block row that GemmTerms has the micro-kernel prefetch: a kKc slice's.
constexpr int64_t kPrefetchLines = kKc * 2 / 64;

// c[r, 0..nr) = (first ? the bias or 0 : c[r, 0..nr)) + acc[r] for r < kMrT: a micro-kernel's
// write-out, one add per element.
template <int kMrT>
inline void StoreTile(const __m512 (&acc)[kMrT][2], float* c, int64_t ldc, int nr, bool first,
                      const float* bias) {
  if (nr == kNr) {
    for (int r = 0; r < kMrT; ++r) {
      float* cr = c + r * ldc;
      __m512 c0 = _mm512_setzero_ps(), c1 = _mm512_setzero_ps();
      if (!first) {
        c0 = _mm512_loadu_ps(cr);
        c1 = _mm512_loadu_ps(cr + 16);
      } else if (bias != nullptr) {
        c0 = _mm512_loadu_ps(bias);
        c1 = _mm512_loadu_ps(bias + 16);
      }
      _mm512_storeu_ps(cr, _mm512_add_ps(c0, acc[r][0]));
      _mm512_storeu_ps(cr + 16, _mm512_add_ps(c1, acc[r][1]));
    }
    return;
  }
  alignas(64) float tmp[kNr];
  for (int r = 0; r < kMrT; ++r) {
    float* cr = c + r * ldc;
    _mm512_store_ps(tmp, acc[r][0]);
    _mm512_store_ps(tmp + 16, acc[r][1]);
    for (int j = 0; j < nr; ++j) {
      const float base = !first ? cr[j] : (bias != nullptr ? bias[j] : 0.0f);
      cr[j] = base + tmp[j];
    }
  }
}

// Step q's kPfPerStep prefetches into L2 (see MicroKernel).
template <int kPfPerStep>
inline void PrefetchStep(const char* pf, int64_t pf_stride, int64_t q) {
#pragma GCC unroll 2
  for (int l = 0; l < kPfPerStep; ++l) {
    const int64_t line = q * kPfPerStep + l;
    __builtin_prefetch(pf + line / kPrefetchLines * pf_stride + line % kPrefetchLines * 64, 0, 2);
  }
}

// step(q) for q < pairs, the first pf_steps of them with their prefetches (PrefetchStep); a branch
// in one loop made GCC keep the accumulators in memory, hence two loops.
template <int kPfPerStep, typename Step>
__attribute__((always_inline)) inline void RunSteps(Step&& step, int64_t pairs, const char* pf,
                                                    int64_t pf_stride, int64_t pf_steps) {
  const int64_t pf_whole = Min64(pf_steps, pairs);
  for (int64_t q = 0; q < pf_whole; ++q) {
    PrefetchStep<kPfPerStep>(pf, pf_stride, q);
    step(q);
  }
  for (int64_t q = pf_whole; q < pairs; ++q) step(q);
}

// The lone line of an odd last slice (kernels.h) as the pair words of rows 0-15 and 16-31: each
// bf16 in a word's low half, the high half zero.
inline void LoneLineWords(const uint32_t* line, __m512i* lo, __m512i* hi) {
  const __m512i v = _mm512_loadu_si512(line);
  *lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(v));
  *hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1));
}

// The first pf_steps steps prefetch kPfPerStep lines each: line L at pf + L / kPrefetchLines *
// pf_stride + L % kPrefetchLines * 64 (GemmTerms: rows of the next block in w's layout, pf_stride
// a row's bytes; PanelWalk: pf_stride kPrefetchLines * 64, so one contiguous run).
//
// `lone` (the prepared layout's odd last slice, kernels.h): after the pairs, one 64-byte line of
// the 32 rows' last elements, each widened to a pair with a zero high half, which is the word the
// packing Gemm's panels hold there, so the bits are the same.
template <int kTerms, int kMrT, int kPfPerStep>
void MicroKernel(const uint16_t* const* a, int64_t kp, const uint32_t* b, int64_t pairs, bool lone,
                 float* c, int64_t ldc, int nr, bool first, const float* bias, const char* pf,
                 int64_t pf_stride, int64_t pf_steps) {
  __m512 acc[kMrT][2];
#pragma GCC unroll 16
  for (int r = 0; r < kMrT; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  // Pair q of x against the weight words of 16 + 16 rows in b0, b1.
  auto dot = [&](__m512bh b0, __m512bh b1, int64_t q) __attribute__((always_inline)) {
#pragma GCC unroll 16
    for (int r = 0; r < kMrT; ++r) {
#pragma GCC unroll 3
      for (int t = 0; t < kTerms; ++t) {
        uint32_t pair;
        std::memcpy(&pair, a[r] + t * kp + 2 * q, 4);
        const __m512bh av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(pair)));
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
      }
    }
  };
  auto step = [&](int64_t q) __attribute__((always_inline)) {
    dot(reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + q * kNr)),
        reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + q * kNr + 16)), q);
  };
  RunSteps<kPfPerStep>(step, pairs, pf, pf_stride, pf_steps);
  if (lone) {
    __m512i lo, hi;
    LoneLineWords(b + pairs * kNr, &lo, &hi);
    dot(reinterpret_cast<__m512bh>(lo), reinterpret_cast<__m512bh>(hi), pairs);
  }
  StoreTile<kMrT>(acc, c, ldc, nr, first, bias);
}

// The f32 FMA micro-kernel over the prepared panels (gemm_bf16_panels: kHighest and kHigh): a[r]
// points at x row r (f32) at the slice's first element; `pairs` whole pairs, then the `lone`
// line of an odd last slice (MicroKernel); the second argument is unused. Each weight
// pair is widened by a shift (element 2q) and a mask (2q + 1), which is exact, and each output
// takes x[2q] * w then x[2q + 1] * w as two FMAs into one f32 lane: products exact within the
// FMA, one rounding per sum, each row in the same order whatever kMrT.
template <int kMrT, int kPfPerStep>
void FmaMicroKernel(const float* const* a, int64_t, const uint32_t* b, int64_t pairs, bool lone,
                    float* c, int64_t ldc, int nr, bool first, const float* bias, const char* pf,
                    int64_t pf_stride, int64_t pf_steps) {
  __m512 acc[kMrT][2];
#pragma GCC unroll 16
  for (int r = 0; r < kMrT; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  const __m512i hi_half = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  auto half = [&](__m512 w0, __m512 w1, int64_t e) __attribute__((always_inline)) {
#pragma GCC unroll 16
    for (int r = 0; r < kMrT; ++r) {
      const __m512 xv = _mm512_set1_ps(a[r][e]);
      acc[r][0] = _mm512_fmadd_ps(w0, xv, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(w1, xv, acc[r][1]);
    }
  };
  auto step = [&](int64_t q) __attribute__((always_inline)) {
    const __m512i v0 = _mm512_loadu_si512(b + q * kNr);
    const __m512i v1 = _mm512_loadu_si512(b + q * kNr + 16);
    half(_mm512_castsi512_ps(_mm512_slli_epi32(v0, 16)),
         _mm512_castsi512_ps(_mm512_slli_epi32(v1, 16)), 2 * q);
    half(_mm512_castsi512_ps(_mm512_and_si512(v0, hi_half)),
         _mm512_castsi512_ps(_mm512_and_si512(v1, hi_half)), 2 * q + 1);
  };
  RunSteps<kPfPerStep>(step, pairs, pf, pf_stride, pf_steps);
  if (lone) {
    __m512i lo, hi;
    LoneLineWords(b + pairs * kNr, &lo, &hi);
    half(_mm512_castsi512_ps(_mm512_slli_epi32(lo, 16)),
         _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16)), 2 * pairs);
  }
  StoreTile<kMrT>(acc, c, ldc, nr, first, bias);
}

template <typename X>
using TileFn = void (*)(const X* const*, int64_t, const uint32_t*, int64_t, bool, float*, int64_t,
                        int, bool, const float*, const char*, int64_t, int64_t);
// The micro-kernels by tile height: [mr - 1] for mr = 1 .. kMr.
template <int kTerms, int kPfPerStep>
inline constexpr TileFn<uint16_t> kMicroKernels[kMr] = {
    &MicroKernel<kTerms, 1, kPfPerStep>, &MicroKernel<kTerms, 2, kPfPerStep>,
    &MicroKernel<kTerms, 3, kPfPerStep>, &MicroKernel<kTerms, 4, kPfPerStep>,
    &MicroKernel<kTerms, 5, kPfPerStep>, &MicroKernel<kTerms, 6, kPfPerStep>,
    &MicroKernel<kTerms, 7, kPfPerStep>, &MicroKernel<kTerms, 8, kPfPerStep>};
template <int kPfPerStep>
inline constexpr TileFn<float> kFmaMicroKernels[kMr] = {
    &FmaMicroKernel<1, kPfPerStep>, &FmaMicroKernel<2, kPfPerStep>, &FmaMicroKernel<3, kPfPerStep>,
    &FmaMicroKernel<4, kPfPerStep>, &FmaMicroKernel<5, kPfPerStep>, &FmaMicroKernel<6, kPfPerStep>,
    &FmaMicroKernel<7, kPfPerStep>, &FmaMicroKernel<8, kPfPerStep>};

template <int kTerms>
void GemmTerms(const uint16_t* packed_x, int64_t k, int64_t x_begin, int64_t x_end, const bf16_t* w,
               const float* bias, float* out, int64_t ldo, int64_t row_begin, int64_t row_end) {
  const int64_t kp = DpBf16PackedK(k);
  alignas(64) uint32_t packed[kKc / 2 * kNr * kNcPanels];
  for (int64_t jb = row_begin; jb < row_end; jb += kNr * kNcPanels) {
    const int64_t nc = Min64(kNr * kNcPanels, row_end - jb);
    const int64_t panels = (nc + kNr - 1) / kNr;
    for (int64_t k0 = 0; k0 < k; k0 += kKc) {
      const int64_t kc = Min64(kKc, k - k0);
      const int64_t pairs = (kc + 1) / 2;
      PackPanels(w + jb * k + k0, k, nc, kc, packed);
      // The block this call packs next (its next k slice, or the next rows' first one): while
      // this one computes, each micro-kernel call prefetches up to 16 of its rows into L2, one
      // 64-byte line per step (kPrefetchLines per row, a slice's 1 KiB). Packing reads w from
      // DRAM, and without this a decode-sized call waited for each block's reads and then
      // computed: at 16 x rows a block has as many steps as lines (docs/PERFORMANCE.md).
      const char* next = nullptr;
      int64_t next_rows = 0, next_row = 0;
      if (k0 + kKc < k) {
        next = reinterpret_cast<const char*>(w + jb * k + k0 + kKc);
        next_rows = nc;
      } else if (jb + kNr * kNcPanels < row_end) {
        next = reinterpret_cast<const char*>(w + (jb + kNr * kNcPanels) * k);
        next_rows = Min64(kNr * kNcPanels, row_end - jb - kNr * kNcPanels);
      }
      for (int64_t i0 = x_begin; i0 < x_end; i0 += kMr) {
        const int mr = static_cast<int>(Min64(kMr, x_end - i0));
        const uint16_t* a[kMr];
        for (int r = 0; r < mr; ++r) a[r] = packed_x + (i0 + r) * kTerms * kp + k0;
        for (int64_t p = 0; p < panels; ++p) {
          const int nr = static_cast<int>(Min64(kNr, nc - p * kNr));
          // Whole rows (past a shorter slice the lines belong to the row's next one or the
          // next row: prefetches never fault).
          const int64_t rows_here = Min64(next_rows - next_row, pairs / kPrefetchLines);
          const char* pf = next != nullptr ? next + next_row * k * 2 : nullptr;
          const int64_t pf_steps = rows_here * kPrefetchLines;
          next_row += rows_here;
          kMicroKernels<kTerms, 1>[mr - 1](
              a, kp, packed + p * pairs * kNr, pairs, false, out + i0 * ldo + jb + p * kNr, ldo, nr,
              k0 == 0, bias != nullptr ? bias + jb + p * kNr : nullptr, pf, k * 2, pf_steps);
        }
      }
    }
  }
}

// ---- w prepared once: the DpBf16 panel layout (kernels.h) -------------------------------------
// Group g's panels at g * GroupWords(k) words (its rows' bytes), slice k0's at k0 / 2 * kNr words
// into it; an odd last slice's pairs, then its lone line of 32 bf16 (row j's last element at j).
constexpr int64_t GroupWords(int64_t k) { return DpBf16PanelGroupBytes(k) / 4; }

void RepackPanels(const bf16_t* w, int64_t k, int64_t group_begin, int64_t group_end,
                  uint32_t* dst) {
  const uint16_t* wb = reinterpret_cast<const uint16_t*>(w);
  for (int64_t g = group_begin; g < group_end; ++g) {
    for (int64_t k0 = 0; k0 < k; k0 += kKc) {
      const int64_t kc = Min64(kKc, k - k0);
      uint32_t* slice = dst + g * GroupWords(k) + k0 / 2 * kNr;
      PackPanels(w + g * kNr * k + k0, k, kNr, kc / 2 * 2, slice);
      if (kc % 2 != 0) {
        uint16_t* line = reinterpret_cast<uint16_t*>(slice + kc / 2 * kNr);
        for (int64_t j = 0; j < kNr; ++j) line[j] = wb[(g * kNr + j) * k + k - 1];
      }
    }
  }
}

// GemmTerms over prepared panels: the same blocks of kNcPanels groups by a kKc slice (one group
// when there is one x tile, so that a decode call's rows are one ascending stream: batch-1 decode
// 1.2-1.5x on Zen 5), the same micro-kernel steps (so the same bits), and no packing. Each panel's
// micro-kernel calls prefetch the same panel of the next block into L2 (its pairs' 128 bytes
// each): the only x tile two lines per step, or the first two tiles one line per
// step each, so that the lines go out at the pace of the compute instead of in one burst.
//
// x row i at x + i * x_stride (the packed terms, or f32 rows); tiles[mr - 1] the micro-kernels
// of one line per prefetching step, tiles2 of two; `aux` their second argument.
template <typename X>
void PanelWalk(const X* x, int64_t x_stride, int64_t k, int64_t x_begin, int64_t x_end,
               const uint32_t* w, const float* bias, float* out, int64_t ldo, int64_t row_begin,
               int64_t row_end, const TileFn<X>* tiles, const TileFn<X>* tiles2, int64_t aux) {
  const int64_t group_words = GroupWords(k);
  const int64_t nc_panels = x_end - x_begin <= kMr ? 1 : kNcPanels;
  for (int64_t jb = row_begin; jb < row_end; jb += kNr * nc_panels) {
    const int64_t panels = Min64(nc_panels, (row_end - jb) / kNr);
    const uint32_t* block = w + jb / kNr * group_words;
    for (int64_t k0 = 0; k0 < k; k0 += kKc) {
      const int64_t kc = Min64(kKc, k - k0);
      const int64_t pairs = kc / 2;
      const bool lone = kc % 2 != 0;
      // The next block: this block's groups at the next slice, or the next groups' first.
      const uint32_t* next = nullptr;
      if (k0 + kKc < k) {
        next = block + (k0 + kKc) / 2 * kNr;
      } else if (jb + kNr * nc_panels < row_end) {
        next = block + nc_panels * group_words;
      }
      const int64_t next_panels = next == nullptr ? 0
                                  : k0 + kKc < k
                                      ? panels
                                      : Min64(nc_panels, (row_end - jb) / kNr - nc_panels);
      for (int64_t i0 = x_begin; i0 < x_end; i0 += kMr) {
        const int mr = static_cast<int>(Min64(kMr, x_end - i0));
        const X* a[kMr];
        for (int r = 0; r < mr; ++r) a[r] = x + (i0 + r) * x_stride + k0;
        const int64_t tile = (i0 - x_begin) / kMr;
        for (int64_t p = 0; p < panels; ++p) {
          const uint32_t* b = block + p * group_words + k0 / 2 * kNr;
          float* c = out + i0 * ldo + jb + p * kNr;
          const float* bp = bias != nullptr ? bias + jb + p * kNr : nullptr;
          const char* pf = p < next_panels && tile < 2
                               ? reinterpret_cast<const char*>(next + p * group_words)
                               : nullptr;
          if (pf != nullptr && x_end - x_begin <= kMr) {
            tiles2[mr - 1](a, aux, b, pairs, lone, c, ldo, kNr, k0 == 0, bp, pf,
                           kPrefetchLines * 64, pairs);
          } else {
            tiles[mr - 1](a, aux, b, pairs, lone, c, ldo, kNr, k0 == 0, bp,
                          pf != nullptr ? pf + tile * pairs * 64 : nullptr, kPrefetchLines * 64,
                          pf != nullptr ? pairs : 0);
          }
        }
      }
    }
  }
}

// f(std::integral_constant<int, T>()) for T = terms: 1, 2, or 3 for any other count.
template <typename F>
void ByTerms(int terms, F&& f) {
  switch (terms) {
    case 1:
      return f(std::integral_constant<int, 1>());
    case 2:
      return f(std::integral_constant<int, 2>());
    default:
      return f(std::integral_constant<int, 3>());
  }
}

}  // namespace

namespace internal {
void DpBf16RepackW(const bf16_t* w, int64_t k, int64_t group_begin, int64_t group_end, void* dst) {
  RepackPanels(w, k, group_begin, group_end, static_cast<uint32_t*>(dst));
}

void DpBf16PanelGemm(const void* packed_x, int64_t k, int64_t x_begin, int64_t x_end, const void* w,
                     const float* bias, float* out, int64_t ldo, int64_t row_begin, int64_t row_end,
                     int terms) {
  const int64_t kp = DpBf16PackedK(k);
  ByTerms(terms, [&](auto t) {
    constexpr int kTerms = decltype(t)::value;
    PanelWalk(static_cast<const uint16_t*>(packed_x), kTerms * kp, k, x_begin, x_end,
              static_cast<const uint32_t*>(w), bias, out, ldo, row_begin, row_end,
              kMicroKernels<kTerms, 1>, kMicroKernels<kTerms, 2>, kp);
  });
}

void Bf16PanelFmaGemm(const float* x, int64_t k, int64_t x_begin, int64_t x_end, const void* w,
                      const float* bias, float* out, int64_t ldo, int64_t row_begin,
                      int64_t row_end) {
  PanelWalk(x, k, k, x_begin, x_end, static_cast<const uint32_t*>(w), bias, out, ldo, row_begin,
            row_end, kFmaMicroKernels<1>, kFmaMicroKernels<2>, 0);
}

void DpBf16PackX(const float* x, int64_t k, int64_t row_begin, int64_t row_end, void* packed,
                 int terms) {
  ByTerms(terms, [&](auto t) {
    PackXTerms<decltype(t)::value>(x, k, row_begin, row_end, static_cast<uint16_t*>(packed));
  });
}

void DpBf16Gemm(const void* packed_x, int64_t k, int64_t x_begin, int64_t x_end, const bf16_t* w,
                const float* bias, float* out, int64_t ldo, int64_t row_begin, int64_t row_end,
                int terms) {
  ByTerms(terms, [&](auto t) {
    GemmTerms<decltype(t)::value>(static_cast<const uint16_t*>(packed_x), k, x_begin, x_end, w,
                                  bias, out, ldo, row_begin, row_end);
  });
}
}  // namespace internal

}  // namespace modserve::backend::cpu
