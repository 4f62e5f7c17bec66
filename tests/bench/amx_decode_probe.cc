// amx_decode_probe: loop shapes for a BF16 decode Gemm of 16-64 x rows on the AMX tiles, outside
// the engine, timed on the same weights (copies of one m x k matrix, >= 1 GiB in all, so every
// call reads DRAM; COPIES=1 keeps one copy, in cache where it fits). Each variant computes the
// products of the f32-accurate Gemm (three bf16 terms of x per tile product, x already packed)
// and differs only in where the weights come from and in what order:
//   pack-B     each 32-row group's weights transposed into B tiles for the whole k first, x as A
//              tiles (the engine's loop for short calls of larger Gemms, GemmAmxBf16FewRows)
//   natural-A  the weights as A tiles where they lie, x as B tiles (GemmAmxBf16Decode)
//   +pf ...    natural-A with software prefetch of the weight rows: dist steps ahead into L1
//              (T0) or L2 (T1), or the next 32-row group into L2
//   k-slices   natural-A in k slices of dist steps, C kept in a staging between slices
//   A-order    the weights pre-packed per 32-row group as consecutive 2 KiB steps (one stream)
//   1 x 4      natural-A with one 16-row weight tile against every x tile of the call (C 0-3 for
//              up to 64 x rows): each weight tile is loaded once, every x tile once per product
//   engine loop  the engine's kernel entry (internal::AmxGemmBf16) on the thread's half of the
//              rows in one call, x packed by the engine's packer: the loop as it ships, without
//              the backend's pool and per-call work around it
//   1x4 L1 slices  1 x 4 in k slices of dist steps, whose x tiles stay in L1, the weights read
//              as if stored in that loop's order, C kept in a staging between slices
//   1x4 ring dist  1 x 4 with each weight A tile copied by vector loads into a ring of L1 slots
//              dist steps before its tile load
// Usage: amx_decode_probe M K N [DIST]   (N <= 64 x rows, a multiple of 16; DIST default 8)
// SYNC=1 in the environment: both threads finish each call before either starts the next, as
// the backend's pool does (otherwise each thread runs its calls on its own).
// TERMS=1 or 2 in the environment: that many bf16 terms of x per product instead of three
// (--matmul_precision medium and high).
// Prints GB/s of weights and the useful GFLOP/s (2 n m k per call), 2 threads, best of 3 rounds.
// Outputs are not checked here: the engine's loops are (tests/engine/backend/amx_gemm_test.cc).
#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "engine/backend/cpu/kernels.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Shape {
  int64_t k, n, steps, dist;
  const uint16_t* x;  // x terms, [x tile][step][term] 1 KiB tiles (as A or as B tiles alike)
  int64_t m = 0;
  const void* packed = nullptr;  // AmxPackX's x for the engine's loop
  float* out = nullptr;          // [n, m]
};

enum Variant {
  kPackB,
  kNaturalA,
  kPfT0,
  kPfNextGroup,
  kPfT1,
  kKSlices,
  kAOrder,
  kOneByFour,
  kEngine,
  kL1Slices,
  kRing,
  kVariants
};
constexpr const char* kNames[kVariants] = {"pack-B",
                                           "natural-A",
                                           "+pf T0 dist steps",
                                           "+pf next group T1",
                                           "+pf T1 dist steps",
                                           "k-slices",
                                           "A-order",
                                           "1 x 4",
                                           "engine loop",
                                           "1x4 L1 slices",
                                           "1x4 ring dist"};

std::atomic<int> g_arrived{0};  // calls finished by both threads together (SYNC)
int g_terms = 3;  // bf16 terms of x per product (TERMS)

inline void Zero4() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}
inline void Store4(float* c) {  // a 32 x 32 staging, 128-byte rows
  _tile_stored(0, c, 128);
  _tile_stored(1, c + 16, 128);
  _tile_stored(2, c + 512, 128);
  _tile_stored(3, c + 528, 128);
}
inline void Load4(const float* c) {
  _tile_loadd(0, c, 128);
  _tile_loadd(1, c + 16, 128);
  _tile_loadd(2, c + 512, 128);
  _tile_loadd(3, c + 528, 128);
}
// The terms of step s against A tiles 4, 5 (loaded by the caller): x tiles xt, xt + 1 as B
// tiles, or only xt where it is the last (half).
inline void Terms(const uint16_t* b0, const uint16_t* b1, int64_t s, bool half) {
  for (int t = 0; t < g_terms; ++t) {
    _tile_loadd(6, b0 + (s * g_terms + t) * 512, 64);
    if (half) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(2, 5, 6);
      continue;
    }
    _tile_loadd(7, b1 + (s * g_terms + t) * 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
}

// The 1 x 4 products of step s: A tile 4 (16 weight rows) against each of the xtiles x tiles
// (xtile elements apart) as B tiles, into C tiles 0 .. xtiles - 1, every term.
inline void TermsOneByFour(const uint16_t* x, int64_t xtile, int64_t xtiles, int64_t s) {
  for (int t = 0; t < g_terms; ++t) {
    const uint16_t* b = x + (s * g_terms + t) * 512;
    _tile_loadd(6, b, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (xtiles > 1) {
      _tile_loadd(7, b + xtile, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (xtiles > 2) {
      _tile_loadd(6, b + 2 * xtile, 64);
      _tile_dpbf16ps(2, 4, 6);
    }
    if (xtiles > 3) {
      _tile_loadd(7, b + 3 * xtile, 64);
      _tile_dpbf16ps(3, 4, 7);
    }
  }
}

// Weight rows [r0, r1) of one call; sink collects a value of every block so nothing is dropped.
void Run(Variant v, const Shape& sh, const uint16_t* w, int64_t r0, int64_t r1, uint32_t* bt,
         float* staging, float* sink) {
  alignas(64) float c[32 * 32];
  const int64_t k = sh.k, steps = sh.steps, xtiles = sh.n / 16, xtile = steps * g_terms * 512;
  if (v == kPackB) {  // x as A tiles 4, 5; the group's weights as B tiles 6, 7
    for (int64_t c0 = r0; c0 < r1; c0 += 32) {
      // As GemmAmxBf16FewRows packs: each 16-row column tile for the whole k.
      const auto* wb = reinterpret_cast<const modserve::bf16_t*>(w);
      modserve::backend::cpu::internal::AmxPackW(wb, k, c0, 16, 1, 0, steps, bt);
      modserve::backend::cpu::internal::AmxPackW(wb, k, c0 + 16, 16, 1, 0, steps, bt + steps * 256);
      for (int64_t xt = 0; xt < xtiles; xt += 2) {
        Zero4();
        const uint16_t* a0 = sh.x + xt * xtile;
        for (int64_t s = 0; s < steps; ++s) {
          _tile_loadd(6, bt + s * 256, 64);
          _tile_loadd(7, bt + (steps + s) * 256, 64);
          for (int t = 0; t < g_terms; ++t) {
            _tile_loadd(4, a0 + (s * g_terms + t) * 512, 64);
            _tile_loadd(5, a0 + xtile + (s * g_terms + t) * 512, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
          }
        }
        Store4(c);
        *sink += c[0];
      }
    }
    return;
  }
  if (v == kEngine) {  // the engine's own loop (x packed by its packer) on this thread's rows
    modserve::backend::cpu::internal::AmxGemmBf16(sh.packed, sh.n, k, 0, sh.n,
                                                  reinterpret_cast<const modserve::bf16_t*>(w),
                                                  nullptr, sh.out, sh.m, r0, r1, staging, g_terms);
    *sink += sh.out[r0];
    return;
  }
  if (v == kOneByFour) {  // C xt += A4 (16 weight rows) . B6 (x tile xt)
    for (int64_t c0 = r0; c0 < r1; c0 += 16) {
      const uint16_t* wa = w + c0 * k;
      Zero4();
      for (int64_t s = 0; s < steps; ++s) {
        _tile_loadd(4, wa + 32 * s, 2 * k);
        TermsOneByFour(sh.x, xtile, xtiles, s);
      }
      Store4(c);
      *sink += c[0];
    }
    return;
  }
  if (v == kRing) {
    // 1 x 4 with each weight A tile copied by vector loads and stores into a ring of L1 slots
    // `dist` steps before its tile load reads it there.
    alignas(64) static thread_local uint16_t ring[16][512];
    const int64_t ahead = std::min<int64_t>(sh.dist, 15);
    auto copy = [&](const uint16_t* wa, int64_t s) {
      uint16_t* dst = ring[s % 16];
      for (int j = 0; j < 16; ++j) {
        _mm512_store_si512(dst + 32 * j, _mm512_loadu_si512(wa + j * k + 32 * s));
      }
    };
    for (int64_t c0 = r0; c0 < r1; c0 += 16) {
      const uint16_t* wa = w + c0 * k;
      Zero4();
      for (int64_t s = 0; s < std::min(ahead, steps); ++s) copy(wa, s);
      for (int64_t s = 0; s < steps; ++s) {
        if (s + ahead < steps) copy(wa, s + ahead);
        _tile_loadd(4, ring[s % 16], 64);
        TermsOneByFour(sh.x, xtile, xtiles, s);
      }
      Store4(c);
      *sink += c[0];
    }
    return;
  }
  if (v == kL1Slices) {
    // k slices of `dist` steps whose x terms (4 x tiles) stay in L1; the weights read as if
    // stored in this loop's order ([slice][16-row group][step] A tiles, one stream); C of each
    // group kept in a staging between slices.
    const int64_t groups = (r1 - r0) / 16;
    const uint16_t* wbase = w + r0 * k;
    int64_t at = 0;
    for (int64_t s0 = 0; s0 < steps; s0 += sh.dist) {
      const int64_t s1 = std::min(steps, s0 + sh.dist);
      for (int64_t g = 0; g < groups; ++g) {
        float* cs = staging + g * 1024;
        if (s0 == 0) {
          Zero4();
        } else {
          _tile_loadd(0, cs, 256);
          _tile_loadd(1, cs + 16, 256);
          _tile_loadd(2, cs + 32, 256);
          _tile_loadd(3, cs + 48, 256);
        }
        for (int64_t s = s0; s < s1; ++s) {
          _tile_loadd(4, wbase + at, 64);
          at += 512;
          TermsOneByFour(sh.x, xtile, xtiles, s);
        }
        _tile_stored(0, cs, 256);
        _tile_stored(1, cs + 16, 256);
        _tile_stored(2, cs + 32, 256);
        _tile_stored(3, cs + 48, 256);
      }
    }
    *sink += staging[0];
    return;
  }
  if (v == kKSlices) {
    for (int64_t s0 = 0; s0 < steps; s0 += sh.dist) {
      const int64_t s1 = std::min(steps, s0 + sh.dist);
      for (int64_t c0 = r0; c0 < r1; c0 += 32) {
        const uint16_t* wa = w + c0 * k;
        for (int64_t xt = 0; xt < xtiles; xt += 2) {
          float* cs = staging + ((c0 - r0) / 32 * ((xtiles + 1) / 2) + xt / 2) * 1024;
          if (s0 == 0) {
            Zero4();
          } else {
            Load4(cs);
          }
          const uint16_t* b0 = sh.x + xt * xtile;
          for (int64_t s = s0; s < s1; ++s) {
            _tile_loadd(4, wa + 32 * s, 2 * k);
            _tile_loadd(5, wa + 16 * k + 32 * s, 2 * k);
            Terms(b0, b0 + xtile, s, xtiles - xt == 1);
          }
          Store4(cs);
        }
      }
    }
    *sink += staging[0];
    return;
  }
  for (int64_t c0 = r0; c0 < r1; c0 += 32) {
    const uint16_t* wa = w + c0 * k;
    for (int64_t xt = 0; xt < xtiles; xt += 2) {
      Zero4();
      const uint16_t* b0 = sh.x + xt * xtile;
      for (int64_t s = 0; s < steps; ++s) {
        if (xt == 0) {  // prefetches once per weight group, in its first pass
          for (int j = 0; j < 32 && v == kPfT0; ++j) {
            _mm_prefetch(reinterpret_cast<const char*>(wa + j * k + 32 * (s + sh.dist)),
                         _MM_HINT_T0);
          }
          for (int j = 0; j < 32 && v == kPfT1; ++j) {
            _mm_prefetch(reinterpret_cast<const char*>(wa + j * k + 32 * (s + sh.dist)),
                         _MM_HINT_T1);
          }
          for (int j = 0; j < 32 && v == kPfNextGroup; ++j) {
            _mm_prefetch(reinterpret_cast<const char*>(wa + (32 + j) * k + 32 * s), _MM_HINT_T1);
          }
        }
        if (v == kAOrder) {  // the group as [step][32 rows][32 bf16]
          _tile_loadd(4, wa + s * 1024, 64);
          _tile_loadd(5, wa + s * 1024 + 512, 64);
        } else {
          _tile_loadd(4, wa + 32 * s, 2 * k);
          _tile_loadd(5, wa + 16 * k + 32 * s, 2 * k);
        }
        Terms(b0, b0 + xtile, s, xtiles - xt == 1);
      }
      Store4(c);
      *sink += c[0];
    }
  }
}

int Main(int argc, char** argv) {
  using modserve::backend::cpu::AmxUnavailableReason;
  using modserve::backend::cpu::CpuHasIsa;
  using modserve::backend::cpu::Isa;
  if (argc < 4) {
    std::fprintf(stderr, "usage: amx_decode_probe M K N [DIST]\n");
    return 2;
  }
  const int64_t m = std::atoll(argv[1]), k = std::atoll(argv[2]), n = std::atoll(argv[3]);
  const int64_t dist = argc > 4 ? std::atoll(argv[4]) : 8;
  if (m <= 0 || m % 64 != 0 || k <= 0 || k % 32 != 0 || n < 16 || n > 64 || n % 16 != 0 ||
      dist <= 0) {
    std::fprintf(stderr, "amx_decode_probe: M a multiple of 64, K of 32, N of 16 up to 64\n");
    return 2;
  }
  if (!CpuHasIsa(Isa::kAmx)) {  // also asks the kernel for the tile permission
    std::printf("AMX unusable here: %s\n", std::string(AmxUnavailableReason()).c_str());
    return 0;
  }
  if (const char* t = std::getenv("TERMS"); t != nullptr) g_terms = std::clamp(std::atoi(t), 1, 3);
  const int64_t steps = k / 32;
  const size_t w_bytes = static_cast<size_t>(m * k * 2);
  const size_t huge = size_t{2} << 20, rounded = (w_bytes + huge - 1) / huge * huge;
  const char* copies_env = std::getenv("COPIES");
  const int copies = copies_env != nullptr
                         ? std::max(1, std::atoi(copies_env))
                         : static_cast<int>(std::max<size_t>(2, (size_t{1} << 30) / w_bytes));
  std::vector<uint16_t*> ws;
  for (int c = 0; c < copies; ++c) {
    auto* p = static_cast<uint16_t*>(std::aligned_alloc(huge, rounded));
    ::madvise(p, rounded, MADV_HUGEPAGE);
    for (int64_t i = 0; i < m * k; ++i) p[i] = static_cast<uint16_t>(0x3c00 + i * 7919 % 256);
    ws.push_back(p);
  }
  // x rows padded to 32 (pack-B reads a second x tile), as the engine pads them.
  const int64_t x_elems = (n + 31) / 32 * 32 * k * g_terms;
  std::vector<uint16_t> x_store(x_elems + 32);
  uint16_t* x = reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(x_store.data()) + 63) &
                                            ~uintptr_t{63});
  for (int64_t i = 0; i < x_elems; ++i) x[i] = static_cast<uint16_t>(0x3f80 + i % 64);
  std::vector<float> xf(n * k), outs(n * m);
  for (int64_t i = 0; i < n * k; ++i) xf[i] = 0.001f * static_cast<float>(i % 997) - 0.5f;
  const size_t packed_bytes = (modserve::backend::cpu::AmxPackedXBytes(n, k) + 63) / 64 * 64;
  void* packed = std::aligned_alloc(64, packed_bytes);
  modserve::backend::cpu::internal::AmxPackX(
      xf.data(), n, k, 0, modserve::backend::cpu::AmxPackedRows(n), packed, g_terms);
  const Shape sh{k, n, steps, dist, x, m, packed, outs.data()};
  const int calls = std::max<int>(copies, static_cast<int>(0.5e9 / (w_bytes / 12.0)));
  double best[kVariants] = {};
  for (int round = 0; round < 3; ++round) {
    for (int v = 0; v < kVariants; ++v) {
      auto work = [&](int th) {
        _tile_loadconfig(&modserve::backend::cpu::kAmxTileConfig);  // 16 x 64 B
        std::vector<uint32_t> bt(2 * steps * 256 + 16);
        // 64-byte aligned, as the engine's scratch is (ThreadScratch).
        const size_t staging_floats = std::max<int64_t>(m / 2 / 16 * 1024 + 16,
                                                        modserve::backend::cpu::kAmxScratchFloats);
        float* staging = static_cast<float*>(
            std::aligned_alloc(64, (staging_floats * sizeof(float) + 63) / 64 * 64));
        float sink = 0;
        const int64_t a = th * m / 2, b = a + m / 2;
        const bool sync = std::getenv("SYNC") != nullptr;
        for (int c = 0; c < calls; ++c) {
          Run(static_cast<Variant>(v), sh, ws[c % copies], a, b, bt.data(), staging, &sink);
          if (sync) {  // both threads finish call c before either starts c + 1
            g_arrived.fetch_add(1);
            while (g_arrived.load() < 2 * (c + 1)) {
            }
          }
        }
        _tile_release();
        std::free(staging);
        if (sink == 42.0f) std::printf(" ");
      };
      g_arrived.store(0);
      const auto t0 = Clock::now();
      std::thread other(work, 1);
      work(0);
      other.join();
      const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
      best[v] = std::max(best[v], static_cast<double>(w_bytes) * calls / sec / 1e9);
    }
  }
  std::printf("amx_decode_probe m=%lld k=%lld n=%lld dist=%lld, %d terms, 2 threads, %d copies\n",
              static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n),
              static_cast<long long>(dist), g_terms, copies);
  for (int v = 0; v < kVariants; ++v) {
    std::printf("  %-20s %6.1f GB/s of weights  %7.0f GFLOP/s\n", kNames[v], best[v],
                best[v] / 2 * 2 * static_cast<double>(n));
  }
  for (uint16_t* p : ws) std::free(p);
  std::free(packed);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }
