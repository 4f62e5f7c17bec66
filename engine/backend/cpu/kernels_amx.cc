// The AMX BF16 prefill Gemm on the matrix unit. Compiled with -mamx-tile -mamx-bf16 and AVX-512
// for this file only, so nothing here may run before kernels.cc's probe (baseline code) has found
// the unit, the OS tile state and this process's tile permission: even a struct copy in this file
// may be an AVX-512 instruction.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "engine/backend/cpu/kernels.h"

namespace modserve::backend::cpu {
namespace {

// The tile registers. GCC's tile intrinsics paste the tile number into the instruction text, so
// each needs a literal: hence the if-constexpr chains. _tile_loadd's asm does not tell the
// compiler that it reads memory, so a compiler barrier keeps the packing stores before it.
struct HwTiles {
  static void Configure() {
    alignas(64) uint8_t cfg[64] = {};
    cfg[0] = 1;  // palette 1
    for (int t = 0; t < 8; ++t) {
      const uint16_t colsb = 64;
      std::memcpy(cfg + 16 + 2 * t, &colsb, 2);
      cfg[48 + t] = 16;
    }
    _tile_loadconfig(cfg);
  }
  template <int kT>
  static void Load(const void* base, int64_t stride) {
    __asm__ volatile("" ::: "memory");
    if constexpr (kT == 0) _tile_loadd(0, base, stride);
    if constexpr (kT == 1) _tile_loadd(1, base, stride);
    if constexpr (kT == 2) _tile_loadd(2, base, stride);
    if constexpr (kT == 3) _tile_loadd(3, base, stride);
    if constexpr (kT == 4) _tile_loadd(4, base, stride);
    if constexpr (kT == 5) _tile_loadd(5, base, stride);
    if constexpr (kT == 6) _tile_loadd(6, base, stride);
    if constexpr (kT == 7) _tile_loadd(7, base, stride);
  }
  template <int kT>
  static void Store(void* base, int64_t stride) {
    if constexpr (kT == 0) _tile_stored(0, base, stride);
    if constexpr (kT == 1) _tile_stored(1, base, stride);
    if constexpr (kT == 2) _tile_stored(2, base, stride);
    if constexpr (kT == 3) _tile_stored(3, base, stride);
  }
  template <int kC, int kA, int kB>
  static void Dot() {
    static_assert((kC == 0 && kA == 4 && kB == 6) || (kC == 1 && kA == 4 && kB == 7) ||
                      (kC == 2 && kA == 5 && kB == 6) || (kC == 3 && kA == 5 && kB == 7),
                  "only the four products of GemmAmxBf16's 2 x 2 tile have an instruction here");
    if constexpr (kC == 0 && kA == 4 && kB == 6) _tile_dpbf16ps(0, 4, 6);
    if constexpr (kC == 1 && kA == 4 && kB == 7) _tile_dpbf16ps(1, 4, 7);
    if constexpr (kC == 2 && kA == 5 && kB == 6) _tile_dpbf16ps(2, 5, 6);
    if constexpr (kC == 3 && kA == 5 && kB == 7) _tile_dpbf16ps(3, 5, 7);
  }
  static void Release() { _tile_release(); }
};

#include "engine/backend/cpu/amx_gemm_impl.h"

static_assert(kAmxScratchFloats == kAmxStagingFloats + kAmxBTilesWords);
// One row of x pads to two row tiles of three 1 KiB terms.
static_assert(AmxPackedXBytes(1, 1) == 2 * kAmxTerms * kAmxTileBf16 * 2);

}  // namespace

namespace internal {

void AmxPackX(const float* x, int64_t n, int64_t k, int64_t row_begin, int64_t row_end,
              void* packed) {
  PackXBf16x3(x, n, k, row_begin, row_end, static_cast<uint16_t*>(packed));
}

void AmxGemmBf16(const void* packed_x, int64_t k, int64_t x_begin, int64_t x_end,
                 const bf16_t* w, const float* bias, float* out, int64_t ldo, int64_t row_begin,
                 int64_t row_end, float* scratch) {
  GemmAmxBf16<HwTiles>(static_cast<const uint16_t*>(packed_x), k, x_begin, x_end,
                       reinterpret_cast<const uint16_t*>(w), bias, out, ldo, row_begin, row_end,
                       scratch);
}

}  // namespace internal

}  // namespace modserve::backend::cpu
