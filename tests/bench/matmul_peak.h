// The f32 matmul peak of this machine's cores, measured: every thread runs independent FMA chains
// on registers only (no loads), 256-bit (AVX2) and, where the CPU has AVX-512 F, 512-bit, and the
// stronger of the two is the figure: the FMA units' throughput at the clock the cores actually run
// at, the ceiling of any f32 GEMM on the vector units. Cores with two 512-bit FMA units (Xeons with
// AMX among them) reach twice the AVX2 rate with 512-bit chains; cores that run 512-bit work in two
// 256-bit halves (Zen 4) the same. It says nothing about matrix units (MeasureAmxTilePeakGflops
// below). Shared by the benches.
#ifndef MODSERVE_TESTS_BENCH_MATMUL_PEAK_H_
#define MODSERVE_TESTS_BENCH_MATMUL_PEAK_H_

#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "engine/backend/cpu/kernels.h"

namespace modserve::bench {

// 12 independent accumulators: Zen 3 and recent Intel cores retire 2 FMAs per cycle with a
// latency of 4-5 cycles, so 10+ chains in flight saturate both units.
__attribute__((target("avx2,fma"))) inline double FmaChainsAvx2(int64_t iters, float seed) {
  // Twelve named accumulators, not an array: an array is kept in memory around the asm below,
  // and the store-to-load latency would then be measured instead of the FMA units.
  __m256 c0 = _mm256_set1_ps(seed), c1 = _mm256_set1_ps(seed + 1), c2 = _mm256_set1_ps(seed + 2),
         c3 = _mm256_set1_ps(seed + 3), c4 = _mm256_set1_ps(seed + 4),
         c5 = _mm256_set1_ps(seed + 5), c6 = _mm256_set1_ps(seed + 6),
         c7 = _mm256_set1_ps(seed + 7), c8 = _mm256_set1_ps(seed + 8),
         c9 = _mm256_set1_ps(seed + 9), c10 = _mm256_set1_ps(seed + 10),
         c11 = _mm256_set1_ps(seed + 11);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    c0 = _mm256_fmadd_ps(c0, a, b);
    c1 = _mm256_fmadd_ps(c1, a, b);
    c2 = _mm256_fmadd_ps(c2, a, b);
    c3 = _mm256_fmadd_ps(c3, a, b);
    c4 = _mm256_fmadd_ps(c4, a, b);
    c5 = _mm256_fmadd_ps(c5, a, b);
    c6 = _mm256_fmadd_ps(c6, a, b);
    c7 = _mm256_fmadd_ps(c7, a, b);
    c8 = _mm256_fmadd_ps(c8, a, b);
    c9 = _mm256_fmadd_ps(c9, a, b);
    c10 = _mm256_fmadd_ps(c10, a, b);
    c11 = _mm256_fmadd_ps(c11, a, b);
    // An empty asm that claims to change the accumulators (in registers) keeps the compiler from
    // collapsing or hoisting the chains.
    __asm__ volatile("" : "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(c4), "+x"(c5), "+x"(c6),
                     "+x"(c7), "+x"(c8), "+x"(c9), "+x"(c10), "+x"(c11));
  }
  const __m256 s = _mm256_add_ps(
      _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                    _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7))),
      _mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11)));
  return _mm256_cvtss_f32(s);
}

// FmaChainsAvx2 on 512-bit vectors (16 lanes).
__attribute__((target("avx512f"))) inline double FmaChainsAvx512(int64_t iters, float seed) {
  __m512 c0 = _mm512_set1_ps(seed), c1 = _mm512_set1_ps(seed + 1), c2 = _mm512_set1_ps(seed + 2),
         c3 = _mm512_set1_ps(seed + 3), c4 = _mm512_set1_ps(seed + 4),
         c5 = _mm512_set1_ps(seed + 5), c6 = _mm512_set1_ps(seed + 6),
         c7 = _mm512_set1_ps(seed + 7), c8 = _mm512_set1_ps(seed + 8),
         c9 = _mm512_set1_ps(seed + 9), c10 = _mm512_set1_ps(seed + 10),
         c11 = _mm512_set1_ps(seed + 11);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
    c0 = _mm512_fmadd_ps(c0, a, b);
    c1 = _mm512_fmadd_ps(c1, a, b);
    c2 = _mm512_fmadd_ps(c2, a, b);
    c3 = _mm512_fmadd_ps(c3, a, b);
    c4 = _mm512_fmadd_ps(c4, a, b);
    c5 = _mm512_fmadd_ps(c5, a, b);
    c6 = _mm512_fmadd_ps(c6, a, b);
    c7 = _mm512_fmadd_ps(c7, a, b);
    c8 = _mm512_fmadd_ps(c8, a, b);
    c9 = _mm512_fmadd_ps(c9, a, b);
    c10 = _mm512_fmadd_ps(c10, a, b);
    c11 = _mm512_fmadd_ps(c11, a, b);
    __asm__ volatile(""
                     : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5), "+v"(c6),
                       "+v"(c7), "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11));
  }
  const __m512 s =
      _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                                  _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7))),
                    _mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)));
  alignas(64) float lanes[16];  // (GCC 12's 512-bit reductions and casts warn wrongly here)
  _mm512_store_ps(lanes, s);
  return lanes[0];
}

// The chains of one ISA: the function and its FLOPs per iteration (12 chains, 2 per FMA lane).
struct FmaChains {
  double (*run)(int64_t, float);
  double flops_per_iter;
  const char* isa;
};

// AVX2 (where the CPU has AVX2 + FMA) and AVX-512 (where it has AVX-512 F) chains.
inline std::vector<FmaChains> AvailableFmaChains() {
  __builtin_cpu_init();
  std::vector<FmaChains> chains;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    chains.push_back({&FmaChainsAvx2, 12.0 * 8 * 2, "AVX2"});
  }
  if (__builtin_cpu_supports("avx512f")) {
    chains.push_back({&FmaChainsAvx512, 12.0 * 16 * 2, "AVX-512"});
  }
  return chains;
}

// GFLOP/s of `threads` threads each running `run(iters, seed)` (flops_per_iter FLOP per
// iteration), the best of 5 runs, wall time.
inline double BestGflopsOfFive(int threads, double flops_per_iter, int64_t iters,
                               double (*run)(int64_t, float)) {
  double best = 0;
  std::atomic<double> sink{0};
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<std::thread> pool;
    const auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const double v = run(iters, 1.0f + static_cast<float>(t));
        double cur = sink.load();
        while (!sink.compare_exchange_weak(cur, cur + v)) {
        }
      });
    }
    for (std::thread& th : pool) th.join();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, threads * flops_per_iter * static_cast<double>(iters) / sec / 1e9);
  }
  if (sink.load() == 42.0) best += 0;  // keeps the chains' results alive
  return best;
}

// GFLOP/s of `threads` threads, best of 5 runs of ~0.1 s each per ISA, wall time; the stronger
// ISA's figure, its name in *isa when given. Returns 0 when the CPU has no AVX2 + FMA.
inline double MeasureFmaPeakGflops(int threads, const char** isa = nullptr) {
  constexpr int64_t kIters = int64_t{1} << 22;  // 12 * 8 * 2 * 4M = 805 MFLOP per thread (AVX2)
  double best = 0;
  for (const FmaChains& c : AvailableFmaChains()) {
    const double gflops = BestGflopsOfFive(threads, c.flops_per_iter, kIters, c.run);
    if (gflops > best) {
      best = gflops;
      if (isa != nullptr) *isa = c.isa;
    }
  }
  return best;
}

// The same for one thread in CPU time (CLOCK_THREAD_CPUTIME_ID): GFLOP/s per core-second, which
// other processes on a shared machine barely change. Best of 5 per ISA.
inline double MeasureFmaPeakGflopsPerCoreSecond(const char** isa = nullptr) {
  constexpr int64_t kIters = int64_t{1} << 22;
  auto now = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  };
  double best = 0, keep = 0;
  for (const FmaChains& c : AvailableFmaChains()) {
    for (int rep = 0; rep < 5; ++rep) {
      const double t0 = now();
      keep += c.run(kIters, 1.0f + static_cast<float>(rep));
      const double gflops = c.flops_per_iter * static_cast<double>(kIters) / (now() - t0) / 1e9;
      if (gflops > best) {
        best = gflops;
        if (isa != nullptr) *isa = c.isa;
      }
    }
  }
  if (keep == 42.0) best += 0;
  return best;
}

#if defined(__x86_64__)
// AVX512_BF16's peak: 12 independent vdpbf16ps chains on registers (each instruction 16 lanes x 2
// bf16 products, 64 FLOP), the ceiling of the vdpbf16ps Gemm that --matmul_precision medium runs
// on CPUs with AVX512_BF16 and no AMX. The bf16 inputs are zero, so the sums stay 0 (no
// denormals). Call only where backend::cpu::CpuHasAvx512Bf16().
__attribute__((target("avx512f,avx512bf16"))) inline double DpBf16Chains(int64_t iters, float) {
  __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0,
         c8 = c0, c9 = c0, c10 = c0, c11 = c0;
  const __m512bh a = reinterpret_cast<__m512bh>(_mm512_setzero_si512());
  for (int64_t it = 0; it < iters; ++it) {
    c0 = _mm512_dpbf16_ps(c0, a, a);
    c1 = _mm512_dpbf16_ps(c1, a, a);
    c2 = _mm512_dpbf16_ps(c2, a, a);
    c3 = _mm512_dpbf16_ps(c3, a, a);
    c4 = _mm512_dpbf16_ps(c4, a, a);
    c5 = _mm512_dpbf16_ps(c5, a, a);
    c6 = _mm512_dpbf16_ps(c6, a, a);
    c7 = _mm512_dpbf16_ps(c7, a, a);
    c8 = _mm512_dpbf16_ps(c8, a, a);
    c9 = _mm512_dpbf16_ps(c9, a, a);
    c10 = _mm512_dpbf16_ps(c10, a, a);
    c11 = _mm512_dpbf16_ps(c11, a, a);
    __asm__ volatile(""
                     : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5), "+v"(c6),
                       "+v"(c7), "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11));
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_add_ps(_mm512_add_ps(c0, c11), c5));
  return lanes[0];
}

// GFLOP/s of bf16 products over `threads` threads on DpBf16Chains, best of 5, wall time.
inline double MeasureDpBf16PeakGflops(int threads) {
  constexpr int64_t kIters = int64_t{1} << 22;  // 12 * 64 * 4M = 3.2 GFLOP per thread
  return BestGflopsOfFive(threads, 12.0 * 64, kIters, &DpBf16Chains);
}

// The AMX tile unit's peak: `iters` rounds of four independent TDPBF16PS (16 x 16 x 32 bf16 pairs,
// 16384 FLOP each) on tiles that never leave the registers. Call only where the process may use
// the unit (backend::cpu::CpuHasIsa(Isa::kAmx), which also asked the kernel for the permission).
__attribute__((target("amx-tile,amx-bf16"))) inline void AmxDotRounds(int64_t iters) {
  _tile_loadconfig(&backend::cpu::kAmxTileConfig);
  alignas(64) static const uint16_t ones[16 * 32] = {};
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_loadd(6, ones, 64);
  _tile_loadd(7, ones, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_release();
}

// GFLOP/s of bf16 tile products over `threads` threads, best of 5 runs of ~0.1 s, wall time. The
// f32-accurate Gemm (x split into three bf16 terms) can reach a third of it.
inline double MeasureAmxTilePeakGflops(int threads) {
  constexpr int64_t kIters = int64_t{1} << 20;  // 4M tile products, ~17 ms per thread at 16 cycles
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<std::thread> pool;
    const auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t) pool.emplace_back([] { AmxDotRounds(kIters); });
    for (std::thread& th : pool) th.join();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, threads * 4.0 * 16384 * static_cast<double>(kIters) / sec / 1e9);
  }
  return best;
}
#endif

}  // namespace modserve::bench

#endif  // MODSERVE_TESTS_BENCH_MATMUL_PEAK_H_
