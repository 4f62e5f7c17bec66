// Fuzz targets for the HTTP API's request handling: bytes as an OpenAI request body through
// ParseOpenAiRequest (JSON, types, chat templates, the shared rules) with the demo model, and
// bytes as a Jinja template through Parse and Render. They check the contracts the headers state
// (codes, field-naming messages, accepted requests within every limit, bounded renders); the
// HTTP framing has its own target (http_fuzz.cc).
#include <fstream>
#include <iterator>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/model/config.h"
#include "engine/sampler/sampler.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"
#include "nlohmann/json.hpp"
#include "server/chat_template.h"
#include "server/jinja.h"
#include "server/openai_request.h"
#include "tests/fuzz/fuzz_targets.h"
#include "tests/fuzz/fuzz_util.h"

namespace modserve::fuzz {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The demo model's config and tokenizer, and SmolLM2's chat template, loaded once.
struct Api {
  engine::ModelConfig config;
  engine::ModelConfig short_config;
  const engine::Tokenizer* tokenizer;
  const server::ChatTemplate* chat;
};

const Api& Demo() {
  static const Api* const api = [] {
    const std::string root = MODSERVE_SOURCE_DIR;
    absl::StatusOr<engine::ModelConfig> config =
        engine::ParseConfig(ReadFile(root + "/models/demo/config.json"));
    FUZZ_CHECK(config.ok(), config.status().ToString());
    auto tok = engine::LoadTokenizer(root + "/models/demo");
    FUZZ_CHECK(tok.ok(), tok.status().ToString());
    auto chat = server::ChatTemplate::Create(
        ReadFile(root + "/tests/testdata/chat_templates/smollm2.jinja"),
        std::string("<|bos|>"), std::string("<|eos|>"));
    FUZZ_CHECK(chat.ok(), chat.status().ToString());
    auto* a = new Api{*config, *config, tok->release(), new server::ChatTemplate(*std::move(chat))};
    a->short_config.max_seq_len = 64;
    return a;
  }();
  return *api;
}

// Flag byte of FuzzOpenAiRequest.
constexpr uint8_t kChat = 1;
constexpr uint8_t kNoTokenizer = 2;
constexpr uint8_t kShortContext = 4;
constexpr uint8_t kNoTemplate = 8;
constexpr uint8_t kLimits = 16;  // --max_prompt_tokens=8 --max_new_tokens=8 --speculative_tokens=3

// "field: ..." where field is a path such as messages[2].content or stream_options.include_usage.
bool StartsWithField(absl::string_view m) {
  const size_t colon = m.find(": ");
  if (colon == absl::string_view::npos || colon == 0) return false;
  for (char c : m.substr(0, colon)) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '.' && c != '[' && c != ']' && c != '-') {
      return false;
    }
  }
  return true;
}

}  // namespace

int FuzzOpenAiRequest(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Api& api = Demo();
  const uint8_t flags = data[0];
  const absl::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  server::OpenAiModel model;
  model.name = "demo";
  model.config = (flags & kShortContext) ? &api.short_config : &api.config;
  model.tokenizer = (flags & kNoTokenizer) ? nullptr : api.tokenizer;
  model.chat_template = (flags & kNoTemplate) ? nullptr : api.chat;
  if (flags & kLimits) {
    model.limits.max_prompt_tokens = 8;
    model.limits.max_new_tokens = 8;
    model.limits.max_speculative_tokens = 3;
  }
  const bool chat = flags & kChat;
  const absl::StatusOr<server::OpenAiRequest> r = server::ParseOpenAiRequest(
      chat ? server::OpenAiEndpoint::kChatCompletions : server::OpenAiEndpoint::kCompletions,
      body, model, absl::InfiniteFuture());
  // std::string_view spelled out: absl::string_view is its own type under some compilers.
  const std::string what = absl::StrCat(chat ? "chat " : "completions ",
                                        Escape(std::string_view(body.data(), body.size())));

  if (!r.ok()) {
    const absl::Status& s = r.status();
    const std::string why = absl::StrCat(s.ToString(), " for ", what);
    FUZZ_CHECK(!s.message().empty(), why);
    switch (s.code()) {
      case absl::StatusCode::kInvalidArgument:
      case absl::StatusCode::kNotFound:
      case absl::StatusCode::kFailedPrecondition:
        FUZZ_CHECK(StartsWithField(s.message()), absl::StrCat("the message must name a field: ",
                                                              why));
        break;
      case absl::StatusCode::kOutOfRange:
        FUZZ_CHECK(absl::StrContains(s.message(), "max_seq_len") ||
                       absl::StrContains(s.message(), "--max_"),
                   absl::StrCat("OutOfRange must name the limit: ", why));
        break;
      case absl::StatusCode::kResourceExhausted:  // the chat template's render bounds
      case absl::StatusCode::kInternal:           // the tokenizer's regex limit
        break;
      default:
        FUZZ_CHECK(false, absl::StrCat("unexpected code: ", why));
    }
    // The error reply is JSON with the message (a 400-class status never hides it).
    const std::string reply = server::ErrorJson(s);
    const nlohmann::json j = nlohmann::json::parse(reply, nullptr, /*allow_exceptions=*/false);
    FUZZ_CHECK(!j.is_discarded() && j.contains("error"), absl::StrCat("bad error JSON ", reply));
    const int http = server::HttpStatusFor(s);
    FUZZ_CHECK(http >= 400 && http < 600, why);
    // A 400-class reply carries the message unchanged; one that quotes ill-formed bytes of the
    // body (the JSON parser's "last read") has them replaced, since the reply must be UTF-8.
    if (http < 500) {
      FUZZ_CHECK(j["error"]["message"].is_string(), reply);
      const std::string message = j["error"]["message"].get<std::string>();
      if (engine::IsValidUtf8(std::string_view(s.message().data(), s.message().size()))) {
        FUZZ_CHECK(message == std::string(s.message()), reply);
      } else {
        FUZZ_CHECK(!message.empty() && engine::IsValidUtf8(message), reply);
      }
    }
    return 0;
  }

  // Accepted: every request is one the engine takes, inside every limit.
  const server::OpenAiRequest& req = *r;
  FUZZ_CHECK(!req.requests.empty(), what);
  FUZZ_CHECK(req.requests.size() <= static_cast<size_t>(server::kMaxPromptsPerRequest), what);
  if (chat) FUZZ_CHECK(req.requests.size() == 1 && !req.echo, what);
  if (!req.stream) FUZZ_CHECK(!req.include_usage, what);
  if (req.echo) FUZZ_CHECK(req.prompt_texts.size() == req.requests.size(), what);
  for (const std::string& t : req.prompt_texts) FUZZ_CHECK(IsStrictUtf8(t), what);
  FUZZ_CHECK(req.logprobs >= -1 && req.logprobs <= engine::kMaxTopLogprobs, what);
  for (const engine::LoopRequest& lr : req.requests) {
    const engine::Request& e = lr.request;
    FUZZ_CHECK(!e.prompt.empty(), what);
    for (int32_t id : e.prompt) {
      FUZZ_CHECK(id >= 0 && id < model.config->vocab_size, absl::StrCat("id ", id, ": ", what));
    }
    const int32_t max_new = e.sampling.max_new_tokens;
    FUZZ_CHECK(max_new >= 1, what);
    FUZZ_CHECK(static_cast<int64_t>(e.prompt.size()) + max_new <= model.config->max_seq_len, what);
    if (flags & kLimits) {
      FUZZ_CHECK(e.prompt.size() <= 8 && max_new <= 8, absl::StrCat("limits ignored: ", what));
    }
    FUZZ_CHECK(e.prompt_logprobs >= -1 && e.prompt_logprobs <= engine::kMaxTopLogprobs, what);
    if (e.threshold) FUZZ_CHECK(*e.threshold > 0.0 && *e.threshold < 1.0, what);
    if (e.speculative_tokens) {
      FUZZ_CHECK(*e.speculative_tokens >= 0 &&
                     *e.speculative_tokens <= model.limits.max_speculative_tokens,
                 absl::StrCat("speculative_tokens outside [0, the server's limit]: ", what));
    }
    if (e.speculative_threshold) {
      FUZZ_CHECK(*e.speculative_threshold > 0.0 && *e.speculative_threshold <= 1.0, what);
    }
    const absl::Status ok = engine::Validate(e.sampling);
    FUZZ_CHECK(ok.ok(), absl::StrCat("the engine refuses: ", ok.ToString(), ": ", what));
  }
  return 0;
}

int FuzzJinja(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<server::jinja::Template> t = server::jinja::Template::Parse(source);
  if (!t.ok()) {
    FUZZ_CHECK(t.status().code() == absl::StatusCode::kInvalidArgument &&
                   absl::StartsWith(t.status().message(), "template"),
               absl::StrCat(t.status().ToString(), " for ", Escape(source)));
    return 0;
  }
  static const nlohmann::ordered_json* const kContext = new nlohmann::ordered_json(
      nlohmann::ordered_json::parse(R"({
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": "Hi \u00fc \ud83d\ude00"},
                     {"role": "assistant", "content": "", "tool_calls": [
                       {"function": {"name": "f", "arguments": {"x": [1, 2.5, null]}}}]},
                     {"role": "tool", "content": "ok"}],
        "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]})"));
  server::jinja::RenderLimits limits;
  limits.max_output_bytes = 1 << 20;
  limits.max_steps = 200000;
  limits.max_call_depth = 16;
  absl::StatusOr<std::string> out =
      t->Render(server::jinja::Value::FromJson(*kContext), limits);
  if (out.ok()) {
    FUZZ_CHECK(IsStrictUtf8(*out), absl::StrCat("not UTF-8: ", Escape(source)));
    FUZZ_CHECK(out->size() <= static_cast<size_t>(limits.max_output_bytes), Escape(source));
    return 0;
  }
  const absl::StatusCode code = out.status().code();
  FUZZ_CHECK(code == absl::StatusCode::kInvalidArgument ||
                 code == absl::StatusCode::kResourceExhausted,
             absl::StrCat(out.status().ToString(), " for ", Escape(source)));
  return 0;
}

}  // namespace modserve::fuzz
