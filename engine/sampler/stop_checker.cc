// StopChecker: only the tail of the text that a new token can affect is searched, so a long
// generation costs O(new text * stop strings) per token, not O(text).
#include "engine/sampler/stop_checker.h"

#include <algorithm>

#include "engine/common/logging.h"

namespace modserve::engine {

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStopToken:
      return "stop_token";
    case FinishReason::kStopString:
      return "stop_string";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

StopChecker::StopChecker(const SamplingParams& params, absl::Span<const TokenId> eos_token_ids)
    : stop_strings_(params.stop_strings), max_new_tokens_(params.max_new_tokens) {
  if (!params.ignore_eos) stop_tokens_.insert(eos_token_ids.begin(), eos_token_ids.end());
  stop_tokens_.insert(params.stop_token_ids.begin(), params.stop_token_ids.end());
  for (const std::string& s : stop_strings_) {
    MODSERVE_CHECK(!s.empty()) << "empty stop string: Validate(SamplingParams) rejects it";
    max_stop_length_ = std::max(max_stop_length_, s.size());
  }
}

StopCheckResult StopChecker::Append(TokenId token, std::string_view new_text) {
  MODSERVE_CHECK(!finished()) << "Append after the request finished";
  ++num_tokens_;
  if (stop_tokens_.contains(token)) return Finish(FinishReason::kStopToken, text_.size());

  const size_t old_size = text_.size();
  text_.append(new_text);
  if (max_stop_length_ > 0 && !new_text.empty()) {
    // A match that is new must end inside new_text, so it starts at most
    // max_stop_length_ - 1 bytes before it. Earlier matches were found on earlier tokens.
    const size_t search_from = old_size - std::min(old_size, max_stop_length_ - 1);
    size_t best_pos = std::string::npos;
    const std::string* best = nullptr;
    for (const std::string& stop : stop_strings_) {
      const size_t pos = text_.find(stop, search_from);
      if (pos < best_pos) {
        best_pos = pos;
        best = &stop;
      }
    }
    if (best != nullptr) {
      matched_stop_string_ = *best;
      return Finish(FinishReason::kStopString, best_pos);
    }
  }
  if (num_tokens_ >= max_new_tokens_) return Finish(FinishReason::kLength, text_.size());

  StopCheckResult result;
  result.num_withheld_bytes = PendingPrefixLength();
  const size_t safe_end = text_.size() - result.num_withheld_bytes;
  // safe_end never moves back: a withheld suffix grows by at most the new text.
  if (safe_end > num_emitted_) {
    result.emit = text_.substr(num_emitted_, safe_end - num_emitted_);
    num_emitted_ = safe_end;
  }
  return result;
}

size_t StopChecker::PendingPrefixLength() const {
  size_t longest = 0;
  const std::string_view text = text_;
  for (const std::string& stop : stop_strings_) {
    const size_t max_len = std::min(stop.size() - 1, text.size());
    for (size_t len = max_len; len > longest; --len) {
      if (text.substr(text.size() - len) == std::string_view(stop).substr(0, len)) {
        longest = len;
        break;
      }
    }
  }
  return longest;
}

StopCheckResult StopChecker::Finish(FinishReason reason, size_t text_end) {
  // Emitted text never reaches into a stop string (see PendingPrefixLength), so the cut is
  // at or after what the client has already seen.
  MODSERVE_CHECK_LE(num_emitted_, text_end);
  text_.resize(text_end);
  finish_reason_ = reason;
  StopCheckResult result;
  result.finish_reason = reason;
  result.emit = text_.substr(num_emitted_);
  num_emitted_ = text_.size();
  return result;
}

}  // namespace modserve::engine
