// The GGML block layouts of quant.h against hand-built blocks (every field at its byte offset),
// and the reference quantizers: round-trip error bounds on random rows, extreme scales, and the
// errors they return. The `gguf` package's independent reader checks the same bytes in
// tests/python/test_quant_gguf.py.
#include "engine/common/quant.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/common/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace modserve::quant {
namespace {

using ::testing::HasSubstr;

constexpr DType kQuantTypes[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                                 DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

std::string Name(DType t) { return std::string(DTypeName(t)); }

void PutF16(uint8_t* p, float v) {
  const f16_t h = F32ToF16(v);
  std::memcpy(p, &h.bits, 2);  // little-endian host, as GGUF
}

std::vector<float> Dequantize(DType t, const std::vector<uint8_t>& bytes, int64_t n) {
  std::vector<float> out(n);
  DequantizeRow(t, bytes.data(), n, out.data());
  return out;
}

std::vector<uint8_t> Quantize(DType t, const std::vector<float>& x) {
  std::vector<uint8_t> bytes(DTypeRowBytes(t, static_cast<int64_t>(x.size())));
  const absl::Status status =
      QuantizeRow(t, x.data(), static_cast<int64_t>(x.size()), bytes.data());
  EXPECT_TRUE(status.ok()) << Name(t) << ": " << status;
  return bytes;
}

// ---- layouts: hand-built blocks, field by field -----------------------------------------------
TEST(QuantLayoutTest, RowBytesFollowTheBlockSizes) {
  EXPECT_EQ(DTypeRowBytes(DType::kQ8_0, 64), 68u);
  EXPECT_EQ(DTypeRowBytes(DType::kQ4_0, 2048), 64u * 18);
  EXPECT_EQ(DTypeRowBytes(DType::kQ4_1, 32), 20u);
  EXPECT_EQ(DTypeRowBytes(DType::kQ5_0, 576), 18u * 22);
  EXPECT_EQ(DTypeRowBytes(DType::kQ5_1, 64), 2u * 24);
  EXPECT_EQ(offsetof(BlockQ5_0, qh), 2u);
  EXPECT_EQ(offsetof(BlockQ5_0, qs), 6u);
  EXPECT_EQ(offsetof(BlockQ5_1, qh), 4u);
  EXPECT_EQ(offsetof(BlockQ5_1, qs), 8u);
  EXPECT_EQ(DTypeRowBytes(DType::kQ4_K, 5632), 22u * 144);
  EXPECT_EQ(DTypeRowBytes(DType::kQ6_K, 512), 2u * 210);
  EXPECT_EQ(offsetof(BlockQ4_K, scales), 4u);
  EXPECT_EQ(offsetof(BlockQ4_K, qs), 16u);
  EXPECT_EQ(DTypeRowBytes(DType::kQ5_K, 768), 3u * 176);
  EXPECT_EQ(offsetof(BlockQ5_K, scales), 4u);
  EXPECT_EQ(offsetof(BlockQ5_K, qh), 16u);
  EXPECT_EQ(offsetof(BlockQ5_K, qs), 48u);
  EXPECT_EQ(offsetof(BlockQ6_K, qh), 128u);
  EXPECT_EQ(offsetof(BlockQ6_K, scales), 192u);
  EXPECT_EQ(offsetof(BlockQ6_K, d), 208u);
}

TEST(QuantLayoutTest, Q8_0IsAnF16ScaleThenSignedBytes) {
  std::vector<uint8_t> block(34);
  PutF16(block.data(), 0.5f);
  for (int j = 0; j < 32; ++j)
    block[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(4 * j - 100));
  const std::vector<float> y = Dequantize(DType::kQ8_0, block, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 0.5f * (4 * j - 100)) << j;
}

TEST(QuantLayoutTest, Q4_0KeepsTheFirstHalfInLowNibbles) {
  std::vector<uint8_t> block(18);
  PutF16(block.data(), 2.0f);
  for (int j = 0; j < 16; ++j) block[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const std::vector<float> y = Dequantize(DType::kQ4_0, block, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 2.0f * (j - 8)) << j;
    EXPECT_EQ(y[16 + j], 2.0f * (15 - j - 8)) << 16 + j;
  }
}

TEST(QuantLayoutTest, Q4_1AddsTheMinimumAfterTheScale) {
  std::vector<uint8_t> block(20);
  PutF16(block.data(), 0.25f);
  PutF16(block.data() + 2, -1.5f);
  for (int j = 0; j < 16; ++j) block[4 + j] = static_cast<uint8_t>(((j * 7) % 16) | (j << 4));
  const std::vector<float> y = Dequantize(DType::kQ4_1, block, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.25f * ((j * 7) % 16) - 1.5f) << j;
    EXPECT_EQ(y[16 + j], 0.25f * j - 1.5f) << 16 + j;
  }
}

// Q5_0 and Q5_1: Q4_0's and Q4_1's nibbles, and the fifth bit of element j in bit j of qh (a
// little-endian uint32): set here for every third element, so both halves and all four qh bytes
// have set and clear bits.
TEST(QuantLayoutTest, Q5_0And5_1TakeTheFifthBitOfElementJFromBitJOfQh) {
  auto level = [](int j) { return ((j * 5) % 16) | (j % 3 == 0 ? 16 : 0); };
  for (const bool has_min : {false, true}) {
    const DType t = has_min ? DType::kQ5_1 : DType::kQ5_0;
    const int qh_at = has_min ? 4 : 2;
    std::vector<uint8_t> block(qh_at + 4 + 16);
    PutF16(block.data(), 0.75f);
    if (has_min) PutF16(block.data() + 2, -2.0f);
    uint32_t qh = 0;
    for (int j = 0; j < 32; ++j) qh |= static_cast<uint32_t>(level(j) >> 4) << j;
    for (int b = 0; b < 4; ++b) block[qh_at + b] = static_cast<uint8_t>(qh >> (8 * b));
    for (int j = 0; j < 16; ++j) {
      block[qh_at + 4 + j] = static_cast<uint8_t>((level(j) & 15) | ((level(16 + j) & 15) << 4));
    }
    const std::vector<float> y = Dequantize(t, block, 32);
    for (int j = 0; j < 32; ++j) {
      EXPECT_EQ(y[j], has_min ? 0.75f * level(j) - 2.0f : 0.75f * (level(j) - 16)) << Name(t) << j;
    }
  }
}

// Q4_K's (and Q5_K's) 12 bytes of 6-bit scales and minimums, packed by hand from the layout:
// bytes 0..3 the low 6 bits of sc[0..3] with sc[4..7]'s top 2 bits above them; bytes 4..7
// likewise for the minimums; bytes 8..11 the low nibbles of sc[4..7] (low) and mn[4..7] (high).
void PackScalesByHand(const int sc[8], const int mn[8], uint8_t* scales) {
  for (int s = 0; s < 4; ++s) {
    scales[s] = static_cast<uint8_t>(sc[s] | ((sc[s + 4] >> 4) << 6));
    scales[4 + s] = static_cast<uint8_t>(mn[s] | ((mn[s + 4] >> 4) << 6));
    scales[8 + s] = static_cast<uint8_t>((sc[s + 4] & 15) | ((mn[s + 4] & 15) << 4));
  }
}

TEST(QuantLayoutTest, Q4_KUnpacksSixBitScalesAndMinimums) {
  // Sub-block scales 1, 2, ..., 8 plus 40 on the last four (so their top bits are set) and
  // minimums 63, 62, ..., 56, packed by hand (PackScalesByHand).
  const int sc[8] = {1, 2, 3, 4, 45, 46, 47, 48};
  const int mn[8] = {63, 62, 61, 60, 59, 58, 57, 56};
  std::vector<uint8_t> block(144);
  PutF16(block.data(), 0.125f);
  PutF16(block.data() + 2, 0.0625f);
  PackScalesByHand(sc, mn, block.data() + 4);
  for (int s = 0; s < 8; ++s) {
    uint8_t got_sc, got_mn;
    Q4KScaleMin(block.data() + 4, s, &got_sc, &got_mn);
    EXPECT_EQ(got_sc, sc[s]) << s;
    EXPECT_EQ(got_mn, mn[s]) << s;
  }
  // Byte 16 + 32 g + l: element l of sub-block 2g (low nibble) and of 2g + 1 (high nibble).
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      block[16 + 32 * g + l] = static_cast<uint8_t>(((l + g) % 16) | (((3 * l) % 16) << 4));
    }
  }
  const std::vector<float> y = Dequantize(DType::kQ4_K, block, 256);
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      const int s0 = 2 * g, s1 = 2 * g + 1;
      EXPECT_EQ(y[64 * g + l], 0.125f * sc[s0] * ((l + g) % 16) - 0.0625f * mn[s0]);
      EXPECT_EQ(y[64 * g + 32 + l], 0.125f * sc[s1] * ((3 * l) % 16) - 0.0625f * mn[s1]);
    }
  }
}

TEST(QuantLayoutTest, Q5_KTakesTheFifthBitOfSubBlockSFromBitSOfQh) {
  // Q4_K's header (d, dmin, packed 6-bit scales and minimums at bytes 0..15), then qh[32]: bit s
  // of qh[l] is the high bit of element l of sub-block s; then qs[128] as Q4_K's qs.
  const int sc[8] = {3, 9, 17, 33, 40, 50, 61, 63};
  const int mn[8] = {0, 5, 10, 20, 30, 40, 50, 63};
  std::vector<uint8_t> block(176, 0);
  PutF16(block.data(), 0.25f);
  PutF16(block.data() + 2, 0.5f);
  PackScalesByHand(sc, mn, block.data() + 4);
  auto q_of = [](int s, int l) { return (7 * l + 13 * s + 5) % 32; };
  for (int s = 0; s < 8; ++s) {
    for (int l = 0; l < 32; ++l) {
      const int q = q_of(s, l);
      block[48 + 32 * (s / 2) + l] |= static_cast<uint8_t>(s % 2 == 0 ? (q & 15) : (q & 15) << 4);
      block[16 + l] |= static_cast<uint8_t>((q >> 4) << s);
    }
  }
  const std::vector<float> y = Dequantize(DType::kQ5_K, block, 256);
  for (int s = 0; s < 8; ++s) {
    for (int l = 0; l < 32; ++l) {
      // GGML's order: d * sc first, then times q, then the minimum's dmin * mn subtracted.
      const float ds = 0.25f * static_cast<float>(sc[s]), ms = 0.5f * static_cast<float>(mn[s]);
      EXPECT_EQ(y[32 * s + l], ds * static_cast<float>(q_of(s, l)) - ms) << s << " " << l;
    }
  }
}

TEST(QuantLayoutTest, Q6_KSplitsSixBitsIntoNibblesAndCrumbs) {
  std::vector<uint8_t> block(210, 0);
  // Element e = 128 h + 32 r + l: low 4 bits in ql[64 h + 32 (r & 1) + l] (low nibble for
  // r < 2), high 2 bits at bit 2 r of qh[32 h + l]; scales at byte 192, d at byte 208.
  auto q_of = [](int e) { return (e * 37 + 11) % 64; };
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, r = (e % 128) / 32, l = e % 32, q = q_of(e);
    block[64 * h + 32 * (r & 1) + l] |= static_cast<uint8_t>(r < 2 ? (q & 15) : (q & 15) << 4);
    block[128 + 32 * h + l] |= static_cast<uint8_t>((q >> 4) << (2 * r));
  }
  for (int s = 0; s < 16; ++s)
    block[192 + s] = static_cast<uint8_t>(static_cast<int8_t>(s * 9 - 70));
  PutF16(block.data() + 208, 0.03125f);
  const std::vector<float> y = Dequantize(DType::kQ6_K, block, 256);
  for (int e = 0; e < 256; ++e) {
    EXPECT_EQ(y[e], 0.03125f * ((e / 16) * 9 - 70) * (q_of(e) - 32)) << e;
  }
}

// ---- round trips ------------------------------------------------------------------------------
// Error of the round trip over a row, normalised: sum (y - x)^2 / sum x^2.
double Nmse(const std::vector<float>& x, const std::vector<float>& y) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    num += (static_cast<double>(y[i]) - x[i]) * (static_cast<double>(y[i]) - x[i]);
    den += static_cast<double>(x[i]) * x[i];
  }
  return num / den;
}

// Upper bounds on the NMSE of N(0, 1) rows. Measured (seed 1): 2.93e-5 (Q8_0), 7.52e-3 (Q4_0),
// 6.16e-3 (Q4_1), 1.88e-3 (Q5_0), 1.45e-3 (Q5_1), 5.18e-3 (Q4_K), 1.30e-3 (Q5_K: each 5-bit
// type about a quarter of its 4-bit sibling's, one more bit per level), 3.20e-4 (Q6_K); the
// bounds leave ~20% margin, so a rounding or
// packing slip (which at least doubles the error) fails.
double NmseBound(DType t) {
  switch (t) {
    case DType::kQ8_0:
      return 3.5e-5;
    case DType::kQ4_0:
      return 9.0e-3;
    case DType::kQ4_1:
      return 7.4e-3;
    case DType::kQ5_0:
      return 2.3e-3;
    case DType::kQ5_1:
      return 1.75e-3;
    case DType::kQ4_K:
      return 6.2e-3;
    case DType::kQ5_K:
      return 1.6e-3;
    case DType::kQ6_K:
      return 3.9e-4;
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kI32:
      break;
  }
  return 0.0;
}

TEST(QuantRoundTripTest, GaussianRowsStayWithinTheFormatsError) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(256 * 64);
  for (float& v : x) v = normal(rng);
  for (DType t : kQuantTypes) {
    const std::vector<float> y = Dequantize(t, Quantize(t, x), static_cast<int64_t>(x.size()));
    const double nmse = Nmse(x, y);
    EXPECT_LE(nmse, NmseBound(t)) << Name(t);
    EXPECT_GT(nmse, 0.0) << Name(t);
  }
}

TEST(QuantRoundTripTest, KQuantsSearchBeatsPlainRounding) {
  // The scale search is what makes Q4_K better than Q4_1 at fewer bits (4.5 vs 5 per weight);
  // Laplace-distributed weights (heavy tails, like real matrices) make the difference larger.
  std::mt19937 rng(2);
  std::exponential_distribution<float> expo(1.0f);
  std::vector<float> x(256 * 64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (rng() & 1 ? 1.0f : -1.0f) * expo(rng);
  const double q4_1 = Nmse(x, Dequantize(DType::kQ4_1, Quantize(DType::kQ4_1, x), x.size()));
  const double q4_k = Nmse(x, Dequantize(DType::kQ4_K, Quantize(DType::kQ4_K, x), x.size()));
  const double q4_0 = Nmse(x, Dequantize(DType::kQ4_0, Quantize(DType::kQ4_0, x), x.size()));
  EXPECT_LT(q4_k, q4_1);
  EXPECT_LT(q4_k, q4_0);
}

TEST(QuantRoundTripTest, BlockErrorIsBoundedByTheStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-6.0f, 4.0f);
  std::vector<float> x(32 * 200);
  for (int b = 0; b < 200; ++b) {
    const float scale = std::pow(10.0f, exponent(rng));
    for (int j = 0; j < 32; ++j) x[32 * b + j] = scale * normal(rng);
  }
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1}) {
    const std::vector<uint8_t> bytes = Quantize(t, x);
    const std::vector<float> y = Dequantize(t, bytes, static_cast<int64_t>(x.size()));
    const size_t block_bytes = DTypeBlockBytes(t);
    for (int b = 0; b < 200; ++b) {
      f16_t d;
      std::memcpy(&d.bits, bytes.data() + b * block_bytes, 2);
      // Half a step, plus the f16 rounding of the scale times the largest level: relative
      // 2^-11 of |x| for normal f16 scales, at most 2^-25 per level for subnormal ones (tiny
      // blocks); Q4_1's f16 minimum adds at most 2^-11 of |x| more.
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * b + j]));
      const float max_level = t == DType::kQ8_0   ? 127.0f
                              : t == DType::kQ4_0 ? 8.0f
                              : t == DType::kQ4_1 ? 15.0f
                              : t == DType::kQ5_0 ? 16.0f
                                                  : 31.0f;
      // Q4_0 (Q5_0) maps the largest-magnitude value to -8 (-16) steps, so values of the other
      // sign may sit up to a whole step beyond +7 (+15) steps, where they clamp.
      const float steps = t == DType::kQ4_0 || t == DType::kQ5_0 ? 1.0f : 0.5f;
      const float bound =
          steps * std::fabs(F16ToF32(d)) * 1.0001f + amax * 0x1p-10f + max_level * 0x1p-25f;
      for (int j = 0; j < 32; ++j) {
        ASSERT_LE(std::fabs(y[32 * b + j] - x[32 * b + j]), bound)
            << Name(t) << " block " << b << " element " << j;
      }
    }
  }
}

// Blocks at the edges: zeros, constants, one spike, all-negative (Q4_1/Q4_K minimums), tiny
// values near the f16 subnormal range and large ones near its top.
TEST(QuantRoundTripTest, ExtremeBlocksRoundTripSensibly) {
  for (DType t : kQuantTypes) {
    const int64_t n = 256;
    auto roundtrip = [&](const std::vector<float>& x) { return Dequantize(t, Quantize(t, x), n); };
    const std::vector<float> zeros(n, 0.0f);
    EXPECT_EQ(roundtrip(zeros), zeros) << Name(t);

    std::vector<float> spike(n, 0.0f);
    spike[77] = -3.0f;
    const std::vector<float> y_spike = roundtrip(spike);
    EXPECT_NEAR(y_spike[77], -3.0f, 3.0f * 2e-3f) << Name(t);
    for (int64_t i = 0; i < n; ++i) {
      if (i != 77) {
        EXPECT_NEAR(y_spike[i], 0.0f, 3.0f / 14) << Name(t) << " " << i;
      }
    }

    // Negative-only rows: the block minimum carries them (Q4_1, Q4_K), or the sign does.
    std::vector<float> negative(n);
    for (int64_t i = 0; i < n; ++i) negative[i] = -5.0f - static_cast<float>(i % 32) / 8.0f;
    const std::vector<float> y_neg = roundtrip(negative);
    // Half a step: Q4_0 has only its 16 signed levels for the range [-8.875, 0], Q5_0 its 32.
    const float neg_tol = t == DType::kQ4_0 ? 0.6f : t == DType::kQ5_0 ? 0.3f : 0.2f;
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_NEAR(y_neg[i], negative[i], neg_tol) << Name(t) << " " << i;
    }

    std::vector<float> constant(n, 2.5f);
    const std::vector<float> y_const = roundtrip(constant);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y_const[i], 2.5f, 0.03f) << Name(t) << " " << i;

    // Tiny values: scales fall into (or below) f16 subnormals; the error stays absolute-small.
    std::mt19937 rng(4);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> tiny(n);
    for (float& v : tiny) v = 1e-7f * normal(rng);
    for (float v : roundtrip(tiny)) EXPECT_LE(std::fabs(v), 1e-6f) << Name(t);

    // Large values that still fit: the relative error matches the format's.
    std::vector<float> large(n);
    for (float& v : large) v = 1e4f * normal(rng);
    const std::vector<float> y_large = roundtrip(large);
    EXPECT_LE(Nmse(large, y_large), 2 * NmseBound(t)) << Name(t);
  }
}

TEST(QuantRoundTripTest, PlainTypesConvertWithRoundToNearestEven) {
  const std::vector<float> x = {1.0f, -2.5f, 3.14159f, 65504.0f, 1e-8f};
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<uint8_t> bytes(DTypeRowBytes(t, 5));
    ASSERT_TRUE(QuantizeRow(t, x.data(), 5, bytes.data()).ok()) << Name(t);
    const std::vector<float> y = Dequantize(t, bytes, 5);
    for (int i = 0; i < 5; ++i) {
      const float want = t == DType::kF32   ? x[i]
                         : t == DType::kF16 ? F16ToF32(F32ToF16(x[i]))
                                            : Bf16ToF32(F32ToBf16(x[i]));
      EXPECT_EQ(y[i], want) << Name(t) << " " << i;
    }
  }
}

// ---- errors -----------------------------------------------------------------------------------
TEST(QuantizeRowTest, RejectsNonFiniteValuesNamingTheElement) {
  for (DType t : kQuantTypes) {
    std::vector<float> x(256, 1.0f);
    x[131] = std::numeric_limits<float>::quiet_NaN();
    std::vector<uint8_t> bytes(DTypeRowBytes(t, 256));
    absl::Status status = QuantizeRow(t, x.data(), 256, bytes.data());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << Name(t);
    EXPECT_THAT(status.message(), HasSubstr("element 131")) << Name(t);
    x[131] = -std::numeric_limits<float>::infinity();
    status = QuantizeRow(t, x.data(), 256, bytes.data());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << Name(t);
  }
}

TEST(QuantizeRowTest, RejectsLengthsThatAreNotWholeBlocks) {
  std::vector<float> x(300, 1.0f);
  std::vector<uint8_t> bytes(1024);
  for (DType t : kQuantTypes) {
    const int64_t bad = DTypeBlockElems(t) + 1;
    const absl::Status status = QuantizeRow(t, x.data(), bad, bytes.data());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << Name(t);
    EXPECT_THAT(status.message(), HasSubstr(Name(t))) << status;
    EXPECT_THAT(status.message(), HasSubstr(std::to_string(bad))) << status;
  }
  EXPECT_EQ(QuantizeRow(DType::kI32, x.data(), 4, bytes.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(QuantizeRowTest, RejectsScalesBeyondF16NamingTheBlock) {
  for (DType t : kQuantTypes) {
    std::vector<float> x(512, 1.0f);
    x[300] = 1e12f;
    std::vector<uint8_t> bytes(DTypeRowBytes(t, 512));
    const absl::Status status = QuantizeRow(t, x.data(), 512, bytes.data());
    EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange) << Name(t);
    const int64_t first = 300 / DTypeBlockElems(t) * DTypeBlockElems(t);
    EXPECT_THAT(status.message(), HasSubstr("element " + std::to_string(first))) << status;
  }
}

}  // namespace
}  // namespace modserve::quant
