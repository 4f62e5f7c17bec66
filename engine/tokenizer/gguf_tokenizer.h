// Tokenizer built from a GGUF file's tokenizer.* metadata, tokenizing as llama.cpp does for the
// same file (GGUF's reference implementation): byte-level BPE (tokenizer.ggml.model "gpt2")
// with the pre-tokenizer named by tokenizer.ggml.pre, and SentencePiece-style BPE from scores
// ("llama"). Other tokenizer models (bert, t5, rwkv, ...) are refused.
#ifndef MODSERVE_ENGINE_TOKENIZER_GGUF_TOKENIZER_H_
#define MODSERVE_ENGINE_TOKENIZER_GGUF_TOKENIZER_H_

#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/tokenizer.h"

namespace modserve::engine {

// Reads tokenizer.ggml.{model, pre, tokens, token_type, merges, scores, bos_token_id,
// eos_token_id, unknown_token_id, add_bos_token, add_eos_token, add_space_prefix} and
// tokenizer.chat_template. The result does not refer to `file` once returned.
//
// Behaviour, as llama.cpp's tokenizer for the same metadata:
//  - Control, user-defined and unknown-type tokens written in the text are matched literally,
//    longest first, before anything else.
//  - "gpt2": the pre-tokenizer's split expressions run in sequence (a missing tokenizer.ggml.pre
//    means "default"), then byte-level BPE by merge rank on each piece. "llama": spaces become
//    U+2581, a space is put before the text and after each literal token when add_space_prefix
//    (default true), then pieces merge by score; characters no token covers become byte tokens
//    <0xXX> (the unknown token where the vocabulary has no byte token).
//  - Encode(add_special_tokens) puts BOS/EOS around the ids as add_bos_token/add_eos_token say
//    (defaults: "llama" BOS yes; "gpt2" per pre-tokenizer, e.g. Llama 3's yes, others no).
//  - Decode: normal tokens by their spelling (byte-level decoded, or U+2581 as a space), byte
//    tokens as their byte, user-defined tokens verbatim, control and unknown-type tokens
//    verbatim unless skip_special_tokens (IsSpecial() is true for exactly these); unused and
//    undefined-type tokens decode to nothing. "llama" drops the leading space of the first
//    piece, as llama.cpp's detokenizer does when the ids do not start with BOS. Unlike
//    llama.cpp's detokenizer it never "cleans up" spaces before punctuation: the text is the
//    concatenation of the pieces, as a stream of them shows.
// Tokens whose name llama.cpp takes for end of generation (<|eot_id|>, <|im_end|>,
// <|endoftext|>, ...) are control tokens whatever tokenizer.ggml.token_type says, as there.
//
// Status codes (every message names the key at fault and starts with the file's path):
//   NotFound         no tokenizer.ggml.model, or llama.cpp's "no_vocab": the file has no
//                    tokenizer
//   InvalidArgument  a key the tokenizer needs is missing (tokenizer.ggml.tokens; .merges for
//                    gpt2) or has the wrong type or size (token_type or scores shorter than
//                    tokens, a merge that is not two spellings separated by a space), an
//                    unsupported tokenizer model or pre-tokenizer (named, with the supported
//                    ones), add_bos_token/add_eos_token set while that token id is missing
// Special token ids outside the vocabulary are ignored, as llama.cpp ignores them. Without the
// keys, "llama" takes llama.cpp's defaults (BOS 1, EOS 2, unknown 0); "gpt2" has no BOS or EOS
// (llama.cpp would guess id 11).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerFromGguf(const GgufFile& file);

// The tokenizer.ggml.pre names LoadTokenizerFromGguf accepts (for "gpt2" models).
std::vector<std::string_view> SupportedGgufPreTokenizers();

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_TOKENIZER_GGUF_TOKENIZER_H_
