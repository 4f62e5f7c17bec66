// AVX-512 (F, BW, VL) instantiation of the CPU kernels; compiled with -mavx512* for this file only.
// Only reachable through KernelsFor(Isa::kAvx512) after CpuHasIsa() said yes.
//
// AVX512_BF16 (vdpbf16ps) is not used here: it needs both operands in bf16, and rounding the f32
// activations to bf16 costs ~3 significant digits, well outside the f32-accumulation tolerance
// the reference allows. Splitting x into two bf16 terms keeps the accuracy but then each
// vdpbf16ps does as many useful multiply-adds as one FMA; measured on Zen 4, that decode kernel was
// no faster than this one (docs/PERFORMANCE.md, "Decode Gemms: software prefetch into L2"). At
// the lower matmul precisions the prefill Gemm does use it (kernels_avx512bf16.cc).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "engine/backend/cpu/kernels.h"
#include "engine/common/quant.h"

namespace modserve::backend::cpu {
namespace {

struct Avx512 {
  using V = __m512;
  static constexpr int kLanes = 16;
  // 8 rows x 2 vectors = 16 accumulators + 2 panel vectors + 1 broadcast of 32 zmm registers.
  static constexpr int kMr = 8;
  // 4 x rows x 4 weight rows = 16 accumulators.
  static constexpr int kSmallNx = 4;
  // GemmSmallN up to 64 x rows. On Zen 4 (one core, BF16, kernel_bench crossover-shapes) it runs
  // at 101-112 GFLOP/s from 32 to 64 rows; GemmLargeN, which packs w in every call, takes
  // 1.13-1.16x as long at 64 rows on TinyLlama's matrices and both LM heads and as long on the
  // 110m shape's 768-wide ones; at 96 rows it is within 3% of GemmSmallN on most of them
  // (docs/PERFORMANCE.md, "The float crossover at 64 rows").
  static constexpr int64_t kFloatSmallNMax = 64;

  static V Zero() { return _mm512_setzero_ps(); }
  static V Set1(float v) { return _mm512_set1_ps(v); }
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  // bf16 is the top half of an f32: widen and shift.
  static V Load(const bf16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static V Load(const f16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // r[i][j] <- r[j][i] for a 16 x 16 block (PackPanels): pairs of rows interleaved by 32 and 64
  // bits within each 128-bit lane, then the 128-bit lanes exchanged in two steps.
  static void Transpose(V* r) {
    V t[16], u[16], v[16];
#pragma GCC unroll 8
    for (int i = 0; i < 16; i += 2) {
      t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
      t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 16; i += 4) {
      u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
      u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
      u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
      u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 16; h += 8) {
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        v[h + j] = _mm512_shuffle_f32x4(u[h + j], u[h + 4 + j], 0x88);
        v[h + 4 + j] = _mm512_shuffle_f32x4(u[h + j], u[h + 4 + j], 0xdd);
      }
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      r[j] = _mm512_shuffle_f32x4(v[j], v[8 + j], 0x88);
      r[8 + j] = _mm512_shuffle_f32x4(v[j], v[8 + j], 0xdd);
    }
  }
  // One level of AttnScores' fold: a and b hold the lane sums of keys [0, N/2) and [N/2, N) of
  // a block, folded N/2 to a vector; the result holds keys [0, N). Level 2 leaves, in each 128-bit
  // lane, one partial sum per key of a pair; 4, one per key of four; 8 and 16 add 128-bit lanes.
  // Every key's 16 lanes are added in the same order, wherever it sits in the block.
  template <int N>
  static V FoldLanes(V a, V b) {
    if constexpr (N == 2) {
      return _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    } else if constexpr (N == 4) {
      return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xee));
    } else {
      static_assert(N == 8 || N == 16);
      return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xdd));
    }
  }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Div(V a, V b) { return _mm512_div_ps(a, b); }
  static float FmaScalar(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
  static V Max(V a, V b) { return _mm512_max_ps(a, b); }
  static void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static float ReduceAdd(V v) { return _mm512_reduce_add_ps(v); }
  static float ReduceMax(V v) { return _mm512_reduce_max_ps(v); }
  static V Min(V a, V b) { return _mm512_min_ps(a, b); }
  static V Round(V v) {
    return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  // p * 2^n for integral n in [-126, 127].
  static V Ldexp(V p, V n) { return _mm512_scalef_ps(p, n); }
  static float ToF32(float v) { return v; }
  static float ToF32(bf16_t v) {
    const uint32_t u = static_cast<uint32_t>(v.bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static float ToF32(f16_t v) { return _cvtsh_ss(v.bits); }
};

#include "engine/backend/cpu/simd_kernels_impl.h"
#include "engine/backend/cpu/quant_kernels_avx2_impl.h"

}  // namespace

namespace internal {
constinit const KernelTable kAvx512KernelTable = WithQuantKernels(MakeKernelTable<Avx512>(Isa::kAvx512));
}  // namespace internal

}  // namespace modserve::backend::cpu
