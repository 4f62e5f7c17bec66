// Decides when a request's generation ends (stop token, max_new_tokens, stop string) and which
// part of the detokenized text is safe to stream. It does not detokenize: the caller passes the
// text each token adds, as produced by the tokenizer's incremental decoder.
#ifndef MODSERVE_ENGINE_SAMPLER_STOP_CHECKER_H_
#define MODSERVE_ENGINE_SAMPLER_STOP_CHECKER_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/types/span.h"
#include "engine/sampler/sampler.h"

namespace modserve::engine {

// Why a request stopped (engine/types.h re-exports it).
enum class FinishReason : uint8_t {
  kLength,      // max_new_tokens generated
  kStopToken,   // EOS (unless ignore_eos) or one of stop_token_ids
  kStopString,  // the text contains one of stop_strings
  kCancelled,   // the client cancelled (set by the engine, never by StopChecker)
  kError,       // the engine failed the request (set by the engine, never by StopChecker)
};

// Bounded label value for metrics and the API: "length", "stop_token", "stop_string", ...
std::string_view FinishReasonName(FinishReason reason);

struct StopCheckResult {
  // Set on the token that ends the request.
  std::optional<FinishReason> finish_reason;
  // Text that became safe to stream with this token (possibly empty). Concatenating every
  // `emit` of a request gives exactly the final text().
  std::string emit;
  // Bytes at the end of the text held back because they may be the start of a stop string;
  // 0 once finished.
  size_t num_withheld_bytes = 0;
};

// Rules, checked in this order for every token:
//  1. Stop token: the token is EOS (from the model config; skipped with ignore_eos) or in
//     stop_token_ids. Its text is not appended (it is not part of the output text), the token
//     still counts as generated.
//  2. Stop string: the earliest occurrence of any stop string in the text, including one that
//     spans tokens. The text is cut before it; neither it nor anything after it is ever emitted.
//  3. Length: max_new_tokens tokens generated (the token's text is kept).
// When no rule fires, the longest suffix of the text that is a proper prefix of some stop
// string is withheld; it is emitted as soon as it stops being a possible prefix, or when the
// request ends for another reason. A withheld suffix starts with the first byte of a stop
// string, so a valid UTF-8 stop string never splits a character of the emitted text.
// Thread contract: one instance per request, engine thread only. Append after the request
// finished is an engine bug (CHECK).
class StopChecker {
 public:
  // eos_token_ids: the model's EOS ids (config eos_token_id, int or list).
  StopChecker(const SamplingParams& params, absl::Span<const TokenId> eos_token_ids);

  // One generated token and the text it adds to the output.
  StopCheckResult Append(TokenId token, std::string_view new_text);

  bool finished() const { return finish_reason_.has_value(); }
  std::optional<FinishReason> finish_reason() const { return finish_reason_; }
  // The stop string that matched (kStopString only), else empty.
  const std::string& matched_stop_string() const { return matched_stop_string_; }
  // Output text so far; once finished, the final text (cut before a stop string).
  const std::string& text() const { return text_; }
  int32_t num_tokens() const { return num_tokens_; }

 private:
  // Length of the longest suffix of text_ that is a proper prefix of a stop string.
  size_t PendingPrefixLength() const;
  StopCheckResult Finish(FinishReason reason, size_t text_end);

  absl::flat_hash_set<TokenId> stop_tokens_;
  std::vector<std::string> stop_strings_;
  size_t max_stop_length_ = 0;
  int32_t max_new_tokens_;
  std::string text_;
  size_t num_emitted_ = 0;  // bytes of text_ already returned in `emit`
  int32_t num_tokens_ = 0;
  std::optional<FinishReason> finish_reason_;
  std::string matched_stop_string_;
};

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_SAMPLER_STOP_CHECKER_H_
