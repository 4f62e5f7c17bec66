// Streaming detokenization: turns generated token ids into text deltas as they arrive. It holds
// back incomplete UTF-8 and never re-emits text; it does not apply stop strings.
#ifndef MODSERVE_ENGINE_TOKENIZER_INCREMENTAL_DETOKENIZER_H_
#define MODSERVE_ENGINE_TOKENIZER_INCREMENTAL_DETOKENIZER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/tokenizer/tokenizer.h"

namespace modserve::engine {

// One per output stream. Threads: not thread-safe (one request's stream, one caller at a time);
// the Tokenizer may be shared with other threads.
//
// Contract: for ids added without prompt context, the concatenation of every Add() return and a
// final Flush() equals tokenizer.Decode(all ids, skip_special_tokens). Each return is valid UTF-8
// and ends on a character boundary. Text whose decode so far ends in U+FFFD (bytes of a character
// cut short) is held back until a later token completes it or Flush() gives up on it.
//
// How: like streaming servers, it decodes a short window of earlier tokens (the "prefix") with and
// without the new ones and emits the difference, so context-dependent decoding (SentencePiece
// drops the leading space of the first piece of a decode) comes out as in a full decode.
class IncrementalDetokenizer {
 public:
  // `tokenizer` is not owned and must outlive this object. `prompt_ids` are context that is
  // never emitted; they decide, e.g., that a first generated "▁Hello" shows its space. When the
  // prompt ends inside a character that generated tokens complete, the completed character is
  // emitted with the generated text.
  IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens,
                         absl::Span<const int32_t> prompt_ids = {});

  // Appends `ids` and returns the newly completed text (possibly empty).
  // InvalidArgument: an id the tokenizer cannot decode (the ids are then not kept).
  absl::StatusOr<std::string> Add(absl::Span<const int32_t> ids);
  absl::StatusOr<std::string> Add(int32_t id) { return Add(absl::Span<const int32_t>(&id, 1)); }

  // Everything still held back, with bytes that form no character replaced by U+FFFD. Call at
  // the end of the stream; a later Add() continues after the flushed text.
  absl::StatusOr<std::string> Flush();

  // Every id added so far, prompt first.
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  // Emits Decode(ids_[prefix_offset_:]) minus Decode(ids_[prefix_offset_:read_offset_]) when it is
  // complete (or `force`), then moves the window forward.
  absl::StatusOr<std::string> Step(bool force);

  const Tokenizer& tokenizer_;
  const bool skip_special_tokens_;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;  // window start: ids before it no longer influence new text
  size_t read_offset_ = 0;    // ids before it have had all their text emitted
};

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_TOKENIZER_INCREMENTAL_DETOKENIZER_H_
