// Prefix caching through the engine on models/demo (MoD: routed layers 1, 3, 5): a request
// served from cached prefix entries gives the tokens, logprobs and routing decisions it gives on
// an engine without the cache, for prefixes ending mid-block and mid-page of a routed layer, at
// different thresholds, and under random interleavings with chunking, preemption and
// cancellation; and every page reference goes back.
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/common/real_model.h"

namespace modserve::engine {
namespace {

const std::string kDemo = std::string(MODSERVE_SOURCE_DIR) + "/models/demo";

std::unique_ptr<Engine> MakeEngine(bool prefix_caching, int64_t kv_cache_bytes = 8 << 20) {
  EngineOptions eo;
  eo.model_dir = kDemo;
  eo.num_threads = 1;
  eo.kv_cache_bytes = kv_cache_bytes;
  eo.prefix_caching = prefix_caching;
  auto e = Engine::Create(eo);
  MODSERVE_CHECK(e.ok()) << e.status();
  return *std::move(e);
}

// Token ids the demo tokenizer names, past its special tokens.
std::vector<TokenId> RandomTokens(std::mt19937& rng, int32_t n) {
  std::vector<TokenId> t;
  for (int32_t i = 0; i < n; ++i) t.push_back(static_cast<TokenId>(3 + rng() % 2000));
  return t;
}

std::vector<TokenId> Concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Request MakeRequest(std::vector<TokenId> prompt, int32_t max_new_tokens, bool seeded,
                    std::optional<double> threshold = std::nullopt) {
  Request r;
  r.prompt = std::move(prompt);
  r.sampling.max_new_tokens = max_new_tokens;
  r.sampling.ignore_eos = true;
  r.sampling.top_logprobs = 2;
  if (seeded) {
    r.sampling.temperature = 0.9f;
    r.sampling.seed = 1234;
  } else {
    r.sampling.temperature = 0.0f;
  }
  r.threshold = threshold;
  return r;
}

GenerationResult GenerateOne(Engine& e, const Request& r) {
  auto out = e.Generate({r});
  MODSERVE_CHECK(out.ok()) << out.status();
  return (*out)[0];
}

void ExpectSameOutput(const GenerationResult& got, const GenerationResult& want) {
  EXPECT_EQ(got.token_ids, want.token_ids);
  EXPECT_EQ(got.routing, want.routing);
  EXPECT_EQ(got.text, want.text);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t i = 0; i < got.logprobs.size(); ++i) {
    EXPECT_NEAR(got.logprobs[i], want.logprobs[i], 1e-5) << "token " << i;
    ASSERT_EQ(got.top_logprobs[i].size(), want.top_logprobs[i].size());
    for (size_t k = 0; k < got.top_logprobs[i].size(); ++k) {
      EXPECT_EQ(got.top_logprobs[i][k].id, want.top_logprobs[i][k].id);
      EXPECT_NEAR(got.top_logprobs[i][k].logprob, want.top_logprobs[i][k].logprob, 1e-5);
    }
  }
  ASSERT_EQ(got.prompt_logprobs.size(), want.prompt_logprobs.size());
  for (size_t i = 0; i < got.prompt_logprobs.size(); ++i) {
    EXPECT_EQ(got.prompt_logprobs[i].logprob.has_value(),
              want.prompt_logprobs[i].logprob.has_value());
    if (got.prompt_logprobs[i].logprob && want.prompt_logprobs[i].logprob) {
      EXPECT_NEAR(*got.prompt_logprobs[i].logprob, *want.prompt_logprobs[i].logprob, 1e-5);
    }
  }
}

// Entries the first n prompt tokens leave at each routed layer.
std::vector<int32_t> RoutedEntries(const GenerationResult& r, int32_t n) {
  std::vector<int32_t> counts;
  for (const std::vector<uint8_t>& layer : r.routing) {
    int32_t c = 0;
    for (int32_t i = 0; i < n; ++i) c += layer[static_cast<size_t>(i)];
    counts.push_back(c);
  }
  return counts;
}

void ExpectNoPagesHeld(const Engine& e) {
  const KvCacheStats st = e.kv_stats();
  EXPECT_EQ(st.num_used_pages, 0);
  EXPECT_EQ(st.num_free_pages, st.num_pages);
  for (int32_t p : st.used_pages_per_layer) EXPECT_EQ(p, 0);
  // Every page still out of the pool is the cache's alone.
  EXPECT_EQ(st.num_referenced_pages, st.num_prefix_cache_pages);
}

TEST(PrefixCacheEngineTest, SharedPrefixEndingMidBlockAndMidPageGivesTheSameOutputs) {
  std::mt19937 rng(1);
  const int32_t bs = 16;
  // 45 shared tokens: two whole blocks are reusable, the third ends mid-block.
  const std::vector<TokenId> prefix = RandomTokens(rng, 45);
  const std::vector<TokenId> first = Concat(prefix, RandomTokens(rng, 7));
  const std::vector<TokenId> second = Concat(prefix, RandomTokens(rng, 11));
  for (bool seeded : {false, true}) {
    SCOPED_TRACE(seeded ? "seeded" : "greedy");
    auto cached = MakeEngine(true);
    auto plain = MakeEngine(false);
    (void)GenerateOne(*cached, MakeRequest(first, 6, seeded));
    const PrefixCacheStats before = cached->prefix_cache_stats();
    EXPECT_EQ(before.hits, 0);
    EXPECT_GT(before.num_blocks, 0);
    const GenerationResult got = GenerateOne(*cached, MakeRequest(second, 12, seeded));
    const PrefixCacheStats after = cached->prefix_cache_stats();
    EXPECT_EQ(after.hits - before.hits, 2 * bs);
    EXPECT_EQ(after.queries - before.queries, static_cast<int64_t>(second.size()));
    const GenerationResult want = GenerateOne(*plain, MakeRequest(second, 12, seeded));
    ExpectSameOutput(got, want);
    // The reused prefix ends mid-page at some routed layer (the demo routes ~1 token in 8), so
    // the second request appended to a copy of a shared page.
    const std::vector<int32_t> entries = RoutedEntries(want, 2 * bs);
    bool mid_page = false;
    for (int32_t c : entries) mid_page |= c % bs != 0;
    EXPECT_TRUE(mid_page) << "the routed layers hold whole pages after 32 tokens";
    ExpectNoPagesHeld(*cached);
  }
}

TEST(PrefixCacheEngineTest, RepeatedPromptReusesEveryWholeBlockButTheLastToken) {
  std::mt19937 rng(2);
  const std::vector<TokenId> prompt = RandomTokens(rng, 64);
  auto cached = MakeEngine(true);
  auto plain = MakeEngine(false);
  const GenerationResult cold = GenerateOne(*cached, MakeRequest(prompt, 8, false));
  const GenerationResult warm = GenerateOne(*cached, MakeRequest(prompt, 8, false));
  // 63 tokens are looked up (the last one is always fed): three whole blocks.
  EXPECT_EQ(cached->prefix_cache_stats().hits, 48);
  const GenerationResult want = GenerateOne(*plain, MakeRequest(prompt, 8, false));
  ExpectSameOutput(cold, want);
  ExpectSameOutput(warm, want);
}

TEST(PrefixCacheEngineTest, EachThresholdHasItsOwnEntries) {
  std::mt19937 rng(3);
  const std::vector<TokenId> prompt = RandomTokens(rng, 40);
  auto cached = MakeEngine(true);
  auto plain = MakeEngine(false);
  (void)GenerateOne(*cached, MakeRequest(prompt, 4, false, 0.05));
  const GenerationResult other = GenerateOne(*cached, MakeRequest(prompt, 4, false, 0.95));
  EXPECT_EQ(cached->prefix_cache_stats().hits, 0);
  const GenerationResult again = GenerateOne(*cached, MakeRequest(prompt, 4, false, 0.05));
  EXPECT_EQ(cached->prefix_cache_stats().hits, 32);
  ExpectSameOutput(other, GenerateOne(*plain, MakeRequest(prompt, 4, false, 0.95)));
  ExpectSameOutput(again, GenerateOne(*plain, MakeRequest(prompt, 4, false, 0.05)));
  // The two thresholds route differently, so sharing entries would have been wrong.
  EXPECT_NE(other.routing, again.routing);
}

TEST(PrefixCacheEngineTest, PromptLogprobsAreComputedNotReused) {
  std::mt19937 rng(4);
  const std::vector<TokenId> prompt = RandomTokens(rng, 50);
  auto cached = MakeEngine(true);
  auto plain = MakeEngine(false);
  (void)GenerateOne(*cached, MakeRequest(prompt, 3, false));
  Request r = MakeRequest(prompt, 3, false);
  r.prompt_logprobs = 1;
  const GenerationResult got = GenerateOne(*cached, r);
  EXPECT_EQ(cached->prefix_cache_stats().hits, 0);
  ASSERT_EQ(got.prompt_logprobs.size(), prompt.size());
  ExpectSameOutput(got, GenerateOne(*plain, r));
}

TEST(PrefixCacheEngineTest, BatchOfRequestsSharingASystemPromptMatchesEachAlone) {
  std::mt19937 rng(5);
  const std::vector<TokenId> system = RandomTokens(rng, 70);
  std::vector<Request> requests;
  for (int i = 0; i < 6; ++i) {
    requests.push_back(MakeRequest(Concat(system, RandomTokens(rng, 3 + i)), 5 + i, i % 2 == 1));
  }
  auto cached = MakeEngine(true);
  auto plain = MakeEngine(false);
  (void)GenerateOne(*cached, requests[0]);  // warms the cache
  auto out = cached->Generate(requests);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_GE(cached->prefix_cache_stats().hits, 6 * 64);
  for (size_t i = 0; i < requests.size(); ++i) {
    SCOPED_TRACE(i);
    ExpectSameOutput((*out)[i], GenerateOne(*plain, requests[i]));
  }
  ExpectNoPagesHeld(*cached);
}

// A model whose large matrices are all quantized gets the same bits from the cache on the CPU
// backend (docs/DESIGN.md 4.1), with a bf16 KV cache too: the request served from the cache
// computes its last prompt rows (5 here) in a smaller step than the one that filled it (37), and
// on a CPU with AMX the prompt rows' attention runs on the tiles in both.
TEST(PrefixCacheEngineTest, QuantizedModelGetsTheSameBitsFromTheCache) {
  MODSERVE_REQUIRE_SMOLLM2(gguf);
  EngineOptions eo;
  eo.model_dir = gguf;
  eo.num_threads = 2;
  eo.kv_cache_bytes = 32 << 20;
  eo.prefix_caching = true;
  eo.kv_dtype = DType::kBF16;
  auto created = Engine::Create(eo);
  ASSERT_TRUE(created.ok()) << created.status();
  Engine& e = **created;
  std::vector<TokenId> prompt =
      e.tokenizer()
          ->Encode(
              "The history of the printing press begins in the fifteenth century, when "
              "movable type changed how books were made and who could read them. Its",
              true)
          .value();
  prompt.resize(37);
  const Request r = MakeRequest(prompt, 16, false);
  const GenerationResult first = GenerateOne(e, r);
  const GenerationResult again = GenerateOne(e, r);
  EXPECT_EQ(e.prefix_cache_stats().hits, 32);
  EXPECT_EQ(again.token_ids, first.token_ids);
  EXPECT_EQ(again.logprobs, first.logprobs);  // bit for bit
  ASSERT_EQ(again.top_logprobs.size(), first.top_logprobs.size());
  for (size_t i = 0; i < first.top_logprobs.size(); ++i) {
    for (size_t k = 0; k < first.top_logprobs[i].size(); ++k) {
      EXPECT_EQ(again.top_logprobs[i][k].logprob, first.top_logprobs[i][k].logprob) << i;
    }
  }
}

// Random requests over a few shared prefixes, driven step by step: random chunk sizes, random
// batches, cancellations, preemptions (on purpose and when the small cache runs out), two
// thresholds, greedy and seeded. Every request that finishes matches the same request run alone
// on an engine without the cache; at the end only the cache holds pages.
TEST(PrefixCacheEngineTest, RandomInterleavingsWithPreemptionAndCancellationMatchTheReference) {
  std::mt19937 rng(6);
  // 64 pages of 16 F32 entries: one sequence needs up to 30, so a few fill the cache, the
  // prefix cache evicts and steps run out of pages.
  auto cached = MakeEngine(true, 64 * 8192);
  auto plain = MakeEngine(false);
  const std::vector<std::vector<TokenId>> prefixes = {RandomTokens(rng, 20), RandomTokens(rng, 37),
                                                      RandomTokens(rng, 50)};
  struct Live {
    Request request;
    bool done = false;
  };
  std::map<SequenceId, Live> live;
  int32_t num_checked = 0, num_cancelled = 0, num_preempted = 0;
  for (int round = 0; round < 300; ++round) {
    const int action = static_cast<int>(rng() % 10);
    if ((action < 2 && live.size() < 4) || live.empty()) {
      Request r = MakeRequest(Concat(prefixes[rng() % prefixes.size()],
                                     RandomTokens(rng, static_cast<int32_t>(rng() % 20))),
                              1 + static_cast<int32_t>(rng() % 10), rng() % 2 == 0,
                              rng() % 3 == 0 ? std::optional<double>(0.3) : std::nullopt);
      auto id = cached->Add(r);
      ASSERT_TRUE(id.ok()) << id.status();
      live.emplace(*id, Live{r});
      continue;
    }
    auto pick = live.begin();
    std::advance(pick, rng() % live.size());
    if (action == 2) {  // cancel
      ASSERT_TRUE(cached->Release(pick->first).ok());
      live.erase(pick);
      ++num_cancelled;
      continue;
    }
    if (action == 3 && cached->HeldPages(pick->first) > 0) {
      ASSERT_TRUE(cached->Preempt(pick->first).ok());
      ++num_preempted;
      continue;
    }
    // One step over a random subset with random chunk sizes.
    std::vector<StepEntry> entries;
    for (const auto& [id, l] : live) {
      if (rng() % 3 != 0 && cached->PendingTokens(id) > 0) {
        entries.push_back({id, 1 + static_cast<int32_t>(rng() % 24)});
      }
    }
    if (entries.empty()) continue;
    auto step = cached->Step(entries);
    if (!step.ok()) {
      ASSERT_EQ(step.status().code(), absl::StatusCode::kResourceExhausted) << step.status();
      // Out of pages: preempt the sequence holding the most.
      SequenceId victim = 0;
      for (const auto& [id, l] : live) {
        if (victim == 0 || cached->HeldPages(id) > cached->HeldPages(victim)) victim = id;
      }
      ASSERT_TRUE(cached->Preempt(victim).ok());
      ++num_preempted;
      continue;
    }
    for (const SequenceStepResult& s : step->sequences) {
      ASSERT_TRUE(s.status.ok()) << s.status;
      if (!cached->Finished(s.seq_id)) continue;
      auto got = cached->Result(s.seq_id);
      ASSERT_TRUE(got.ok());
      SCOPED_TRACE(::testing::Message() << "round " << round << " sequence " << s.seq_id);
      ExpectSameOutput(*got, GenerateOne(*plain, live.at(s.seq_id).request));
      ++num_checked;
      ASSERT_TRUE(cached->Release(s.seq_id).ok());
      live.erase(s.seq_id);
    }
  }
  for (const auto& [id, l] : live) ASSERT_TRUE(cached->Release(id).ok());
  EXPECT_GE(num_checked, 10);
  EXPECT_GT(num_cancelled, 0);
  EXPECT_GT(num_preempted, 0);
  EXPECT_GT(cached->prefix_cache_stats().hits, 0);
  ExpectNoPagesHeld(*cached);
}

}  // namespace
}  // namespace modserve::engine
