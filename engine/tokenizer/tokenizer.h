// The tokenizer interface (text <-> token ids) and the factory that loads one from a model
// directory or a GGUF file. It does not apply chat templates, truncate or pad: callers do that
// around it.
#ifndef MODSERVE_ENGINE_TOKENIZER_TOKENIZER_H_
#define MODSERVE_ENGINE_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace modserve::engine {

// Immutable once loaded. Threads: every method is const and safe to call concurrently from any
// number of threads (implementations hold no mutable state).
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids for `text` (UTF-8). `add_special_tokens` applies the model's post-processing
  // (e.g. a leading BOS). Special tokens written literally in `text` ("<|bos|>") map to their id.
  // InvalidArgument: `text` is not valid UTF-8. Internal: the regex engine gave up (its match
  // limit) or the SentencePiece library failed.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                                      bool add_special_tokens) const = 0;

  // Text for `ids`, always valid UTF-8: byte sequences that do not form UTF-8 become U+FFFD.
  // `skip_special_tokens` drops ids for which IsSpecial() is true.
  // InvalidArgument: an id outside [0, vocab_size()) or one that names no token.
  virtual absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                             bool skip_special_tokens) const = 0;

  // One more than the largest id, added tokens included.
  virtual int vocab_size() const = 0;

  // The id of the token spelled `token` in the model's own alphabet (byte-level BPE: "Ġthe";
  // SentencePiece: "▁the"), or nullopt.
  virtual std::optional<int32_t> TokenToId(std::string_view token) const = 0;
  // The spelling of `id` (owned by the tokenizer), or nullopt when `id` names no token.
  virtual std::optional<std::string_view> IdToToken(int32_t id) const = 0;
  // Whether Decode(..., skip_special_tokens=true) drops `id` (BOS/EOS/pad/control tokens).
  virtual bool IsSpecial(int32_t id) const = 0;

  // Begin/end-of-sequence ids when the tokenizer files define them. The model's config.json
  // (bos_token_id, eos_token_id) is authoritative where the two disagree.
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;

  // The model's chat template (Jinja source, as tokenizer_config.json's "chat_template" or the
  // GGUF key tokenizer.chat_template hold it); empty when the model has none.
  const std::string& chat_template() const { return chat_template_; }
  // For loaders only, before the tokenizer is shared between threads.
  void set_chat_template(std::string chat_template) { chat_template_ = std::move(chat_template); }

 private:
  std::string chat_template_;
};

// `model_dir` may also be a GGUF file (a name ending in .gguf, or the GGUF magic): its
// tokenizer.* metadata is loaded by LoadTokenizerFromGguf (gguf_tokenizer.h), whose status codes
// apply, after GgufFile::Open's (DataLoss for a file that is not well-formed GGUF).
// Loads `model_dir`/tokenizer.json (Hugging Face byte-level BPE; preferred when both exist) or
// `model_dir`/tokenizer.model (SentencePiece). Reads `model_dir`/tokenizer_config.json, when
// present, for the names of the BOS and EOS tokens and the chat template ("chat_template": a
// string, or a list of {"name", "template"} objects of which "default" is taken).
// NotFound: neither file exists. InvalidArgument: the file is malformed or uses a feature this
// implementation does not support (the message names it: e.g. a WordPiece model, a Metaspace
// pre-tokenizer); we refuse rather than tokenize differently from the reference.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_dir);

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_TOKENIZER_TOKENIZER_H_
