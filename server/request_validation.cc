// Field-by-field checks in one place for every API; engine::Validate runs last as a backstop for
// anything added later.
#include "server/request_validation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"

namespace modserve::server {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::Status CheckTokenIds(absl::string_view field, const std::vector<int64_t>& ids,
                           int64_t vocab_size) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return Invalid(absl::StrCat(field, "[", i, "]"),
                     absl::StrCat(ids[i], " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRange(absl::string_view field, double value, double lo, bool lo_open,
                        double hi) {
  const bool above_lo = lo_open ? value > lo : value >= lo;
  if (!std::isfinite(value) || !above_lo || value > hi) {
    return Invalid(field,
                   absl::StrCat(value, " is not in ", lo_open ? "(" : "[", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckPromptLength(absl::string_view field, int64_t num_tokens,
                               const RequestLimits& limits) {
  if (limits.max_prompt_tokens > 0 && num_tokens > limits.max_prompt_tokens) {
    return absl::OutOfRangeError(absl::StrCat(field, ": ", num_tokens,
                                              " tokens exceeds --max_prompt_tokens=",
                                              limits.max_prompt_tokens));
  }
  return absl::OkStatus();
}

}  // namespace

const FieldNames& GrpcFieldNames() {
  static constexpr FieldNames kNames{
      .request_id = "request_id",
      .prompt = "prompt",
      .prompt_token_ids = "prompt_token_ids",
      .temperature = "sampling.temperature",
      .top_k = "sampling.top_k",
      .top_p = "sampling.top_p",
      .min_p = "sampling.min_p",
      .repetition_penalty = "sampling.repetition_penalty",
      .presence_penalty = "sampling.presence_penalty",
      .frequency_penalty = "sampling.frequency_penalty",
      .max_new_tokens = "stopping.max_new_tokens",
      .stop = "stopping.stop",
      .stop_token_ids = "stopping.stop_token_ids",
      .top_logprobs = "top_logprobs",
      .prompt_logprobs = "prompt_logprobs",
      .threshold = "routing.threshold",
      .speculative_tokens = "speculative_tokens",
      .speculative_threshold = "speculative_threshold",
  };
  return kNames;
}

absl::StatusOr<engine::LoopRequest> ValidateGeneration(const GenerationFields& f,
                                                       const FieldNames& names,
                                                       const engine::ModelConfig& config,
                                                       const engine::Tokenizer* tokenizer,
                                                       absl::Time deadline,
                                                       const RequestLimits& limits) {
  engine::LoopRequest out;
  out.deadline = deadline;
  if (f.request_id.size() > kMaxRequestIdBytes) {
    return Invalid(names.request_id, absl::StrCat(f.request_id.size(), " bytes is longer than ",
                                                  kMaxRequestIdBytes));
  }
  out.request_id = f.request_id;
  engine::Request& r = out.request;

  if (f.prompt_text.has_value() == f.prompt_ids.has_value()) {
    return Invalid(names.prompt, absl::StrCat("set exactly one of ", names.prompt, " and ",
                                              names.prompt_token_ids));
  }
  if (f.prompt_text.has_value()) {
    if (f.prompt_text->empty()) return Invalid(names.prompt, "is empty");
    if (tokenizer == nullptr) {
      return Invalid(names.prompt, absl::StrCat("the model has no tokenizer; send token ids (",
                                                names.prompt_token_ids, ") instead"));
    }
    absl::StatusOr<std::vector<int32_t>> ids =
        tokenizer->Encode(*f.prompt_text, f.add_special_tokens);
    if (!ids.ok()) {
      if (absl::IsInvalidArgument(ids.status())) {
        return Invalid(names.prompt, ids.status().message());
      }
      return ids.status();
    }
    if (ids->empty()) return Invalid(names.prompt, "tokenizes to no tokens");
    MODSERVE_RETURN_IF_ERROR(
        CheckPromptLength(names.prompt, static_cast<int64_t>(ids->size()), limits));
    for (int32_t id : *ids) {
      // A tokenizer larger than the model's embedding table is a checkpoint mismatch, but
      // the request is what names the offending text.
      if (id < 0 || id >= config.vocab_size) {
        return Invalid(names.prompt, absl::StrCat("tokenizes to id ", id,
                                                  ", outside the model's vocabulary [0, ",
                                                  config.vocab_size, ")"));
      }
    }
    r.prompt = *std::move(ids);
  } else {
    const std::vector<int64_t>& ids = *f.prompt_ids;
    if (ids.empty()) return Invalid(names.prompt_token_ids, "is empty");
    MODSERVE_RETURN_IF_ERROR(
        CheckPromptLength(names.prompt, static_cast<int64_t>(ids.size()), limits));
    MODSERVE_RETURN_IF_ERROR(CheckTokenIds(names.prompt_token_ids, ids, config.vocab_size));
    r.prompt.assign(ids.begin(), ids.end());
  }

  // Unset, the temperature is greedy.
  engine::SamplingParams& sp = r.sampling;
  sp.temperature = 0.0f;
  if (f.temperature) {
    if (!std::isfinite(*f.temperature) || *f.temperature < 0.0) {
      return Invalid(names.temperature, absl::StrCat(*f.temperature, " is not >= 0"));
    }
    sp.temperature = static_cast<float>(*f.temperature);
  }
  if (f.top_k) {
    if (*f.top_k < 0) return Invalid(names.top_k, absl::StrCat(*f.top_k, " is < 0"));
    // Any k at or past the vocabulary keeps every token: saturate rather than overflow int32.
    sp.top_k = static_cast<int32_t>(
        std::min<int64_t>(*f.top_k, std::numeric_limits<int32_t>::max()));
  }
  if (f.top_p) {
    MODSERVE_RETURN_IF_ERROR(CheckRange(names.top_p, *f.top_p, 0.0, true, 1.0));
    sp.top_p = static_cast<float>(*f.top_p);
  }
  if (f.min_p) {
    MODSERVE_RETURN_IF_ERROR(CheckRange(names.min_p, *f.min_p, 0.0, false, 1.0));
    sp.min_p = static_cast<float>(*f.min_p);
  }
  if (f.repetition_penalty) {
    if (!std::isfinite(*f.repetition_penalty) || *f.repetition_penalty <= 0.0) {
      return Invalid(names.repetition_penalty,
                     absl::StrCat(*f.repetition_penalty, " is not > 0"));
    }
    sp.repetition_penalty = static_cast<float>(*f.repetition_penalty);
  }
  if (f.presence_penalty) {
    MODSERVE_RETURN_IF_ERROR(
        CheckRange(names.presence_penalty, *f.presence_penalty, -2.0, false, 2.0));
    sp.presence_penalty = static_cast<float>(*f.presence_penalty);
  }
  if (f.frequency_penalty) {
    MODSERVE_RETURN_IF_ERROR(
        CheckRange(names.frequency_penalty, *f.frequency_penalty, -2.0, false, 2.0));
    sp.frequency_penalty = static_cast<float>(*f.frequency_penalty);
  }
  if (f.seed) sp.seed = *f.seed;

  const int64_t prompt_len = static_cast<int64_t>(r.prompt.size());
  int64_t max_new = limits.max_new_tokens > 0
                        ? std::min(kDefaultMaxNewTokens, limits.max_new_tokens)
                        : kDefaultMaxNewTokens;
  if (f.max_new_tokens) {
    if (*f.max_new_tokens < 1) {
      return Invalid(names.max_new_tokens, absl::StrCat(*f.max_new_tokens, " is < 1"));
    }
    // Refused rather than clamped: a client asking for more than it can get should know.
    if (limits.max_new_tokens > 0 && *f.max_new_tokens > limits.max_new_tokens) {
      return absl::OutOfRangeError(absl::StrCat(names.max_new_tokens, ": ", *f.max_new_tokens,
                                                " exceeds --max_new_tokens=",
                                                limits.max_new_tokens));
    }
    max_new = *f.max_new_tokens;
  } else if (f.max_new_tokens_fill_context) {
    max_new = config.max_seq_len - prompt_len;
    if (limits.max_new_tokens > 0) max_new = std::min<int64_t>(max_new, limits.max_new_tokens);
    if (max_new < 1) {
      return absl::OutOfRangeError(absl::StrCat("prompt (", prompt_len,
                                                " tokens) leaves no room in the model's "
                                                "max_seq_len ",
                                                config.max_seq_len));
    }
  }
  if (f.stop.size() > kMaxStopStrings) {
    return Invalid(names.stop,
                   absl::StrCat(f.stop.size(), " stop strings; at most ", kMaxStopStrings));
  }
  for (size_t i = 0; i < f.stop.size(); ++i) {
    const std::string field = absl::StrCat(names.stop, "[", i, "]");
    if (f.stop[i].empty()) return Invalid(field, "is empty");
    if (f.stop[i].size() > kMaxStopStringBytes) {
      return Invalid(field,
                     absl::StrCat(f.stop[i].size(), " bytes; at most ", kMaxStopStringBytes));
    }
    sp.stop_strings.push_back(f.stop[i]);
  }
  // Checked before the per-id loop: the engine thread hashes every stop id.
  if (f.stop_token_ids.size() > engine::kMaxStopTokenIds) {
    return Invalid(names.stop_token_ids, absl::StrCat(f.stop_token_ids.size(), " ids; at most ",
                                                      engine::kMaxStopTokenIds));
  }
  MODSERVE_RETURN_IF_ERROR(
      CheckTokenIds(names.stop_token_ids, f.stop_token_ids, config.vocab_size));
  sp.stop_token_ids.assign(f.stop_token_ids.begin(), f.stop_token_ids.end());
  sp.ignore_eos = f.ignore_eos;

  if (f.top_logprobs < 0 || f.top_logprobs > engine::kMaxTopLogprobs) {
    return Invalid(names.top_logprobs, absl::StrCat(f.top_logprobs, " is not in [0, ",
                                                    engine::kMaxTopLogprobs, "]"));
  }
  sp.top_logprobs = static_cast<int32_t>(f.top_logprobs);
  if (f.prompt_logprobs) {
    if (*f.prompt_logprobs < 0 || *f.prompt_logprobs > engine::kMaxTopLogprobs) {
      return Invalid(names.prompt_logprobs, absl::StrCat(*f.prompt_logprobs, " is not in [0, ",
                                                         engine::kMaxTopLogprobs, "]"));
    }
    r.prompt_logprobs = static_cast<int32_t>(*f.prompt_logprobs);
  }

  if (f.threshold) {
    const double tau = *f.threshold;
    if (!(tau > 0.0 && tau < 1.0)) {
      return Invalid(names.threshold, absl::StrCat(tau, " is not in (0, 1)"));
    }
    r.threshold = tau;
  }

  if (f.speculative_tokens) {
    const int64_t k = *f.speculative_tokens;
    if (k < 0) return Invalid(names.speculative_tokens, absl::StrCat(k, " is < 0"));
    if (k > limits.max_speculative_tokens) {
      return Invalid(names.speculative_tokens,
                     absl::StrCat(k, " exceeds the server's --speculative_tokens=",
                                  limits.max_speculative_tokens,
                                  " (a request may lower it or set 0, not raise it)"));
    }
    r.speculative_tokens = static_cast<int32_t>(k);
  }
  if (f.speculative_threshold) {
    const double t = *f.speculative_threshold;
    if (!(t > 0.0 && t <= 1.0)) {
      return Invalid(names.speculative_threshold, absl::StrCat(t, " is not in (0, 1]"));
    }
    r.speculative_threshold = t;
  }

  // In int64: a JSON max_tokens may be far beyond int32.
  const int64_t total = prompt_len + max_new;
  if (total > config.max_seq_len) {
    return absl::OutOfRangeError(absl::StrCat("prompt (", prompt_len, " tokens) + ",
                                              names.max_new_tokens, " (", max_new, ") = ", total,
                                              " exceeds the model's max_seq_len ",
                                              config.max_seq_len));
  }
  sp.max_new_tokens = static_cast<int32_t>(max_new);
  MODSERVE_RETURN_IF_ERROR(engine::Validate(sp));
  return out;
}

absl::StatusOr<engine::LoopRequest> ToLoopRequest(const v1::GenerateRequest& request,
                                                  const engine::ModelConfig& config,
                                                  const engine::Tokenizer* tokenizer,
                                                  absl::Time deadline) {
  return ToLoopRequest(request, config, tokenizer, deadline, RequestLimits{});
}

absl::StatusOr<engine::LoopRequest> ToLoopRequest(const v1::GenerateRequest& request,
                                                  const engine::ModelConfig& config,
                                                  const engine::Tokenizer* tokenizer,
                                                  absl::Time deadline,
                                                  const RequestLimits& limits) {
  GenerationFields f;
  f.request_id = request.request_id();
  switch (request.input_case()) {
    case v1::GenerateRequest::kPrompt:
      f.prompt_text = request.prompt();
      break;
    case v1::GenerateRequest::kPromptTokenIds:
      f.prompt_ids.emplace(request.prompt_token_ids().ids().begin(),
                           request.prompt_token_ids().ids().end());
      break;
    case v1::GenerateRequest::INPUT_NOT_SET:
      break;
  }
  if (request.has_sampling()) {
    const v1::SamplingParams& s = request.sampling();
    if (s.has_temperature()) f.temperature = s.temperature();
    if (s.has_top_k()) f.top_k = s.top_k();
    if (s.has_top_p()) f.top_p = s.top_p();
    if (s.has_min_p()) f.min_p = s.min_p();
    if (s.has_repetition_penalty()) f.repetition_penalty = s.repetition_penalty();
    if (s.has_presence_penalty()) f.presence_penalty = s.presence_penalty();
    if (s.has_frequency_penalty()) f.frequency_penalty = s.frequency_penalty();
    if (s.has_seed()) f.seed = s.seed();
  }
  const v1::StoppingCriteria& st = request.stopping();
  if (st.has_max_new_tokens()) f.max_new_tokens = st.max_new_tokens();
  f.stop.assign(st.stop().begin(), st.stop().end());
  f.stop_token_ids.assign(st.stop_token_ids().begin(), st.stop_token_ids().end());
  f.ignore_eos = st.ignore_eos();
  f.top_logprobs = request.top_logprobs();
  if (request.has_prompt_logprobs()) f.prompt_logprobs = request.prompt_logprobs();
  if (request.routing().has_threshold()) f.threshold = request.routing().threshold();
  if (request.has_speculative_tokens()) f.speculative_tokens = request.speculative_tokens();
  if (request.has_speculative_threshold()) {
    f.speculative_threshold = request.speculative_threshold();
  }
  return ValidateGeneration(f, GrpcFieldNames(), config, tokenizer, deadline, limits);
}

}  // namespace modserve::server
