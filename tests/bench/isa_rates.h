// Instruction throughput probes: one thread runs 12 independent chains of one vector instruction
// on registers only (the load probes: one L1 load each), in CPU time, so the figure is how many
// of that instruction a core retires per second when nothing else limits it. The kernels' design
// notes (PERFORMANCE.md) compare these rates: an FMA against vpdpbusd, vpmaddubsw and vdpbf16ps,
// ymm against zmm, and loads (64-byte, and 4-byte broadcast) against them. Each probe runs only
// where the CPU has its ISA (the caller checks). Used by kernel_bench isa-rates.
#ifndef MODSERVE_TESTS_BENCH_ISA_RATES_H_
#define MODSERVE_TESTS_BENCH_ISA_RATES_H_

#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <cstdint>

namespace modserve::bench {

// NAME(iters): iters x 12 instructions OP(chain, b, k) (k: the chain, 0-11), 12 chains in named
// registers (an array would live in memory around the asm, and store-to-load latency would be
// measured instead). The empty asm claims to change every chain and b each iteration, so the
// compiler can neither merge nor hoist them; "+v" admits any vector register the target has (zmm
// included), "+r" (a load probe's b, a pointer) a general one.
#define MODSERVE_RATE_PROBE(NAME, TARGET, VEC, C_INIT, B_INIT, B_REG, OP)                      \
  __attribute__((target(TARGET))) inline void NAME(int64_t iters) {                            \
    VEC c0 = C_INIT, c1 = C_INIT, c2 = C_INIT, c3 = C_INIT, c4 = C_INIT, c5 = C_INIT;          \
    VEC c6 = C_INIT, c7 = C_INIT, c8 = C_INIT, c9 = C_INIT, c10 = C_INIT, c11 = C_INIT;        \
    auto b = B_INIT;                                                                           \
    for (int64_t it = 0; it < iters; ++it) {                                                   \
      c0 = OP(c0, b, 0);                                                                       \
      c1 = OP(c1, b, 1);                                                                       \
      c2 = OP(c2, b, 2);                                                                       \
      c3 = OP(c3, b, 3);                                                                       \
      c4 = OP(c4, b, 4);                                                                       \
      c5 = OP(c5, b, 5);                                                                       \
      c6 = OP(c6, b, 6);                                                                       \
      c7 = OP(c7, b, 7);                                                                       \
      c8 = OP(c8, b, 8);                                                                       \
      c9 = OP(c9, b, 9);                                                                       \
      c10 = OP(c10, b, 10);                                                                    \
      c11 = OP(c11, b, 11);                                                                    \
      __asm__ volatile(""                                                                      \
                       : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5), "+v"(c6), \
                         "+v"(c7), "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11), B_REG(b));        \
    }                                                                                          \
  }

#define MODSERVE_FMA(c, b, k) _mm256_fmadd_ps(c, b, b)
#define MODSERVE_FMA512(c, b, k) _mm512_fmadd_ps(c, b, b)
#define MODSERVE_MADDUBS(c, b, k) _mm256_maddubs_epi16(c, b)
#define MODSERVE_DPBUSD(c, b, k) _mm256_dpbusd_epi32(c, b, b)
#define MODSERVE_DPBUSD512(c, b, k) _mm512_dpbusd_epi32(c, b, b)
#define MODSERVE_DPBF16(c, b, k) _mm256_dpbf16_ps(c, b, b)
#define MODSERVE_DPBF16_512(c, b, k) _mm512_dpbf16_ps(c, b, b)

MODSERVE_RATE_PROBE(RateFmaYmm, "avx2,fma", __m256, _mm256_set1_ps(1.0f), _mm256_set1_ps(1e-7f),
                    "+v", MODSERVE_FMA)
MODSERVE_RATE_PROBE(RateFmaZmm, "avx512f", __m512, _mm512_set1_ps(1.0f), _mm512_set1_ps(1e-7f),
                    "+v", MODSERVE_FMA512)
MODSERVE_RATE_PROBE(RateMaddubsYmm, "avx2", __m256i, _mm256_set1_epi8(1), _mm256_set1_epi8(1), "+v",
                    MODSERVE_MADDUBS)
MODSERVE_RATE_PROBE(RateDpbusdYmm, "avx512f,avx512vl,avx512vnni", __m256i, _mm256_set1_epi8(1),
                    _mm256_set1_epi8(1), "+v", MODSERVE_DPBUSD)
MODSERVE_RATE_PROBE(RateDpbusdZmm, "avx512f,avx512vnni", __m512i, _mm512_set1_epi8(1),
                    _mm512_set1_epi8(1), "+v", MODSERVE_DPBUSD512)
MODSERVE_RATE_PROBE(RateDpbf16Ymm, "avx512f,avx512vl,avx512bf16", __m256, _mm256_set1_ps(1.0f),
                    (__m256bh)_mm256_set1_epi16(0x3f80), "+v", MODSERVE_DPBF16)
MODSERVE_RATE_PROBE(RateDpbf16Zmm, "avx512f,avx512bf16", __m512, _mm512_set1_ps(1.0f),
                    (__m512bh)_mm512_set1_epi16(0x3f80), "+v", MODSERVE_DPBF16_512)

// Loads from L1: chain k XORs in a load from line k of a 768-byte buffer (ZMM: all 64 bytes;
// BCAST: 4 bytes broadcast to 16 lanes, as the one-row interleaved-copy tiles take their
// activation bytes, one per vpdpbusd). The asm claims to move the pointer, so the loads stay in
// the loop, and the lines differ, so no two are merged.
alignas(64) inline int32_t g_rate_lines[12 * 16] = {};
#define MODSERVE_LOAD_ZMM(c, q, k) _mm512_xor_si512(c, _mm512_loadu_si512(q + 16 * k))
#define MODSERVE_LOAD_BCAST(c, q, k) _mm512_xor_si512(c, _mm512_set1_epi32(q[16 * k]))

MODSERVE_RATE_PROBE(RateLoadZmm, "avx512f", __m512i, _mm512_setzero_si512(),
                    static_cast<const int32_t*>(g_rate_lines), "+r", MODSERVE_LOAD_ZMM)
MODSERVE_RATE_PROBE(RateLoadBroadcastZmm, "avx512f", __m512i, _mm512_setzero_si512(),
                    static_cast<const int32_t*>(g_rate_lines), "+r", MODSERVE_LOAD_BCAST)

#undef MODSERVE_LOAD_ZMM
#undef MODSERVE_LOAD_BCAST
#undef MODSERVE_FMA
#undef MODSERVE_FMA512
#undef MODSERVE_MADDUBS
#undef MODSERVE_DPBUSD
#undef MODSERVE_DPBUSD512
#undef MODSERVE_DPBF16
#undef MODSERVE_DPBF16_512
#undef MODSERVE_RATE_PROBE

// Instructions per nanosecond of this thread's CPU time running probe, best of 5 runs of 2^22
// iterations (12 instructions each).
inline double InstructionsPerNs(void (*probe)(int64_t)) {
  constexpr int64_t kIters = int64_t{1} << 22;
  auto now = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  };
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = now();
    probe(kIters);
    best = std::max(best, 12.0 * static_cast<double>(kIters) / (now() - t0) / 1e9);
  }
  return best;
}

}  // namespace modserve::bench

#endif  // MODSERVE_TESTS_BENCH_ISA_RATES_H_
