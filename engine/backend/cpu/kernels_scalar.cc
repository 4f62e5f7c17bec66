// Portable instantiation of the CPU kernels (one float per "vector"), compiled with the baseline
// flags: the fallback for CPUs without AVX2, and the third leg of the dispatch tests.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "engine/backend/cpu/kernels.h"
#include "engine/common/dtype.h"
#include "engine/common/quant.h"

namespace modserve::backend::cpu {
namespace {

struct Scalar {
  using V = float;
  static constexpr int kLanes = 1;
  static constexpr int kMr = 4;
  static constexpr int kSmallNx = 4;

  static V Zero() { return 0.0f; }
  static V Set1(float v) { return v; }
  static V Load(const float* p) { return *p; }
  static V Load(const bf16_t* p) { return Bf16ToF32(*p); }
  static V Load(const f16_t* p) { return F16ToF32(*p); }
  static V Fma(V a, V b, V c) { return a * b + c; }
  static float FmaScalar(float a, float b, float c) { return a * b + c; }
  static V Add(V a, V b) { return a + b; }
  static V Sub(V a, V b) { return a - b; }
  static V Mul(V a, V b) { return a * b; }
  static V Div(V a, V b) { return a / b; }
  static V Max(V a, V b) { return a > b ? a : b; }
  static void Store(float* p, V v) { *p = v; }
  static float ReduceAdd(V v) { return v; }
  static float ReduceMax(V v) { return v; }
  static V Min(V a, V b) { return a < b ? a : b; }
  static V Round(V v) { return __builtin_nearbyintf(v); }
  static V Ldexp(V p, V n) { return __builtin_ldexpf(p, static_cast<int>(n)); }
  static float ToF32(float v) { return v; }
  static float ToF32(bf16_t v) { return Bf16ToF32(v); }
  static float ToF32(f16_t v) { return F16ToF32(v); }
};

#include "engine/backend/cpu/simd_kernels_impl.h"
#include "engine/backend/cpu/quant_kernels_scalar_impl.h"

}  // namespace

namespace internal {
constinit const KernelTable kScalarKernelTable = WithQuantKernels(MakeKernelTable<Scalar>(Isa::kScalar));
}  // namespace internal

}  // namespace modserve::backend::cpu
