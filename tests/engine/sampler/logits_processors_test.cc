// Checks each logits transform against its formula, written out independently here.
#include "engine/sampler/logits_processors.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace modserve::engine {
namespace {

std::vector<float> RandomLogits(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(n);
  for (float& l : logits) l = normal(rng);
  return logits;
}

TEST(LogitsProcessorsTest, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  const std::vector<float> original = {2.0f, -2.0f, 0.5f, 0.0f, 3.0f, -0.25f};
  std::vector<float> logits = original;
  const std::vector<TokenId> seen = {0, 1, 3, 5};
  const float penalty = 1.7f;
  ApplyRepetitionPenalty(absl::MakeSpan(logits), seen, penalty);
  for (TokenId id = 0; id < 6; ++id) {
    const bool penalised = id == 0 || id == 1 || id == 3 || id == 5;
    const float x = original[id];
    const float expected = !penalised ? x : (x > 0 ? x / penalty : x * penalty);
    EXPECT_EQ(logits[id], expected) << id;
  }
  // Both signs move towards "less likely" for penalty > 1.
  EXPECT_LT(logits[0], original[0]);
  EXPECT_LT(logits[1], original[1]);
}

TEST(LogitsProcessorsTest, PresenceAndFrequencyPenaltiesFollowOpenAiFormula) {
  const std::vector<float> original = RandomLogits(10, 1);
  std::vector<float> logits = original;
  const std::vector<std::pair<TokenId, int32_t>> counts = {{2, 1}, {7, 4}, {9, 2}};
  const float presence = 0.6f;
  const float frequency = 0.3f;
  ApplyPresenceFrequencyPenalties(absl::MakeSpan(logits), counts, presence, frequency);
  for (TokenId id = 0; id < 10; ++id) {
    int32_t count = 0;
    for (const auto& [t, c] : counts) count += t == id ? c : 0;
    const float expected =
        original[id] - (count > 0 ? frequency * static_cast<float>(count) + presence : 0.0f);
    EXPECT_EQ(logits[id], expected) << id;
  }
}

TEST(LogitsProcessorsTest, TemperatureDivides) {
  const std::vector<float> original = RandomLogits(16, 2);
  std::vector<float> logits = original;
  ApplyTemperature(absl::MakeSpan(logits), 0.7f);
  for (size_t i = 0; i < logits.size(); ++i) EXPECT_EQ(logits[i], original[i] / 0.7f);
}

TEST(LogitsProcessorsTest, TopKKeepsBestSortedWithLowIdTies) {
  std::vector<Candidate> c = {{0, 1.0f}, {1, 3.0f}, {2, 2.0f}, {3, 3.0f}, {4, 2.0f}, {5, -1.0f}};
  KeepTopK(c, 3);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].id, 1);
  EXPECT_EQ(c[1].id, 3);
  EXPECT_EQ(c[2].id, 2);  // ties with id 4 at the cut: the lower id stays
}

TEST(LogitsProcessorsTest, TopPKeepsSmallestPrefixReachingMass) {
  // Probabilities 0.5, 0.25, 0.125, 0.125 (logits are their logs).
  const std::vector<Candidate> sorted = {
      {3, std::log(0.5f)}, {0, std::log(0.25f)}, {1, std::log(0.125f)}, {2, std::log(0.125f)}};
  EXPECT_EQ(TopPCount(sorted, 0.3f), 1u);
  EXPECT_EQ(TopPCount(sorted, 0.5f), 1u);  // mass exactly p is enough
  EXPECT_EQ(TopPCount(sorted, 0.51f), 2u);
  EXPECT_EQ(TopPCount(sorted, 0.8f), 3u);
  EXPECT_EQ(TopPCount(sorted, 0.9f), 4u);
  EXPECT_EQ(TopPCount(sorted, 1.0f), 4u);
  // Four equal tokens and p = 0.5: exactly two stay, the two lowest ids by canonical order.
  std::vector<Candidate> equal = {{3, 0.0f}, {1, 0.0f}, {2, 0.0f}, {0, 0.0f}};
  std::sort(equal.begin(), equal.end(), CandidateBefore);
  ASSERT_EQ(TopPCount(equal, 0.5f), 2u);
  EXPECT_EQ(equal[0].id, 0);
  EXPECT_EQ(equal[1].id, 1);
}

TEST(LogitsProcessorsTest, MinPKeepsTokensAboveFractionOfMax) {
  const std::vector<float> logits = RandomLogits(50, 3);
  for (float min_p : {0.0f, 0.05f, 0.3f, 0.9f, 1.0f}) {
    std::vector<Candidate> c;
    for (TokenId id = 0; id < 50; ++id) c.push_back({id, logits[id]});
    KeepMinP(c, min_p);
    // Reference: probabilities by an explicit softmax.
    double max_logit = -1e30, total = 0.0;
    for (float l : logits) max_logit = std::max<double>(max_logit, l);
    for (float l : logits) total += std::exp(l - max_logit);
    std::vector<TokenId> expected;
    for (TokenId id = 0; id < 50; ++id) {
      const double p = std::exp(logits[id] - max_logit) / total;
      if (p >= min_p * (1.0 / total)) expected.push_back(id);
    }
    std::vector<TokenId> kept;
    for (const Candidate& x : c) kept.push_back(x.id);
    EXPECT_EQ(kept, expected) << "min_p=" << min_p;
  }
}

TEST(LogitsProcessorsTest, LogSumExpMatchesDirectSum) {
  std::vector<Candidate> c;
  const std::vector<float> logits = RandomLogits(20, 4);
  double direct = 0.0;
  for (TokenId id = 0; id < 20; ++id) {
    c.push_back({id, logits[id]});
    direct += std::exp(static_cast<double>(logits[id]));
  }
  EXPECT_NEAR(LogSumExp(c), std::log(direct), 1e-12);
}

}  // namespace
}  // namespace modserve::engine
