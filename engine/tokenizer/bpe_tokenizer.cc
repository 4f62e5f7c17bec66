// Byte-level BPE as Hugging Face `tokenizers` runs it: added-token split, normalize, pre-tokenize
// (regex splits, then bytes), BPE merges by rank, post-process. It does not train, truncate, pad
// or compute offsets; anything in tokenizer.json it cannot reproduce exactly is refused at load.
#include "engine/tokenizer/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <exception>
#include <optional>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/pcre2_regex.h"
#include "engine/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

#ifdef MODSERVE_TOKENIZER_HAS_ICU
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>
#endif

namespace modserve::engine {
namespace {

using Json = nlohmann::json;

// The pattern ByteLevel(use_regex=true) applies: GPT-2's, as hard-coded in `tokenizers`.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// JSON access without exceptions: every accessor names the key it was looking for.

absl::Status Malformed(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", where, ": ", what));
}

absl::StatusOr<const Json*> Member(const Json& obj, const std::string& key,
                                   const std::string& where) {
  if (!obj.is_object()) return Malformed(where, "expected an object");
  auto it = obj.find(key);
  if (it == obj.end()) return Malformed(where, absl::StrCat("missing key '", key, "'"));
  return &*it;
}

absl::StatusOr<std::string> StringMember(const Json& obj, const std::string& key,
                                         const std::string& where) {
  MODSERVE_ASSIGN_OR_RETURN(const Json* v, Member(obj, key, where));
  if (!v->is_string()) return Malformed(where, absl::StrCat("'", key, "' must be a string"));
  return v->get<std::string>();
}

// `key` as a bool, `fallback` when absent or null.
absl::StatusOr<bool> BoolMember(const Json& obj, const std::string& key, bool fallback,
                                const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return Malformed(where, absl::StrCat("'", key, "' must be a bool"));
  return it->get<bool>();
}

absl::StatusOr<int32_t> IdValue(const Json& v, const std::string& where) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
    return Malformed(where, absl::StrCat("token id ", v.dump(), " is not an int in [0, 2^31)"));
  }
  return static_cast<int32_t>(v.get<int64_t>());
}

std::string TypeOf(const Json& obj) {
  auto it = obj.find("type");
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// Rust's char::is_whitespace (Unicode White_Space), which lstrip/rstrip use.
bool IsUnicodeWhitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

size_t PreviousCharStart(std::string_view s, size_t pos) {
  do {
    --pos;
  } while (pos > 0 && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80);
  return pos;
}

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct SplitStep {
  std::unique_ptr<Pcre2Regex> regex;
  SplitBehavior behavior;
  bool invert;
};

struct AddedToken {
  int32_t id;
  std::string content;  // as matched: NFC-normalized when `normalized` and the model uses NFC
  bool special;
  bool lstrip;
  bool rstrip;
  bool single_word;
  bool normalized;
};

// A run of text still to be tokenized, or an added token already resolved to an id.
struct Segment {
  int32_t added_id;       // -1 for text
  std::string_view text;  // points into the caller's string or into Encode's normalized buffers
};

using internal::ByteLevelToBytes;
using internal::NextCodePoint;
using internal::StringToId;

class BpeTokenizer final : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(const Json& root,
                                                           const BpeSpecialTokenNames& names);

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              bool add_special_tokens) const override;
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool skip_special_tokens) const override;
  int vocab_size() const override { return static_cast<int>(id_to_token_.size()); }
  std::optional<int32_t> TokenToId(std::string_view token) const override;
  std::optional<std::string_view> IdToToken(int32_t id) const override;
  bool IsSpecial(int32_t id) const override {
    return id >= 0 && id < vocab_size() && is_special_[id];
  }
  std::optional<int32_t> bos_id() const override { return bos_id_; }
  std::optional<int32_t> eos_id() const override { return eos_id_; }

 private:
  BpeTokenizer() = default;

  absl::Status ParseModel(const Json& model);
  absl::Status ParseAddedTokens(const Json& root);
  absl::Status ParseNormalizer(const Json& normalizer);
  absl::Status ParsePreTokenizer(const Json& pre, bool* saw_byte_level);
  absl::Status ParsePostProcessor(const Json& post);
  absl::Status ParseDecoder(const Json& decoder);
  void SetSpecialIds(const BpeSpecialTokenNames& names);
  void IndexAddedTokens();

  absl::StatusOr<std::string> Normalize(std::string_view text) const;
  // Splits `text` around the added tokens of `matchers` (leftmost-longest), appending to `out`.
  void SplitAddedTokens(std::string_view text, bool normalized_pass,
                        std::vector<Segment>* out) const;
  absl::Status PreTokenize(std::string_view text, std::vector<std::string_view>* pieces,
                           std::vector<std::string_view>* scratch) const;
  absl::Status ApplySplit(const Pcre2Regex& regex, SplitBehavior behavior, bool invert,
                          std::string_view piece, std::vector<std::string_view>* out) const;

  // Indexed by id, size vocab_size(); ids that name no token have has_token_ false.
  std::vector<std::string> id_to_token_;  // spelling as in the file ("Ġthe", "<|bos|>")
  std::vector<std::string> id_to_bytes_;  // what the ByteLevel decoder turns the token into
  std::vector<uint8_t> has_token_;
  std::vector<uint8_t> is_special_;
  StringToId token_to_id_;              // spelling -> id (added tokens win)
  std::optional<internal::BpeModel> bpe_;  // the model vocab and merges

  std::vector<AddedToken> added_tokens_;
  // Per first byte, indices into added_tokens_ sorted longest content first (leftmost-longest).
  std::array<std::vector<int32_t>, 256> raw_matchers_;
  std::array<std::vector<int32_t>, 256> normalized_matchers_;
  std::unique_ptr<Pcre2Regex> word_char_;  // \w, for single_word tokens

  bool nfc_ = false;
  std::vector<SplitStep> splits_;  // before the ByteLevel step
  bool add_prefix_space_ = false;
  std::unique_ptr<Pcre2Regex> byte_level_regex_;  // null when ByteLevel has use_regex false

  std::vector<int32_t> prefix_ids_;  // post-processor ids before $A
  std::vector<int32_t> suffix_ids_;  // and after it
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
};

absl::StatusOr<std::unique_ptr<Tokenizer>> BpeTokenizer::Create(const Json& root,
                                                                const BpeSpecialTokenNames& names) {
  if (!root.is_object()) return Malformed("top level", "expected an object");
  std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer());
  MODSERVE_ASSIGN_OR_RETURN(const Json* model, Member(root, "model", "top level"));
  MODSERVE_RETURN_IF_ERROR(tok->ParseModel(*model));
  MODSERVE_RETURN_IF_ERROR(tok->ParseNormalizer(root.value("normalizer", Json())));
  MODSERVE_RETURN_IF_ERROR(tok->ParseAddedTokens(root));
  bool saw_byte_level = false;
  MODSERVE_RETURN_IF_ERROR(
      tok->ParsePreTokenizer(root.value("pre_tokenizer", Json()), &saw_byte_level));
  if (!saw_byte_level) {
    return Malformed("pre_tokenizer",
                     "unsupported: only byte-level BPE (a ByteLevel "
                     "pre-tokenizer) is implemented");
  }
  MODSERVE_RETURN_IF_ERROR(tok->ParsePostProcessor(root.value("post_processor", Json())));
  MODSERVE_RETURN_IF_ERROR(tok->ParseDecoder(root.value("decoder", Json())));
  tok->SetSpecialIds(names);
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

absl::Status BpeTokenizer::ParseModel(const Json& model) {
  const std::string type = TypeOf(model);
  if (!type.empty() && type != "BPE") {
    return Malformed("model.type",
                     absl::StrCat("unsupported model type '", type, "' (only BPE is implemented)"));
  }
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0)) {
    return Malformed("model.dropout", "unsupported: BPE dropout makes encoding random");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() &&
        !(model[key].is_string() && model[key].get<std::string>().empty())) {
      return Malformed(absl::StrCat("model.", key), "unsupported in byte-level BPE");
    }
  }
  internal::BpeModelOptions options;
  MODSERVE_ASSIGN_OR_RETURN(options.ignore_merges,
                            BoolMember(model, "ignore_merges", false, "model"));

  MODSERVE_ASSIGN_OR_RETURN(const Json* vocab, Member(model, "vocab", "model"));
  if (!vocab->is_object()) return Malformed("model.vocab", "expected an object token -> id");
  int32_t max_id = -1;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    MODSERVE_ASSIGN_OR_RETURN(int32_t id, IdValue(it.value(), "model.vocab"));
    max_id = std::max(max_id, id);
  }
  id_to_token_.resize(max_id + 1);
  has_token_.assign(max_id + 1, 0);
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    const int32_t id = static_cast<int32_t>(it.value().get<int64_t>());
    if (has_token_[id]) {
      return Malformed("model.vocab", absl::StrCat("id ", id, " is used by both '",
                                                   id_to_token_[id], "' and '", it.key(), "'"));
    }
    id_to_token_[id] = it.key();
    has_token_[id] = 1;
    token_to_id_[it.key()] = id;
  }
  std::vector<std::pair<std::string_view, int32_t>> tokens;
  tokens.reserve(token_to_id_.size());
  for (int32_t id = 0; id <= max_id; ++id) {
    if (has_token_[id]) tokens.emplace_back(id_to_token_[id], id);
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = token_to_id_.find(model["unk_token"].get<std::string>());
    if (it == token_to_id_.end()) {
      return Malformed("model.unk_token", absl::StrCat("'", model["unk_token"].get<std::string>(),
                                                       "' is not in the vocab"));
    }
    options.unk_id = it->second;
  }

  MODSERVE_ASSIGN_OR_RETURN(const Json* merges, Member(model, "merges", "model"));
  if (!merges->is_array()) return Malformed("model.merges", "expected an array");
  std::vector<std::pair<std::string, std::string>> merge_strings;
  merge_strings.reserve(merges->size());
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const Json& m = (*merges)[rank];
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
        return Malformed("model.merges", absl::StrCat("merge #", rank, " '", s,
                                                      "' is not two tokens separated by a space"));
      }
      merge_strings.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merge_strings.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return Malformed("model.merges", absl::StrCat("merge #", rank, " ", m.dump(),
                                                    " is neither \"a b\" nor [\"a\", \"b\"]"));
    }
  }
  std::vector<std::pair<std::string_view, std::string_view>> merge_views(merge_strings.begin(),
                                                                         merge_strings.end());
  absl::StatusOr<internal::BpeModel> bpe = internal::BpeModel::Create(tokens, merge_views, options);
  if (!bpe.ok()) return Malformed("model.merges", std::string(bpe.status().message()));
  bpe_ = *std::move(bpe);
  return absl::OkStatus();
}

absl::Status BpeTokenizer::ParseNormalizer(const Json& normalizer) {
  if (normalizer.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(normalizer);
  if (type == "Sequence") {
    MODSERVE_ASSIGN_OR_RETURN(const Json* list, Member(normalizer, "normalizers", "normalizer"));
    if (!list->is_array()) return Malformed("normalizer.normalizers", "expected an array");
    for (const Json& n : *list) MODSERVE_RETURN_IF_ERROR(ParseNormalizer(n));
    return absl::OkStatus();
  }
  if (type == "NFC") {
    if (!BpeTokenizerSupportsNfc()) {
      return Malformed("normalizer", "NFC is unsupported in this build (built without ICU)");
    }
    nfc_ = true;
    return absl::OkStatus();
  }
  return Malformed("normalizer", absl::StrCat("unsupported normalizer type '", type,
                                              "' (supported: null, NFC, Sequence)"));
}

absl::Status BpeTokenizer::ParseAddedTokens(const Json& root) {
  auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array()) return Malformed("added_tokens", "expected an array");
  for (const Json& t : *it) {
    AddedToken a;
    MODSERVE_ASSIGN_OR_RETURN(const Json* id, Member(t, "id", "added_tokens[]"));
    MODSERVE_ASSIGN_OR_RETURN(a.id, IdValue(*id, "added_tokens[].id"));
    MODSERVE_ASSIGN_OR_RETURN(a.content, StringMember(t, "content", "added_tokens[]"));
    if (a.content.empty()) return Malformed("added_tokens[]", "empty 'content'");
    MODSERVE_ASSIGN_OR_RETURN(a.special, BoolMember(t, "special", false, "added_tokens[]"));
    MODSERVE_ASSIGN_OR_RETURN(a.lstrip, BoolMember(t, "lstrip", false, "added_tokens[]"));
    MODSERVE_ASSIGN_OR_RETURN(a.rstrip, BoolMember(t, "rstrip", false, "added_tokens[]"));
    MODSERVE_ASSIGN_OR_RETURN(a.single_word, BoolMember(t, "single_word", false, "added_tokens[]"));
    MODSERVE_ASSIGN_OR_RETURN(a.normalized,
                              BoolMember(t, "normalized", !a.special, "added_tokens[]"));
    if (a.id >= static_cast<int32_t>(id_to_token_.size())) {
      id_to_token_.resize(a.id + 1);
      has_token_.resize(a.id + 1, 0);
    }
    // Added tokens take over the id's spelling, as in the reference's id_to_token.
    id_to_token_[a.id] = a.content;
    has_token_[a.id] = 1;
    token_to_id_[a.content] = a.id;
    if (a.normalized && nfc_) {
      MODSERVE_ASSIGN_OR_RETURN(a.content, Normalize(a.content));
    }
    added_tokens_.push_back(std::move(a));
  }
  is_special_.assign(id_to_token_.size(), 0);
  for (const AddedToken& a : added_tokens_) is_special_[a.id] = a.special;
  IndexAddedTokens();
  MODSERVE_ASSIGN_OR_RETURN(word_char_, Pcre2Regex::Compile(R"(\w)"));
  return absl::OkStatus();
}

void BpeTokenizer::IndexAddedTokens() {
  for (int32_t i = 0; i < static_cast<int32_t>(added_tokens_.size()); ++i) {
    const AddedToken& a = added_tokens_[i];
    auto& bucket = (a.normalized ? normalized_matchers_
                                 : raw_matchers_)[static_cast<unsigned char>(a.content[0])];
    bucket.push_back(i);
  }
  for (auto* matchers : {&raw_matchers_, &normalized_matchers_}) {
    for (auto& bucket : *matchers) {
      std::stable_sort(bucket.begin(), bucket.end(), [&](int32_t x, int32_t y) {
        return added_tokens_[x].content.size() > added_tokens_[y].content.size();
      });
    }
  }
}

absl::Status BpeTokenizer::ParsePreTokenizer(const Json& pre, bool* saw_byte_level) {
  if (pre.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(pre);
  if (*saw_byte_level) {
    return Malformed("pre_tokenizer", absl::StrCat("unsupported: '", type,
                                                   "' after ByteLevel "
                                                   "(ByteLevel must be the last step)"));
  }
  if (type == "Sequence") {
    MODSERVE_ASSIGN_OR_RETURN(const Json* list, Member(pre, "pretokenizers", "pre_tokenizer"));
    if (!list->is_array()) return Malformed("pre_tokenizer.pretokenizers", "expected an array");
    for (const Json& p : *list) MODSERVE_RETURN_IF_ERROR(ParsePreTokenizer(p, saw_byte_level));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    *saw_byte_level = true;
    MODSERVE_ASSIGN_OR_RETURN(add_prefix_space_,
                              BoolMember(pre, "add_prefix_space", true, "ByteLevel"));
    MODSERVE_ASSIGN_OR_RETURN(bool use_regex, BoolMember(pre, "use_regex", true, "ByteLevel"));
    if (use_regex) {
      MODSERVE_ASSIGN_OR_RETURN(byte_level_regex_, Pcre2Regex::Compile(kGpt2Pattern));
    }
    return absl::OkStatus();
  }
  if (type == "Split") {
    SplitStep step;
    MODSERVE_ASSIGN_OR_RETURN(const Json* pattern, Member(pre, "pattern", "Split"));
    if (pattern->is_object() && pattern->contains("Regex") && (*pattern)["Regex"].is_string()) {
      MODSERVE_ASSIGN_OR_RETURN(step.regex,
                                Pcre2Regex::Compile((*pattern)["Regex"].get<std::string>()));
    } else if (pattern->is_object() && pattern->contains("String") &&
               (*pattern)["String"].is_string()) {
      MODSERVE_ASSIGN_OR_RETURN(
          step.regex, Pcre2Regex::CompileLiteral((*pattern)["String"].get<std::string>()));
    } else {
      return Malformed("Split.pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    MODSERVE_ASSIGN_OR_RETURN(std::string behavior, StringMember(pre, "behavior", "Split"));
    if (behavior == "Removed") {
      step.behavior = SplitBehavior::kRemoved;
    } else if (behavior == "Isolated") {
      step.behavior = SplitBehavior::kIsolated;
    } else if (behavior == "MergedWithPrevious") {
      step.behavior = SplitBehavior::kMergedWithPrevious;
    } else if (behavior == "MergedWithNext") {
      step.behavior = SplitBehavior::kMergedWithNext;
    } else if (behavior == "Contiguous") {
      step.behavior = SplitBehavior::kContiguous;
    } else {
      return Malformed("Split.behavior", absl::StrCat("unknown behavior '", behavior, "'"));
    }
    MODSERVE_ASSIGN_OR_RETURN(step.invert, BoolMember(pre, "invert", false, "Split"));
    splits_.push_back(std::move(step));
    return absl::OkStatus();
  }
  return Malformed("pre_tokenizer", absl::StrCat("unsupported pre-tokenizer type '", type,
                                                 "' (supported: ByteLevel, Split, Sequence)"));
}

absl::Status BpeTokenizer::ParsePostProcessor(const Json& post) {
  if (post.is_null()) return absl::OkStatus();
  const std::string type = TypeOf(post);
  if (type == "ByteLevel") return absl::OkStatus();  // only trims offsets, which we do not expose
  if (type == "Sequence") {
    MODSERVE_ASSIGN_OR_RETURN(const Json* list, Member(post, "processors", "post_processor"));
    if (!list->is_array()) return Malformed("post_processor.processors", "expected an array");
    for (const Json& p : *list) MODSERVE_RETURN_IF_ERROR(ParsePostProcessor(p));
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") {
    return Malformed("post_processor", absl::StrCat("unsupported post-processor type '", type,
                                                    "' (supported: TemplateProcessing, "
                                                    "ByteLevel, Sequence)"));
  }
  if (!prefix_ids_.empty() || !suffix_ids_.empty()) {
    return Malformed("post_processor", "unsupported: more than one TemplateProcessing");
  }
  MODSERVE_ASSIGN_OR_RETURN(const Json* single, Member(post, "single", "TemplateProcessing"));
  MODSERVE_ASSIGN_OR_RETURN(const Json* specials,
                            Member(post, "special_tokens", "TemplateProcessing"));
  if (!single->is_array()) return Malformed("TemplateProcessing.single", "expected an array");
  bool seen_sequence = false;
  for (const Json& item : *single) {
    if (item.is_object() && item.contains("Sequence")) {
      const Json& seq = item["Sequence"];
      if (!seq.is_object() || seq.value("id", "") != "A" || seen_sequence) {
        return Malformed("TemplateProcessing.single", "expects exactly one Sequence $A");
      }
      seen_sequence = true;
      continue;
    }
    if (!item.is_object() || !item.contains("SpecialToken") || !item["SpecialToken"].is_object()) {
      return Malformed("TemplateProcessing.single", absl::StrCat("unknown item ", item.dump()));
    }
    MODSERVE_ASSIGN_OR_RETURN(std::string name,
                              StringMember(item["SpecialToken"], "id", "SpecialToken"));
    MODSERVE_ASSIGN_OR_RETURN(const Json* entry,
                              Member(*specials, name, "TemplateProcessing.special_tokens"));
    MODSERVE_ASSIGN_OR_RETURN(const Json* ids, Member(*entry, "ids", name));
    if (!ids->is_array()) return Malformed(name, "'ids' must be an array");
    for (const Json& id : *ids) {
      MODSERVE_ASSIGN_OR_RETURN(int32_t v, IdValue(id, name));
      if (v >= vocab_size() || !has_token_[v]) {
        return Malformed(name, absl::StrCat("template id ", v, " names no token"));
      }
      (seen_sequence ? suffix_ids_ : prefix_ids_).push_back(v);
    }
  }
  if (!seen_sequence) return Malformed("TemplateProcessing.single", "has no Sequence $A");
  return absl::OkStatus();
}

absl::Status BpeTokenizer::ParseDecoder(const Json& decoder) {
  const std::string type = decoder.is_null() ? "null" : TypeOf(decoder);
  if (type != "ByteLevel") {
    return Malformed("decoder", absl::StrCat("unsupported decoder type '", type,
                                             "' (only ByteLevel is implemented)"));
  }
  // The reference decoder maps each token's characters back to bytes, falling back to the
  // token's own UTF-8 when a character is outside the byte alphabet (e.g. "hello world").
  id_to_bytes_.resize(id_to_token_.size());
  for (size_t id = 0; id < id_to_token_.size(); ++id) {
    if (!has_token_[id]) continue;
    std::optional<std::string> bytes = ByteLevelToBytes(id_to_token_[id]);
    id_to_bytes_[id] = bytes ? std::move(*bytes) : id_to_token_[id];
  }
  return absl::OkStatus();
}

void BpeTokenizer::SetSpecialIds(const BpeSpecialTokenNames& names) {
  if (is_special_.size() < id_to_token_.size()) is_special_.resize(id_to_token_.size(), 0);
  auto find = [&](std::string_view name) -> std::optional<int32_t> {
    auto it = token_to_id_.find(name);
    if (it == token_to_id_.end()) return std::nullopt;
    return it->second;
  };
  if (!names.bos.empty()) {
    bos_id_ = find(names.bos);
  } else if (!prefix_ids_.empty()) {
    bos_id_ = prefix_ids_.front();
  }
  if (!names.eos.empty()) {
    eos_id_ = find(names.eos);
  } else {
    for (std::string_view name :
         {"<|eos|>", "</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>"}) {
      if ((eos_id_ = find(name))) break;
    }
  }
}

absl::StatusOr<std::string> BpeTokenizer::Normalize(std::string_view text) const {
  if (!nfc_) return std::string(text);
  // ASCII text is already in NFC; skipping ICU for it keeps the common path cheap.
  if (std::all_of(text.begin(), text.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
    return std::string(text);
  }
#ifdef MODSERVE_TOKENIZER_HAS_ICU
  UErrorCode error = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(error);
  if (U_FAILURE(error)) return absl::InternalError("ICU NFC normalizer is unavailable");
  icu::UnicodeString normalized = nfc->normalize(
      icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), text.size())), error);
  if (U_FAILURE(error)) return absl::InternalError(absl::StrCat("ICU NFC failed: ", error));
  std::string out;
  normalized.toUTF8String(out);
  return out;
#else
  return absl::InternalError("NFC requested in a build without ICU");
#endif
}

void BpeTokenizer::SplitAddedTokens(std::string_view text, bool normalized_pass,
                                    std::vector<Segment>* out) const {
  const auto& matchers = normalized_pass ? normalized_matchers_ : raw_matchers_;
  size_t start_offset = 0;  // start of the text not yet emitted
  size_t pos = 0;
  while (pos < text.size()) {
    const auto& bucket = matchers[static_cast<unsigned char>(text[pos])];
    const AddedToken* match = nullptr;
    for (int32_t i : bucket) {
      const std::string& c = added_tokens_[i].content;
      if (text.compare(pos, c.size(), c) == 0) {
        match = &added_tokens_[i];
        break;
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos;
    size_t stop = pos + match->content.size();
    // A rejected match is still consumed: the reference's matcher yields non-overlapping matches.
    pos = stop;
    if (match->single_word) {
      const bool word_before =
          start > 0 && word_char_->FullMatch(text.substr(PreviousCharStart(text, start),
                                                         start - PreviousCharStart(text, start)));
      size_t next = stop;
      const bool word_after = stop < text.size() && (NextCodePoint(text, &next), true) &&
                              word_char_->FullMatch(text.substr(stop, next - stop));
      if (word_before || word_after) continue;
    }
    if (match->lstrip) {
      size_t s = start;
      while (s > 0) {
        const size_t prev = PreviousCharStart(text, s);
        size_t p = prev;
        if (!IsUnicodeWhitespace(NextCodePoint(text, &p))) break;
        s = prev;
      }
      start = std::max(s, start_offset);
    }
    if (match->rstrip) {
      while (stop < text.size()) {
        size_t p = stop;
        if (!IsUnicodeWhitespace(NextCodePoint(text, &p))) break;
        stop = p;
      }
      pos = stop;
    }
    if (start_offset < start) out->push_back({-1, text.substr(start_offset, start - start_offset)});
    out->push_back({match->id, text.substr(start, stop - start)});
    start_offset = stop;
  }
  if (start_offset < text.size()) out->push_back({-1, text.substr(start_offset)});
}

absl::Status BpeTokenizer::ApplySplit(const Pcre2Regex& regex, SplitBehavior behavior, bool invert,
                                      std::string_view piece,
                                      std::vector<std::string_view>* out) const {
  std::vector<std::pair<size_t, size_t>> found;
  MODSERVE_RETURN_IF_ERROR(regex.FindAll(piece, &found));
  // The piece as alternating (range, is_match) parts covering all of it, as the reference sees it.
  struct Part {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Part> parts;
  size_t prev = 0;
  for (const auto& [b, e] : found) {
    if (prev < b) parts.push_back({prev, b, invert});
    parts.push_back({b, e, !invert});
    prev = e;
  }
  if (prev < piece.size()) parts.push_back({prev, piece.size(), invert});

  std::vector<Part> merged;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Part& p : parts) {
        if (!p.is_match) merged.push_back(p);
      }
      break;
    case SplitBehavior::kIsolated:
      merged = std::move(parts);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Part& p : parts) {
        if (p.is_match && !previous_match && !merged.empty()) {
          merged.back().end = p.end;
        } else {
          merged.push_back(p);
        }
        previous_match = p.is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty()) {
          merged.back().begin = it->begin;
        } else {
          merged.push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const Part& p : parts) {
        if (p.is_match == previous_match && !merged.empty()) {
          merged.back().end = p.end;
        } else {
          merged.push_back(p);
        }
        previous_match = p.is_match;
      }
      break;
    }
  }
  for (const Part& p : merged) {
    if (p.end > p.begin) out->push_back(piece.substr(p.begin, p.end - p.begin));
  }
  return absl::OkStatus();
}

absl::Status BpeTokenizer::PreTokenize(std::string_view text, std::vector<std::string_view>* pieces,
                                       std::vector<std::string_view>* scratch) const {
  pieces->clear();
  pieces->push_back(text);
  for (const SplitStep& step : splits_) {
    scratch->clear();
    for (std::string_view p : *pieces) {
      MODSERVE_RETURN_IF_ERROR(ApplySplit(*step.regex, step.behavior, step.invert, p, scratch));
    }
    std::swap(*pieces, *scratch);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> BpeTokenizer::Encode(std::string_view text,
                                                          bool add_special_tokens) const {
  const size_t bad = FirstInvalidUtf8Offset(text);
  if (bad != text.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("text is not valid UTF-8 at byte ", bad, " of ", text.size()));
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + prefix_ids_.size() + suffix_ids_.size() + 1);
  if (add_special_tokens) ids.insert(ids.end(), prefix_ids_.begin(), prefix_ids_.end());

  std::vector<Segment> raw_segments;
  SplitAddedTokens(text, /*normalized_pass=*/false, &raw_segments);
  std::vector<std::string> normalized_texts;  // owns what the segments below point into
  normalized_texts.reserve(raw_segments.size());
  std::vector<Segment> segments;
  for (const Segment& seg : raw_segments) {
    if (seg.added_id >= 0) {
      segments.push_back(seg);
      continue;
    }
    std::string_view normalized = seg.text;
    if (nfc_) {
      MODSERVE_ASSIGN_OR_RETURN(std::string n, Normalize(seg.text));
      normalized_texts.push_back(std::move(n));
      normalized = normalized_texts.back();
    }
    SplitAddedTokens(normalized, /*normalized_pass=*/true, &segments);
  }

  std::vector<std::string_view> pieces, scratch, words;
  std::vector<std::pair<size_t, size_t>> matches;
  std::string prefixed;
  for (const Segment& seg : segments) {
    if (seg.added_id >= 0) {
      ids.push_back(seg.added_id);
      continue;
    }
    MODSERVE_RETURN_IF_ERROR(PreTokenize(seg.text, &pieces, &scratch));
    for (std::string_view piece : pieces) {
      // ByteLevel: the optional prefix space goes on every piece, then the GPT-2 split.
      if (add_prefix_space_ && piece[0] != ' ') {
        prefixed.resize(piece.size() + 1);
        prefixed[0] = ' ';
        piece.copy(prefixed.data() + 1, piece.size());
        piece = prefixed;
      }
      if (byte_level_regex_ == nullptr) {
        bpe_->EncodeWord(piece, &ids);
        continue;
      }
      words.clear();
      MODSERVE_RETURN_IF_ERROR(
          ApplySplit(*byte_level_regex_, SplitBehavior::kIsolated, false, piece, &words));
      for (std::string_view w : words) bpe_->EncodeWord(w, &ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

absl::StatusOr<std::string> BpeTokenizer::Decode(absl::Span<const int32_t> ids,
                                                 bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || !has_token_[id]) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " names no token (vocab_size ", vocab_size(), ")"));
    }
    if (skip_special_tokens && is_special_[id]) continue;
    bytes += id_to_bytes_[id];
  }
  return ReplaceInvalidUtf8(bytes);
}

std::optional<int32_t> BpeTokenizer::TokenToId(std::string_view token) const {
  auto it = token_to_id_.find(token);
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string_view> BpeTokenizer::IdToToken(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !has_token_[id]) return std::nullopt;
  return id_to_token_[id];
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadBpeTokenizerFromJson(
    std::string_view json_text, const BpeSpecialTokenNames& names) {
  Json root;
  try {
    root = Json::parse(json_text);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json is not valid JSON: ", e.what()));
  }
  // Accessors check types before reading, so nothing below should throw; the catch is a
  // backstop that keeps a third-party exception from escaping our no-throw boundary.
  try {
    return BpeTokenizer::Create(root, names);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", e.what()));
  }
}

bool BpeTokenizerSupportsNfc() {
#ifdef MODSERVE_TOKENIZER_HAS_ICU
  return true;
#else
  return false;
#endif
}

}  // namespace modserve::engine
