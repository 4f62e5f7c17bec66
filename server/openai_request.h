// OpenAI request bodies (/v1/completions, /v1/chat/completions) -> engine requests: JSON type
// checks naming the field as OpenAI spells it, OpenAI's defaults, the fields this server refuses
// rather than ignores (n > 1, suffix, logit_bias, tools, non-text response formats), chat
// messages through the model's template, then the rules every API shares
// (request_validation.h); and the other way, a status as OpenAI's error object. No I/O, no
// engine: it only reads the model's config and tokenizer.
#ifndef MODSERVE_SERVER_OPENAI_REQUEST_H_
#define MODSERVE_SERVER_OPENAI_REQUEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "engine/executor/step_loop.h"
#include "engine/model/config.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/chat_template.h"
#include "server/request_validation.h"

namespace modserve::server {

enum class OpenAiEndpoint { kCompletions, kChatCompletions };

// A completions request may carry a list of prompts (one choice each); at most this many.
inline constexpr int kMaxPromptsPerRequest = 128;

// What the request is checked against; every pointer must outlive the call (chat_template and
// tokenizer may be null: chat and text prompts are then refused with a 400 that says why).
struct OpenAiModel {
  std::string name;  // the served model name ("model" must match it when given)
  const engine::ModelConfig* config = nullptr;
  const engine::Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;
  // Why chat_template is null when the model has a template that does not parse (the 400 on
  // chat says so).
  absl::Status chat_template_status;
  RequestLimits limits;
};

struct OpenAiRequest {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  // One engine request per prompt, in order (choice index = position).
  std::vector<engine::LoopRequest> requests;
  // Completions with echo: each prompt's text (as sent, or decoded from its token ids).
  std::vector<std::string> prompt_texts;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // completions only
  // Completions: `logprobs` (alternatives per token, 0..20), -1 when absent. Chat: 0..20 from
  // top_logprobs when `logprobs` is true, else -1.
  int32_t logprobs = -1;
  bool return_routing = false;  // MoD extension: the routing summary in each choice
};

// `body` is the raw request body. InvalidArgument "<field>: ..." (a 400 naming the field, also
// for malformed JSON: "body: ..."); OutOfRange for prompts or max_tokens past a limit; NotFound
// "model: ..." when the request names another model; FailedPrecondition when the model cannot
// serve the request at all (chat without a chat template, text without a tokenizer).
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiEndpoint endpoint, absl::string_view body,
                                                 const OpenAiModel& model, absl::Time deadline);

// absl status -> HTTP status, as the OpenAI API uses them: 400 for invalid requests (and
// requests too long for the model or the cache), 401, 403, 404, 429 for limits a retry may clear
// (the concurrent-request bound, a full queue), 499 when the client cancelled, 500, 501, 503
// when draining or unhealthy, 504 for an expired deadline.
int HttpStatusFor(const absl::Status& status);

// OpenAI's error object: {"error": {"message", "type", "param", "code"}}, `param` being the
// field a validation message starts with ("top_p: ..." -> "top_p"). Internal details are not
// sent (the caller logs them).
std::string ErrorJson(const absl::Status& status);

// OpenAI's names for the shared rules' messages ("max_tokens", "top_p", "stop", ...).
const FieldNames& OpenAiFieldNames(OpenAiEndpoint endpoint);

}  // namespace modserve::server

#endif  // MODSERVE_SERVER_OPENAI_REQUEST_H_
