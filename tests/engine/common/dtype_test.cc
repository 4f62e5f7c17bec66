// Checks the scalar F16/BF16 conversions exhaustively against each other and known bit patterns.
#include "engine/common/dtype.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "gtest/gtest.h"

namespace modserve {
namespace {

TEST(DTypeTest, Bf16RoundTripsEveryPattern) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float f = Bf16ToF32(bf16_t{static_cast<uint16_t>(b)});
    if (std::isnan(f)) continue;
    EXPECT_EQ(F32ToBf16(f).bits, b) << b;
  }
}

TEST(DTypeTest, F16RoundTripsEveryPattern) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float f = F16ToF32(f16_t{static_cast<uint16_t>(b)});
    if (std::isnan(f)) continue;
    EXPECT_EQ(F32ToF16(f).bits, b) << b;
  }
}

TEST(DTypeTest, KnownValues) {
  EXPECT_EQ(F32ToF16(1.0f).bits, 0x3c00);
  EXPECT_EQ(F32ToF16(-2.0f).bits, 0xc000);
  EXPECT_EQ(F32ToF16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(F32ToF16(1e6f).bits, 0x7c00);
  EXPECT_EQ(F32ToF16(5.96046448e-08f).bits, 0x0001);  // smallest subnormal
  EXPECT_EQ(F32ToBf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(F32ToBf16(1.00390625f).bits, 0x3f80);  // tie rounds to even
  EXPECT_EQ(F32ToBf16(1.01171875f).bits, 0x3f82);  // tie rounds to even (up)
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DTypeTest, F16RoundsToNearestEven) {
  // Halfway between 1.0 and the next half (1 + 2^-10) rounds down to even; just above rounds up.
  EXPECT_EQ(F32ToF16(1.0f + 0.00048828125f).bits, 0x3c00);
  EXPECT_EQ(F32ToF16(1.0f + 0.00048828125f * 1.01f).bits, 0x3c01);
  EXPECT_EQ(F32ToF16(1.0f + 3 * 0.00048828125f).bits, 0x3c02);
}

}  // namespace
}  // namespace modserve
