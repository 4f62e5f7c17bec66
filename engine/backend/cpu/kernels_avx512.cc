// AVX-512 (F, BW, VL) instantiation of the CPU kernels; compiled with -mavx512* for this file only.
// Only reachable through KernelsFor(Isa::kAvx512) after CpuHasIsa() said yes.
//
// AVX512_BF16 (vdpbf16ps) is deliberately not used: it needs both operands in bf16, and rounding
// the f32 activations to bf16 costs ~3 significant digits, well outside the f32-accumulation
// tolerance the reference allows. Decode is bound by reading w, where the shift conversion is free
// anyway.
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
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
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
