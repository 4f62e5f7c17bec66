// Checks the Sampler: validation, the Philox generator against Random123's known answers,
// greedy and tie rules, empirical distributions against a plain reference (chi-square),
// penalties end to end, determinism and independence from the batch.
#include "engine/sampler/sampler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace modserve::engine {
namespace {

// ---- Reference distribution: the documented order, written as plainly as possible. ----
// Returns p[id] over the whole vocabulary (0 for truncated tokens).
std::vector<double> ReferenceProbs(const std::vector<float>& logits, const SamplingParams& p) {
  const int n = static_cast<int>(logits.size());
  std::vector<double> scaled(n);
  for (int i = 0; i < n; ++i) scaled[i] = static_cast<double>(logits[i] / p.temperature);
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return scaled[a] > scaled[b]; });
  int keep = n;
  if (p.top_k > 0) keep = std::min(keep, p.top_k);
  auto softmax_of_prefix = [&](int count) {
    std::vector<double> probs(count);
    double total = 0.0;
    for (int i = 0; i < count; ++i) total += probs[i] = std::exp(scaled[order[i]]);
    for (double& x : probs) x /= total;
    return probs;
  };
  if (p.top_p < 1.0f) {
    const std::vector<double> probs = softmax_of_prefix(keep);
    double mass = 0.0;
    int count = 0;
    while (count < keep && mass < p.top_p - 1e-12) mass += probs[count++];
    keep = count;
  }
  if (p.min_p > 0.0f) {
    const std::vector<double> probs = softmax_of_prefix(keep);
    int count = 0;
    while (count < keep && probs[count] >= p.min_p * probs[0]) ++count;
    keep = count;
  }
  const std::vector<double> probs = softmax_of_prefix(keep);
  std::vector<double> out(n, 0.0);
  for (int i = 0; i < keep; ++i) out[order[i]] = probs[i];
  return out;
}

// Upper quantile of chi-square(df) at z standard deviations (Wilson-Hilferty). z = 4.75 is a
// one-sided tail of about 1e-6, so a correct sampler fails this for practically no seed.
double ChiSquareBound(int df, double z = 4.75) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

std::vector<float> RandomLogits(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(n);
  for (float& l : logits) l = normal(rng);
  return logits;
}

TEST(SamplerTest, ValidateAcceptsDefaultsAndRejectsEachField) {
  EXPECT_TRUE(Validate(SamplingParams{}).ok());
  struct Case {
    std::string field;
    std::function<void(SamplingParams&)> mutate;
  };
  const std::vector<Case> cases = {
      {"temperature", [](SamplingParams& p) { p.temperature = -0.1f; }},
      {"temperature", [](SamplingParams& p) { p.temperature = INFINITY; }},
      {"temperature", [](SamplingParams& p) { p.temperature = NAN; }},
      {"top_k", [](SamplingParams& p) { p.top_k = -1; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 0.0f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = 1.01f; }},
      {"top_p", [](SamplingParams& p) { p.top_p = NAN; }},
      {"min_p", [](SamplingParams& p) { p.min_p = 1.01f; }},
      {"min_p", [](SamplingParams& p) { p.min_p = -0.01f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = 0.0f; }},
      {"repetition_penalty", [](SamplingParams& p) { p.repetition_penalty = INFINITY; }},
      {"presence_penalty", [](SamplingParams& p) { p.presence_penalty = NAN; }},
      {"frequency_penalty", [](SamplingParams& p) { p.frequency_penalty = -INFINITY; }},
      {"top_logprobs", [](SamplingParams& p) { p.top_logprobs = 21; }},
      {"top_logprobs", [](SamplingParams& p) { p.top_logprobs = -1; }},
      {"max_new_tokens", [](SamplingParams& p) { p.max_new_tokens = 0; }},
      {"stop_token_ids[1]",
       [](SamplingParams& p) {
         p.stop_token_ids = {3, -2};
       }},
      {"stop_strings[0]", [](SamplingParams& p) { p.stop_strings = {""}; }},
  };
  for (const Case& c : cases) {
    SamplingParams params;
    c.mutate(params);
    const absl::Status status = Validate(params);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(status.message().find(c.field), std::string::npos) << status;
  }
  SamplingParams edge;
  edge.temperature = 0.0f;
  edge.top_p = 1.0f;
  edge.min_p = 0.0f;
  edge.top_logprobs = 20;
  edge.max_new_tokens = 1;
  EXPECT_TRUE(Validate(edge).ok());
  edge.min_p = 1.0f;  // only the most probable token(s): legal, as the API documents
  EXPECT_TRUE(Validate(edge).ok());
}

// Random123 tests/kat_vectors, the three "philox4x32 10" lines (counter, key -> output).
TEST(SamplerTest, PhiloxMatchesRandom123KnownAnswers) {
  EXPECT_EQ(Philox4x32({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(Philox4x32({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
            (std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(Philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(SamplerTest, UniformDrawIsUniformAndKeyedBySeedAndStep) {
  constexpr int kDraws = 100000;
  constexpr int kBins = 16;
  std::vector<int> bins(kBins, 0);
  for (int i = 0; i < kDraws; ++i) {
    const double u = UniformDraw(77, static_cast<uint64_t>(i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ++bins[static_cast<int>(u * kBins)];
  }
  double chi2 = 0.0;
  const double expected = static_cast<double>(kDraws) / kBins;
  for (int b : bins) chi2 += (b - expected) * (b - expected) / expected;
  EXPECT_LT(chi2, ChiSquareBound(kBins - 1));
  EXPECT_EQ(UniformDraw(5, 9), UniformDraw(5, 9));
  EXPECT_NE(UniformDraw(5, 9), UniformDraw(5, 10));
  EXPECT_NE(UniformDraw(5, 9), UniformDraw(6, 9));
  EXPECT_NE(UniformDraw(5, 9), UniformDraw(5, 9 + (uint64_t{1} << 32)));  // high counter word
}

TEST(SamplerTest, GreedyPicksArgmaxWithLowestIdOnTies) {
  Sampler sampler(1);
  SamplingParams params;
  params.temperature = 0.0f;
  params.top_logprobs = 3;
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 2.0f};
  SamplingState state = sampler.NewState(params, {});
  auto result = sampler.Sample(logits, params, &state);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->token, 1);
  const double lse = std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0));
  EXPECT_NEAR(result->logprob, 3.0 - lse, 1e-6);
  ASSERT_EQ(result->top_logprobs.size(), 3u);
  EXPECT_EQ(result->top_logprobs[0].id, 1);
  EXPECT_EQ(result->top_logprobs[1].id, 2);
  EXPECT_EQ(result->top_logprobs[2].id, 3);
  EXPECT_NEAR(result->top_logprobs[2].logprob, 2.0 - lse, 1e-6);
  EXPECT_EQ(state.num_generated(), 1);
}

TEST(SamplerTest, TopKOneEqualsGreedy) {
  Sampler sampler(2);
  for (uint32_t trial = 0; trial < 200; ++trial) {
    std::vector<float> logits = RandomLogits(64, trial);
    if (trial % 4 == 0) logits[40] = logits[7] = 50.0f;  // a tie for the maximum
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    SamplingParams top1;
    top1.temperature = 1.5f;
    top1.top_k = 1;
    top1.seed = trial;
    SamplingState a = sampler.NewState(greedy, {});
    SamplingState b = sampler.NewState(top1, {});
    const TokenId g = sampler.Sample(logits, greedy, &a)->token;
    auto t = sampler.Sample(logits, top1, &b);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->token, g) << trial;
    EXPECT_EQ(t->logprob, 0.0f);  // the only survivor has probability 1
  }
}

struct DistributionCase {
  std::string name;
  SamplingParams params;
};

TEST(SamplerTest, EmpiricalFrequenciesMatchReferenceDistribution) {
  const std::vector<float> logits = {2.0f, 1.5f, 1.0f, 0.5f, 0.5f, 0.0f, -0.5f, -1.0f, -3.0f};
  auto make = [](float t, int32_t k, float p, float min_p) {
    SamplingParams params;
    params.temperature = t;
    params.top_k = k;
    params.top_p = p;
    params.min_p = min_p;
    params.seed = 12345;
    params.top_logprobs = 20;
    return params;
  };
  const std::vector<DistributionCase> cases = {
      {"plain", make(1.0f, 0, 1.0f, 0.0f)}, {"cold", make(0.5f, 0, 1.0f, 0.0f)},
      {"hot", make(2.0f, 0, 1.0f, 0.0f)},   {"top_k", make(1.0f, 4, 1.0f, 0.0f)},
      {"top_p", make(1.0f, 0, 0.8f, 0.0f)}, {"min_p", make(1.0f, 0, 1.0f, 0.2f)},
      {"all", make(1.3f, 6, 0.9f, 0.15f)},
  };
  constexpr int kSamples = 20000;
  for (const DistributionCase& c : cases) {
    const std::vector<double> ref = ReferenceProbs(logits, c.params);
    Sampler sampler(99);
    SamplingState state = sampler.NewState(c.params, {});
    std::vector<int> counts(logits.size(), 0);
    for (int i = 0; i < kSamples; ++i) {
      auto result = sampler.Sample(logits, c.params, &state);
      ASSERT_TRUE(result.ok()) << result.status();
      ++counts[result->token];
      // The reported logprobs are those of the reference (final) distribution.
      ASSERT_NEAR(result->logprob, std::log(ref[result->token]), 1e-5) << c.name;
      if (i == 0) {
        size_t support = 0;
        for (double p : ref) support += p > 0.0;
        ASSERT_EQ(result->top_logprobs.size(), support) << c.name;
        for (size_t j = 0; j < result->top_logprobs.size(); ++j) {
          const TokenLogprob& alt = result->top_logprobs[j];
          EXPECT_NEAR(alt.logprob, std::log(ref[alt.id]), 1e-5) << c.name;
          if (j > 0) {
            EXPECT_GE(result->top_logprobs[j - 1].logprob, alt.logprob);
          }
        }
      }
    }
    double chi2 = 0.0;
    int df = -1;
    for (size_t id = 0; id < logits.size(); ++id) {
      if (ref[id] == 0.0) {
        EXPECT_EQ(counts[id], 0) << c.name << ": truncated token " << id << " was sampled";
        continue;
      }
      const double expected = ref[id] * kSamples;
      chi2 += (counts[id] - expected) * (counts[id] - expected) / expected;
      ++df;
    }
    ASSERT_GT(df, 0) << c.name;
    EXPECT_LT(chi2, ChiSquareBound(df)) << c.name << " df=" << df << " chi2=" << chi2;
  }
}

// Large vocabularies take the partial-sort path for top-p; the nucleus (and so every reported
// logprob) must be the one the full reference sort gives, whether it is smaller or larger than
// the first prefix the sampler tries.
TEST(SamplerTest, TopPOnLargeVocabularyMatchesFullSortReference) {
  constexpr int kVocab = 20000;
  // flat: nucleus of thousands; peaked: tens; flat under one outlier that holds ~70% of the mass
  // (the gaps stepping down from it pass the cut by far: the prefix is bisected); masked ids.
  for (const float scale : {0.2f, 3.0f, -0.2f}) {
    std::vector<float> logits = RandomLogits(kVocab, 17);
    for (float& l : logits) l *= std::fabs(scale);
    if (scale < 0.0f) {
      logits[4321] = 11.0f;
      for (int i = 0; i < kVocab; i += 13) logits[i] = -INFINITY;
    }
    SamplingParams params;
    params.top_p = 0.9f;
    params.seed = 5;
    params.top_logprobs = 20;
    const std::vector<double> ref = ReferenceProbs(logits, params);
    size_t support = 0;
    for (double p : ref) support += p > 0.0;
    if (scale > 0.0f && scale < 1.0f) {
      ASSERT_GT(support, 4096u);
    } else if (scale > 0.0f) {
      ASSERT_LT(support, 1024u);
    } else {
      ASSERT_GT(support, 1000u);  // the outlier and a few thousand of the flat rest
    }
    Sampler sampler(0);
    SamplingState state = sampler.NewState(params, {});
    for (int i = 0; i < 300; ++i) {
      auto result = sampler.Sample(logits, params, &state);
      ASSERT_TRUE(result.ok());
      ASSERT_GT(ref[result->token], 0.0) << "scale " << scale << " token " << result->token;
      ASSERT_NEAR(result->logprob, std::log(ref[result->token]), 1e-4) << "scale " << scale;
      for (const TokenLogprob& alt : result->top_logprobs) {
        ASSERT_NEAR(alt.logprob, std::log(ref[alt.id]), 1e-4);
      }
    }
  }
}

// Top-k selects among the entries at or above a threshold found by counting passes; the k kept
// must be those of a full sort whatever the row looks like: an outlier maximum far above the
// rest, ties across the k-th place, masked ids, few finite entries.
TEST(SamplerTest, TopKOnLargeVocabularyMatchesFullSortReference) {
  constexpr int kVocab = 49152;
  for (int shape = 0; shape < 4; ++shape) {
    std::vector<float> logits = RandomLogits(kVocab, 40 + shape);
    for (float& l : logits) l *= 3.0f;
    if (shape == 1) logits[777] = 60.0f;  // one outlier: gaps of 1, 4, 16 from it find nothing
    if (shape == 2) {
      for (int i = 0; i < kVocab; i += 97) logits[i] = 30.0f;  // 507 ties at the top
    }
    if (shape == 3) {
      for (int i = 0; i < kVocab; ++i) {
        if (i % 1000 != 0) logits[i] = -INFINITY;  // 50 finite entries: top_k 40 of them
      }
    }
    for (int32_t k : {1, 40, 50, 300}) {
      SamplingParams params;
      params.top_k = k;
      params.seed = 9;
      params.top_logprobs = 400;
      const std::vector<double> ref = ReferenceProbs(logits, params);
      Sampler sampler(0);
      SamplingState state = sampler.NewState(params, {});
      auto result = sampler.Sample(logits, params, &state);
      ASSERT_TRUE(result.ok()) << result.status();
      size_t support = 0;
      for (double p : ref) support += p > 0.0;
      ASSERT_EQ(result->top_logprobs.size(), support) << "shape " << shape << " k " << k;
      for (const TokenLogprob& alt : result->top_logprobs) {
        ASSERT_GT(ref[alt.id], 0.0) << "shape " << shape << " k " << k << " id " << alt.id;
        ASSERT_NEAR(alt.logprob, std::log(ref[alt.id]), 1e-4);
      }
    }
  }
}

TEST(SamplerTest, TopPTieAtBoundaryKeepsLowerIds) {
  // Four equally likely tokens, top_p = 0.5: exactly ids 0 and 1 survive, each with p = 0.5.
  const std::vector<float> logits = {0.0f, 0.0f, 0.0f, 0.0f};
  SamplingParams params;
  params.top_p = 0.5f;
  params.seed = 3;
  Sampler sampler(0);
  SamplingState state = sampler.NewState(params, {});
  int ones = 0;
  for (int i = 0; i < 2000; ++i) {
    auto result = sampler.Sample(logits, params, &state);
    ASSERT_TRUE(result.ok());
    ASSERT_LE(result->token, 1);
    EXPECT_NEAR(result->logprob, std::log(0.5), 1e-6);
    ones += result->token;
  }
  EXPECT_NEAR(ones / 2000.0, 0.5, 5 * std::sqrt(0.25 / 2000));
}

TEST(SamplerTest, PenaltiesChangeTheDistributionAsTheFormulasSay) {
  const std::vector<float> logits = {2.0f, 1.5f, -0.5f, 0.25f, 1.0f};
  const std::vector<TokenId> prompt = {0, 2, 2};
  SamplingParams params;
  params.temperature = 0.8f;
  params.repetition_penalty = 1.3f;
  params.presence_penalty = 0.4f;
  params.frequency_penalty = 0.25f;
  params.top_logprobs = 5;
  params.seed = 8;
  Sampler sampler(0);
  SamplingState state = sampler.NewState(params, prompt);
  // Force some output history: token 4 twice, token 3 once.
  state.Accept(4);
  state.Accept(4);
  state.Accept(3);
  std::vector<float> expected = logits;
  const std::map<TokenId, int> output_counts = {{3, 1}, {4, 2}};
  for (TokenId id : {0, 2, 3, 4}) {  // prompt + output, each once
    expected[id] = expected[id] > 0 ? expected[id] / 1.3f : expected[id] * 1.3f;
  }
  for (const auto& [id, count] : output_counts) expected[id] -= 0.25f * count + 0.4f;
  double lse = 0.0;
  for (float& l : expected) lse += std::exp(static_cast<double>(l / 0.8f));
  lse = std::log(lse);
  auto result = sampler.Sample(logits, params, &state);
  ASSERT_TRUE(result.ok());
  ASSERT_EQ(result->top_logprobs.size(), 5u);
  for (const TokenLogprob& alt : result->top_logprobs) {
    EXPECT_NEAR(alt.logprob, expected[alt.id] / 0.8f - lse, 1e-5) << alt.id;
  }
  EXPECT_EQ(state.num_generated(), 4);
}

TEST(SamplerTest, GreedyWithRepetitionPenaltyReportsLogSoftmaxOfPenalisedLogits) {
  const std::vector<float> logits = {2.0f, 1.5f, -1.0f};
  SamplingParams params;
  params.temperature = 0.0f;
  params.repetition_penalty = 2.0f;
  Sampler sampler(0);
  SamplingState state = sampler.NewState(params, std::vector<TokenId>{0});
  auto result = sampler.Sample(logits, params, &state);
  ASSERT_TRUE(result.ok());
  // Token 0 drops from 2.0 to 1.0, below token 1's 1.5.
  EXPECT_EQ(result->token, 1);
  const double lse = std::log(std::exp(1.0) + std::exp(1.5) + std::exp(-1.0));
  EXPECT_NEAR(result->logprob, 1.5 - lse, 1e-6);
  // Now 1 was generated: with the same logits it is penalised too (1.5 / 2 = 0.75 < 1.0).
  EXPECT_EQ(sampler.Sample(logits, params, &state)->token, 0);
}

// A deterministic "model": logits that depend on the request and its step only.
std::vector<float> FakeLogits(int request, int64_t step) {
  return RandomLogits(257, static_cast<uint32_t>(request * 100003 + step));
}

std::vector<TokenId> RunAlone(int request, const SamplingParams& params, uint64_t engine_seed,
                              int steps) {
  Sampler sampler(engine_seed);
  SamplingState state = sampler.NewState(params, std::vector<TokenId>{1, 2, 3});
  std::vector<TokenId> out;
  for (int s = 0; s < steps; ++s)
    out.push_back(sampler.Sample(FakeLogits(request, s), params, &state)->token);
  return out;
}

SamplingParams SeededParams(uint64_t seed) {
  SamplingParams params;
  params.temperature = 1.1f;
  params.top_p = 0.95f;
  params.top_k = 100;
  params.repetition_penalty = 1.1f;
  params.frequency_penalty = 0.2f;
  params.seed = seed;
  return params;
}

TEST(SamplerTest, SameSeedGivesSameTokens) {
  const SamplingParams params = SeededParams(2024);
  const std::vector<TokenId> first = RunAlone(0, params, /*engine_seed=*/1, 64);
  EXPECT_EQ(RunAlone(0, params, /*engine_seed=*/999, 64), first);
  const std::vector<TokenId> other = RunAlone(0, SeededParams(2025), 1, 64);
  EXPECT_NE(other, first);
}

TEST(SamplerTest, OutputDoesNotDependOnInterleavingWithOtherRequests) {
  constexpr int kSteps = 40;
  const std::vector<SamplingParams> params = {SeededParams(11), SeededParams(22), SeededParams(33)};
  std::vector<std::vector<TokenId>> alone;
  for (int r = 0; r < 3; ++r) alone.push_back(RunAlone(r, params[r], 5, kSteps));
  std::mt19937 rng(7);
  for (int trial = 0; trial < 5; ++trial) {
    Sampler sampler(static_cast<uint64_t>(trial));
    std::vector<SamplingState> states;
    for (int r = 0; r < 3; ++r) states.push_back(sampler.NewState(params[r], {1, 2, 3}));
    // A random schedule: each slot is one request's next step, in a shuffled order.
    std::vector<int> schedule;
    for (int r = 0; r < 3; ++r) schedule.insert(schedule.end(), kSteps, r);
    std::shuffle(schedule.begin(), schedule.end(), rng);
    std::vector<std::vector<TokenId>> got(3);
    for (int r : schedule) {
      const int64_t step = states[r].num_generated();
      got[r].push_back(sampler.Sample(FakeLogits(r, step), params[r], &states[r])->token);
    }
    for (int r = 0; r < 3; ++r) EXPECT_EQ(got[r], alone[r]) << "trial " << trial << " req " << r;
  }
}

TEST(SamplerTest, UnseededRequestsDrawSeedsFromEngineGenerator) {
  SamplingParams unseeded;
  Sampler a(42), b(42), c(43);
  const uint64_t a1 = a.RequestSeed(unseeded), a2 = a.RequestSeed(unseeded);
  EXPECT_NE(a1, a2);
  EXPECT_EQ(b.RequestSeed(unseeded), a1);
  EXPECT_EQ(b.RequestSeed(unseeded), a2);
  EXPECT_NE(c.RequestSeed(unseeded), a1);
  SamplingParams seeded;
  seeded.seed = 77;
  EXPECT_EQ(a.RequestSeed(seeded), 77u);
  EXPECT_EQ(a.NewState(seeded, {}).seed(), 77u);
}

TEST(SamplerTest, BadLogitsAndTokenIdsAreErrors) {
  Sampler sampler(0);
  SamplingParams params;
  SamplingState state = sampler.NewState(params, {});
  EXPECT_EQ(sampler.Sample(std::vector<float>{0.0f, NAN}, params, &state).status().code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(sampler.Sample(std::vector<float>{INFINITY, 0.0f}, params, &state).status().code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(
      sampler.Sample(std::vector<float>{-INFINITY, -INFINITY}, params, &state).status().code(),
      absl::StatusCode::kInternal);
  EXPECT_EQ(sampler.Sample(std::vector<float>{}, params, &state).status().code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(state.num_generated(), 0);  // failures record nothing
  SamplingState bad = sampler.NewState(params, std::vector<TokenId>{5});
  const absl::Status status = sampler.Sample(std::vector<float>{0.0f, 1.0f}, params, &bad).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("token id 5"), std::string::npos) << status;
}

// With nothing truncated the draw walks the whole row; its token is the inverse CDF of the
// softmax at UniformDraw(seed, step), computed here in double with std::exp (draws within 1e-9
// of a boundary of that CDF are skipped: f32 exps may put them on either side).
TEST(SamplerTest, UntruncatedDrawIsTheInverseCdfOfTheSoftmax) {
  std::mt19937 rng(8);
  std::normal_distribution<float> dist(0.0f, 2.5f);
  std::vector<float> logits(50001);
  for (float& x : logits) x = dist(rng);
  for (size_t i = 5; i < logits.size(); i += 11) logits[i] = -INFINITY;
  for (float temperature : {0.7f, 1.0f}) {
    SamplingParams params;
    params.temperature = temperature;
    params.seed = 4242;
    params.top_logprobs = 3;
    std::vector<double> cdf(logits.size());
    double mx = -INFINITY, total = 0.0;
    for (float x : logits) mx = std::max<double>(mx, x / temperature);
    for (size_t i = 0; i < logits.size(); ++i) {
      cdf[i] = total += std::exp(static_cast<double>(logits[i] / temperature) - mx);
    }
    Sampler sampler(0);
    SamplingState state = sampler.NewState(params, {});
    int compared = 0;
    for (int step = 0; step < 300; ++step) {
      const double u = UniformDraw(4242, static_cast<uint64_t>(step)) * total;
      const size_t want = std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin();
      auto result = sampler.Sample(logits, params, &state);
      ASSERT_TRUE(result.ok()) << result.status();
      ASSERT_EQ(result->top_logprobs.size(), 3u);
      const double lo = want == 0 ? 0.0 : cdf[want - 1];
      if (u - lo < 1e-9 * total || cdf[want] - u < 1e-9 * total) continue;
      ++compared;
      EXPECT_EQ(result->token, static_cast<TokenId>(want)) << "step " << step;
      EXPECT_NEAR(result->logprob, logits[want] / temperature - mx - std::log(total), 1e-5);
    }
    EXPECT_GT(compared, 290);
  }
}

TEST(SamplerTest, MaskedTokensAreNeverSampledAndTopLogprobsStopAtSupport) {
  const std::vector<float> logits = {-INFINITY, 0.3f, -INFINITY, 0.1f, -INFINITY};
  SamplingParams params;
  params.seed = 1;
  params.top_logprobs = 5;
  Sampler sampler(0);
  SamplingState state = sampler.NewState(params, {});
  for (int i = 0; i < 500; ++i) {
    auto result = sampler.Sample(logits, params, &state);
    ASSERT_TRUE(result.ok());
    ASSERT_TRUE(result->token == 1 || result->token == 3);
    ASSERT_EQ(result->top_logprobs.size(), 2u);
    EXPECT_EQ(result->top_logprobs[0].id, 1);
  }
}

}  // namespace
}  // namespace modserve::engine
