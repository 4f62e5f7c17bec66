// The rules of a generation request, shared by the gRPC and the HTTP (OpenAI) front ends: every
// field checked against the model (vocabulary, context length) and the operator's limits, each
// error naming the field as the caller's API spells it (and the flag). It tokenizes text prompts
// (on the calling thread, never the engine thread) and does no scheduling. The API adapters
// (ToLoopRequest for proto here, server/openai_api.cc for JSON) only check types and map names.
#ifndef MODSERVE_SERVER_REQUEST_VALIDATION_H_
#define MODSERVE_SERVER_REQUEST_VALIDATION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/executor/step_loop.h"
#include "engine/model/config.h"
#include "engine/tokenizer/tokenizer.h"
#include "modserve/v1/modserve.pb.h"

namespace modserve::server {

inline constexpr size_t kMaxRequestIdBytes = 128;
inline constexpr int kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 256;
inline constexpr int32_t kDefaultMaxNewTokens = 16;

// Operator limits on one request (modserve's flags of the same names). 0 = no limit of its own:
// the model's max_seq_len still bounds prompt + stopping.max_new_tokens.
struct RequestLimits {
  // Prompt tokens (after tokenization for text prompts).
  int32_t max_prompt_tokens = 0;
  // The largest stopping.max_new_tokens a request may ask for. An unset stopping.max_new_tokens
  // is kDefaultMaxNewTokens, lowered to this limit when the limit is smaller.
  int32_t max_new_tokens = 0;
  // The most speculative tokens a request may ask for: the server's --speculative_tokens (a
  // request may lower it or turn speculation off, not raise it).
  int32_t max_speculative_tokens = engine::kMaxSpeculativeTokens;
};

// One request's values, whichever API carried them, after that API's type checks. Numbers are
// wide (int64, double) so that out-of-range values from JSON reach the range checks.
struct GenerationFields {
  std::string request_id;
  // Exactly one of the two. Text is tokenized here, with the tokenizer's special tokens (BOS)
  // when add_special_tokens (a chat template already wrote its own).
  std::optional<std::string> prompt_text;
  std::optional<std::vector<int64_t>> prompt_ids;
  bool add_special_tokens = true;
  std::optional<double> temperature;  // unset: greedy
  std::optional<int64_t> top_k;
  std::optional<double> top_p;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;
  std::optional<double> presence_penalty;
  std::optional<double> frequency_penalty;
  std::optional<uint64_t> seed;
  // Unset: kDefaultMaxNewTokens (lowered to the limit), or, with max_new_tokens_fill_context,
  // whatever the context leaves after the prompt (lowered to the limit).
  std::optional<int64_t> max_new_tokens;
  bool max_new_tokens_fill_context = false;
  std::vector<std::string> stop;
  std::vector<int64_t> stop_token_ids;
  bool ignore_eos = false;
  int64_t top_logprobs = 0;
  // Set: every prompt token's logprob, with this many alternatives (0..20).
  std::optional<int64_t> prompt_logprobs;
  std::optional<double> threshold;
  // Self-speculative decoding overrides; unset: the engine's defaults (the server's flags).
  std::optional<int64_t> speculative_tokens;
  std::optional<double> speculative_threshold;
};

// How an API names each field in its messages.
struct FieldNames {
  const char* request_id;
  const char* prompt;
  const char* prompt_token_ids;
  const char* temperature;
  const char* top_k;
  const char* top_p;
  const char* min_p;
  const char* repetition_penalty;
  const char* presence_penalty;
  const char* frequency_penalty;
  const char* max_new_tokens;
  const char* stop;
  const char* stop_token_ids;
  const char* top_logprobs;
  const char* prompt_logprobs;
  const char* threshold;
  const char* speculative_tokens;
  const char* speculative_threshold;
};

// modserve.v1.GenerateRequest's names ("sampling.top_p", "stopping.max_new_tokens", ...).
const FieldNames& GrpcFieldNames();

// `tokenizer` may be null (then text prompts are refused). Thread-safe (reads only).
// InvalidArgument naming the field ("sampling.top_p: 1.5 is not in (0, 1]"); OutOfRange when the
// prompt or max_new_tokens exceeds its limit ("prompt: 5000 tokens exceeds
// --max_prompt_tokens=4096"), or prompt + max_new_tokens exceeds the model's max_seq_len.
absl::StatusOr<engine::LoopRequest> ValidateGeneration(const GenerationFields& fields,
                                                       const FieldNames& names,
                                                       const engine::ModelConfig& config,
                                                       const engine::Tokenizer* tokenizer,
                                                       absl::Time deadline,
                                                       const RequestLimits& limits);

// The gRPC adapter: proto -> GenerationFields -> ValidateGeneration with GrpcFieldNames().
absl::StatusOr<engine::LoopRequest> ToLoopRequest(const v1::GenerateRequest& request,
                                                  const engine::ModelConfig& config,
                                                  const engine::Tokenizer* tokenizer,
                                                  absl::Time deadline,
                                                  const RequestLimits& limits);
// No operator limits (RequestLimits{}).
absl::StatusOr<engine::LoopRequest> ToLoopRequest(const v1::GenerateRequest& request,
                                                  const engine::ModelConfig& config,
                                                  const engine::Tokenizer* tokenizer,
                                                  absl::Time deadline);

}  // namespace modserve::server

#endif  // MODSERVE_SERVER_REQUEST_VALIDATION_H_
