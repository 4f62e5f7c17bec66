// The AMX-INT8 Gemms (engine/backend/cpu/amx_int8_impl.h) on a software model of the tile
// registers, for the conformance suite
// (QuantizedGemmIsaTest.EmulatedAmxInt8GemmsGiveTheVnniTablesBits): their steps, half steps,
// packing and remainders then run on every CPU with AVX-512, matrix unit or not. Built with AVX-512
// F/BW/VL and F16C like kernels_avx512vnni.cc; the suite calls in only after
// CpuHasIsa(kAvx512Vnni). The model follows the instruction set reference: TILELOADD fills a tile's
// configured rows and bytes and zeroes the rest, TILESTORED writes the configured part, TDPBSUD
// adds exact int32 sums of signed (A) by unsigned (B) bytes.
#include "tests/engine/backend/amx_int8_emulated.h"

#if defined(__AVX512F__)
#include <immintrin.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "engine/backend/cpu/kernels.h"
#include "engine/common/logging.h"
#include "engine/common/quant.h"

namespace modserve::backend::cpu {
namespace {

struct EmulatedInt8Tiles {
  static inline thread_local uint8_t tile[8][16][64];
  static inline thread_local bool configured = false;
  static constexpr const AmxTileConfig& kConfig = kAmxInt8TileConfig;

  static void Configure() {
    MODSERVE_CHECK(!configured) << "tiles configured twice";
    configured = true;
    std::memset(tile, 0, sizeof(tile));
  }
  static void Release() {
    MODSERVE_CHECK(configured) << "tiles released unconfigured";
    configured = false;
  }
  template <int kT>
  static void Zero() {
    MODSERVE_CHECK(configured) << "tile zero before the configuration";
    std::memset(tile[kT], 0, sizeof(tile[kT]));
  }
  template <int kT>
  static void Load(const void* base, int64_t stride) {
    MODSERVE_CHECK(configured) << "tile load before the configuration";
    std::memset(tile[kT], 0, sizeof(tile[kT]));
    for (int r = 0; r < kConfig.rows[kT]; ++r) {
      std::memcpy(tile[kT][r], static_cast<const uint8_t*>(base) + r * stride, kConfig.colsb[kT]);
    }
  }
  template <int kT>
  static void Store(void* base, int64_t stride) {
    MODSERVE_CHECK(configured) << "tile store before the configuration";
    for (int r = 0; r < kConfig.rows[kT]; ++r) {
      std::memcpy(static_cast<uint8_t*>(base) + r * stride, tile[kT][r], kConfig.colsb[kT]);
    }
  }
  template <int kC, int kA, int kB>
  static void Dot() {
    MODSERVE_CHECK(configured) << "tile product before the configuration";
    // The shapes TDPBSUD requires of the configuration (#UD otherwise).
    static_assert(kConfig.rows[kA] == kConfig.rows[kC] &&
                  kConfig.colsb[kA] / 4 == kConfig.rows[kB] &&
                  kConfig.colsb[kB] == kConfig.colsb[kC]);
    for (int m = 0; m < kConfig.rows[kC]; ++m) {
      for (int n = 0; n < kConfig.colsb[kC] / 4; ++n) {
        int32_t c;
        std::memcpy(&c, tile[kC][m] + 4 * n, 4);
        for (int p = 0; p < kConfig.rows[kB]; ++p) {
          for (int i = 0; i < 4; ++i) {
            c += static_cast<int32_t>(static_cast<int8_t>(tile[kA][m][4 * p + i])) *
                 static_cast<int32_t>(tile[kB][p][4 * n + i]);
          }
        }
        std::memcpy(tile[kC][m] + 4 * n, &c, 4);
      }
    }
  }
};

namespace x16 {
using T = EmulatedInt8Tiles;
// The helpers first: the Gemms name them.
#include "engine/backend/cpu/x16_vector_impl.h"
// clang-format would sort the two; amx_int8_impl.h must come second.
#include "engine/backend/cpu/amx_int8_impl.h"

std::atomic<int64_t> calls{0};
EmulatedInt8Gemms rest;  // the VNNI table's kernels for the rows the tiles leave

void GemmQ8_0(const QuantizedActs& a, int64_t x_begin, int64_t x_end, const void* w,
              const float* bias, float* out, int64_t ldo, int64_t row_begin, int64_t row_end) {
  calls.fetch_add(1);
  AmxInt8Gemm<T, kQ8_0X16UnitBytes, kQ8_0X16UnitElems, &AmxInt8StepQ8_0<T, 2>,
              &AmxInt8StepQ8_0<T, 1>>(a, x_begin, x_end, w, bias, out, ldo, row_begin, row_end,
                                      rest.q8_0_x16);
}
void GemmQ4_K(const QuantizedActs& a, int64_t x_begin, int64_t x_end, const void* w,
              const float* bias, float* out, int64_t ldo, int64_t row_begin, int64_t row_end) {
  calls.fetch_add(1);
  AmxInt8Gemm<T, kQ4KX16UnitBytes, 256, &AmxInt8StepQ4_K<T, 2>, &AmxInt8StepQ4_K<T, 1>>(
      a, x_begin, x_end, w, bias, out, ldo, row_begin, row_end, rest.q4_k_x16);
}
void GemmQ5_K(const QuantizedActs& a, int64_t x_begin, int64_t x_end, const void* w,
              const float* bias, float* out, int64_t ldo, int64_t row_begin, int64_t row_end) {
  calls.fetch_add(1);
  AmxInt8Gemm<T, kQ5KX16UnitBytes, 256, &AmxInt8StepQ4_K<T, 2, true>, &AmxInt8StepQ4_K<T, 1, true>>(
      a, x_begin, x_end, w, bias, out, ldo, row_begin, row_end, rest.q5_k_x16);
}
template <bool kHasMin>
void GemmQ4(const QuantizedActs& a, int64_t x_begin, int64_t x_end, const void* w,
            const float* bias, float* out, int64_t ldo, int64_t row_begin, int64_t row_end) {
  calls.fetch_add(1);
  AmxInt8GemmQ4<T, kHasMin>(a, x_begin, x_end, w, bias, out, ldo, row_begin, row_end,
                            kHasMin ? rest.q4_1 : rest.q4_0);
}
}  // namespace x16

}  // namespace

EmulatedInt8Gemms EmulatedAmxInt8Gemms(const EmulatedInt8Gemms& vnni) {
  x16::rest = vnni;
  return {.q4_0 = &x16::GemmQ4<false>,
          .q4_1 = &x16::GemmQ4<true>,
          .q4_k_x16 = &x16::GemmQ4_K,
          .q5_k_x16 = &x16::GemmQ5_K,
          .q8_0_x16 = &x16::GemmQ8_0};
}

int64_t EmulatedAmxInt8Calls() { return x16::calls.load(); }

}  // namespace modserve::backend::cpu

#else  // not built with AVX-512 (not x86-64): the suite never gets past its CPUID check.

namespace modserve::backend::cpu {
EmulatedInt8Gemms EmulatedAmxInt8Gemms(const EmulatedInt8Gemms& vnni) { return vnni; }
int64_t EmulatedAmxInt8Calls() { return 0; }
}  // namespace modserve::backend::cpu

#endif
