// AVX2 + FMA + F16C instantiation of the CPU kernels; compiled with -mavx2 -mfma -mf16c for this
// file only. Only reachable through KernelsFor(Isa::kAvx2) after CpuHasIsa() said yes.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "engine/backend/cpu/kernels.h"
#include "engine/common/quant.h"

namespace modserve::backend::cpu {
namespace {

struct Avx2 {
  using V = __m256;
  static constexpr int kLanes = 8;
  // 6 rows x 2 vectors = 12 accumulators + 2 panel vectors + 1 broadcast of 16 ymm registers.
  static constexpr int kMr = 6;
  // 2 x rows x 4 weight rows = 8 accumulators; 4 x rows would spill.
  static constexpr int kSmallNx = 2;
  // GemmSmallN up to 32 x rows: on Zen 3 (one core, BF16 2048 x 2048) it beats GemmLargeN,
  // whose packing of w costs ~5 ms per call, by 20-45% at n = 17..32; they cross near n = 40
  // (docs/PERFORMANCE.md, kernel_bench crossover).
  static constexpr int64_t kFloatSmallNMax = 32;

  static V Zero() { return _mm256_setzero_ps(); }
  static V Set1(float v) { return _mm256_set1_ps(v); }
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  // bf16 is the top half of an f32: widen and shift.
  static V Load(const bf16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static V Load(const f16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // 16 bf16 at p: elements 0, 2, ..., 14 (the low halves of the 32-bit lanes, shifted up) and
  // 1, 3, ..., 15 (the high halves, masked) as f32.
  static void LoadBf16Pairs(const bf16_t* p, V* even, V* odd) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    *even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    const __m256i high_halves = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
    *odd = _mm256_castsi256_ps(_mm256_and_si256(v, high_halves));
  }
  // r[i][j] <- r[j][i] for an 8 x 8 block (PackPanels transposes 8 weight rows at a time with it
  // instead of 64 scalar stores).
  static void Transpose(V* r) {
    const V t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const V t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const V t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const V t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const V u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    const V u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    const V u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    const V u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
  }
  // One level of AttnScores' fold (see the AVX-512 one): unpack, shuffle, then the two 128-bit
  // lanes added.
  template <int N>
  static V FoldLanes(V a, V b) {
    if constexpr (N == 2) {
      return _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    } else if constexpr (N == 4) {
      return _mm256_add_ps(_mm256_shuffle_ps(a, b, 0x44), _mm256_shuffle_ps(a, b, 0xee));
    } else {
      static_assert(N == 8);
      return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
    }
  }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Div(V a, V b) { return _mm256_div_ps(a, b); }
  static float FmaScalar(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
  static V Max(V a, V b) { return _mm256_max_ps(a, b); }
  static V Min(V a, V b) { return _mm256_min_ps(a, b); }
  static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static float ReduceAdd(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float ReduceMax(V v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static V Round(V v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // p * 2^n for integral n in [-126, 127]: 2^n built in the exponent field, (n + 127) << 23.
  static V Ldexp(V p, V n) {
    const __m256i bits = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  }
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
constinit const KernelTable kAvx2KernelTable = WithQuantKernels(MakeKernelTable<Avx2>(Isa::kAvx2));
}  // namespace internal

}  // namespace modserve::backend::cpu
