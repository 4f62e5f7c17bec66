// ExpNonPositive and SumExpShifted against std::exp in double precision; every ISA body of
// SumExpShifted and ArgMaxBelowInfinity against the baseline one and a scalar walk.
#include "engine/sampler/sum_exp.h"

#include <gtest/gtest.h>

#include <algorithm>
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

// The bodies this CPU can run: the baseline always, then up to the best.
std::vector<RowPassIsa> RunnableIsas() {
  std::vector<RowPassIsa> isas = {RowPassIsa::kBaseline};
  if (BestRowPassIsa() != RowPassIsa::kBaseline) isas.push_back(RowPassIsa::kAvx2);
  if (BestRowPassIsa() == RowPassIsa::kAvx512) isas.push_back(RowPassIsa::kAvx512);
  return isas;
}

TEST(SumExpTest, EveryIsaBodyGivesTheBaselineBits) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(17);
  std::normal_distribution<float> dist(0.0f, 30.0f);
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 70; ++n) lengths.push_back(n);
  for (size_t n : {1000u, 32000u, 49152u, 128256u}) lengths.push_back(n);
  for (size_t n : lengths) {
    std::vector<float> row(n);
    for (float& x : row) x = dist(rng);
    // Terms at and around the cut-off of exp (-87 after the shift), -inf and NaN.
    for (size_t i = 0; i < n; i += 7) row[i] = 3.0f - 87.0f + 0.001f * static_cast<float>(i % 5);
    if (n > 4) row[n / 2] = -kInf, row[n - 1] = std::numeric_limits<float>::quiet_NaN();
    if (n > 3) row[3] = 1.0f;
    for (float shift : {3.0f, 60.0f}) {
      const double want = SumExpShifted(row, shift, RowPassIsa::kBaseline);
      for (RowPassIsa isa : RunnableIsas()) {
        EXPECT_EQ(SumExpShifted(row, shift, isa), want)
            << "isa " << static_cast<int>(isa) << " n " << n << " shift " << shift;
        EXPECT_EQ(SumExpShiftedAtLeast(row, shift, -kInf, isa), want);
      }
      // Only the terms of elements >= t: against the sum over a copy with the rest at -inf.
      for (float t : {-30.0f, 0.0f, 1.0f, 2.5f}) {  // row[3] is 1: a term at t counts
        std::vector<float> kept = row;
        for (float& x : kept) x = x >= t ? x : -kInf;
        const double want_t = SumExpShifted(kept, shift, RowPassIsa::kBaseline);
        for (RowPassIsa isa : RunnableIsas()) {
          EXPECT_EQ(SumExpShiftedAtLeast(row, shift, t, isa), want_t)
              << "isa " << static_cast<int>(isa) << " n " << n << " t " << t;
        }
      }
    }
  }
}

// What a walk over ascending ids keeping the first strictly greater element picks.
size_t ScalarArgMax(const std::vector<float>& x) {
  size_t best = 0;
  for (size_t i = 1; i < x.size(); ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

TEST(SumExpTest, ArgMaxIsTheFirstMaximumOnEveryIsa) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(23);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  int checked = 0;
  for (size_t n : {1u, 2u, 15u, 16u, 17u, 31u, 32u, 33u, 47u, 100u, 1000u, 32000u}) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> row(n);
      for (float& x : row) x = dist(rng);
      // Ties of the maximum at up to three places (any lane, block or the tail), with -0 and +0
      // as a tie when the maximum is zero; runs of -inf; a row of -inf only.
      const float top = trial % 5 == 0 ? 0.0f : 12.0f;
      for (int t = 0; t < trial % 4; ++t) {
        row[rng() % n] = (t % 2 == 0 && top == 0.0f) ? -0.0f : top;
      }
      if (trial % 5 == 0) {
        for (float& x : row) x = std::min(x, -1.0f);
        row[rng() % n] = -0.0f;
        row[rng() % n] = 0.0f;
      }
      if (trial % 7 == 3) {
        for (size_t i = 0; i < n; i += 2) row[i] = -kInf;
      }
      if (trial == 39) std::fill(row.begin(), row.end(), -kInf);
      const size_t want = ScalarArgMax(row);
      for (RowPassIsa isa : RunnableIsas()) {
        size_t got = n + 1;
        ASSERT_TRUE(ArgMaxBelowInfinity(row, &got, isa)) << "n " << n;
        EXPECT_EQ(got, want) << "isa " << static_cast<int>(isa) << " n " << n << " trial " << trial;
        ++checked;
      }
      // One NaN or +inf anywhere, the tail included, is reported.
      for (float poison : {std::numeric_limits<float>::quiet_NaN(), kInf}) {
        std::vector<float> bad = row;
        bad[trial % 2 == 0 ? n - 1 : rng() % n] = poison;
        for (RowPassIsa isa : RunnableIsas()) {
          size_t got = 0;
          EXPECT_FALSE(ArgMaxBelowInfinity(bad, &got, isa))
              << "isa " << static_cast<int>(isa) << " n " << n << " trial " << trial;
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(SumExpTest, FirstIndexPastMassIsTheAscendingWalkOnEveryIsa) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(31);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  int checked = 0;
  for (size_t n : {1u, 7u, 8u, 9u, 15u, 16u, 17u, 33u, 100u, 1000u, 32000u}) {
    std::vector<float> row(n);
    for (float& x : row) x = std::min(dist(rng), 0.0f);
    for (size_t i = 1; i < n; i += 3) row[i] = -kInf;  // masked ids add nothing to the walk
    // The scalar walk the contract names: ExpNonPositive terms summed in f64, ascending.
    std::vector<double> running(n);
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) running[i] = sum += ExpNonPositive(row[i] - 0.0f);
    std::vector<double> masses = {-1.0, 0.0, sum, 2 * sum};
    for (int t = 0; t < 50; ++t) masses.push_back(unit(rng) * sum);
    for (size_t i = 0; i < n; i += std::max<size_t>(1, n / 20)) {
      masses.push_back(running[i]);  // exactly at a running sum: the walk goes one past it
    }
    for (double mass : masses) {
      const size_t want = std::upper_bound(running.begin(), running.end(), mass) - running.begin();
      for (RowPassIsa isa : RunnableIsas()) {
        EXPECT_EQ(FirstIndexPastMass(row, 0.0f, mass, isa), want)
            << "isa " << static_cast<int>(isa) << " n " << n << " mass " << mass;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(SumExpTest, CountAtLeastCountsOnEveryIsa) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(37);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (size_t n : {0u, 1u, 15u, 16u, 17u, 100u, 32000u}) {
    std::vector<float> row(n);
    for (float& x : row) x = dist(rng);
    for (size_t i = 0; i < n; i += 5) row[i] = -kInf;
    if (n > 3) row[2] = std::numeric_limits<float>::quiet_NaN(), row[3] = 1.0f;
    for (float t : {-kInf, -std::numeric_limits<float>::max(), -1.0f, 0.0f, 1.0f, 3.0f, kInf}) {
      int64_t want = 0;
      for (float x : row) want += x >= t;
      for (RowPassIsa isa : RunnableIsas()) {
        EXPECT_EQ(CountAtLeast(row, t, isa), want)
            << "isa " << static_cast<int>(isa) << " n " << n << " t " << t;
      }
    }
  }
}

}  // namespace
}  // namespace modserve
