// ExpNonPositive and SumExpShifted against std::exp in double precision.
#include "engine/sampler/sum_exp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace modserve {
namespace {

TEST(SumExpTest, ExpNonPositiveIsWithin3e7OfExpOnASweep) {
  double worst = 0;
  float worst_at = 0;
  // Every 1/4096 from -87 to 0, plus the ends of each reduction interval.
  for (int i = 0; i <= 87 * 4096; ++i) {
    const float v = -static_cast<float>(i) / 4096.0f;
    const double want = std::exp(static_cast<double>(v));
    const double rel = std::fabs(ExpNonPositive(v) - want) / want;
    if (rel > worst) worst = rel, worst_at = v;
  }
  EXPECT_LT(worst, 3e-7) << "at " << worst_at;
  EXPECT_EQ(ExpNonPositive(0.0f), 1.0f);
}

TEST(SumExpTest, ExpNonPositiveIsZeroBelowTheRangeAndForInfAndNan) {
  EXPECT_EQ(ExpNonPositive(-87.5f), 0.0f);
  EXPECT_EQ(ExpNonPositive(-1e30f), 0.0f);
  EXPECT_EQ(ExpNonPositive(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(ExpNonPositive(std::numeric_limits<float>::quiet_NaN()), 0.0f);
  EXPECT_GT(ExpNonPositive(-86.9f), 0.0f);
}

TEST(SumExpTest, SumMatchesDoubleExpOnLogitRows) {
  std::mt19937 rng(11);
  for (size_t vocab : {1u, 7u, 8u, 9u, 1000u, 32000u, 49152u, 128256u}) {
    for (float spread : {0.5f, 3.0f, 20.0f}) {
      std::normal_distribution<float> dist(0.0f, spread);
      std::vector<float> row(vocab);
      for (float& x : row) x = dist(rng);
      if (vocab > 10) row[vocab / 3] = -std::numeric_limits<float>::infinity();  // a masked id
      float max = -std::numeric_limits<float>::infinity();
      for (float x : row) max = std::max(max, x);
      double want = 0;
      for (float x : row) want += std::exp(static_cast<double>(x) - max);
      const double got = SumExpShifted(row, max);
      EXPECT_NEAR(got, want, 3e-7 * want) << "vocab " << vocab << " spread " << spread;
    }
  }
}

TEST(SumExpTest, SumIsTheSameForTheSameRowAtAnyOffset) {
  // The fixed lanes make the result a function of the row alone, not of where it starts.
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  std::vector<float> buf(1003);
  for (float& x : buf) x = std::min(dist(rng), 0.0f);
  std::vector<float> copy(buf.begin() + 3, buf.end());
  const absl::Span<const float> view(buf.data() + 3, 1000);
  EXPECT_EQ(SumExpShifted(view, 0.0f), SumExpShifted(copy, 0.0f));
}

}  // namespace
}  // namespace modserve
