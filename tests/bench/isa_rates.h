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

// NAME(iters): iters x 12 instructions OP(chain, b), 12 chains in named registers (an array would
// live in memory around the asm, and store-to-load latency would be measured instead). The empty
// asm claims to change every chain each iteration, so the compiler can neither merge nor hoist
// them; "v" admits any vector register the target has (zmm included).
#define MODSERVE_RATE_PROBE(NAME, TARGET, VEC, C_INIT, B_INIT, OP)                             \
  __attribute__((target(TARGET))) inline void NAME(int64_t iters) {                            \
    VEC c0 = C_INIT, c1 = C_INIT, c2 = C_INIT, c3 = C_INIT, c4 = C_INIT, c5 = C_INIT;          \
    VEC c6 = C_INIT, c7 = C_INIT, c8 = C_INIT, c9 = C_INIT, c10 = C_INIT, c11 = C_INIT;        \
    auto b = B_INIT;                                                                           \
    for (int64_t it = 0; it < iters; ++it) {                                                   \
      c0 = OP(c0, b);                                                                          \
      c1 = OP(c1, b);                                                                          \
      c2 = OP(c2, b);                                                                          \
      c3 = OP(c3, b);                                                                          \
      c4 = OP(c4, b);                                                                          \
      c5 = OP(c5, b);                                                                          \
      c6 = OP(c6, b);                                                                          \
      c7 = OP(c7, b);                                                                          \
      c8 = OP(c8, b);                                                                          \
      c9 = OP(c9, b);                                                                          \
      c10 = OP(c10, b);                                                                        \
      c11 = OP(c11, b);                                                                        \
      __asm__ volatile(""                                                                      \
                       : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5), "+v"(c6), \
                         "+v"(c7), "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11), "+v"(b));         \
    }                                                                                          \
  }

#define MODSERVE_FMA(c, b) _mm256_fmadd_ps(c, b, b)
#define MODSERVE_FMA512(c, b) _mm512_fmadd_ps(c, b, b)
#define MODSERVE_MADDUBS(c, b) _mm256_maddubs_epi16(c, b)
#define MODSERVE_DPBUSD(c, b) _mm256_dpbusd_epi32(c, b, b)
#define MODSERVE_DPBUSD512(c, b) _mm512_dpbusd_epi32(c, b, b)
#define MODSERVE_DPBF16(c, b) _mm256_dpbf16_ps(c, b, b)
#define MODSERVE_DPBF16_512(c, b) _mm512_dpbf16_ps(c, b, b)

MODSERVE_RATE_PROBE(RateFmaYmm, "avx2,fma", __m256, _mm256_set1_ps(1.0f), _mm256_set1_ps(1e-7f),
                    MODSERVE_FMA)
MODSERVE_RATE_PROBE(RateFmaZmm, "avx512f", __m512, _mm512_set1_ps(1.0f), _mm512_set1_ps(1e-7f),
                    MODSERVE_FMA512)
MODSERVE_RATE_PROBE(RateMaddubsYmm, "avx2", __m256i, _mm256_set1_epi8(1), _mm256_set1_epi8(1),
                    MODSERVE_MADDUBS)
MODSERVE_RATE_PROBE(RateDpbusdYmm, "avx512f,avx512vl,avx512vnni", __m256i, _mm256_set1_epi8(1),
                    _mm256_set1_epi8(1), MODSERVE_DPBUSD)
MODSERVE_RATE_PROBE(RateDpbusdZmm, "avx512f,avx512vnni", __m512i, _mm512_set1_epi8(1),
                    _mm512_set1_epi8(1), MODSERVE_DPBUSD512)
MODSERVE_RATE_PROBE(RateDpbf16Ymm, "avx512f,avx512vl,avx512bf16", __m256, _mm256_set1_ps(1.0f),
                    (__m256bh)_mm256_set1_epi16(0x3f80), MODSERVE_DPBF16)
MODSERVE_RATE_PROBE(RateDpbf16Zmm, "avx512f,avx512bf16", __m512, _mm512_set1_ps(1.0f),
                    (__m512bh)_mm512_set1_epi16(0x3f80), MODSERVE_DPBF16_512)

// Loads from L1: iters x 12 loads, each XOR'd into its own chain, from 12 lines of a 768-byte
// buffer. The empty asm claims to move the pointer, so the loads can be neither hoisted nor
// merged. ZMM: a 64-byte load; BCAST: a 4-byte load broadcast to 16 lanes (what the one-row
// interleaved-copy tiles take their activation bytes with, one per vpdpbusd).
#define MODSERVE_LOAD_PROBE(NAME, LOAD)                                                        \
  __attribute__((target("avx512f"))) inline void NAME(int64_t iters) {                         \
    alignas(64) static int32_t buf[12 * 16] = {};                                              \
    const int32_t* p = buf;                                                                    \
    __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;          \
    __m512i c6 = c0, c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0;                            \
    for (int64_t it = 0; it < iters; ++it) {                                                   \
      c0 = _mm512_xor_si512(c0, LOAD(p + 0 * 16));                                             \
      c1 = _mm512_xor_si512(c1, LOAD(p + 1 * 16));                                             \
      c2 = _mm512_xor_si512(c2, LOAD(p + 2 * 16));                                             \
      c3 = _mm512_xor_si512(c3, LOAD(p + 3 * 16));                                             \
      c4 = _mm512_xor_si512(c4, LOAD(p + 4 * 16));                                             \
      c5 = _mm512_xor_si512(c5, LOAD(p + 5 * 16));                                             \
      c6 = _mm512_xor_si512(c6, LOAD(p + 6 * 16));                                             \
      c7 = _mm512_xor_si512(c7, LOAD(p + 7 * 16));                                             \
      c8 = _mm512_xor_si512(c8, LOAD(p + 8 * 16));                                             \
      c9 = _mm512_xor_si512(c9, LOAD(p + 9 * 16));                                             \
      c10 = _mm512_xor_si512(c10, LOAD(p + 10 * 16));                                          \
      c11 = _mm512_xor_si512(c11, LOAD(p + 11 * 16));                                          \
      __asm__ volatile(""                                                                      \
                       : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5), "+v"(c6), \
                         "+v"(c7), "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11), "+r"(p));         \
    }                                                                                          \
  }

#define MODSERVE_LOAD_ZMM(q) _mm512_loadu_si512(q)
#define MODSERVE_LOAD_BCAST(q) _mm512_set1_epi32(*(q))

MODSERVE_LOAD_PROBE(RateLoadZmm, MODSERVE_LOAD_ZMM)
MODSERVE_LOAD_PROBE(RateLoadBroadcastZmm, MODSERVE_LOAD_BCAST)

#undef MODSERVE_LOAD_ZMM
#undef MODSERVE_LOAD_BCAST
#undef MODSERVE_LOAD_PROBE
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
