// Unit tests of the proto -> engine request conversion: defaults (unset sampling is greedy),
// every field carried over, the error code and field name of each refusal, and the operator's
// limits (prompt tokens, stopping.max_new_tokens) with the flag named in each refusal.
#include "server/request_validation.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/model/checkpoint_test_util.h"

namespace modserve::server {
namespace {

using ::modserve::engine::testing::IsOk;
using ::modserve::engine::testing::StatusIs;
using ::testing::ElementsAre;

engine::ModelConfig Config() {
  engine::ModelConfig c;
  c.vocab_size = 160;
  c.max_seq_len = 64;
  return c;
}

v1::GenerateRequest Request() {
  v1::GenerateRequest r;
  r.mutable_prompt_token_ids()->add_ids(1);
  r.mutable_prompt_token_ids()->add_ids(42);
  return r;
}

TEST(RequestValidationTest, UnsetSamplingIsGreedyWithDefaults) {
  auto r = ToLoopRequest(Request(), Config(), nullptr, absl::InfiniteFuture());
  ASSERT_THAT(r, IsOk());
  EXPECT_THAT(r->request.prompt, ElementsAre(1, 42));
  EXPECT_EQ(r->request.sampling.temperature, 0.0f);
  EXPECT_EQ(r->request.sampling.max_new_tokens, kDefaultMaxNewTokens);
  EXPECT_FALSE(r->request.sampling.seed.has_value());
  EXPECT_FALSE(r->request.threshold.has_value());
  EXPECT_EQ(r->deadline, absl::InfiniteFuture());
}

TEST(RequestValidationTest, EveryFieldIsCarriedOver) {
  v1::GenerateRequest req = Request();
  req.set_request_id("abc");
  auto* s = req.mutable_sampling();
  s->set_temperature(0.7f);
  s->set_top_k(5);
  s->set_top_p(0.9f);
  s->set_min_p(0.05f);
  s->set_repetition_penalty(1.1f);
  s->set_presence_penalty(0.5f);
  s->set_frequency_penalty(-0.5f);
  s->set_seed(99);
  req.mutable_stopping()->set_max_new_tokens(7);
  req.mutable_stopping()->add_stop("\n\n");
  req.mutable_stopping()->add_stop_token_ids(3);
  req.mutable_stopping()->set_ignore_eos(true);
  req.set_top_logprobs(4);
  req.set_prompt_logprobs(2);
  req.mutable_routing()->set_threshold(0.25);
  const absl::Time deadline = absl::FromUnixSeconds(2000000000);
  auto r = ToLoopRequest(req, Config(), nullptr, deadline);
  ASSERT_THAT(r, IsOk());
  const engine::SamplingParams& p = r->request.sampling;
  EXPECT_EQ(r->request_id, "abc");
  EXPECT_EQ(p.temperature, 0.7f);
  EXPECT_EQ(p.top_k, 5);
  EXPECT_EQ(p.top_p, 0.9f);
  EXPECT_EQ(p.min_p, 0.05f);
  EXPECT_EQ(p.repetition_penalty, 1.1f);
  EXPECT_EQ(p.presence_penalty, 0.5f);
  EXPECT_EQ(p.frequency_penalty, -0.5f);
  EXPECT_EQ(p.seed, 99u);
  EXPECT_EQ(p.max_new_tokens, 7);
  EXPECT_THAT(p.stop_strings, ElementsAre("\n\n"));
  EXPECT_THAT(p.stop_token_ids, ElementsAre(3));
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_EQ(p.top_logprobs, 4);
  EXPECT_EQ(r->request.prompt_logprobs, 2);
  EXPECT_EQ(r->request.threshold, 0.25);
  EXPECT_EQ(r->deadline, deadline);
}

TEST(RequestValidationTest, RefusalsNameTheField) {
  v1::GenerateRequest req = Request();
  req.mutable_sampling()->set_top_p(1.5f);
  EXPECT_THAT(ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture()),
              StatusIs(absl::StatusCode::kInvalidArgument, "sampling.top_p: 1.5 is not in (0, 1]"));
  req = Request();
  req.set_prompt("text");
  EXPECT_THAT(ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture()),
              StatusIs(absl::StatusCode::kInvalidArgument, "prompt: the model has no tokenizer"));
  req = Request();
  req.mutable_prompt_token_ids()->add_ids(160);
  EXPECT_THAT(ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "prompt_token_ids[2]: 160 is outside the vocabulary [0, 160)"));
}

TEST(RequestValidationTest, StopTokenIdsAreLimitedInNumber) {
  v1::GenerateRequest req = Request();
  for (size_t i = 0; i < engine::kMaxStopTokenIds; ++i) req.mutable_stopping()->add_stop_token_ids(3);
  EXPECT_THAT(ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture()), IsOk());
  req.mutable_stopping()->add_stop_token_ids(3);
  EXPECT_THAT(ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "stopping.stop_token_ids: 257 ids; at most 256"));
}

TEST(RequestValidationTest, PromptLogprobsAreOffUnlessAskedAndBounded) {
  auto off = ToLoopRequest(Request(), Config(), nullptr, absl::InfiniteFuture());
  ASSERT_THAT(off, IsOk());
  EXPECT_EQ(off->request.prompt_logprobs, -1);
  v1::GenerateRequest req = Request();
  req.set_prompt_logprobs(0);
  auto zero = ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture());
  ASSERT_THAT(zero, IsOk());
  EXPECT_EQ(zero->request.prompt_logprobs, 0);
  req.set_prompt_logprobs(21);
  EXPECT_THAT(ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture()),
              StatusIs(absl::StatusCode::kInvalidArgument, "prompt_logprobs: 21 is not in [0, 20]"));
  req.set_prompt_logprobs(-1);
  EXPECT_THAT(ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture()),
              StatusIs(absl::StatusCode::kInvalidArgument, "prompt_logprobs: -1 is not in"));
}

TEST(RequestValidationTest, SpeculationMayBeLoweredOrTurnedOffButNotRaised) {
  RequestLimits limits;
  limits.max_speculative_tokens = 4;  // the server's --speculative_tokens
  auto unset = ToLoopRequest(Request(), Config(), nullptr, absl::InfiniteFuture(), limits);
  ASSERT_THAT(unset, IsOk());
  EXPECT_FALSE(unset->request.speculative_tokens.has_value());  // the engine's default
  EXPECT_FALSE(unset->request.speculative_threshold.has_value());
  for (int32_t k : {0, 2, 4}) {
    v1::GenerateRequest req = Request();
    req.set_speculative_tokens(k);
    req.set_speculative_threshold(0.75);
    auto r = ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture(), limits);
    ASSERT_THAT(r, IsOk());
    EXPECT_EQ(r->request.speculative_tokens, k);
    EXPECT_EQ(r->request.speculative_threshold, 0.75);
  }
  v1::GenerateRequest req = Request();
  req.set_speculative_tokens(5);
  EXPECT_THAT(ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture(), limits),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "speculative_tokens: 5 exceeds the server's --speculative_tokens=4"));
  limits.max_speculative_tokens = 0;  // a server without speculation
  req.set_speculative_tokens(1);
  EXPECT_THAT(ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture(), limits),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "speculative_tokens: 1 exceeds the server's --speculative_tokens=0"));
  req.set_speculative_tokens(-1);
  EXPECT_THAT(ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture(), limits),
              StatusIs(absl::StatusCode::kInvalidArgument, "speculative_tokens: -1 is < 0"));
  req = Request();
  for (double t : {0.0, -0.25, 1.5, std::nan("")}) {
    req.set_speculative_threshold(t);
    EXPECT_THAT(ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture(), limits),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         absl::StrCat("speculative_threshold: ", t, " is not in (0, 1]")));
  }
}

TEST(RequestValidationTest, PromptPlusMaxNewTokensBeyondContextIsOutOfRange) {
  v1::GenerateRequest req = Request();
  req.mutable_stopping()->set_max_new_tokens(62);
  EXPECT_THAT(ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture()), IsOk());
  req.mutable_stopping()->set_max_new_tokens(63);
  EXPECT_THAT(ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture()),
              StatusIs(absl::StatusCode::kOutOfRange, "= 65 exceeds the model's max_seq_len 64"));
}

TEST(RequestValidationTest, PromptTokenIdsOverTheLimitAreOutOfRangeNamingTheFlag) {
  v1::GenerateRequest req = Request();
  req.mutable_prompt_token_ids()->add_ids(7);  // 3 tokens
  RequestLimits limits;
  limits.max_prompt_tokens = 3;
  EXPECT_THAT(ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture(), limits), IsOk());
  limits.max_prompt_tokens = 2;
  EXPECT_THAT(ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture(), limits),
              StatusIs(absl::StatusCode::kOutOfRange,
                       "prompt: 3 tokens exceeds --max_prompt_tokens=2"));
}

TEST(RequestValidationTest, TextPromptIsCountedAfterTokenization) {
  auto tokenizer = engine::LoadTokenizer(MODSERVE_SOURCE_DIR "/tests/testdata/tokenizer/demo");
  ASSERT_THAT(tokenizer, IsOk());
  const std::string text = "The quick brown fox jumps over the lazy dog";
  auto ids = (*tokenizer)->Encode(text, /*add_special_tokens=*/true);
  ASSERT_THAT(ids, IsOk());
  const int32_t n = static_cast<int32_t>(ids->size());
  ASSERT_GT(n, 1);
  engine::ModelConfig config = Config();
  config.vocab_size = 1 << 20;
  config.max_seq_len = n + 64;
  v1::GenerateRequest req;
  req.set_prompt(text);
  RequestLimits limits;
  limits.max_prompt_tokens = n;
  auto ok = ToLoopRequest(req, config, tokenizer->get(), absl::InfiniteFuture(), limits);
  ASSERT_THAT(ok, IsOk());
  EXPECT_EQ(ok->request.prompt, *ids);
  limits.max_prompt_tokens = n - 1;
  EXPECT_THAT(ToLoopRequest(req, config, tokenizer->get(), absl::InfiniteFuture(), limits),
              StatusIs(absl::StatusCode::kOutOfRange,
                       absl::StrCat("prompt: ", n, " tokens exceeds --max_prompt_tokens=", n - 1)));
}

TEST(RequestValidationTest, MaxNewTokensOverTheLimitIsOutOfRangeAndUnsetIsLowered) {
  v1::GenerateRequest req = Request();
  RequestLimits limits;
  limits.max_new_tokens = 10;
  req.mutable_stopping()->set_max_new_tokens(10);
  EXPECT_THAT(ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture(), limits), IsOk());
  req.mutable_stopping()->set_max_new_tokens(11);
  EXPECT_THAT(ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture(), limits),
              StatusIs(absl::StatusCode::kOutOfRange,
                       "stopping.max_new_tokens: 11 exceeds --max_new_tokens=10"));
  // Unset: the default, or the limit when that is smaller.
  req.mutable_stopping()->clear_max_new_tokens();
  auto lowered = ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture(), limits);
  ASSERT_THAT(lowered, IsOk());
  EXPECT_EQ(lowered->request.sampling.max_new_tokens, 10);
  limits.max_new_tokens = kDefaultMaxNewTokens + 1;
  auto unchanged = ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture(), limits);
  ASSERT_THAT(unchanged, IsOk());
  EXPECT_EQ(unchanged->request.sampling.max_new_tokens, kDefaultMaxNewTokens);
}

TEST(RequestValidationTest, NoLimitsLeaveOnlyTheContextLength) {
  v1::GenerateRequest req = Request();
  req.mutable_stopping()->set_max_new_tokens(62);
  EXPECT_THAT(ToLoopRequest(req, Config(), nullptr, absl::InfiniteFuture(), RequestLimits{}),
              IsOk());
}

}  // namespace
}  // namespace modserve::server
