// Fuzz target for request validation: bytes -> modserve.v1.GenerateRequest -> ToLoopRequest with
// the demo model's config and tokenizer. An independent oracle (written from the proto's field
// comments, not from request_validation.cc) decides which fields are invalid; the target checks
// that the validator agrees and that an accepted request carries every field over unchanged.
// It does not submit anything to an engine.
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "engine/model/config.h"
#include "engine/sampler/sampler.h"
#include "engine/tokenizer/tokenizer.h"
#include "google/protobuf/stubs/logging.h"
#include "modserve/v1/modserve.pb.h"
#include "server/request_validation.h"
#include "tests/fuzz/fuzz_targets.h"
#include "tests/fuzz/fuzz_util.h"

namespace modserve::fuzz {
namespace {

// The demo model, loaded once and never freed. The "short" config is the same model with a
// 64-token context, so that the context limit is reachable with inputs of a few hundred bytes.
struct Model {
  engine::ModelConfig config;
  engine::ModelConfig short_config;
  const engine::Tokenizer* tokenizer;
};

const Model& Demo() {
  static const Model* const model = [] {
    // Proto3 parsing logs every string field that is not UTF-8; that is expected input here.
    google::protobuf::SetLogHandler(
        [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
    const std::string dir = std::string(MODSERVE_SOURCE_DIR) + "/models/demo";
    // Read here and parsed with ParseConfig rather than LoadConfig: in this clang build (static
    // libprotobuf.a linked in), the std::string that LoadConfig gets from ostringstream::str()
    // is freed as a wild pointer (ASan bad-free in config.cc's LoadConfig).
    std::ifstream in(dir + "/config.json", std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    absl::StatusOr<engine::ModelConfig> config = engine::ParseConfig(text);
    FUZZ_CHECK(config.ok(), config.status().ToString());
    auto tok = engine::LoadTokenizer(dir);
    FUZZ_CHECK(tok.ok(), tok.status().ToString());
    auto* m = new Model{*config, *config, tok->release()};
    m->short_config.max_seq_len = 64;
    return m;
  }();
  return *model;
}

// Flag byte (the first input byte).
constexpr uint8_t kSplitTextPrompt = 1;  // [u16 n][n bytes of proto][rest: prompt text]
constexpr uint8_t kNoTokenizer = 2;
constexpr uint8_t kShortContext = 4;
constexpr uint8_t kNoDeadline = 8;
// Validate as a server with --speculative_tokens=kLowSpeculativeTokens would, not with no limits.
constexpr uint8_t kLowSpeculativeLimit = 16;
constexpr int32_t kLowSpeculativeTokens = 3;

bool In(float v, float lo, bool lo_open, float hi) {
  return std::isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi;
}

// What the proto says about one request: the fields that break their documented rule (in the
// order ToLoopRequest reads them, for messages), the prompt it should tokenize to, and whether
// the tokenizer itself refused valid text with Internal (its regex limit).
struct Verdict {
  std::vector<std::string> invalid;
  std::vector<int32_t> prompt;
  bool tokenizer_internal = false;
};

void CheckIds(const char* field, const google::protobuf::RepeatedField<int32_t>& ids, int64_t vocab,
              std::vector<std::string>* invalid) {
  for (int i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      invalid->push_back(field);
      return;
    }
  }
}

Verdict Judge(const v1::GenerateRequest& r, const engine::ModelConfig& config,
              const engine::Tokenizer* tokenizer, int32_t speculative_limit) {
  Verdict v;
  std::vector<std::string>& bad = v.invalid;
  if (r.request_id().size() > 128) bad.push_back("request_id");
  switch (r.input_case()) {
    case v1::GenerateRequest::kPrompt: {
      if (r.prompt().empty() || tokenizer == nullptr || !IsStrictUtf8(r.prompt())) {
        bad.push_back("prompt");
        break;
      }
      absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(r.prompt(), true);
      if (!ids.ok()) {
        if (ids.status().code() == absl::StatusCode::kInternal) {
          v.tokenizer_internal = true;
        } else {
          bad.push_back("prompt");
        }
        break;
      }
      bool in_vocab = !ids->empty();
      for (int32_t id : *ids) in_vocab = in_vocab && id >= 0 && id < config.vocab_size;
      if (!in_vocab) bad.push_back("prompt");
      v.prompt = *ids;
      break;
    }
    case v1::GenerateRequest::kPromptTokenIds: {
      const auto& ids = r.prompt_token_ids().ids();
      if (ids.empty()) bad.push_back("prompt_token_ids");
      CheckIds("prompt_token_ids", ids, config.vocab_size, &bad);
      v.prompt.assign(ids.begin(), ids.end());
      break;
    }
    case v1::GenerateRequest::INPUT_NOT_SET:
      bad.push_back("prompt");
      break;
  }
  const v1::SamplingParams& s = r.sampling();
  if (s.has_temperature() && !In(s.temperature(), 0.0f, false, INFINITY)) {
    bad.push_back("sampling.temperature");
  }
  if (s.has_top_k() && s.top_k() < 0) bad.push_back("sampling.top_k");
  if (s.has_top_p() && !In(s.top_p(), 0.0f, true, 1.0f)) bad.push_back("sampling.top_p");
  if (s.has_min_p() && !In(s.min_p(), 0.0f, false, 1.0f)) bad.push_back("sampling.min_p");
  if (s.has_repetition_penalty() && !In(s.repetition_penalty(), 0.0f, true, INFINITY)) {
    bad.push_back("sampling.repetition_penalty");
  }
  if (s.has_presence_penalty() && !In(s.presence_penalty(), -2.0f, false, 2.0f)) {
    bad.push_back("sampling.presence_penalty");
  }
  if (s.has_frequency_penalty() && !In(s.frequency_penalty(), -2.0f, false, 2.0f)) {
    bad.push_back("sampling.frequency_penalty");
  }
  const v1::StoppingCriteria& st = r.stopping();
  if (st.has_max_new_tokens() && st.max_new_tokens() < 1) bad.push_back("stopping.max_new_tokens");
  if (st.stop_size() > server::kMaxStopStrings) bad.push_back("stopping.stop");
  for (const std::string& stop : st.stop()) {
    if (stop.empty() || stop.size() > server::kMaxStopStringBytes) {
      bad.push_back("stopping.stop");
      break;
    }
  }
  CheckIds("stopping.stop_token_ids", st.stop_token_ids(), config.vocab_size, &bad);
  if (r.top_logprobs() < 0 || r.top_logprobs() > 20) bad.push_back("top_logprobs");
  if (r.has_prompt_logprobs() && (r.prompt_logprobs() < 0 || r.prompt_logprobs() > 20)) {
    bad.push_back("prompt_logprobs");
  }
  if (r.routing().has_threshold() &&
      !(r.routing().threshold() > 0.0 && r.routing().threshold() < 1.0)) {
    bad.push_back("routing.threshold");
  }
  // 0 (off) up to the server's --speculative_tokens; a draft threshold in (0, 1].
  if (r.has_speculative_tokens() &&
      (r.speculative_tokens() < 0 || r.speculative_tokens() > speculative_limit)) {
    bad.push_back("speculative_tokens");
  }
  if (r.has_speculative_threshold() &&
      !(r.speculative_threshold() > 0.0 && r.speculative_threshold() <= 1.0)) {
    bad.push_back("speculative_threshold");
  }
  return v;
}

// True when `message` names `field`: "field: ..." or "field[i]: ...".
bool Names(absl::string_view message, const std::string& field) {
  return absl::StartsWith(message, absl::StrCat(field, ":")) ||
         absl::StartsWith(message, absl::StrCat(field, "["));
}

std::string Describe(const v1::GenerateRequest& r) { return r.ShortDebugString().substr(0, 600); }

}  // namespace

int FuzzRequest(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Model& model = Demo();
  const uint8_t flags = data[0];
  ++data, --size;
  v1::GenerateRequest request;
  std::optional<std::string> text;
  if (flags & kSplitTextPrompt) {
    if (size < 2) return 0;
    const size_t n = std::min<size_t>(data[0] | (size_t{data[1]} << 8), size - 2);
    if (!request.ParseFromArray(data + 2, static_cast<int>(n))) return 0;
    text.emplace(reinterpret_cast<const char*>(data + 2 + n), size - 2 - n);
    request.set_prompt(*text);  // not UTF-8-checked here: the validator must do it
  } else if (!request.ParseFromArray(data, static_cast<int>(size))) {
    return 0;
  }
  const engine::ModelConfig& config = (flags & kShortContext) ? model.short_config : model.config;
  const engine::Tokenizer* tokenizer = (flags & kNoTokenizer) ? nullptr : model.tokenizer;
  const absl::Time deadline =
      (flags & kNoDeadline) ? absl::InfiniteFuture() : absl::FromUnixSeconds(2000000000);

  // No operator limits (RequestLimits{}) allow up to the engine's most speculative tokens.
  server::RequestLimits limits;
  if (flags & kLowSpeculativeLimit) limits.max_speculative_tokens = kLowSpeculativeTokens;

  const Verdict v = Judge(request, config, tokenizer, limits.max_speculative_tokens);
  absl::StatusOr<engine::LoopRequest> out =
      server::ToLoopRequest(request, config, tokenizer, deadline, limits);
  const int32_t max_new = request.stopping().has_max_new_tokens()
                              ? request.stopping().max_new_tokens()
                              : server::kDefaultMaxNewTokens;
  const bool too_long =
      static_cast<int64_t>(v.prompt.size()) + max_new > static_cast<int64_t>(config.max_seq_len);

  if (!out.ok()) {
    const absl::Status& s = out.status();
    const std::string why =
        absl::StrCat(s.ToString(), "\n  for ", Describe(request), "\n  oracle: invalid = [",
                     absl::StrJoin(v.invalid, ","), "], too_long = ", too_long);
    if (s.code() == absl::StatusCode::kInternal) {
      FUZZ_CHECK(v.tokenizer_internal, absl::StrCat("Internal without a tokenizer failure: ", why));
      return 0;
    }
    if (!v.invalid.empty()) {
      FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument,
                 absl::StrCat("an invalid field must give InvalidArgument: ", why));
      bool named = false;
      for (const std::string& f : v.invalid) named = named || Names(s.message(), f);
      FUZZ_CHECK(named, absl::StrCat("the message must name an invalid field: ", why));
      return 0;
    }
    FUZZ_CHECK(!v.tokenizer_internal, absl::StrCat("tokenizer failed, yet: ", why));
    FUZZ_CHECK(too_long, absl::StrCat("a request valid by the proto's rules was refused: ", why));
    FUZZ_CHECK(s.code() == absl::StatusCode::kOutOfRange &&
                   absl::StrContains(s.message(), "stopping.max_new_tokens") &&
                   absl::StrContains(s.message(), absl::StrCat(config.max_seq_len)),
               absl::StrCat("an over-long request must be OutOfRange naming max_new_tokens and ",
                            "max_seq_len: ", why));
    return 0;
  }

  // Accepted: the oracle must agree, and every field must arrive as sent (or as its default).
  const std::string what = Describe(request);
  FUZZ_CHECK(
      v.invalid.empty() && !v.tokenizer_internal,
      absl::StrCat("accepted although [", absl::StrJoin(v.invalid, ","), "] are invalid: ", what));
  FUZZ_CHECK(!too_long, absl::StrCat("accepted past max_seq_len ", config.max_seq_len, ": ", what));
  const engine::Request& r = out->request;
  const engine::SamplingParams& sp = r.sampling;
  FUZZ_CHECK(out->request_id == request.request_id(), "request_id changed");
  FUZZ_CHECK(out->deadline == deadline, "deadline changed");
  FUZZ_CHECK(r.prompt == v.prompt,
             absl::StrCat("prompt is [", absl::StrJoin(r.prompt, ","), "], expected [",
                          absl::StrJoin(v.prompt, ","), "]: ", what));
  FUZZ_CHECK(!r.prompt.empty(), "empty prompt accepted");
  for (int32_t id : r.prompt) {
    FUZZ_CHECK(id >= 0 && id < config.vocab_size, absl::StrCat("prompt id ", id, " outside vocab"));
  }
  FUZZ_CHECK(static_cast<int64_t>(r.prompt.size()) + sp.max_new_tokens <= config.max_seq_len,
             "prompt + max_new_tokens > max_seq_len");
  FUZZ_CHECK(sp.max_new_tokens == max_new && sp.max_new_tokens >= 1, "max_new_tokens");

  const v1::SamplingParams& s = request.sampling();
  FUZZ_CHECK(sp.temperature == (s.has_temperature() ? s.temperature() : 0.0f), "temperature");
  FUZZ_CHECK(std::isfinite(sp.temperature) && sp.temperature >= 0.0f, "temperature range");
  FUZZ_CHECK(sp.top_k == (s.has_top_k() ? s.top_k() : 0) && sp.top_k >= 0, "top_k");
  FUZZ_CHECK(sp.top_p == (s.has_top_p() ? s.top_p() : 1.0f), "top_p");
  FUZZ_CHECK(sp.top_p > 0.0f && sp.top_p <= 1.0f, "top_p outside (0, 1]");
  FUZZ_CHECK(sp.min_p == (s.has_min_p() ? s.min_p() : 0.0f), "min_p");
  FUZZ_CHECK(sp.min_p >= 0.0f && sp.min_p <= 1.0f, "min_p outside [0, 1]");
  FUZZ_CHECK(sp.repetition_penalty == (s.has_repetition_penalty() ? s.repetition_penalty() : 1.0f),
             "repetition_penalty");
  FUZZ_CHECK(sp.presence_penalty == (s.has_presence_penalty() ? s.presence_penalty() : 0.0f),
             "presence_penalty");
  FUZZ_CHECK(sp.frequency_penalty == (s.has_frequency_penalty() ? s.frequency_penalty() : 0.0f),
             "frequency_penalty");
  FUZZ_CHECK(sp.seed == (s.has_seed() ? std::optional<uint64_t>(s.seed()) : std::nullopt), "seed");
  const v1::StoppingCriteria& st = request.stopping();
  FUZZ_CHECK(sp.stop_strings == std::vector<std::string>(st.stop().begin(), st.stop().end()),
             "stop strings");
  FUZZ_CHECK(sp.stop_token_ids ==
                 std::vector<int32_t>(st.stop_token_ids().begin(), st.stop_token_ids().end()),
             "stop_token_ids");
  for (int32_t id : sp.stop_token_ids) {
    FUZZ_CHECK(id >= 0 && id < config.vocab_size, absl::StrCat("stop id ", id, " outside vocab"));
  }
  FUZZ_CHECK(sp.ignore_eos == st.ignore_eos(), "ignore_eos");
  FUZZ_CHECK(sp.top_logprobs == request.top_logprobs(), "top_logprobs");
  FUZZ_CHECK(r.prompt_logprobs == (request.has_prompt_logprobs() ? request.prompt_logprobs() : -1),
             "prompt_logprobs");
  FUZZ_CHECK(r.threshold == (request.routing().has_threshold()
                                 ? std::optional<double>(request.routing().threshold())
                                 : std::nullopt),
             "threshold");
  if (r.threshold) FUZZ_CHECK(*r.threshold > 0.0 && *r.threshold < 1.0, "threshold range");
  FUZZ_CHECK(r.speculative_tokens == (request.has_speculative_tokens()
                                          ? std::optional<int32_t>(request.speculative_tokens())
                                          : std::nullopt),
             "speculative_tokens");
  FUZZ_CHECK(
      r.speculative_threshold == (request.has_speculative_threshold()
                                      ? std::optional<double>(request.speculative_threshold())
                                      : std::nullopt),
      "speculative_threshold");
  const absl::Status engine_ok = engine::Validate(sp);
  FUZZ_CHECK(engine_ok.ok(),
             absl::StrCat("accepted, but the engine refuses: ", engine_ok.ToString(), ": ", what));
  return 0;
}

}  // namespace modserve::fuzz
