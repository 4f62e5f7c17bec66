// UTF-8 validation, lossy repair and boundary helpers shared by the tokenizers and the streaming
// detokenizer. Byte-level only: no normalization, no character properties.
#ifndef MODSERVE_ENGINE_TOKENIZER_UTF8_H_
#define MODSERVE_ENGINE_TOKENIZER_UTF8_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace modserve::engine {

// Whether `text` is well-formed UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
bool IsValidUtf8(std::string_view text);

// Byte offset of the first ill-formed sequence in `text`, or text.size() when it is valid.
size_t FirstInvalidUtf8Offset(std::string_view text);

// `bytes` with every maximal ill-formed subsequence replaced by one U+FFFD (the Unicode
// "substitution of maximal subparts" practice; the same output as Rust's from_utf8_lossy, which
// Hugging Face tokenizers uses to decode).
std::string ReplaceInvalidUtf8(std::string_view bytes);

// Length of the longest suffix of `bytes` that is a proper prefix of a well-formed sequence (a
// character cut short: more bytes could still complete it). 0..3. Cutting `bytes` before that
// suffix never changes what ReplaceInvalidUtf8 produces for the part before the cut.
size_t IncompleteUtf8SuffixLength(std::string_view bytes);

// Appends the UTF-8 encoding of `code_point` (at most U+10FFFF, not a surrogate) to `out`.
void AppendUtf8(char32_t code_point, std::string* out);

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_TOKENIZER_UTF8_H_
