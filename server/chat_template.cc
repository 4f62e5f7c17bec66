// ChatTemplate: message checks first (so a malformed message is named before any rendering), then
// one render with bounded output and steps.
#include "server/chat_template.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"

namespace modserve::server {

absl::StatusOr<ChatTemplate> ChatTemplate::Create(std::string_view source,
                                                  std::optional<std::string> bos_token,
                                                  std::optional<std::string> eos_token) {
  absl::StatusOr<jinja::Template> t = jinja::Template::Parse(source);
  if (!t.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", t.status().message()));
  }
  ChatTemplate out;
  out.template_ = *std::move(t);
  out.bos_token_ = std::move(bos_token);
  out.eos_token_ = std::move(eos_token);
  return out;
}

namespace {

absl::Status Bad(const std::string &field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// One message with its content flattened to a string (or null).
absl::StatusOr<nlohmann::ordered_json> NormalizeMessage(const nlohmann::ordered_json &m, size_t i) {
  const std::string at = absl::StrCat("messages[", i, "]");
  if (!m.is_object()) return Bad(at, "must be an object");
  auto role = m.find("role");
  if (role == m.end()) return Bad(at + ".role", "is required");
  if (!role->is_string() || role->get_ref<const std::string &>().empty()) {
    return Bad(at + ".role", "must be a non-empty string");
  }
  nlohmann::ordered_json out = m;
  auto content = m.find("content");
  if (content == m.end() || content->is_null()) {
    out["content"] = nullptr;
  } else if (content->is_array()) {
    std::string text;
    for (size_t k = 0; k < content->size(); ++k) {
      const nlohmann::ordered_json &part = (*content)[k];
      const std::string part_at = absl::StrCat(at, ".content[", k, "]");
      if (!part.is_object()) return Bad(part_at, "must be an object");
      auto type = part.find("type");
      if (type == part.end() || !type->is_string()) return Bad(part_at + ".type", "is required");
      if (*type != "text") {
        return Bad(part_at + ".type", absl::StrCat("'", type->get<std::string>(),
                                                   "' is not supported (text parts only)"));
      }
      auto t = part.find("text");
      if (t == part.end() || !t->is_string()) return Bad(part_at + ".text", "must be a string");
      if (k > 0) text += "\n";
      text += t->get<std::string>();
    }
    out["content"] = std::move(text);
  } else if (!content->is_string()) {
    return Bad(at + ".content", "must be a string, an array of text parts, or null");
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> ChatTemplate::Apply(const nlohmann::ordered_json &messages,
                                                bool add_generation_prompt) const {
  if (!messages.is_array()) return Bad("messages", "must be an array");
  if (messages.empty()) return Bad("messages", "must not be empty");
  nlohmann::ordered_json normalized = nlohmann::ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    MODSERVE_ASSIGN_OR_RETURN(nlohmann::ordered_json m, NormalizeMessage(messages[i], i));
    normalized.push_back(std::move(m));
  }
  jinja::Dict context;
  context.Set("messages", jinja::Value::FromJson(normalized));
  context.Set("add_generation_prompt", jinja::Value::Bool(add_generation_prompt));
  if (bos_token_) context.Set("bos_token", jinja::Value::String(*bos_token_));
  if (eos_token_) context.Set("eos_token", jinja::Value::String(*eos_token_));
  absl::StatusOr<std::string> text = template_.Render(jinja::Value::FromDict(std::move(context)));
  if (!text.ok()) {
    if (absl::IsResourceExhausted(text.status())) return text.status();
    // The template refusing the conversation is the client's problem: a 400 naming messages.
    return Bad("messages",
               jinja::IsRaisedByTemplate(text.status())
                   ? text.status().message()
                   : absl::StrCat("the chat template failed: ", text.status().message()));
  }
  return text;
}

}  // namespace modserve::server
