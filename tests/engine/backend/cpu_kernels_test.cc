// The CPU kernel table's online-softmax tile on every ISA this CPU runs, against double-precision
// exp: its vectorised exp is within 2 ulp, and m, l and the returned rescale follow the contract
// in kernels.h (first tile, later tile, lengths that leave a scalar tail).
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/cpu/kernels.h"
#include "gtest/gtest.h"

namespace modserve::backend::cpu {
namespace {

// |got - want| in units in the last place of the float nearest `want`.
double Ulps(float got, double want) {
  return std::fabs(got - want) / std::ldexp(1.0, std::ilogb(want) - 23);
}

class CpuKernelsTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!CpuHasIsa(GetParam())) GTEST_SKIP() << "this CPU cannot run " << IsaName(GetParam());
  }
  const KernelTable& kernels() const { return KernelsFor(GetParam()); }
};

TEST_P(CpuKernelsTest, SoftmaxTileExpIsWithinTwoUlpOverTheWholeRange) {
  std::mt19937 rng(7);
  for (float low : {-87.0f, -4.0f}) {
    std::uniform_real_distribution<float> dist(low, 0.0f);
    double worst = 0.0;
    for (int rep = 0; rep < 2000; ++rep) {
      std::vector<float> x(64), s(64);
      x[0] = 0.0f;  // the tile's max, so s[t] becomes exp(x[t])
      for (size_t t = 1; t < x.size(); ++t) x[t] = dist(rng);
      s = x;
      float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
      const float rescale = kernels().attn_softmax(s.data(), 64, &m, &l);
      ASSERT_EQ(rescale, 0.0f) << "first tile";
      ASSERT_EQ(m, 0.0f);
      double sum = 0.0;
      for (size_t t = 0; t < x.size(); ++t) {
        worst = std::max(worst, Ulps(s[t], std::exp(double{x[t]})));
        sum += s[t];
      }
      ASSERT_NEAR(l, sum, 1e-6 * sum);
    }
    EXPECT_LE(worst, 2.0) << "inputs in [" << low << ", 0]";
  }
}

TEST_P(CpuKernelsTest, SoftmaxTileRescalesTheRunningStateAndHandlesTails) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-6.0f, 3.0f);
  for (int64_t n : {1, 7, 37, 64}) {
    std::vector<float> x(n);
    for (float& v : x) v = dist(rng);
    x[n / 2] = 3.0f;  // the tile max, above the running max below
    std::vector<float> s = x;
    float m = 1.5f, l = 2.0f;
    const float rescale = kernels().attn_softmax(s.data(), n, &m, &l);
    EXPECT_EQ(m, 3.0f) << "n=" << n;
    EXPECT_NEAR(rescale, std::exp(1.5 - 3.0), 1e-7) << "n=" << n;
    double sum = 0.0;
    for (int64_t t = 0; t < n; ++t) {
      // s - m' is an f32 subtraction; its rounding is not the exp's error.
      const double want = std::exp(double{x[t] - 3.0f});
      EXPECT_LE(Ulps(s[t], want), 2.0) << "n=" << n << " t=" << t;
      sum += want;
    }
    EXPECT_NEAR(l, 2.0 * std::exp(-1.5) + sum, 1e-6 * (2.0 + sum)) << "n=" << n;
    // A tile below the running max leaves m alone and scales nothing down.
    std::vector<float> low(n, -1.0f);
    const float keep = kernels().attn_softmax(low.data(), n, &m, &l);
    EXPECT_EQ(m, 3.0f);
    EXPECT_EQ(keep, 1.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, CpuKernelsTest,
                         ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512),
                         [](const auto& info) { return std::string(IsaName(info.param)); });

}  // namespace
}  // namespace modserve::backend::cpu
