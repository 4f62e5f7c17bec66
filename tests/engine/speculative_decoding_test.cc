// Self-speculative decoding through the engine: drafts by the same model at a higher routing
// threshold, verified in one pass. Greedy requests give the tokens, logprobs, routing decisions
// and KV pages of decoding without speculation (on models/demo, every test checkpoint and, when
// present, the real MoD model), alone, batched with other requests, after a preemption and with
// prefix caching; sampled ones follow the same distribution (chi-square, fixed seeds).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/engine.h"
#include "engine/sampler/speculative_sampling.h"
#include "gtest/gtest.h"
#include "tests/common/real_model.h"

namespace modserve::engine {
namespace {

namespace fs = std::filesystem;

const std::string kDemo = std::string(MODSERVE_SOURCE_DIR) + "/models/demo";
const std::string kSmolMod = std::string(MODSERVE_SOURCE_DIR) + "/models/smollm2-mod";

std::unique_ptr<Engine> MakeEngine(const std::string& dir, int32_t spec_tokens = 0,
                                   double spec_threshold = 1.0, bool prefix_caching = false) {
  EngineOptions eo;
  eo.model_dir = dir;
  eo.num_threads = 1;
  eo.kv_cache_bytes = 16 << 20;
  eo.speculative_tokens = spec_tokens;
  eo.speculative_threshold = spec_threshold;
  eo.prefix_caching = prefix_caching;
  auto e = Engine::Create(eo);
  MODSERVE_CHECK(e.ok()) << e.status();
  return *std::move(e);
}

Request Greedy(std::vector<TokenId> prompt, int32_t max_new_tokens) {
  Request r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.0f;
  r.sampling.max_new_tokens = max_new_tokens;
  r.sampling.ignore_eos = true;
  r.sampling.top_logprobs = 3;
  return r;
}

std::vector<TokenId> Prompt(int32_t n, int32_t salt, int64_t vocab) {
  std::vector<TokenId> p = {1};
  for (int32_t i = 1; i < n; ++i) {
    p.push_back(static_cast<TokenId>(3 + (i * 37 + salt * 101) % (std::min<int64_t>(vocab, 2000) - 3)));
  }
  return p;
}

// Everything a client sees of a greedy request, and the KV it holds at the end.
void ExpectSameOutput(const GenerationResult& got, const GenerationResult& want,
                      const std::string& what) {
  EXPECT_EQ(got.token_ids, want.token_ids) << what;
  EXPECT_EQ(got.routing, want.routing) << what;
  // Bit-identical: the verification pass computes each row as a one-row decode step does.
  EXPECT_EQ(got.logprobs, want.logprobs) << what;
  ASSERT_EQ(got.top_logprobs.size(), want.top_logprobs.size()) << what;
  for (size_t i = 0; i < got.top_logprobs.size(); ++i) {
    ASSERT_EQ(got.top_logprobs[i].size(), want.top_logprobs[i].size()) << what;
    for (size_t j = 0; j < got.top_logprobs[i].size(); ++j) {
      EXPECT_EQ(got.top_logprobs[i][j].id, want.top_logprobs[i][j].id) << what;
      EXPECT_EQ(got.top_logprobs[i][j].logprob, want.top_logprobs[i][j].logprob) << what;
    }
  }
  EXPECT_EQ(got.finish_reason, want.finish_reason) << what;
  EXPECT_EQ(got.kv_pages, want.kv_pages) << what;
  EXPECT_EQ(got.kv_bytes, want.kv_bytes) << what;
}

// Runs one request to the end with Engine::Step (prompt in one step, then decode steps asking
// for `num_draft` drafts), preempting it once after `preempt_after` generated tokens (0: never).
// Adds the speculation counters to *drafted / *accepted.
GenerationResult RunSteps(Engine& engine, const Request& request, int32_t num_draft,
                          int32_t preempt_after = 0, int64_t* drafted = nullptr,
                          int64_t* accepted = nullptr, int32_t* preempted_at = nullptr) {
  auto id = engine.Add(request);
  MODSERVE_CHECK(id.ok()) << id.status();
  bool preempted = false;
  while (!engine.Finished(*id)) {
    const int32_t pending = engine.PendingTokens(*id);
    auto step = engine.Step({{*id, pending, num_draft}});
    MODSERVE_CHECK(step.ok()) << step.status();
    const SequenceStepResult& s = step->sequences[0];
    MODSERVE_CHECK(s.status.ok()) << s.status;
    if (drafted != nullptr) *drafted += s.num_drafted;
    if (accepted != nullptr) *accepted += s.num_accepted;
    auto so_far = engine.Result(*id);
    if (!preempted && preempt_after > 0 &&
        static_cast<int32_t>(so_far->token_ids.size()) >= preempt_after && !engine.Finished(*id)) {
      MODSERVE_CHECK(engine.Preempt(*id).ok());
      preempted = true;
      if (preempted_at != nullptr) *preempted_at = static_cast<int32_t>(so_far->token_ids.size());
    }
  }
  GenerationResult r = *engine.Result(*id);
  MODSERVE_CHECK(engine.Release(*id).ok());
  return r;
}

TEST(SpeculativeDecodingTest, DraftAtTheRequestThresholdIsAlwaysAccepted) {
  // The draft is then the target model itself: every draft must survive verification, which
  // holds only if a multi-row verification pass gives each row the bits of a one-row decode.
  auto engine = MakeEngine(kDemo, 0);
  const Request request = Greedy(Prompt(21, 1, 2048), 40);
  const GenerationResult want = RunSteps(*engine, request, 0);
  Request spec = request;
  spec.speculative_tokens = 4;
  spec.speculative_threshold = 0.5;  // models/demo's default threshold
  int64_t drafted = 0, accepted = 0;
  const GenerationResult got = RunSteps(*engine, spec, 4, 0, &drafted, &accepted);
  ExpectSameOutput(got, want, "K=4 at T=r");
  EXPECT_GT(drafted, 30);
  EXPECT_EQ(accepted, drafted);
  EXPECT_EQ(engine->kv_stats().num_free_pages, engine->kv_stats().num_pages);
}

TEST(SpeculativeDecodingTest, DraftsAreAcceptedPastTheContextWhereAttentionSplits) {
  // With several threads a one-row decode step at a long context splits its attention; the
  // verification pass of 1 + K rows must split each row exactly as that step does, or the drafts
  // at the request's own threshold stop matching it bit for bit. Contexts 300-340 cross the CPU
  // backend's split size (256 keys).
  EngineOptions eo;
  eo.model_dir = kDemo;
  eo.num_threads = 3;
  eo.kv_cache_bytes = 16 << 20;
  auto created = Engine::Create(eo);
  ASSERT_TRUE(created.ok()) << created.status();
  Engine& engine = **created;
  const Request request = Greedy(Prompt(300, 4, 2048), 40);
  const GenerationResult want = RunSteps(engine, request, 0);
  Request spec = request;
  spec.speculative_tokens = 4;
  spec.speculative_threshold = 0.5;  // models/demo's default threshold: the draft is the model
  int64_t drafted = 0, accepted = 0;
  const GenerationResult got = RunSteps(engine, spec, 4, 0, &drafted, &accepted);
  ExpectSameOutput(got, want, "K=4 at T=r, context 300-340");
  EXPECT_GT(drafted, 30);
  EXPECT_EQ(accepted, drafted);
  EXPECT_EQ(engine.kv_stats().num_free_pages, engine.kv_stats().num_pages);
}

TEST(SpeculativeDecodingTest, GreedyOutputRoutingAndPagesEqualDecodingOnEveryCheckpoint) {
  std::vector<std::string> dirs = {kDemo};
  for (const auto& entry :
       fs::directory_iterator(fs::path(MODSERVE_SOURCE_DIR) / "tests/testdata/checkpoints")) {
    dirs.push_back(entry.path().string());
  }
  std::sort(dirs.begin() + 1, dirs.end());
  for (const std::string& dir : dirs) {
    auto engine = MakeEngine(dir);
    const int64_t vocab = engine->config().vocab_size;
    const int32_t max_seq = static_cast<int32_t>(engine->config().max_seq_len);
    const int32_t prompt_len = std::min(19, max_seq / 4);
    const int32_t new_tokens = std::min(33, max_seq - prompt_len);
    const Request request = Greedy(Prompt(prompt_len, 2, vocab), new_tokens);
    const GenerationResult want = RunSteps(*engine, request, 0);
    int64_t total_drafted = 0, total_accepted = 0;
    for (int32_t k : {1, 2, 3, 5, 8}) {
      for (double t : {1.0, 0.9, 0.6}) {
        Request spec = request;
        spec.speculative_tokens = k;
        spec.speculative_threshold = t;
        const GenerationResult got =
            RunSteps(*engine, spec, k, 0, &total_drafted, &total_accepted);
        ExpectSameOutput(got, want, dir + " K=" + std::to_string(k) + " T=" + std::to_string(t));
        EXPECT_EQ(engine->kv_stats().num_free_pages, engine->kv_stats().num_pages) << dir;
      }
    }
    EXPECT_GT(total_drafted, 0) << dir;
    EXPECT_LE(total_accepted, total_drafted) << dir;
  }
}

TEST(SpeculativeDecodingTest, RealMoDModelGivesTheSameGreedyOutput) {
  if (!fs::exists(fs::path(MODSERVE_SOURCE_DIR) / "models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")) {
    GTEST_SKIP() << "models/smollm2 is absent (bash tools/fetch_models.sh)";
  }
  auto engine = MakeEngine(kSmolMod);
  const std::vector<TokenId> prompt =
      engine->tokenizer()->Encode("The capital of France is Paris. The capital of Italy is", true).value();
  const Request request = Greedy(prompt, 24);
  const GenerationResult want = RunSteps(*engine, request, 0);
  for (double t : {1.0, 0.9}) {
    Request spec = request;
    spec.speculative_tokens = 4;
    spec.speculative_threshold = t;
    int64_t drafted = 0, accepted = 0;
    ExpectSameOutput(RunSteps(*engine, spec, 4, 0, &drafted, &accepted), want,
                     "smollm2-mod T=" + std::to_string(t));
    EXPECT_GT(drafted, 0);
  }
}

TEST(SpeculativeDecodingTest, BatchedVerificationStaysWithinTheBackendsRowInvariantRange) {
  // Four decoding sequences drafting K each verify 4 (1 + K) rows in one pass. Past the backend's
  // row-invariant range a row no longer gets the bits of a one-row step (on models/smollm2-mod,
  // with kernels that sum larger steps in another order, that changed greedy tokens), so the
  // engine keeps a speculative step within the range; within it the pass itself must be exact.
  // On the CPU backend this model's range is unbounded (quantized matrices, f32 routers of one
  // row): K = 16 puts 68 rows in one pass. Either way the batch must give exactly what plain
  // batched decoding gives.
  MODSERVE_REQUIRE_SMOLLM2(gguf);
  auto engine = MakeEngine(kSmolMod);
  const int32_t bound = engine->max_row_invariant_rows();
  EXPECT_GE(bound, 1);
  const int32_t k = std::min(kMaxSpeculativeTokens, bound / 4 + 1);
  const char* const texts[] = {"The capital of France is Paris. The capital of Italy is",
                               "def fibonacci(n):\n    if n < 2:\n        return",
                               "Once upon a time, in a small village by the sea, there lived",
                               "The three primary colors are"};
  std::vector<Request> plain;
  for (const char* text : texts) {
    plain.push_back(Greedy(engine->tokenizer()->Encode(text, true).value(), 32));
  }
  auto want = engine->Generate(plain);
  ASSERT_TRUE(want.ok()) << want.status();
  for (double t : {0.9, 0.8}) {
    std::vector<Request> spec = plain;
    for (Request& r : spec) {
      r.speculative_tokens = k;
      r.speculative_threshold = t;
    }
    auto got = engine->Generate(spec);
    ASSERT_TRUE(got.ok()) << got.status();
    for (size_t i = 0; i < plain.size(); ++i) {
      ExpectSameOutput((*got)[i], (*want)[i],
                       "request " + std::to_string(i) + " T=" + std::to_string(t));
    }
  }
  EXPECT_EQ(engine->kv_stats().num_free_pages, engine->kv_stats().num_pages);
}

// At --matmul_precision medium on a CPU with AVX512_BF16 and no AMX, models/demo's BF16 matrices
// (every row count a multiple of 32) run from vdpbf16ps panels, one kernel for every row count
// (at highest too, from the same panels on the FMA units),
// so the engine's row-invariant range is no longer capped at 8 rows; a batch of eight drafting
// sequences then verifies 8 (1 + 8) rows in one pass (past every float kernel crossover) and must
// give plain batched decoding's output at that precision exactly. Elsewhere the range caps the
// pass, as it should.
TEST(SpeculativeDecodingTest, AtMediumPrecisionBatchedVerificationGivesPlainDecodingsOutput) {
  EngineOptions eo;
  eo.model_dir = kDemo;
  eo.num_threads = 2;
  eo.kv_cache_bytes = 16 << 20;
  eo.matmul_precision = backend::MatmulPrecision::kMedium;
  auto created = Engine::Create(eo);
  ASSERT_TRUE(created.ok()) << created.status();
  Engine& engine = **created;
  // The table the engine's backend runs (the best, or MODSERVE_CPU_ISA's in the narrower-ISA
  // runs): a CPU backend created as the engine creates one picks it.
  auto probe = backend::cpu::CpuBackend::Create({.num_threads = 1});
  ASSERT_TRUE(probe.ok()) << probe.status();
  const backend::cpu::KernelTable& table = backend::cpu::KernelsFor((*probe)->isa());
  const bool panels = table.gemm_dpbf16_panels != nullptr && table.gemm_amx_bf16 == nullptr;
  if (panels) {
    EXPECT_EQ(engine.max_row_invariant_rows(), eo.max_batch_tokens);
  }
  const int64_t vocab = engine.config().vocab_size;
  std::vector<Request> plain;
  for (int32_t i = 0; i < 8; ++i) plain.push_back(Greedy(Prompt(11 + 3 * i, i, vocab), 28));
  auto want = engine.Generate(plain);
  ASSERT_TRUE(want.ok()) << want.status();
  std::vector<Request> spec = plain;
  for (Request& r : spec) {
    r.speculative_tokens = 8;
    r.speculative_threshold = 0.9;
  }
  auto got = engine.Generate(spec);
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < plain.size(); ++i) {
    ExpectSameOutput((*got)[i], (*want)[i], "request " + std::to_string(i));
  }
  EXPECT_EQ(engine.kv_stats().num_free_pages, engine.kv_stats().num_pages);
}

TEST(SpeculativeDecodingTest, PreemptedSpeculativeSequenceResumesWithTheSameOutput) {
  // Recomputing after a preemption feeds the generated tokens by prefill, which rounds
  // differently from decode in the last bits, so the reference is decoding preempted after the
  // same number of tokens.
  auto engine = MakeEngine(kDemo);
  const Request request = Greedy(Prompt(30, 3, 2048), 40);
  Request spec = request;
  spec.speculative_tokens = 3;
  for (int32_t preempt_after : {1, 7, 20}) {
    int32_t at = 0;
    const GenerationResult got = RunSteps(*engine, spec, 3, preempt_after, nullptr, nullptr, &at);
    ASSERT_GE(at, preempt_after);
    const GenerationResult want = RunSteps(*engine, request, 0, at);
    ExpectSameOutput(got, want, "preempted after " + std::to_string(at));
  }
  EXPECT_EQ(engine->kv_stats().num_free_pages, engine->kv_stats().num_pages);
}

TEST(SpeculativeDecodingTest, MixedBatchWithPrefixCachingGivesEachRequestItsOwnOutput) {
  // Generate batches speculative and plain requests in one step, greedy and sampled, two of
  // them sharing a cached prompt prefix; each request gets what it gets alone without either.
  auto plain = MakeEngine(kDemo);
  auto engine = MakeEngine(kDemo, 0, 1.0, /*prefix_caching=*/true);
  // Bit-identical prompt logprobs need each prompt row computed by the same kernels in the three
  // runs: alone (L rows), batched (6 L) and batched after the cache (6 x the 16 uncached tokens).
  // Rows within the row-invariant bound get one-row bits whatever the call; beyond it, the
  // prefill kernels give a row the same bits in any call beyond it. So every prefill call here
  // is beyond it: L = 16 * c + 16 > bound, 6 * 16 > bound, and the 6 L rows fit one pass (a
  // second chunk of 6 L - 512 rows could fall within the bound). Where the bound covers every
  // call (the CPU's BF16 panel copies: one kernel at every row count), every row gets its
  // one-row bits and any L will do. L >= 32, so that the shared prefix fills a whole cached page
  // of 16 tokens.
  const int32_t bound = engine->max_row_invariant_rows();
  const bool every_call_within = bound >= EngineOptions{}.max_batch_tokens;
  if (!every_call_within) {
    ASSERT_LT(bound, 6 * 16);
  }
  const int32_t prompt_len = every_call_within ? 32 : std::max(32, 16 * (bound / 16) + 16);
  ASSERT_LE(6 * prompt_len, EngineOptions{}.max_batch_tokens);
  const std::vector<TokenId> shared = Prompt(prompt_len - 1, 4, 2048);
  std::vector<Request> requests;
  for (int i = 0; i < 6; ++i) {
    std::vector<TokenId> prompt = shared;
    prompt.push_back(static_cast<TokenId>(100 + i));
    Request r = Greedy(prompt, 24 + i);
    if (i % 3 == 2) {
      r.sampling.temperature = 0.8f;
      r.sampling.seed = 77 + i;  // sampled, not speculative: its own stream, whatever its batch
    } else {
      r.speculative_tokens = 1 + i;
      r.speculative_threshold = i % 2 == 0 ? 1.0 : 0.8;
    }
    requests.push_back(std::move(r));
  }
  auto got = engine->Generate(requests);
  ASSERT_TRUE(got.ok()) << got.status();
  auto again = engine->Generate(requests);  // now from the prefix cache
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_GT(engine->prefix_cache_stats().hits, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    Request alone = requests[i];
    alone.speculative_tokens = 0;
    auto want = plain->Generate({alone});
    ASSERT_TRUE(want.ok()) << want.status();
    ExpectSameOutput((*got)[i], (*want)[0], "request " + std::to_string(i));
    ExpectSameOutput((*again)[i], (*want)[0], "cached request " + std::to_string(i));
  }
}

TEST(SpeculativeDecodingTest, BadSettingsAreInvalidArgument) {
  auto engine = MakeEngine(kDemo);
  Request r = Greedy({1, 5, 6}, 4);
  for (int32_t k : {-1, kMaxSpeculativeTokens + 1}) {
    r.speculative_tokens = k;
    EXPECT_EQ(engine->Add(r).status().code(), absl::StatusCode::kInvalidArgument) << k;
  }
  r.speculative_tokens = 2;
  for (double t : {0.0, -0.5, 1.5, std::nan("")}) {
    r.speculative_threshold = t;
    absl::Status st = engine->Add(r).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << t;
    EXPECT_NE(st.message().find("speculative_threshold"), std::string::npos) << st;
  }
  EngineOptions eo;
  eo.model_dir = kDemo;
  eo.speculative_tokens = 99;
  EXPECT_EQ(Engine::Create(eo).status().code(), absl::StatusCode::kInvalidArgument);
  eo.speculative_tokens = 2;
  eo.speculative_threshold = 0.0;
  EXPECT_EQ(Engine::Create(eo).status().code(), absl::StatusCode::kInvalidArgument);
}

// Upper alpha = 1e-3 critical value of chi-square with `df` degrees of freedom
// (Wilson-Hilferty; z = 3.09), accurate to a few percent for df >= 3.
double ChiSquareCritical(int df) {
  const double z = 3.0902;
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

std::vector<TokenLogprob> LogSoftmax(const std::vector<float>& logits) {
  double m = *std::max_element(logits.begin(), logits.end()), sum = 0.0;
  for (float l : logits) sum += std::exp(l - m);
  std::vector<TokenLogprob> out;
  for (size_t i = 0; i < logits.size(); ++i) {
    out.push_back({static_cast<TokenId>(i), static_cast<float>(logits[i] - m - std::log(sum))});
  }
  return out;
}

TEST(SpeculativeSamplingTest, OutputFollowsTheTargetDistribution) {
  // p and q over 6 tokens that disagree a lot (q puts mass where p has none at all).
  const std::vector<TokenLogprob> p = LogSoftmax({2.0f, 0.5f, -1.0f, 1.0f, 0.0f, -INFINITY});
  const std::vector<TokenLogprob> q = LogSoftmax({-1.0f, 1.5f, 1.0f, 0.0f, -2.0f, 1.0f});
  constexpr int kDraws = 60000;
  std::vector<int64_t> counts(6, 0), drafts(6, 0);
  int64_t accepted = 0;
  for (uint64_t seed = 1; seed <= kDraws; ++seed) {
    const TokenId draft = DrawToken(q, UniformDraw(seed, 5, kDraftStream));
    const SpeculativeChoice c = AcceptOrResample(p, q, draft, UniformDraw(seed, 5, kAcceptStream),
                                                 UniformDraw(seed, 5, kResampleStream));
    ++counts[c.token];
    ++drafts[draft];
    accepted += c.accepted;
  }
  auto chi2 = [&](const std::vector<int64_t>& n) {
    double x = 0.0;
    for (size_t i = 0; i < 5; ++i) {  // token 5 has p = 0
      const double e = kDraws * std::exp(static_cast<double>(p[i].logprob));
      x += (n[i] - e) * (n[i] - e) / e;
    }
    return x;
  };
  EXPECT_EQ(counts[5], 0);
  EXPECT_LT(chi2(counts), ChiSquareCritical(4));
  // The test has power: the drafts themselves (q) fail it by far.
  EXPECT_GT(chi2(drafts), 100 * ChiSquareCritical(4));
  // Acceptance rate = sum_x min(p(x), q(x)).
  double overlap = 0.0;
  for (size_t i = 0; i < 6; ++i) {
    overlap += std::min(std::exp(static_cast<double>(p[i].logprob)),
                        std::exp(static_cast<double>(q[i].logprob)));
  }
  const double sd = std::sqrt(overlap * (1 - overlap) / kDraws);
  EXPECT_NEAR(static_cast<double>(accepted) / kDraws, overlap, 4 * sd);
}

TEST(SpeculativeSamplingTest, EngineSamplesTheDistributionOfDecoding) {
  // Two-sample chi-square over the first three generated tokens (top_k = 3, so at most 27
  // outcomes) of many seeds, with and without speculation (different seeds on each side).
  auto engine = MakeEngine(kDemo);
  constexpr int kRuns = 1200;
  auto outcomes = [&](bool speculative, uint64_t first_seed) {
    std::vector<Request> requests;
    for (int i = 0; i < kRuns; ++i) {
      Request r;
      r.prompt = Prompt(12, 5, 2048);
      r.sampling.temperature = 1.0f;
      r.sampling.top_k = 3;
      r.sampling.max_new_tokens = 3;
      r.sampling.ignore_eos = true;
      r.sampling.seed = first_seed + static_cast<uint64_t>(i);
      if (speculative) {
        r.speculative_tokens = 2;
        r.speculative_threshold = 1.0;
      }
      requests.push_back(std::move(r));
    }
    std::map<std::vector<TokenId>, int64_t> n;
    for (size_t b = 0; b < requests.size(); b += 100) {
      auto got = engine->Generate(absl::MakeConstSpan(requests).subspan(b, 100));
      MODSERVE_CHECK(got.ok()) << got.status();
      for (const GenerationResult& g : *got) ++n[g.token_ids];
    }
    return n;
  };
  std::map<std::vector<TokenId>, int64_t> a = outcomes(false, 1), b = outcomes(true, 100001);
  std::map<std::vector<TokenId>, std::pair<int64_t, int64_t>> both;
  for (const auto& [k, v] : a) both[k].first = v;
  for (const auto& [k, v] : b) both[k].second = v;
  // Pool outcomes seen fewer than 10 times in all into one cell.
  double x = 0.0;
  int cells = 0;
  int64_t rare_a = 0, rare_b = 0;
  for (const auto& [k, v] : both) {
    if (v.first + v.second < 10) {
      rare_a += v.first;
      rare_b += v.second;
      continue;
    }
    x += static_cast<double>((v.first - v.second) * (v.first - v.second)) / (v.first + v.second);
    ++cells;
  }
  if (rare_a + rare_b > 0) {
    x += static_cast<double>((rare_a - rare_b) * (rare_a - rare_b)) / (rare_a + rare_b);
    ++cells;
  }
  ASSERT_GE(cells, 4);
  EXPECT_LT(x, ChiSquareCritical(cells - 1)) << cells << " cells";
}

}  // namespace
}  // namespace modserve::engine
