// Converts a GenerateRequest to the engine's request, checking every field against the model
// (vocabulary, context length) and the operator's limits, naming the field (and the flag) in each
// error. It tokenizes text prompts (on the calling gRPC thread, never the engine thread) and does
// no scheduling.
#ifndef MODSERVE_SERVER_REQUEST_VALIDATION_H_
#define MODSERVE_SERVER_REQUEST_VALIDATION_H_

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
};

// `tokenizer` may be null (then text prompts are refused). Thread-safe (reads only).
// InvalidArgument naming the field ("sampling.top_p: 1.5 is not in (0, 1]"); OutOfRange when the
// prompt or stopping.max_new_tokens exceeds its limit ("prompt: 5000 tokens exceeds
// --max_prompt_tokens=4096"), or prompt + stopping.max_new_tokens exceeds the model's max_seq_len.
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
