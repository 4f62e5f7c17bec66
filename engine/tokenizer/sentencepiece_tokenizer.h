// SentencePiece tokenizer.model (Llama 2, Mistral) through Debian's libsentencepiece. It encodes
// with the model's own normalizer; it does not add EOS and does not sample (no subword
// regularization).
#ifndef MODSERVE_ENGINE_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_
#define MODSERVE_ENGINE_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"

namespace modserve::engine {

// Loads `path`. Encode(add_special_tokens=true) puts the model's BOS in front when the model
// defines one (as Llama 2 does). IsSpecial() is true for control pieces (<s>, </s>, <pad>), which
// the library already decodes to nothing; unknown pieces decode to " ⁇ " as the library does.
// NotFound: no file at `path`. InvalidArgument: the file is not a SentencePiece model.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(const std::string& path);

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_
