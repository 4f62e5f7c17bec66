// Field-by-field checks; engine::Validate runs last as a backstop for anything added later.
#include "server/request_validation.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"

namespace modserve::server {
namespace {

absl::Status Invalid(std::string_view field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(std::string(field), ": ", what));
}

absl::Status CheckTokenIds(std::string_view field,
                           const google::protobuf::RepeatedField<int32_t>& ids,
                           int64_t vocab_size) {
  for (int i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return Invalid(absl::StrCat(std::string(field), "[", i, "]"),
                     absl::StrCat(ids[i], " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRange(std::string_view field, float value, float lo, bool lo_open, float hi) {
  const bool above_lo = lo_open ? value > lo : value >= lo;
  if (!std::isfinite(value) || !above_lo || value > hi) {
    return Invalid(field,
                   absl::StrCat(value, " is not in ", lo_open ? "(" : "[", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckPromptLength(int64_t num_tokens, const RequestLimits& limits) {
  if (limits.max_prompt_tokens > 0 && num_tokens > limits.max_prompt_tokens) {
    return absl::OutOfRangeError(absl::StrCat("prompt: ", num_tokens,
                                              " tokens exceeds --max_prompt_tokens=",
                                              limits.max_prompt_tokens));
  }
  return absl::OkStatus();
}

}  // namespace

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
  engine::LoopRequest out;
  out.deadline = deadline;
  if (request.request_id().size() > kMaxRequestIdBytes) {
    return Invalid("request_id", absl::StrCat(request.request_id().size(), " bytes is longer than ",
                                              kMaxRequestIdBytes));
  }
  out.request_id = request.request_id();
  engine::Request& r = out.request;

  switch (request.input_case()) {
    case v1::GenerateRequest::kPrompt: {
      if (request.prompt().empty()) return Invalid("prompt", "is empty");
      if (tokenizer == nullptr) {
        return Invalid("prompt", "the model has no tokenizer; send prompt_token_ids instead");
      }
      absl::StatusOr<std::vector<int32_t>> ids =
          tokenizer->Encode(request.prompt(), /*add_special_tokens=*/true);
      if (!ids.ok()) {
        if (absl::IsInvalidArgument(ids.status())) {
          return Invalid("prompt", std::string(ids.status().message()));
        }
        return ids.status();
      }
      if (ids->empty()) return Invalid("prompt", "tokenizes to no tokens");
      MODSERVE_RETURN_IF_ERROR(CheckPromptLength(static_cast<int64_t>(ids->size()), limits));
      for (int32_t id : *ids) {
        // A tokenizer larger than the model's embedding table is a checkpoint mismatch, but
        // the request is what names the offending text.
        if (id < 0 || id >= config.vocab_size) {
          return Invalid("prompt", absl::StrCat("tokenizes to id ", id,
                                                ", outside the model's vocabulary [0, ",
                                                config.vocab_size, ")"));
        }
      }
      r.prompt = *std::move(ids);
      break;
    }
    case v1::GenerateRequest::kPromptTokenIds: {
      const auto& ids = request.prompt_token_ids().ids();
      if (ids.empty()) return Invalid("prompt_token_ids", "is empty");
      MODSERVE_RETURN_IF_ERROR(CheckPromptLength(ids.size(), limits));
      MODSERVE_RETURN_IF_ERROR(CheckTokenIds("prompt_token_ids", ids, config.vocab_size));
      r.prompt.assign(ids.begin(), ids.end());
      break;
    }
    case v1::GenerateRequest::INPUT_NOT_SET:
      return Invalid("prompt", "set exactly one of prompt and prompt_token_ids");
  }

  // Unset sampling, or an unset temperature, is greedy.
  engine::SamplingParams& sp = r.sampling;
  sp.temperature = 0.0f;
  if (request.has_sampling()) {
    const v1::SamplingParams& s = request.sampling();
    if (s.has_temperature()) {
      if (!std::isfinite(s.temperature()) || s.temperature() < 0.0f) {
        return Invalid("sampling.temperature", absl::StrCat(s.temperature(), " is not >= 0"));
      }
      sp.temperature = s.temperature();
    }
    if (s.has_top_k()) {
      if (s.top_k() < 0) return Invalid("sampling.top_k", absl::StrCat(s.top_k(), " is < 0"));
      sp.top_k = s.top_k();
    }
    if (s.has_top_p()) {
      MODSERVE_RETURN_IF_ERROR(CheckRange("sampling.top_p", s.top_p(), 0.0f, true, 1.0f));
      sp.top_p = s.top_p();
    }
    if (s.has_min_p()) {
      MODSERVE_RETURN_IF_ERROR(CheckRange("sampling.min_p", s.min_p(), 0.0f, false, 1.0f));
      sp.min_p = s.min_p();
    }
    if (s.has_repetition_penalty()) {
      if (!std::isfinite(s.repetition_penalty()) || s.repetition_penalty() <= 0.0f) {
        return Invalid("sampling.repetition_penalty",
                       absl::StrCat(s.repetition_penalty(), " is not > 0"));
      }
      sp.repetition_penalty = s.repetition_penalty();
    }
    if (s.has_presence_penalty()) {
      MODSERVE_RETURN_IF_ERROR(
          CheckRange("sampling.presence_penalty", s.presence_penalty(), -2.0f, false, 2.0f));
      sp.presence_penalty = s.presence_penalty();
    }
    if (s.has_frequency_penalty()) {
      MODSERVE_RETURN_IF_ERROR(
          CheckRange("sampling.frequency_penalty", s.frequency_penalty(), -2.0f, false, 2.0f));
      sp.frequency_penalty = s.frequency_penalty();
    }
    if (s.has_seed()) sp.seed = s.seed();
  }

  sp.max_new_tokens = limits.max_new_tokens > 0
                          ? std::min(kDefaultMaxNewTokens, limits.max_new_tokens)
                          : kDefaultMaxNewTokens;
  const v1::StoppingCriteria& st = request.stopping();
  if (st.has_max_new_tokens()) {
    if (st.max_new_tokens() < 1) {
      return Invalid("stopping.max_new_tokens", absl::StrCat(st.max_new_tokens(), " is < 1"));
    }
    // Refused rather than clamped: a client asking for more than it can get should know.
    if (limits.max_new_tokens > 0 && st.max_new_tokens() > limits.max_new_tokens) {
      return absl::OutOfRangeError(absl::StrCat("stopping.max_new_tokens: ", st.max_new_tokens(),
                                                " exceeds --max_new_tokens=",
                                                limits.max_new_tokens));
    }
    sp.max_new_tokens = st.max_new_tokens();
  }
  if (st.stop_size() > kMaxStopStrings) {
    return Invalid("stopping.stop",
                   absl::StrCat(st.stop_size(), " stop strings; at most ", kMaxStopStrings));
  }
  for (int i = 0; i < st.stop_size(); ++i) {
    const std::string field = absl::StrCat("stopping.stop[", i, "]");
    if (st.stop(i).empty()) return Invalid(field, "is empty");
    if (st.stop(i).size() > kMaxStopStringBytes) {
      return Invalid(field,
                     absl::StrCat(st.stop(i).size(), " bytes; at most ", kMaxStopStringBytes));
    }
    sp.stop_strings.push_back(st.stop(i));
  }
  if (static_cast<size_t>(st.stop_token_ids_size()) > engine::kMaxStopTokenIds) {
    return Invalid("stopping.stop_token_ids", absl::StrCat(st.stop_token_ids_size(),
                                                           " ids; at most ",
                                                           engine::kMaxStopTokenIds));
  }
  MODSERVE_RETURN_IF_ERROR(
      CheckTokenIds("stopping.stop_token_ids", st.stop_token_ids(), config.vocab_size));
  sp.stop_token_ids.assign(st.stop_token_ids().begin(), st.stop_token_ids().end());
  sp.ignore_eos = st.ignore_eos();

  if (request.top_logprobs() < 0 || request.top_logprobs() > engine::kMaxTopLogprobs) {
    return Invalid("top_logprobs", absl::StrCat(request.top_logprobs(), " is not in [0, ",
                                                engine::kMaxTopLogprobs, "]"));
  }
  sp.top_logprobs = request.top_logprobs();

  if (request.routing().has_threshold()) {
    const double tau = request.routing().threshold();
    if (!(tau > 0.0 && tau < 1.0)) {
      return Invalid("routing.threshold", absl::StrCat(tau, " is not in (0, 1)"));
    }
    r.threshold = tau;
  }

  const int64_t total = static_cast<int64_t>(r.prompt.size()) + sp.max_new_tokens;
  if (total > config.max_seq_len) {
    return absl::OutOfRangeError(absl::StrCat(
        "prompt (", r.prompt.size(), " tokens) + stopping.max_new_tokens (", sp.max_new_tokens,
        ") = ", total, " exceeds the model's max_seq_len ", config.max_seq_len));
  }
  MODSERVE_RETURN_IF_ERROR(engine::Validate(sp));
  return out;
}

}  // namespace modserve::server
