// The GGML block-quantized weight layouts (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) exactly
// as GGUF files store them, and plain scalar reference quantizers and dequantizers. No SIMD and no
// threads: the CPU backend's kernels read these layouts directly; this file is their definition and
// oracle.
#ifndef MODSERVE_ENGINE_COMMON_QUANT_H_
#define MODSERVE_ENGINE_COMMON_QUANT_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "engine/common/dtype.h"

namespace modserve::quant {

// Elements per block of Q8_0 / Q4_0 / Q4_1, and per super-block of the K-quants.
inline constexpr int kBlockElems = 32;
inline constexpr int kSuperBlockElems = 256;

// Every block is a run of consecutive elements of one row; a row is its blocks back to back, with
// no padding. All multi-byte fields are little-endian (as every GGUF writer emits them); the
// structs have 2-byte alignment, so a block array may start at any even address.

// Q8_0: x[j] = d * qs[j], j < 32.
struct BlockQ8_0 {
  f16_t d;
  int8_t qs[32];
};

// Q4_0: x[j] = d * (q[j] - 8) with q[j] = qs[j] & 15 for j < 16 and qs[j - 16] >> 4 for j >= 16
// (the low nibbles hold the first half of the block, the high nibbles the second).
struct BlockQ4_0 {
  f16_t d;
  uint8_t qs[16];
};

// Q4_1: x[j] = d * q[j] + m, nibbles as in Q4_0 (q in 0..15, m usually the block minimum).
struct BlockQ4_1 {
  f16_t d;
  f16_t m;
  uint8_t qs[16];
};

// Q5_0: x[j] = d * (q[j] - 16), q[j] in 0..31: its low 4 bits are Q4_0's nibble j, its fifth bit
// is bit j of qh read as a little-endian uint32. Where a K-quant needs a row length that is a
// multiple of 256, GGML's quantizer writes Q5_0 instead (a Q4_K_M file of a model 576 or 896 wide
// is mostly Q5_0).
struct BlockQ5_0 {
  f16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};

// Q5_1: x[j] = d * q[j] + m, q[j] in 0..31 as in Q5_0.
struct BlockQ5_1 {
  f16_t d;
  f16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};

// Q4_K: 8 sub-blocks of 32. Sub-block s has a 6-bit scale sc[s] and a 6-bit minimum mn[s]
// (Q4KScaleMin unpacks them from `scales`), and x = d * sc[s] * q - dmin * mn[s] with q in 0..15.
// qs[32 g + l] holds element l of sub-block 2 g in its low nibble and element l of sub-block
// 2 g + 1 in its high nibble (g < 4, l < 32).
struct BlockQ4_K {
  f16_t d;
  f16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};

// Q6_K: 16 sub-blocks of 16, x = d * scales[s] * (q - 32) with q in 0..63 for element e of
// sub-block s = e / 16. Element e = 128 h + 32 r + l (h < 2, r < 4, l < 32) keeps its low 4 bits
// in ql[64 h + 32 (r & 1) + l] (low nibble for r < 2, high nibble for r >= 2) and its high 2 bits
// in bits 2 r .. 2 r + 1 of qh[32 h + l].
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  f16_t d;
};

// Q5_K: Q4_K with a fifth bit: x = d * sc[s] * q - dmin * mn[s] with q in 0..31 for element l of
// sub-block s; d, dmin and scales as Q4_K's (same offsets), the low 4 bits of q in qs as Q4_K
// keeps its levels, and the high bit in bit s of qh[l].
struct BlockQ5_K {
  f16_t d;
  f16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};

static_assert(sizeof(BlockQ8_0) == DTypeBlockBytes(DType::kQ8_0));
static_assert(sizeof(BlockQ4_0) == DTypeBlockBytes(DType::kQ4_0));
static_assert(sizeof(BlockQ4_1) == DTypeBlockBytes(DType::kQ4_1));
static_assert(sizeof(BlockQ4_K) == DTypeBlockBytes(DType::kQ4_K));
static_assert(sizeof(BlockQ6_K) == DTypeBlockBytes(DType::kQ6_K));
static_assert(sizeof(BlockQ5_K) == DTypeBlockBytes(DType::kQ5_K));
static_assert(sizeof(BlockQ5_0) == DTypeBlockBytes(DType::kQ5_0));
static_assert(sizeof(BlockQ5_1) == DTypeBlockBytes(DType::kQ5_1));
static_assert(offsetof(BlockQ5_K, scales) == offsetof(BlockQ4_K, scales));
static_assert(alignof(BlockQ8_0) == 2 && alignof(BlockQ4_K) == 2 && alignof(BlockQ6_K) == 2);

// The 6-bit scale and minimum of sub-block s (< 8) of a Q4_K block. Bytes 0..3 hold the low 6 bits
// of sc[0..3], bytes 4..7 those of mn[0..3]; for s >= 4 the low 4 bits come from byte 8 + (s - 4)
// (scale in its low nibble, minimum in its high nibble) and the top 2 bits from the spare top bits
// of bytes s - 4 (scale) and s (minimum).
inline void Q4KScaleMin(const uint8_t* scales, int s, uint8_t* sc, uint8_t* mn) {
  if (s < 4) {
    *sc = scales[s] & 63;
    *mn = scales[s + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((scales[s + 4] & 0x0f) | ((scales[s - 4] >> 6) << 4));
    *mn = static_cast<uint8_t>((scales[s + 4] >> 4) | ((scales[s] >> 6) << 4));
  }
}

// dst[i] = the value element i of the row `src` stands for, i < num_elems. `t` is any weight
// dtype (F32, F16, BF16 or a quantized one; I32 is a caller bug and CHECK-fails). For a quantized
// type num_elems must be a multiple of DTypeBlockElems(t) (CHECKed). Products are formed in f32
// in the order GGML's reference dequantizers use (d * sc first, then times q), so results are
// bit-identical to the `gguf` Python package's and llama.cpp's.
void DequantizeRow(DType t, const void* src, int64_t num_elems, float* dst);

// Writes the blocks (or plain elements) of `t` for src[0 .. num_elems) to dst, which must hold
// DTypeRowBytes(t, num_elems) bytes. Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 use GGML's reference rounding
// (byte for byte what its quantize_row_*_ref and the `gguf` package write); Q4_K, Q5_K and Q6_K
// search each sub-block's scale (and minimum) for the least weighted squared error, as GGML's
// reference K-quantizers do, so their round-trip error is comparable. F32/F16/BF16 convert with
// round to nearest even. Errors (nothing useful is in dst then):
//   InvalidArgument: `t` is I32, num_elems is negative or not a multiple of the block, or an
//     element is NaN or infinite (the message names its index);
//   OutOfRange: a block's scale does not fit in f16 (|x| beyond ~8e6 for Q8_0; the message
//     names the block's first element).
absl::Status QuantizeRow(DType t, const float* src, int64_t num_elems, void* dst);

}  // namespace modserve::quant

#endif  // MODSERVE_ENGINE_COMMON_QUANT_H_
