// Overloaded scalar conversions between f32 and the storage dtypes, for templates over the weight
// or KV dtype. Baseline-ISA code only: never include this from a kernels_<isa>.cc.
#ifndef MODSERVE_ENGINE_BACKEND_CPU_SCALAR_CONVERT_H_
#define MODSERVE_ENGINE_BACKEND_CPU_SCALAR_CONVERT_H_

#include "engine/common/dtype.h"

namespace modserve::backend::cpu {

inline float ToF32(float v) { return v; }
inline float ToF32(bf16_t v) { return Bf16ToF32(v); }
inline float ToF32(f16_t v) { return F16ToF32(v); }

// Round to nearest even, as torch's .to(dtype) does.
template <typename T>
T FromF32(float v);
template <>
inline float FromF32<float>(float v) {
  return v;
}
template <>
inline bf16_t FromF32<bf16_t>(float v) {
  return F32ToBf16(v);
}
template <>
inline f16_t FromF32<f16_t>(float v) {
  return F32ToF16(v);
}

}  // namespace modserve::backend::cpu

#endif  // MODSERVE_ENGINE_BACKEND_CPU_SCALAR_CONVERT_H_
