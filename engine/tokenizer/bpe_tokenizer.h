// Hugging Face tokenizer.json loader for byte-level BPE models (GPT-2, Llama 3, Qwen2 layouts).
// Other model types (WordPiece, Unigram, WordLevel) and non-byte-level pipelines are refused.
#ifndef MODSERVE_ENGINE_TOKENIZER_BPE_TOKENIZER_H_
#define MODSERVE_ENGINE_TOKENIZER_BPE_TOKENIZER_H_

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"

namespace modserve::engine {

// Names of the BOS/EOS tokens from tokenizer_config.json; empty means "not given", in which case
// BOS is the special token the post-processor puts before $A and EOS is taken from a short list
// of conventional names (<|eos|>, </s>, <|end_of_text|>, <|endoftext|>, <|im_end|>).
struct BpeSpecialTokenNames {
  std::string_view bos;
  std::string_view eos;
};

// Parses the contents of a tokenizer.json. Supported: model BPE (vocab, merges as "a b" strings
// or [a, b] pairs, ignore_merges, unk_token); added_tokens (special or not, lstrip, rstrip,
// single_word, normalized); normalizer null, NFC (only when built with ICU) or a Sequence of
// those; pre_tokenizer ByteLevel or Sequence[Split(String|Regex, any behavior, invert)...,
// ByteLevel] with ByteLevel last; post_processor null, ByteLevel, TemplateProcessing or a
// Sequence of those; decoder ByteLevel.
// InvalidArgument: malformed JSON, a missing or mistyped key, or an unsupported feature; the
// message names the key or the feature.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadBpeTokenizerFromJson(
    std::string_view json_text, const BpeSpecialTokenNames& names = {});

// Whether this build can load tokenizer.json files whose normalizer is NFC.
bool BpeTokenizerSupportsNfc();

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_TOKENIZER_BPE_TOKENIZER_H_
