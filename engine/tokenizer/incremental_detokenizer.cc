// Window-diff streaming detokenizer. It only calls Tokenizer::Decode, so it works the same for
// byte-level BPE and SentencePiece; it keeps no per-tokenizer special cases.
#include "engine/tokenizer/incremental_detokenizer.h"

#include <algorithm>
#include <string_view>

#include "engine/common/status_macros.h"

namespace modserve::engine {
namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD
// Prompt tokens decoded as context for the first generated ones: enough for SentencePiece's
// leading-space rule and for a character spread over up to 4 byte tokens.
constexpr size_t kPromptContextTokens = 4;

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Length of the longest common prefix of `a` and `b`, cut back to a UTF-8 character boundary.
size_t CommonPrefixLength(std::string_view a, std::string_view b) {
  size_t n = 0;
  const size_t limit = std::min(a.size(), b.size());
  while (n < limit && a[n] == b[n]) ++n;
  while (n > 0 && n < b.size() && (static_cast<unsigned char>(b[n]) & 0xC0) == 0x80) --n;
  return n;
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens,
                                               absl::Span<const int32_t> prompt_ids)
    : tokenizer_(tokenizer),
      skip_special_tokens_(skip_special_tokens),
      ids_(prompt_ids.begin(), prompt_ids.end()) {
  read_offset_ = ids_.size();
  prefix_offset_ = ids_.size() > kPromptContextTokens ? ids_.size() - kPromptContextTokens : 0;
  // A window whose prefix decodes to nothing (control tokens, a lone "▁") would let
  // SentencePiece strip the space of the first generated piece; widen it until it has text.
  while (prefix_offset_ > 0) {
    absl::StatusOr<std::string> context = tokenizer_.Decode(
        absl::MakeConstSpan(ids_).subspan(prefix_offset_, read_offset_ - prefix_offset_),
        skip_special_tokens_);
    if (!context.ok() || !context->empty()) break;  // a bad prompt id surfaces in Add()
    --prefix_offset_;
  }
}

absl::StatusOr<std::string> IncrementalDetokenizer::Add(absl::Span<const int32_t> ids) {
  const size_t old_size = ids_.size();
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  absl::StatusOr<std::string> delta = Step(/*force=*/false);
  if (!delta.ok()) ids_.resize(old_size);
  return delta;
}

absl::StatusOr<std::string> IncrementalDetokenizer::Flush() { return Step(/*force=*/true); }

absl::StatusOr<std::string> IncrementalDetokenizer::Step(bool force) {
  const absl::Span<const int32_t> all(ids_);
  MODSERVE_ASSIGN_OR_RETURN(
      std::string prefix_text,
      tokenizer_.Decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_),
                        skip_special_tokens_));
  MODSERVE_ASSIGN_OR_RETURN(std::string new_text,
                            tokenizer_.Decode(all.subspan(prefix_offset_), skip_special_tokens_));
  // A trailing U+FFFD is most likely a character whose remaining bytes are still to come.
  if (new_text.size() <= prefix_text.size() || (!force && EndsWith(new_text, kReplacementChar))) {
    if (force) read_offset_ = ids_.size();
    return std::string();
  }
  // The window normally decodes to its old text plus more; it does not when the prompt (or a
  // flushed stream) ended inside a character, and then the shared part is what was shown.
  const size_t shown = new_text.compare(0, prefix_text.size(), prefix_text) == 0
                           ? prefix_text.size()
                           : CommonPrefixLength(prefix_text, new_text);
  std::string delta = new_text.substr(shown);

  // The new window starts where this one's read part ended, unless that part decodes to nothing
  // on its own: a window must begin with text, or SentencePiece would strip a space it should
  // keep (see the constructor).
  const size_t next_prefix = read_offset_;
  MODSERVE_ASSIGN_OR_RETURN(
      std::string next_context,
      tokenizer_.Decode(all.subspan(next_prefix, ids_.size() - next_prefix), skip_special_tokens_));
  if (!next_context.empty()) prefix_offset_ = next_prefix;
  read_offset_ = ids_.size();
  return delta;
}

}  // namespace modserve::engine
