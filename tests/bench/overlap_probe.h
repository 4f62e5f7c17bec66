// Memory / compute overlap probe (kernel_bench overlap): how much of the read bandwidth a streaming
// kernel keeps when it also computes. Each thread reads its own part of a buffer in 64-byte lines,
// as one ascending stream or as two streams that alternate every kChunkBytes, and spends `ops`
// AVX-512 instructions on each line (pairs of vpandd + vpdpbusd into eight accumulators, no
// dependency from one line to the next): the shape of the decode kernels' inner loops. Run over a
// buffer beyond the caches it gives GB/s from DRAM; over a small buffer that stays in L2, the rate
// at which the same code computes when memory costs nothing. If the core overlapped the two fully,
// DRAM GB/s would stay at the zero-op figure until the L2 rate fell below it; if it serialised
// them, 1 / GB/s would be the sum of the two reciprocals. PERFORMANCE.md reads the decode kernels'
// figures against this. AVX-512 VNNI only (the caller checks).
#ifndef MODSERVE_TESTS_BENCH_OVERLAP_PROBE_H_
#define MODSERVE_TESTS_BENCH_OVERLAP_PROBE_H_

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace modserve::bench {

// Bytes each stream reads before the other stream of a two-stream pass takes over.
inline constexpr size_t kOverlapChunkBytes = 2048;

// Reads bytes [0, bytes) of p (a multiple of 2 * kOverlapChunkBytes) with kOps instructions per
// line, as one stream (kStreams 1) or two interleaved streams over its halves (kStreams 2).
// Returns a value that depends on every line, so nothing is optimised away.
template <int kOps, int kStreams>
__attribute__((target("avx512f,avx512bw,avx512vnni"), noinline)) inline int64_t OverlapPass(
    const uint8_t* p, size_t bytes) {
  static_assert(kOps % 2 == 0 && (kStreams == 1 || kStreams == 2));
  __m512i acc[8];
  for (__m512i& a : acc) a = _mm512_setzero_si512();
  const __m512i mask = _mm512_set1_epi8(0x0f), ones = _mm512_set1_epi8(1);
  const size_t stream_bytes = bytes / kStreams;
  for (size_t chunk = 0; chunk < stream_bytes; chunk += kOverlapChunkBytes) {
    for (int s = 0; s < kStreams; ++s) {
      const uint8_t* base = p + s * stream_bytes + chunk;
      for (size_t off = 0; off < kOverlapChunkBytes; off += 512) {
        // Eight lines per iteration, so that every accumulator index is a constant and the
        // accumulators stay in registers.
#pragma GCC unroll 8
        for (int l = 0; l < 8; ++l) {
          const __m512i v = _mm512_loadu_si512(base + off + 64 * l);
          if constexpr (kOps == 0) acc[l] = _mm512_add_epi32(acc[l], v);
#pragma GCC unroll 32
          for (int i = 0; i < kOps / 2; ++i) {
            const int slot = (l * (kOps / 2) + i) & 7;
            const __m512i w = _mm512_and_si512(v, i % 2 == 0 ? mask : ones);
            acc[slot] = _mm512_dpbusd_epi32(acc[slot], w, ones);
          }
        }
      }
    }
  }
  __m512i sum = acc[0];
  for (int i = 1; i < 8; ++i) sum = _mm512_add_epi32(sum, acc[i]);
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, sum);
  int64_t total = 0;
  for (int32_t v : lanes) total += v;
  return total;
}

using OverlapPassFn = int64_t (*)(const uint8_t*, size_t);

// The passes kernel_bench sweeps: ops per line 0, 4, 8, 16, 24, at one and two streams.
inline constexpr int kOverlapOps[] = {0, 4, 8, 16, 24};
inline constexpr OverlapPassFn kOverlapOneStream[] = {&OverlapPass<0, 1>, &OverlapPass<4, 1>,
                                                      &OverlapPass<8, 1>, &OverlapPass<16, 1>,
                                                      &OverlapPass<24, 1>};
inline constexpr OverlapPassFn kOverlapTwoStreams[] = {&OverlapPass<0, 2>, &OverlapPass<4, 2>,
                                                       &OverlapPass<8, 2>, &OverlapPass<16, 2>,
                                                       &OverlapPass<24, 2>};

}  // namespace modserve::bench

#endif  // MODSERVE_TESTS_BENCH_OVERLAP_PROBE_H_
