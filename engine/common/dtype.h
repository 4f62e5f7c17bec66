// Element types of weights and activations, and exact scalar conversions between them.
// F32 activations everywhere; F16/BF16 appear only as stored weights and KV entries, and the
// block-quantized types (GGML layouts, engine/common/quant.h) only as stored weights.
#ifndef MODSERVE_ENGINE_COMMON_DTYPE_H_
#define MODSERVE_ENGINE_COMMON_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace modserve {

// kI32 is for indices (token ids, positions, page tables, slot maps), never for weights.
// kQ8_0 .. kQ5_K are block-quantized weight storage as GGUF files hold it: each run of
// DTypeBlockElems(t) consecutive elements of a row is one block of DTypeBlockBytes(t) bytes, so
// a quantized row's length must be a multiple of the block.
enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kI32,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ4_K,
  kQ6_K,
  kQ5_K,
  kQ5_0,
  kQ5_1
};

constexpr bool DTypeIsQuantized(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kI32:
      return false;
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ4_K:
    case DType::kQ6_K:
    case DType::kQ5_K:
    case DType::kQ5_0:
    case DType::kQ5_1:
      return true;
  }
  return false;
}

// Elements per block: 1 for the plain types.
constexpr int64_t DTypeBlockElems(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kI32:
      return 1;
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
      return 32;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return 256;
  }
  return 1;
}

// Bytes per block (per element for the plain types).
constexpr size_t DTypeBlockBytes(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kQ8_0:
      return 34;  // f16 scale, 32 x int8
    case DType::kQ4_0:
      return 18;  // f16 scale, 32 x 4 bits
    case DType::kQ4_1:
      return 20;  // f16 scale and minimum, 32 x 4 bits
    case DType::kQ4_K:
      return 144;  // f16 super-scale and super-minimum, 12 bytes of 6-bit scales, 256 x 4 bits
    case DType::kQ6_K:
      return 210;  // 256 x 6 bits, 16 x int8 scales, f16 super-scale
    case DType::kQ5_K:
      return 176;  // as Q4_K, plus 256 high bits
    case DType::kQ5_0:
      return 22;  // f16 scale, 32 high bits, 32 x 4 low bits
    case DType::kQ5_1:
      return 24;  // f16 scale and minimum, 32 high bits, 32 x 4 low bits
  }
  return 0;
}

// Bytes of one element of a plain type; 0 for the block-quantized types, which have no
// per-element size (use DTypeRowBytes).
constexpr size_t DTypeBytes(DType t) { return DTypeIsQuantized(t) ? 0 : DTypeBlockBytes(t); }

// Bytes of `num_elems` consecutive elements; for a quantized type num_elems must be a multiple
// of the block (callers check shapes first).
constexpr size_t DTypeRowBytes(DType t, int64_t num_elems) {
  return static_cast<size_t>(num_elems / DTypeBlockElems(t)) * DTypeBlockBytes(t);
}

constexpr std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI32:
      return "I32";
    case DType::kQ8_0:
      return "Q8_0";
    case DType::kQ4_0:
      return "Q4_0";
    case DType::kQ4_1:
      return "Q4_1";
    case DType::kQ4_K:
      return "Q4_K";
    case DType::kQ6_K:
      return "Q6_K";
    case DType::kQ5_K:
      return "Q5_K";
    case DType::kQ5_0:
      return "Q5_0";
    case DType::kQ5_1:
      return "Q5_1";
  }
  return "?";
}

// Storage types: 16-bit patterns with explicit conversions, so they never mix with float silently.
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

inline float Bf16ToF32(bf16_t v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as PyTorch does; NaN stays NaN.
inline bf16_t F32ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}

inline float F16ToF32(f16_t v) {
  const uint32_t sign = static_cast<uint32_t>(v.bits & 0x8000u) << 16;
  uint32_t exp = (v.bits >> 10) & 0x1fu;
  uint32_t mant = v.bits & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      u = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; overflow to infinity, as IEEE conversion does.
inline f16_t F32ToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return f16_t{static_cast<uint16_t>(sign | 0x7e00u)};
  if (abs >= 0x477ff000u) return f16_t{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (abs < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    if (abs < 0x33000001u) return f16_t{sign};
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14 - (exp - 127) + 13 - 1 ... aligns to 2^-24 units
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return f16_t{static_cast<uint16_t>(sign | half)};
  }
  uint32_t v = abs - (112u << 23);  // rebias exponent 127 -> 15
  v += 0xfffu + ((v >> 13) & 1u);
  return f16_t{static_cast<uint16_t>(sign | (v >> 13))};
}

}  // namespace modserve

#endif  // MODSERVE_ENGINE_COMMON_DTYPE_H_
