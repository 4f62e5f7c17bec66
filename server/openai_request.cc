// ParseOpenAiRequest: JSON types first (each error names the field), then the shared rules. The
// body is parsed as ordered JSON (message and tool order matter to chat templates); nlohmann's
// parser validates UTF-8 and reports the byte offset of a syntax error.
#include "server/openai_request.h"

#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "nlohmann/json.hpp"

namespace modserve::server {
namespace {

using json = nlohmann::ordered_json;

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

const char* TypeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    default:
      return "something else";
  }
}

// The field, or null when absent or JSON null (OpenAI treats both as "not given").
const json* Get(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::optional<double>> Number(const json& body, const char* name) {
  const json* v = Get(body, name);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number()) return Bad(name, absl::StrCat("must be a number, got ", TypeName(*v)));
  return std::optional<double>(v->get<double>());
}

// An integer; 2.0 counts (JSON has one number type), 2.5 does not.
absl::StatusOr<std::optional<int64_t>> IntegerValue(const json& v, absl::string_view name) {
  if (v.is_number_integer()) return std::optional<int64_t>(v.get<int64_t>());
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) return Bad(name, "is too large");
    return std::optional<int64_t>(static_cast<int64_t>(u));
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e18) {
      return std::optional<int64_t>(static_cast<int64_t>(d));
    }
  }
  return Bad(name, absl::StrCat("must be an integer, got ", TypeName(v)));
}

absl::StatusOr<std::optional<int64_t>> Integer(const json& body, const char* name) {
  const json* v = Get(body, name);
  if (v == nullptr) return std::optional<int64_t>();
  return IntegerValue(*v, name);
}

absl::StatusOr<std::optional<bool>> Bool(const json& body, const char* name) {
  const json* v = Get(body, name);
  if (v == nullptr) return std::optional<bool>();
  if (!v->is_boolean()) return Bad(name, absl::StrCat("must be a boolean, got ", TypeName(*v)));
  return std::optional<bool>(v->get<bool>());
}

absl::StatusOr<std::optional<std::string>> String(const json& body, const char* name) {
  const json* v = Get(body, name);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) return Bad(name, absl::StrCat("must be a string, got ", TypeName(*v)));
  return std::optional<std::string>(v->get<std::string>());
}

absl::StatusOr<std::vector<int64_t>> TokenIds(const json& v, absl::string_view name) {
  std::vector<int64_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    MODSERVE_ASSIGN_OR_RETURN(std::optional<int64_t> id,
                              IntegerValue(v[i], absl::StrCat(name, "[", i, "]")));
    ids.push_back(*id);
  }
  return ids;
}

// The sampling and stopping fields both endpoints share.
absl::Status CommonFields(const json& body, GenerationFields* f, OpenAiRequest* out) {
  MODSERVE_ASSIGN_OR_RETURN(f->temperature, Number(body, "temperature"));
  // OpenAI's default temperature is 1, not greedy.
  if (!f->temperature) f->temperature = 1.0;
  MODSERVE_ASSIGN_OR_RETURN(std::optional<int64_t> top_k, Integer(body, "top_k"));
  if (top_k && *top_k != -1) f->top_k = *top_k;  // -1 = off, as vLLM spells it
  MODSERVE_ASSIGN_OR_RETURN(f->top_p, Number(body, "top_p"));
  MODSERVE_ASSIGN_OR_RETURN(f->min_p, Number(body, "min_p"));
  MODSERVE_ASSIGN_OR_RETURN(f->repetition_penalty, Number(body, "repetition_penalty"));
  MODSERVE_ASSIGN_OR_RETURN(f->presence_penalty, Number(body, "presence_penalty"));
  MODSERVE_ASSIGN_OR_RETURN(f->frequency_penalty, Number(body, "frequency_penalty"));
  MODSERVE_ASSIGN_OR_RETURN(std::optional<int64_t> seed, Integer(body, "seed"));
  if (seed) f->seed = static_cast<uint64_t>(*seed);  // any int64: its two's complement bits
  if (const json* stop = Get(body, "stop")) {
    if (stop->is_string()) {
      f->stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (size_t i = 0; i < stop->size(); ++i) {
        if (!(*stop)[i].is_string()) {
          return Bad(absl::StrCat("stop[", i, "]"),
                     absl::StrCat("must be a string, got ", TypeName((*stop)[i])));
        }
        f->stop.push_back((*stop)[i].get<std::string>());
      }
    } else {
      return Bad("stop",
                 absl::StrCat("must be a string or an array of strings, got ", TypeName(*stop)));
    }
  }
  if (const json* ids = Get(body, "stop_token_ids")) {
    if (!ids->is_array()) return Bad("stop_token_ids", "must be an array of token ids");
    MODSERVE_ASSIGN_OR_RETURN(f->stop_token_ids, TokenIds(*ids, "stop_token_ids"));
  }
  MODSERVE_ASSIGN_OR_RETURN(std::optional<bool> ignore_eos, Bool(body, "ignore_eos"));
  f->ignore_eos = ignore_eos.value_or(false);
  MODSERVE_ASSIGN_OR_RETURN(f->threshold, Number(body, "routing_threshold"));
  MODSERVE_ASSIGN_OR_RETURN(f->speculative_tokens, Integer(body, "speculative_tokens"));
  MODSERVE_ASSIGN_OR_RETURN(f->speculative_threshold, Number(body, "speculative_threshold"));
  MODSERVE_ASSIGN_OR_RETURN(std::optional<bool> routing, Bool(body, "return_routing"));
  out->return_routing = routing.value_or(false);

  MODSERVE_ASSIGN_OR_RETURN(std::optional<int64_t> n, Integer(body, "n"));
  if (n && *n != 1) return Bad("n", absl::StrCat(*n, " is not supported; only n = 1"));
  MODSERVE_ASSIGN_OR_RETURN(std::optional<int64_t> best_of, Integer(body, "best_of"));
  if (best_of && *best_of != 1) {
    return Bad("best_of", absl::StrCat(*best_of, " is not supported; only best_of = 1"));
  }
  if (const json* bias = Get(body, "logit_bias")) {
    if (!bias->is_object()) return Bad("logit_bias", "must be an object");
    if (!bias->empty()) return Bad("logit_bias", "is not supported by this server");
  }
  MODSERVE_ASSIGN_OR_RETURN(std::optional<std::string> user, String(body, "user"));
  (void)user;  // accepted and unused, as OpenAI's is for abuse monitoring

  MODSERVE_ASSIGN_OR_RETURN(std::optional<bool> stream, Bool(body, "stream"));
  out->stream = stream.value_or(false);
  if (const json* options = Get(body, "stream_options")) {
    if (!options->is_object()) return Bad("stream_options", "must be an object");
    if (!out->stream) return Bad("stream_options", "is only allowed with stream: true");
    if (const json* usage = Get(*options, "include_usage")) {
      if (!usage->is_boolean()) {
        return Bad("stream_options.include_usage",
                   absl::StrCat("must be a boolean, got ", TypeName(*usage)));
      }
      out->include_usage = usage->get<bool>();
    }
  }
  return absl::OkStatus();
}

absl::Status CompletionFields(const json& body, const OpenAiModel& model,
                              std::vector<GenerationFields>* prompts, OpenAiRequest* out) {
  GenerationFields common;
  MODSERVE_RETURN_IF_ERROR(CommonFields(body, &common, out));
  MODSERVE_ASSIGN_OR_RETURN(common.max_new_tokens, Integer(body, "max_tokens"));
  MODSERVE_ASSIGN_OR_RETURN(std::optional<bool> echo, Bool(body, "echo"));
  out->echo = echo.value_or(false);
  MODSERVE_ASSIGN_OR_RETURN(std::optional<int64_t> logprobs, Integer(body, "logprobs"));
  if (logprobs) {
    if (*logprobs < 0 || *logprobs > engine::kMaxTopLogprobs) {
      return Bad("logprobs",
                 absl::StrCat(*logprobs, " is not in [0, ", engine::kMaxTopLogprobs, "]"));
    }
    out->logprobs = static_cast<int32_t>(*logprobs);
    common.top_logprobs = *logprobs;
    // Echoed prompt tokens carry their logprobs too (what lm-eval's loglikelihood reads).
    if (out->echo) common.prompt_logprobs = *logprobs;
  }
  MODSERVE_ASSIGN_OR_RETURN(std::optional<std::string> suffix, String(body, "suffix"));
  if (suffix && !suffix->empty()) return Bad("suffix", "is not supported by this server");

  const json* prompt = Get(body, "prompt");
  if (prompt == nullptr) return Bad("prompt", "is required");
  auto add_text = [&](const std::string& text) {
    GenerationFields f = common;
    f.prompt_text = text;
    prompts->push_back(std::move(f));
    out->prompt_texts.push_back(text);
  };
  auto add_ids = [&](const json& ids, absl::string_view name) -> absl::Status {
    GenerationFields f = common;
    MODSERVE_ASSIGN_OR_RETURN(std::vector<int64_t> parsed, TokenIds(ids, name));
    f.prompt_ids = std::move(parsed);
    prompts->push_back(std::move(f));
    out->prompt_texts.emplace_back();  // filled once the ids are checked
    return absl::OkStatus();
  };
  constexpr absl::string_view kShapes =
      "must be a string, an array of strings, an array of token ids, or an array of arrays of "
      "token ids";
  if (prompt->is_string()) {
    add_text(prompt->get<std::string>());
  } else if (prompt->is_array()) {
    if (prompt->empty()) return Bad("prompt", "must not be empty");
    const json& first = prompt->front();
    if (first.is_number()) {
      MODSERVE_RETURN_IF_ERROR(add_ids(*prompt, "prompt"));
    } else {
      if (prompt->size() > kMaxPromptsPerRequest) {
        return Bad("prompt", absl::StrCat(prompt->size(), " prompts; at most ",
                                          kMaxPromptsPerRequest, " per request"));
      }
      for (size_t i = 0; i < prompt->size(); ++i) {
        const json& p = (*prompt)[i];
        const std::string name = absl::StrCat("prompt[", i, "]");
        if (p.is_string() && first.is_string()) {
          add_text(p.get<std::string>());
        } else if (p.is_array() && first.is_array()) {
          MODSERVE_RETURN_IF_ERROR(add_ids(p, name));
        } else {
          return Bad(name, absl::StrCat(TypeName(p), " mixed with ", TypeName(first),
                                        ": the "
                                        "prompt ",
                                        kShapes));
        }
      }
    }
  } else {
    return Bad("prompt", absl::StrCat(kShapes, ", got ", TypeName(*prompt)));
  }
  (void)model;
  return absl::OkStatus();
}

absl::Status ChatFields(const json& body, const OpenAiModel& model,
                        std::vector<GenerationFields>* prompts, OpenAiRequest* out) {
  GenerationFields f;
  MODSERVE_RETURN_IF_ERROR(CommonFields(body, &f, out));
  MODSERVE_ASSIGN_OR_RETURN(std::optional<int64_t> max_tokens, Integer(body, "max_tokens"));
  MODSERVE_ASSIGN_OR_RETURN(std::optional<int64_t> max_completion,
                            Integer(body, "max_completion_tokens"));
  f.max_new_tokens = max_completion ? max_completion : max_tokens;
  // Unset, a chat reply may use whatever context the conversation leaves (OpenAI's default).
  f.max_new_tokens_fill_context = true;
  MODSERVE_ASSIGN_OR_RETURN(std::optional<bool> logprobs, Bool(body, "logprobs"));
  MODSERVE_ASSIGN_OR_RETURN(std::optional<int64_t> top, Integer(body, "top_logprobs"));
  if (top) {
    if (!logprobs.value_or(false)) return Bad("top_logprobs", "needs logprobs: true");
    if (*top < 0 || *top > engine::kMaxTopLogprobs) {
      return Bad("top_logprobs",
                 absl::StrCat(*top, " is not in [0, ", engine::kMaxTopLogprobs, "]"));
    }
  }
  if (logprobs.value_or(false)) {
    out->logprobs = static_cast<int32_t>(top.value_or(0));
    f.top_logprobs = top.value_or(0);
  }
  if (const json* tools = Get(body, "tools")) {
    if (!tools->is_array()) return Bad("tools", "must be an array");
    if (!tools->empty()) return Bad("tools", "function calling is not supported by this server");
  }
  if (const json* format = Get(body, "response_format")) {
    if (!format->is_object()) return Bad("response_format", "must be an object");
    auto type = format->find("type");
    if (type == format->end() || !type->is_string() || *type != "text") {
      return Bad("response_format.type", "only \"text\" is supported by this server");
    }
  }
  MODSERVE_ASSIGN_OR_RETURN(std::optional<bool> add_generation_prompt,
                            Bool(body, "add_generation_prompt"));
  auto messages = body.find("messages");
  if (messages == body.end()) return Bad("messages", "is required");
  if (model.chat_template == nullptr) {
    if (!model.chat_template_status.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("messages: the model's chat template cannot be used (",
                       model.chat_template_status.message(),
                       "); start modserve with --chat_template FILE, or use /v1/completions"));
    }
    return absl::FailedPreconditionError(
        "messages: the model has no chat template (none in tokenizer_config.json or the GGUF "
        "file); start modserve with --chat_template FILE, or use /v1/completions");
  }
  MODSERVE_ASSIGN_OR_RETURN(std::string text, model.chat_template->Apply(
                                                  *messages, add_generation_prompt.value_or(true)));
  f.prompt_text = std::move(text);
  f.add_special_tokens = false;  // the template wrote the special tokens it wants
  prompts->push_back(std::move(f));
  out->prompt_texts.emplace_back();
  return absl::OkStatus();
}

}  // namespace

int HttpStatusFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      // A request that could never fit the KV cache will not fit on a retry either.
      return absl::StrContains(status.message(), "--kv_cache_bytes") ? 400 : 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:  // Internal, Unknown, DataLoss (absl's enum reserves more values)
      break;
  }
  return 500;
}

namespace {

// The field a validation message starts with: "top_p: ..." and "messages[2].content: ...".
std::optional<std::string> ParamOf(absl::string_view message) {
  const size_t colon = message.find(": ");
  if (colon == absl::string_view::npos || colon == 0) return std::nullopt;
  const absl::string_view field = message.substr(0, colon);
  for (char c : field) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != '.' && c != '[' && c != ']' && c != '-') {
      return std::nullopt;
    }
  }
  if (field == "body") return std::nullopt;
  return std::string(field);
}

json ErrorObject(const absl::Status& status) {
  const int http = HttpStatusFor(status);
  const bool internal = http == 500;
  std::string type = "invalid_request_error";
  json code = nullptr;
  switch (http) {
    case 401:
      type = "authentication_error";
      code = "invalid_api_key";
      break;
    case 403:
      type = "permission_error";
      break;
    case 404:
      type = "not_found_error";
      if (absl::StartsWith(status.message(), "model:")) code = "model_not_found";
      break;
    case 429:
      type = "rate_limit_error";
      code = "rate_limit_exceeded";
      break;
    case 499:
      type = "cancelled";
      break;
    case 500:
    case 501:
    case 503:
    case 504:
      type = "server_error";
      break;
    default:
      if (status.code() == absl::StatusCode::kOutOfRange &&
          absl::StrContains(status.message(), "max_seq_len")) {
        code = "context_length_exceeded";
      }
  }
  const std::optional<std::string> param = internal ? std::nullopt : ParamOf(status.message());
  return {{"error",
           {{"message", internal ? std::string("internal server error (details are in the server "
                                               "log)")
                                 : std::string(status.message())},
            {"type", type},
            {"param", param ? json(*param) : json(nullptr)},
            {"code", code}}}};
}

}  // namespace

std::string ErrorJson(const absl::Status& status) {
  // Replace rather than throw on invalid UTF-8: a reply must never fail.
  return ErrorObject(status).dump(-1, ' ', false, json::error_handler_t::replace);
}

const FieldNames& OpenAiFieldNames(OpenAiEndpoint endpoint) {
  static constexpr FieldNames kCompletions{
      .request_id = "x-request-id",
      .prompt = "prompt",
      .prompt_token_ids = "prompt",
      .temperature = "temperature",
      .top_k = "top_k",
      .top_p = "top_p",
      .min_p = "min_p",
      .repetition_penalty = "repetition_penalty",
      .presence_penalty = "presence_penalty",
      .frequency_penalty = "frequency_penalty",
      .max_new_tokens = "max_tokens",
      .stop = "stop",
      .stop_token_ids = "stop_token_ids",
      .top_logprobs = "logprobs",
      .prompt_logprobs = "logprobs",
      .threshold = "routing_threshold",
      .speculative_tokens = "speculative_tokens",
      .speculative_threshold = "speculative_threshold",
  };
  static constexpr FieldNames kChat = [] {
    FieldNames n = kCompletions;
    n.prompt = "messages";
    n.prompt_token_ids = "messages";
    n.max_new_tokens = "max_completion_tokens";
    n.top_logprobs = "top_logprobs";
    return n;
  }();
  return endpoint == OpenAiEndpoint::kCompletions ? kCompletions : kChat;
}

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiEndpoint endpoint, absl::string_view body,
                                                 const OpenAiModel& model, absl::Time deadline) {
  json parsed;
  try {
    parsed = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    // nlohmann's message names the byte offset and the problem (syntax, invalid UTF-8).
    return Bad("body", absl::StrCat("not valid JSON: ", e.what()));
  }
  if (!parsed.is_object()) {
    return Bad("body", absl::StrCat("must be a JSON object, got ", TypeName(parsed)));
  }
  OpenAiRequest out;
  out.endpoint = endpoint;
  MODSERVE_ASSIGN_OR_RETURN(std::optional<std::string> name, String(parsed, "model"));
  if (name && *name != model.name) {
    return absl::NotFoundError(absl::StrCat("model: '", *name,
                                            "' is not served here; this "
                                            "server serves '",
                                            model.name, "' (GET /v1/models)"));
  }
  std::vector<GenerationFields> prompts;
  if (endpoint == OpenAiEndpoint::kCompletions) {
    MODSERVE_RETURN_IF_ERROR(CompletionFields(parsed, model, &prompts, &out));
  } else {
    MODSERVE_RETURN_IF_ERROR(ChatFields(parsed, model, &prompts, &out));
  }
  const FieldNames& names = OpenAiFieldNames(endpoint);
  for (size_t i = 0; i < prompts.size(); ++i) {
    absl::StatusOr<engine::LoopRequest> r = ValidateGeneration(
        prompts[i], names, *model.config, model.tokenizer, deadline, model.limits);
    if (!r.ok()) {
      if (prompts.size() == 1 || !absl::StartsWith(r.status().message(), "prompt")) {
        return r.status();
      }
      // Name the prompt of a list ("prompt[2]: ...").
      return absl::Status(r.status().code(),
                          absl::StrCat("prompt[", i, "]",
                                       r.status().message().substr(std::string("prompt").size())));
    }
    if (out.echo && prompts[i].prompt_ids && model.tokenizer != nullptr) {
      absl::StatusOr<std::string> text =
          model.tokenizer->Decode(r->request.prompt, /*skip_special_tokens=*/false);
      if (text.ok()) out.prompt_texts[i] = *std::move(text);
    }
    out.requests.push_back(*std::move(r));
  }
  if (!out.echo) out.prompt_texts.clear();
  return out;
}

}  // namespace modserve::server
