// OpenAI chat messages -> prompt text through the model's Jinja chat template, as transformers'
// apply_chat_template renders it (variables `messages`, `add_generation_prompt`, `bos_token`,
// `eos_token`). It checks the messages' shape, naming the offending field, and does not
// tokenize: the caller encodes the text without adding special tokens (the template has them).
#ifndef MODSERVE_SERVER_CHAT_TEMPLATE_H_
#define MODSERVE_SERVER_CHAT_TEMPLATE_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "server/jinja.h"

namespace modserve::server {

// Immutable after Create; Apply is safe from any number of threads.
class ChatTemplate {
 public:
  // `bos_token` / `eos_token`: the text of the model's special tokens (absent ones stay undefined
  // in the template, as transformers leaves them). InvalidArgument "chat template: ..." when the
  // source does not parse (line and reason).
  static absl::StatusOr<ChatTemplate> Create(std::string_view source,
                                             std::optional<std::string> bos_token,
                                             std::optional<std::string> eos_token);

  // `messages`: a non-empty array of objects with a string "role" and a "content" that is a
  // string, null, or an array of {"type": "text", "text": ...} parts (joined with "\n", as vLLM
  // does for text-only templates); other keys (name, tool_calls, tool_call_id) pass through.
  // InvalidArgument "messages[2].content: ..." for a malformed message; InvalidArgument
  // "messages: <the template's message>" when the template refuses the conversation
  // (raise_exception, e.g. roles that do not alternate) or fails rendering it.
  absl::StatusOr<std::string> Apply(const nlohmann::ordered_json &messages,
                                    bool add_generation_prompt) const;

 private:
  ChatTemplate() = default;

  jinja::Template template_;
  std::optional<std::string> bos_token_;
  std::optional<std::string> eos_token_;
};

}  // namespace modserve::server

#endif  // MODSERVE_SERVER_CHAT_TEMPLATE_H_
