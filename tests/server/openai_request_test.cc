// ParseOpenAiRequest: OpenAI's defaults, every field carried into the same engine request the
// gRPC API builds for the same values (one set of rules), prompt lists, chat through a template
// (tokenized without adding special tokens), and a 4xx naming the field for each kind of bad
// input: wrong types, unsupported fields, malformed JSON, invalid UTF-8, another model's name,
// chat without a template, limits.
#include "server/openai_request.h"

#include <string>

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

class OpenAiRequestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = engine::LoadTokenizer(MODSERVE_SOURCE_DIR "/tests/testdata/tokenizer/demo");
    ASSERT_THAT(tok, IsOk());
    tokenizer_ = *std::move(tok);
    config_.vocab_size = tokenizer_->vocab_size();
    config_.max_seq_len = 256;
    auto chat = ChatTemplate::Create(
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}",
        std::string("<|bos|>"), std::string("<|eos|>"));
    ASSERT_THAT(chat, IsOk());
    chat_.emplace(*std::move(chat));
    model_.name = "demo";
    model_.config = &config_;
    model_.tokenizer = tokenizer_.get();
    model_.chat_template = &*chat_;
  }

  absl::StatusOr<OpenAiRequest> Completion(const std::string& body) {
    return ParseOpenAiRequest(OpenAiEndpoint::kCompletions, body, model_, absl::InfiniteFuture());
  }
  absl::StatusOr<OpenAiRequest> Chat(const std::string& body) {
    return ParseOpenAiRequest(OpenAiEndpoint::kChatCompletions, body, model_,
                              absl::InfiniteFuture());
  }

  engine::ModelConfig config_;
  std::unique_ptr<engine::Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_;
  OpenAiModel model_;
};

TEST_F(OpenAiRequestTest, OpenAiDefaults) {
  auto r = Completion(R"({"model": "demo", "prompt": [1, 17, 42]})");
  ASSERT_THAT(r, IsOk());
  ASSERT_EQ(r->requests.size(), 1u);
  const engine::SamplingParams& sp = r->requests[0].request.sampling;
  EXPECT_THAT(r->requests[0].request.prompt, ElementsAre(1, 17, 42));
  EXPECT_EQ(sp.temperature, 1.0f);  // OpenAI's default, not greedy
  EXPECT_EQ(sp.max_new_tokens, kDefaultMaxNewTokens);
  EXPECT_FALSE(r->stream);
  EXPECT_FALSE(r->echo);
  EXPECT_EQ(r->logprobs, -1);
  // The model field is optional.
  EXPECT_THAT(Completion(R"({"prompt": "hi"})"), IsOk());
}

TEST_F(OpenAiRequestTest, FieldsBuildTheSameEngineRequestAsGrpc) {
  auto r = Completion(R"({"prompt": [1, 17, 42], "max_tokens": 7, "temperature": 0.7,
      "top_p": 0.9, "top_k": 5, "min_p": 0.05, "repetition_penalty": 1.1,
      "presence_penalty": 0.5, "frequency_penalty": -0.5, "seed": 99, "stop": ["\n\n", "x"],
      "stop_token_ids": [3], "ignore_eos": true, "logprobs": 4, "routing_threshold": 0.3,
      "speculative_tokens": 3, "speculative_threshold": 0.8, "user": "someone", "unknown_field": {"is": "ignored"}})");
  ASSERT_THAT(r, IsOk());
  v1::GenerateRequest g;
  for (int id : {1, 17, 42}) g.mutable_prompt_token_ids()->add_ids(id);
  auto* s = g.mutable_sampling();
  s->set_temperature(0.7f);
  s->set_top_p(0.9f);
  s->set_top_k(5);
  s->set_min_p(0.05f);
  s->set_repetition_penalty(1.1f);
  s->set_presence_penalty(0.5f);
  s->set_frequency_penalty(-0.5f);
  s->set_seed(99);
  g.mutable_stopping()->set_max_new_tokens(7);
  g.mutable_stopping()->add_stop("\n\n");
  g.mutable_stopping()->add_stop("x");
  g.mutable_stopping()->add_stop_token_ids(3);
  g.mutable_stopping()->set_ignore_eos(true);
  g.set_top_logprobs(4);
  g.mutable_routing()->set_threshold(0.3);
  g.set_speculative_tokens(3);
  g.set_speculative_threshold(0.8);
  auto grpc = ToLoopRequest(g, config_, tokenizer_.get(), absl::InfiniteFuture());
  ASSERT_THAT(grpc, IsOk());
  const engine::Request& a = r->requests[0].request;
  const engine::Request& b = grpc->request;
  EXPECT_EQ(a.prompt, b.prompt);
  EXPECT_EQ(a.sampling.temperature, b.sampling.temperature);
  EXPECT_EQ(a.sampling.top_p, b.sampling.top_p);
  EXPECT_EQ(a.sampling.top_k, b.sampling.top_k);
  EXPECT_EQ(a.sampling.min_p, b.sampling.min_p);
  EXPECT_EQ(a.sampling.repetition_penalty, b.sampling.repetition_penalty);
  EXPECT_EQ(a.sampling.presence_penalty, b.sampling.presence_penalty);
  EXPECT_EQ(a.sampling.frequency_penalty, b.sampling.frequency_penalty);
  EXPECT_EQ(a.sampling.seed, b.sampling.seed);
  EXPECT_EQ(a.sampling.max_new_tokens, b.sampling.max_new_tokens);
  EXPECT_EQ(a.sampling.stop_strings, b.sampling.stop_strings);
  EXPECT_EQ(a.sampling.stop_token_ids, b.sampling.stop_token_ids);
  EXPECT_EQ(a.sampling.ignore_eos, b.sampling.ignore_eos);
  EXPECT_EQ(a.sampling.top_logprobs, b.sampling.top_logprobs);
  EXPECT_EQ(a.threshold, b.threshold);
  EXPECT_EQ(a.speculative_tokens, 3);
  EXPECT_EQ(a.speculative_tokens, b.speculative_tokens);
  EXPECT_EQ(a.speculative_threshold, 0.8);
  EXPECT_EQ(a.speculative_threshold, b.speculative_threshold);
  EXPECT_EQ(r->logprobs, 4);
}

TEST_F(OpenAiRequestTest, TextPromptsTokenizeWithTheModelsSpecialTokens) {
  auto r = Completion(R"({"prompt": "The quick brown fox", "stop": "fox"})");
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->requests[0].request.prompt, *tokenizer_->Encode("The quick brown fox", true));
  EXPECT_THAT(r->requests[0].request.sampling.stop_strings, ElementsAre("fox"));
}

TEST_F(OpenAiRequestTest, PromptListsBecomeOneRequestEach) {
  auto texts = Completion(R"({"prompt": ["a b", "c d e"], "echo": true})");
  ASSERT_THAT(texts, IsOk());
  ASSERT_EQ(texts->requests.size(), 2u);
  EXPECT_EQ(texts->requests[1].request.prompt, *tokenizer_->Encode("c d e", true));
  EXPECT_THAT(texts->prompt_texts, ElementsAre("a b", "c d e"));
  auto ids = Completion(R"({"prompt": [[1, 2], [3, 4, 5]], "echo": true})");
  ASSERT_THAT(ids, IsOk());
  ASSERT_EQ(ids->requests.size(), 2u);
  EXPECT_THAT(ids->requests[1].request.prompt, ElementsAre(3, 4, 5));
  EXPECT_EQ(ids->prompt_texts[1], *tokenizer_->Decode({3, 4, 5}, false));
  EXPECT_THAT(Completion(R"({"prompt": [[1, 2], [3, 99999]]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "prompt[1][1]: 99999 is outside"));
  EXPECT_THAT(Completion(R"({"prompt": ["a", [1]]})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "prompt[1]:"));
  EXPECT_THAT(Completion(R"({"prompt": []})"),
              StatusIs(absl::StatusCode::kInvalidArgument, "prompt: must not be empty"));
  std::string many = R"({"prompt": [)";
  for (int i = 0; i <= kMaxPromptsPerRequest; ++i) absl::StrAppend(&many, i ? "," : "", "\"x\"");
  EXPECT_THAT(Completion(many + "]}"),
              StatusIs(absl::StatusCode::kInvalidArgument, "prompts; at most"));
}

TEST_F(OpenAiRequestTest, ChatRendersTheTemplateWithoutAddingSpecialTokens) {
  auto r = Chat(R"({"messages": [{"role": "user", "content": "hi there"}], "max_tokens": 5,
      "logprobs": true, "top_logprobs": 3, "stream": true,
      "stream_options": {"include_usage": true}})");
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->requests[0].request.prompt, *tokenizer_->Encode("<user>hi there<assistant>", false));
  EXPECT_EQ(r->requests[0].request.sampling.max_new_tokens, 5);
  EXPECT_EQ(r->requests[0].request.sampling.top_logprobs, 3);
  EXPECT_EQ(r->logprobs, 3);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  // Unset, the reply may fill what the context leaves; max_completion_tokens wins over
  // max_tokens.
  auto fill = Chat(R"({"messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_THAT(fill, IsOk());
  EXPECT_EQ(fill->requests[0].request.sampling.max_new_tokens,
            config_.max_seq_len - static_cast<int64_t>(fill->requests[0].request.prompt.size()));
  auto both = Chat(R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9,
      "max_completion_tokens": 4})");
  ASSERT_THAT(both, IsOk());
  EXPECT_EQ(both->requests[0].request.sampling.max_new_tokens, 4);
  auto no_prompt = Chat(R"({"messages": [{"role": "user", "content": "hi"}],
      "add_generation_prompt": false})");
  ASSERT_THAT(no_prompt, IsOk());
  EXPECT_EQ(no_prompt->requests[0].request.prompt, *tokenizer_->Encode("<user>hi", false));
}

TEST_F(OpenAiRequestTest, BadValuesNameTheField) {
  const struct {
    const char* body;
    absl::StatusCode code;
    const char* message;
  } kCases[] = {
      {R"({"prompt": "x", "max_tokens": "8"})", absl::StatusCode::kInvalidArgument,
       "max_tokens: must be an integer, got a string"},
      {R"({"prompt": "x", "max_tokens": 2.5})", absl::StatusCode::kInvalidArgument,
       "max_tokens: must be an integer, got a number"},
      {R"({"prompt": "x", "max_tokens": 0})", absl::StatusCode::kInvalidArgument,
       "max_tokens: 0 is < 1"},
      {R"({"prompt": "x", "max_tokens": 100000000000})", absl::StatusCode::kOutOfRange,
       "exceeds the model's max_seq_len 256"},
      {R"({"prompt": "x", "temperature": "hot"})", absl::StatusCode::kInvalidArgument,
       "temperature: must be a number, got a string"},
      {R"({"prompt": "x", "temperature": -1})", absl::StatusCode::kInvalidArgument,
       "temperature: -1 is not >= 0"},
      {R"({"prompt": "x", "top_p": 1.5})", absl::StatusCode::kInvalidArgument,
       "top_p: 1.5 is not in (0, 1]"},
      {R"({"prompt": "x", "top_k": -2})", absl::StatusCode::kInvalidArgument, "top_k: -2 is < 0"},
      {R"({"prompt": "x", "presence_penalty": 3})", absl::StatusCode::kInvalidArgument,
       "presence_penalty: 3 is not in [-2, 2]"},
      {R"({"prompt": "x", "stop": 3})", absl::StatusCode::kInvalidArgument,
       "stop: must be a string or an array of strings"},
      {R"({"prompt": "x", "stop": ["a", 1]})", absl::StatusCode::kInvalidArgument, "stop[1]:"},
      {R"({"prompt": "x", "stop": [""]})", absl::StatusCode::kInvalidArgument, "stop[0]: is empty"},
      {R"({"prompt": "x", "stop_token_ids": [1, -5]})", absl::StatusCode::kInvalidArgument,
       "stop_token_ids[1]: -5 is outside the vocabulary"},
      {R"({"prompt": "x", "logprobs": 21})", absl::StatusCode::kInvalidArgument,
       "logprobs: 21 is not in [0, 20]"},
      {R"({"prompt": "x", "logprobs": true})", absl::StatusCode::kInvalidArgument,
       "logprobs: must be an integer, got a boolean"},
      {R"({"prompt": "x", "echo": "yes"})", absl::StatusCode::kInvalidArgument,
       "echo: must be a boolean"},
      {R"({"prompt": "x", "n": 2})", absl::StatusCode::kInvalidArgument, "n: 2 is not supported"},
      {R"({"prompt": "x", "best_of": 3})", absl::StatusCode::kInvalidArgument, "best_of: 3"},
      {R"({"prompt": "x", "suffix": "tail"})", absl::StatusCode::kInvalidArgument,
       "suffix: is not supported"},
      {R"({"prompt": "x", "logit_bias": {"5": 100}})", absl::StatusCode::kInvalidArgument,
       "logit_bias: is not supported"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})",
       absl::StatusCode::kInvalidArgument, "stream_options: is only allowed with stream: true"},
      {R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": 1}})",
       absl::StatusCode::kInvalidArgument, "stream_options.include_usage: must be a boolean"},
      {R"({"prompt": "x", "routing_threshold": 1.5})", absl::StatusCode::kInvalidArgument,
       "routing_threshold: 1.5 is not in (0, 1)"},
      {R"({"prompt": "x", "speculative_tokens": 2.5})", absl::StatusCode::kInvalidArgument,
       "speculative_tokens: must be an integer"},
      {R"({"prompt": "x", "speculative_tokens": -1})", absl::StatusCode::kInvalidArgument,
       "speculative_tokens: -1 is < 0"},
      {R"({"prompt": "x", "speculative_tokens": 99999999999})", absl::StatusCode::kInvalidArgument,
       "speculative_tokens: 99999999999 exceeds the server's --speculative_tokens="},
      {R"({"prompt": "x", "speculative_threshold": "high"})", absl::StatusCode::kInvalidArgument,
       "speculative_threshold: must be a number"},
      {R"({"prompt": "x", "speculative_threshold": 0})", absl::StatusCode::kInvalidArgument,
       "speculative_threshold: 0 is not in (0, 1]"},
      {R"({"prompt": 7})", absl::StatusCode::kInvalidArgument, "prompt: must be a string"},
      {R"({"max_tokens": 5})", absl::StatusCode::kInvalidArgument, "prompt: is required"},
      {R"({"prompt": ""})", absl::StatusCode::kInvalidArgument, "prompt: is empty"},
      {R"({"model": "gpt-4", "prompt": "x"})", absl::StatusCode::kNotFound,
       "model: 'gpt-4' is not served here"},
      {R"({"model": 5, "prompt": "x"})", absl::StatusCode::kInvalidArgument,
       "model: must be a string"},
      {R"({"prompt": "x",)", absl::StatusCode::kInvalidArgument, "body: not valid JSON"},
      {"[1, 2]", absl::StatusCode::kInvalidArgument, "body: must be a JSON object, got an array"},
      {"", absl::StatusCode::kInvalidArgument, "body: not valid JSON"},
      // Invalid UTF-8 inside a JSON string: refused by the JSON parser itself.
      {"{\"prompt\": \"ab\xff\xfe\"}", absl::StatusCode::kInvalidArgument, "body: not valid JSON"},
      {R"({"prompt": "\ud800"})", absl::StatusCode::kInvalidArgument, "body: not valid JSON"},
  };
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.body);
    EXPECT_THAT(Completion(c.body), StatusIs(c.code, c.message));
  }
}

TEST_F(OpenAiRequestTest, BadChatRequestsNameTheField) {
  const struct {
    const char* body;
    absl::StatusCode code;
    const char* message;
  } kCases[] = {
      {R"({"max_tokens": 3})", absl::StatusCode::kInvalidArgument, "messages: is required"},
      {R"({"messages": "hi"})", absl::StatusCode::kInvalidArgument, "messages: must be an array"},
      {R"({"messages": [{"role": "user", "content": 5}]})", absl::StatusCode::kInvalidArgument,
       "messages[0].content:"},
      {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})",
       absl::StatusCode::kInvalidArgument, "top_logprobs: needs logprobs: true"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true,
          "top_logprobs": 30})",
       absl::StatusCode::kInvalidArgument, "top_logprobs: 30 is not in [0, 20]"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})",
       absl::StatusCode::kInvalidArgument, "tools: function calling is not supported"},
      {R"({"messages": [{"role": "user", "content": "x"}],
          "response_format": {"type": "json_object"}})",
       absl::StatusCode::kInvalidArgument, "response_format.type"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 1000})",
       absl::StatusCode::kOutOfRange, "max_completion_tokens (1000)"},
  };
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.body);
    EXPECT_THAT(Chat(c.body), StatusIs(c.code, c.message));
  }
  // Accepted and unused: an empty tools list, tool_choice none, a text response format.
  EXPECT_THAT(Chat(R"({"messages": [{"role": "user", "content": "x"}], "tools": [],
      "tool_choice": "none", "response_format": {"type": "text"}})"),
              IsOk());
}

TEST_F(OpenAiRequestTest, ChatWithoutATemplateIsRefusedAndSaysWhy) {
  model_.chat_template = nullptr;
  EXPECT_THAT(
      Chat(R"({"messages": [{"role": "user", "content": "hi"}]})"),
      StatusIs(absl::StatusCode::kFailedPrecondition, "messages: the model has no chat template"));
  model_.chat_template_status = absl::InvalidArgumentError("chat template: template line 3: x");
  EXPECT_THAT(Chat(R"({"messages": [{"role": "user", "content": "hi"}]})"),
              StatusIs(absl::StatusCode::kFailedPrecondition, "template line 3"));
}

TEST_F(OpenAiRequestTest, OperatorLimitsNameTheFlag) {
  model_.limits.max_new_tokens = 8;
  model_.limits.max_prompt_tokens = 2;
  EXPECT_THAT(Completion(R"({"prompt": [1, 2], "max_tokens": 9})"),
              StatusIs(absl::StatusCode::kOutOfRange, "max_tokens: 9 exceeds --max_new_tokens=8"));
  EXPECT_THAT(
      Completion(R"({"prompt": [1, 2, 3]})"),
      StatusIs(absl::StatusCode::kOutOfRange, "prompt: 3 tokens exceeds --max_prompt_tokens=2"));
  EXPECT_THAT(
      Completion(R"({"prompt": [[1], [1, 2, 3]]})"),
      StatusIs(absl::StatusCode::kOutOfRange, "prompt[1]: 3 tokens exceeds --max_prompt_tokens=2"));
  // Chat's fill-the-context default is lowered to the limit.
  model_.limits.max_prompt_tokens = 0;
  auto chat = Chat(R"({"messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_THAT(chat, IsOk());
  EXPECT_EQ(chat->requests[0].request.sampling.max_new_tokens, 8);
}

}  // namespace
}  // namespace modserve::server
