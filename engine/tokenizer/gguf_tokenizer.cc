// GGUF tokenizer metadata -> Tokenizer, following llama.cpp's reading of the same keys: its
// default ids and flags per tokenizer model and pre-tokenizer, its literal matching of special
// tokens, its split expressions (written here for PCRE2), its merge-by-spelling BPE and its
// score-driven SentencePiece merges. Goldens from llama.cpp itself check all of this
// (tests/testdata/tokenizer/gguf/).
#include "engine/tokenizer/gguf_tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/pcre2_regex.h"
#include "engine/tokenizer/utf8.h"

namespace modserve::engine {

std::vector<std::string_view> SupportedGgufPreTokenizers();

namespace {

using internal::StringToId;

// tokenizer.ggml.token_type values.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// A tokenizer.ggml.pre name group: llama.cpp's split expressions for it, in order, and the
// flags it implies. The expressions are llama.cpp's (its "adapted" forms where it rewrote a
// tokenizer.json pattern), in PCRE2 syntax; each split keeps both matches and the text between
// them as pieces, as llama.cpp's splitter does.
struct PreTokenizer {
  std::vector<std::string_view> names;
  std::vector<std::string_view> patterns;
  bool ignore_merges = false;
  bool add_bos = false;
};

// GPT-2's expression; llama.cpp lists it without the trailing "|\s+", which its splitter
// implies (unmatched whitespace becomes a piece of its own either way).
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|)"
    R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kPoro = R"( ?[^(\s|.,!?…。，、।۔،)]+)";
constexpr std::string_view kGpt4o =
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+)"
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|)"
    R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*)"
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kDeepseek3 =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|)"
    R"( ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kCjk = "[一-龥぀-ゟ゠-ヿ]+";

const std::vector<PreTokenizer>& PreTokenizers() {
  static const std::vector<PreTokenizer>* const table = new std::vector<PreTokenizer>{
      {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
        "jina-v5-nano"},
       {kLlama3},
       /*ignore_merges=*/true,
       /*add_bos=*/true},
      {{"dbrx", "smaug-bpe"}, {kLlama3}},
      {{"chatglm-bpe"}, {kLlama3}},
      {{"glm4", "glm5"}, {kLlama3}, /*ignore_merges=*/true},
      {{"jais-2"},
       {R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|)"
        R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|)"
        R"(\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|)"
        R"(\s{1,2}(?!\S)|\s{1})"}},
      {{"deepseek-coder"},
       {"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", "[一-龥ࠀ-一가-퟿]+", R"(\p{N})"}},
      {{"deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm"}, {R"(\p{N}{1,3})", kCjk, kDeepseek3}},
      {{"spark2_5"},
       {R"(\p{N}{1,3})", kCjk,
        R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|)"
        R"( ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+)",
        R"(\p{N})"}},
      {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b",
        "mellum2"},
       {R"(\p{N})", kGpt2}},
      {{"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "a.x-4.0", "mellum", "mpt", "olmo",
        "jais", "trillion", "granite-docling", "exaone4"},
       {kGpt2}},
      {{"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan",
        "solar-open", "grok-2"},
       {kQwen2}},
      {{"qwen35"},
       {R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?)"
        R"([\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {{"poro-chat", "bloom", "gpt3-finnish"}, {kPoro}},
      {{"viking"}, {kPoro, R"(\p{N})"}},
      {{"tekken"},
       {R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|)"
        R"([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|)"
        R"(\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       /*ignore_merges=*/true,
       /*add_bos=*/true},
      {{"chameleon"},
       {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )",
        R"(\p{N})", R"([\p{P}!-/:-@\[-`{-~])", kGpt2},
       false,
       /*add_bos=*/true},
      {{"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"}, {kGpt4o}},
      {{"granite-embed-multi-97m"},
       {R"([^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+)"
        R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|)"
        R"([^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*)"
        R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|)"
        R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       /*ignore_merges=*/true},
      {{"bailingmoe", "bailingmoe2", "llada-moe"},
       {R"('(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|)"
        R"( ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)"}},
      {{"seed-coder"},
       {R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|)"
        R"(\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {{"ufakzeka"},
       {R"([^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {{"laguna"}, {R"([^\n]+|[\n]+)", kQwen2}},
      {{"exaone-moe"},
       {R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?)"
        R"((?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|)"
        R"(\s+(?!\S)|\s+)"}},
      {{"minicpm5"},
       {R"(\p{N}{1,3})",
        R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|)"
        R"(\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       /*ignore_merges=*/true},
  };
  return *table;
}

// Token names llama.cpp treats as end of generation, and therefore as control tokens whatever
// the file's token type says; plus the fill-in-the-middle names it promotes the same way.
constexpr std::string_view kControlNames[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
    // fill in the middle: prefix, suffix, middle, pad, repo, file separator
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
    "<|code_prefix|>", "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
    "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>",
    "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>",
    "<|middle|>", "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", "<|fim_repo|>",
    "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>"};
// Names llama.cpp always renders (gpt-oss's channel markers), whatever their type.
constexpr std::string_view kAlwaysRenderedNames[] = {"<|channel|>", "<|message|>", "<|start|>",
                                                     "<|constrain|>"};

// Splits `text` at every match of `regex`, keeping matches and the gaps between them.
absl::Status SplitIsolated(const Pcre2Regex& regex, std::string_view text,
                           std::vector<std::string_view>* out,
                           std::vector<std::pair<size_t, size_t>>* scratch) {
  MODSERVE_RETURN_IF_ERROR(regex.FindAll(text, scratch));
  size_t prev = 0;
  for (const auto& [b, e] : *scratch) {
    if (prev < b) out->push_back(text.substr(prev, b - prev));
    out->push_back(text.substr(b, e - b));
    prev = e;
  }
  if (prev < text.size()) out->push_back(text.substr(prev));
  return absl::OkStatus();
}

std::string JoinNames(const std::vector<std::string_view>& names) {
  std::string out;
  for (std::string_view n : names) {
    if (!out.empty()) out += ", ";
    out.append(n);
  }
  return out;
}

// "<0xAB>" -> 0xAB.
std::optional<uint8_t> ParseByteToken(std::string_view text) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return std::nullopt;
  const int hi = hex(text[3]);
  const int lo = hex(text[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}

void ReplaceAll(std::string* s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s->size());
  size_t pos = 0;
  while (true) {
    const size_t hit = s->find(from, pos);
    if (hit == std::string::npos) break;
    out.append(*s, pos, hit - pos);
    out.append(to);
    pos = hit + from.size();
  }
  out.append(*s, pos, std::string::npos);
  *s = std::move(out);
}

// A key a present tokenizer needs: its absence is malformed metadata (InvalidArgument), unlike a
// file without tokenizer.ggml.model, which has no tokenizer at all (NotFound).
template <typename T>
absl::StatusOr<T> Required(absl::StatusOr<T> value) {
  if (absl::IsNotFound(value.status())) {
    return absl::InvalidArgumentError(value.status().message());
  }
  return value;
}

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// What both tokenizer models share: the vocabulary with its types, literal matching of special
// tokens, BOS/EOS and the piece table Decode concatenates.
class GgufTokenizer : public Tokenizer {
 public:
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              bool add_special_tokens) const override;
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool skip_special_tokens) const override;
  int vocab_size() const override { return static_cast<int>(tokens_.size()); }
  std::optional<int32_t> TokenToId(std::string_view token) const override {
    auto it = token_to_id_.find(token);
    if (it == token_to_id_.end()) return std::nullopt;
    return it->second;
  }
  std::optional<std::string_view> IdToToken(int32_t id) const override {
    if (id < 0 || id >= vocab_size()) return std::nullopt;
    return std::string_view(tokens_[id]);
  }
  bool IsSpecial(int32_t id) const override {
    return id >= 0 && id < vocab_size() &&
           (types_[id] == TokenType::kControl || types_[id] == TokenType::kUnknown);
  }
  std::optional<int32_t> bos_id() const override { return bos_id_; }
  std::optional<int32_t> eos_id() const override { return eos_id_; }

 protected:
  // Reads what both models share; add_bos_ and add_space_prefix_ hold the model's defaults.
  absl::Status LoadCommon(const GgufFile& file, bool spm);
  // Appends the ids of one run of text between literal tokens. `after_literal`: the run starts
  // the text or follows a literal token.
  virtual absl::Status EncodeText(std::string_view text, bool after_literal,
                                  std::vector<int32_t>* ids) const = 0;
  // The piece of a normal token (byte-level decoded, or with U+2581 as space).
  virtual std::string NormalPiece(int32_t id) const = 0;
  void BuildPieces();

  std::string path_;
  std::vector<std::string> tokens_;  // spellings by id
  std::vector<TokenType> types_;
  StringToId token_to_id_;  // spelling -> id; a repeated spelling means its last id
  std::optional<int32_t> bos_id_, eos_id_, unk_id_;
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool add_space_prefix_ = false;

 private:
  struct Fragment {
    size_t begin;
    size_t end;
    int32_t id;  // -1: text
  };
  std::vector<int32_t> literal_ids_;  // control, user-defined and unknown; longest first
  std::vector<std::string> pieces_;   // Decode's text per id, special tokens included
};

absl::Status GgufTokenizer::LoadCommon(const GgufFile& file, bool spm) {
  path_ = file.path();
  MODSERVE_ASSIGN_OR_RETURN(absl::Span<const std::string_view> tokens,
                            Required(file.GetStringArray("tokenizer.ggml.tokens")));
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": metadata key 'tokenizer.ggml.tokens' is an empty array"));
  }
  if (tokens.size() > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": metadata key 'tokenizer.ggml.tokens' has ", tokens.size(), " entries"));
  }
  const int32_t n = static_cast<int32_t>(tokens.size());
  tokens_.reserve(n);
  for (int32_t id = 0; id < n; ++id) {
    // llama.cpp renames empty spellings, which could otherwise match everywhere.
    tokens_.push_back(tokens[id].empty() ? absl::StrCat("[EMPTY_", id, "]")
                                         : std::string(tokens[id]));
    token_to_id_.insert_or_assign(tokens_.back(), id);
  }

  types_.assign(n, TokenType::kNormal);
  if (file.Contains("tokenizer.ggml.token_type")) {
    MODSERVE_ASSIGN_OR_RETURN(std::vector<int32_t> types,
                              file.GetI32Array("tokenizer.ggml.token_type"));
    if (types.size() < tokens.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": metadata key 'tokenizer.ggml.token_type' has ", types.size(),
                       " entries for ", tokens.size(), " tokens"));
    }
    for (int32_t id = 0; id < n; ++id) {
      types_[id] = types[id] >= 0 && types[id] <= 6 ? static_cast<TokenType>(types[id])
                                                    : TokenType::kUndefined;
    }
  }
  for (std::string_view name : kControlNames) {
    if (auto it = token_to_id_.find(name); it != token_to_id_.end()) {
      types_[it->second] = TokenType::kControl;
    }
  }
  for (std::string_view name : kAlwaysRenderedNames) {
    if (auto it = token_to_id_.find(name); it != token_to_id_.end()) {
      types_[it->second] = TokenType::kUserDefined;
    }
  }
  // gpt-oss: with <|return|> and <|call|> present, <|end|> ends a message, not the generation.
  const bool harmony = (TokenToId("<|return|>") && TokenToId("<|call|>")) ||
                       (TokenToId("<|calls|>") && TokenToId("<|flush|>"));
  if (harmony && TokenToId("<|end|>")) types_[*TokenToId("<|end|>")] = TokenType::kUserDefined;

  // Special ids: a key naming an id outside the vocabulary is ignored, as llama.cpp does.
  auto special_id = [&](std::string_view key,
                        std::optional<int32_t> fallback) -> absl::StatusOr<std::optional<int32_t>> {
    std::optional<int32_t> id = fallback && *fallback < n ? fallback : std::nullopt;
    if (!file.Contains(key)) return id;
    MODSERVE_ASSIGN_OR_RETURN(uint32_t v, file.GetU32(key));
    if (v < static_cast<uint32_t>(n)) id = static_cast<int32_t>(v);
    return id;
  };
  std::optional<int32_t> default_bos, default_eos, default_unk;
  if (spm) {
    default_bos = 1;
    default_eos = 2;
    default_unk = 0;
  }
  MODSERVE_ASSIGN_OR_RETURN(bos_id_, special_id("tokenizer.ggml.bos_token_id", default_bos));
  MODSERVE_ASSIGN_OR_RETURN(eos_id_, special_id("tokenizer.ggml.eos_token_id", default_eos));
  MODSERVE_ASSIGN_OR_RETURN(unk_id_, special_id("tokenizer.ggml.unknown_token_id", default_unk));
  for (auto [key, flag] :
       {std::pair<std::string_view, bool*>{"tokenizer.ggml.add_bos_token", &add_bos_},
        {"tokenizer.ggml.add_eos_token", &add_eos_},
        {"tokenizer.ggml.add_space_prefix", &add_space_prefix_}}) {
    if (file.Contains(key)) {
      MODSERVE_ASSIGN_OR_RETURN(*flag, file.GetBool(key));
    }
  }
  if (add_bos_ && !bos_id_) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_,
                     ": BOS is to be added (tokenizer.ggml.add_bos_token, or the default of this "
                     "tokenizer) but metadata key 'tokenizer.ggml.bos_token_id' names no token"));
  }
  if (add_eos_ && !eos_id_) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_,
                     ": metadata key 'tokenizer.ggml.add_eos_token' is true but "
                     "'tokenizer.ggml.eos_token_id' names no token"));
  }
  if (file.Contains("tokenizer.chat_template")) {
    MODSERVE_ASSIGN_OR_RETURN(std::string_view tmpl, file.GetString("tokenizer.chat_template"));
    set_chat_template(std::string(tmpl));
  }

  for (int32_t id = 0; id < n; ++id) {
    const TokenType t = types_[id];
    if (t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) {
      literal_ids_.push_back(id);
    }
  }
  std::stable_sort(literal_ids_.begin(), literal_ids_.end(),
                   [&](int32_t a, int32_t b) { return tokens_[a].size() > tokens_[b].size(); });
  return absl::OkStatus();
}

void GgufTokenizer::BuildPieces() {
  pieces_.resize(tokens_.size());
  for (size_t id = 0; id < tokens_.size(); ++id) {
    switch (types_[id]) {
      case TokenType::kNormal:
        pieces_[id] = NormalPiece(static_cast<int32_t>(id));
        break;
      case TokenType::kControl:
      case TokenType::kUnknown:
      case TokenType::kUserDefined:
        pieces_[id] = tokens_[id];
        break;
      case TokenType::kByte:
        if (std::optional<uint8_t> b = ParseByteToken(tokens_[id])) {
          pieces_[id] = std::string(1, static_cast<char>(*b));
        } else {
          pieces_[id] = tokens_[id];
        }
        break;
      case TokenType::kUnused:
      case TokenType::kUndefined:
        break;  // llama.cpp renders nothing for these
    }
  }
}

absl::StatusOr<std::vector<int32_t>> GgufTokenizer::Encode(std::string_view text,
                                                           bool add_special_tokens) const {
  const size_t bad = FirstInvalidUtf8Offset(text);
  if (bad != text.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("text is not valid UTF-8 at byte ", bad, " of ", text.size()));
  }
  // Literal tokens, longest first: each claims its occurrences, left to right, in the text no
  // longer token has claimed (llama.cpp's order, not leftmost-longest).
  std::vector<Fragment> fragments;
  if (!text.empty()) fragments.push_back({0, text.size(), -1});
  std::vector<Fragment> next;
  for (int32_t id : literal_ids_) {
    const std::string& lit = tokens_[id];
    if (text.find(lit) == std::string_view::npos) continue;
    next.clear();
    for (const Fragment& f : fragments) {
      if (f.id >= 0) {
        next.push_back(f);
        continue;
      }
      const std::string_view window = text.substr(0, f.end);
      size_t pos = f.begin;
      while (true) {
        const size_t hit = window.find(lit, pos);
        if (hit == std::string_view::npos) break;
        if (hit > pos) next.push_back({pos, hit, -1});
        next.push_back({hit, hit + lit.size(), id});
        pos = hit + lit.size();
      }
      if (pos < f.end) next.push_back({pos, f.end, -1});
    }
    std::swap(fragments, next);
  }

  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (add_special_tokens && add_bos_) ids.push_back(*bos_id_);
  bool after_literal = true;
  for (const Fragment& f : fragments) {
    if (f.id >= 0) {
      ids.push_back(f.id);
      after_literal = true;
      continue;
    }
    MODSERVE_RETURN_IF_ERROR(
        EncodeText(text.substr(f.begin, f.end - f.begin), after_literal, &ids));
    after_literal = false;
  }
  if (add_special_tokens && add_eos_) ids.push_back(*eos_id_);
  return ids;
}

absl::StatusOr<std::string> GgufTokenizer::Decode(absl::Span<const int32_t> ids,
                                                  bool skip_special_tokens) const {
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside [0, vocab_size ", vocab_size(), ")"));
    }
  }
  // As llama.cpp's detokenizer: the first piece loses one leading space where a space prefix
  // was added, unless the ids start with a BOS that skip_special_tokens removes.
  bool strip_space = add_space_prefix_;
  size_t begin = 0;
  size_t end = ids.size();
  if (skip_special_tokens && add_bos_ && end > 0 && ids[0] == *bos_id_) {
    strip_space = false;
    ++begin;
  }
  if (skip_special_tokens && add_eos_ && end > begin && ids[end - 1] == *eos_id_) --end;
  std::string bytes;
  for (size_t i = begin; i < end; ++i) {
    const int32_t id = ids[i];
    if (skip_special_tokens && IsSpecial(id)) {
      strip_space = false;
      continue;
    }
    std::string_view piece = pieces_[id];
    if (strip_space && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
    strip_space = false;
    bytes.append(piece);
  }
  return ReplaceInvalidUtf8(bytes);
}

// ---- "gpt2": byte-level BPE ----

class GgufBpeTokenizer final : public GgufTokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(const GgufFile& file);

 private:
  absl::Status EncodeText(std::string_view text, bool after_literal,
                          std::vector<int32_t>* ids) const override;
  std::string NormalPiece(int32_t id) const override {
    // A spelling outside the byte alphabet decodes as itself.
    std::optional<std::string> bytes = internal::ByteLevelToBytes(tokens_[id]);
    return bytes ? *std::move(bytes) : tokens_[id];
  }

  std::vector<std::unique_ptr<Pcre2Regex>> splits_;
  std::optional<internal::BpeModel> bpe_;
};

absl::StatusOr<std::unique_ptr<Tokenizer>> GgufBpeTokenizer::Create(const GgufFile& file) {
  std::unique_ptr<GgufBpeTokenizer> tok(new GgufBpeTokenizer());
  std::string pre = "default";
  if (file.Contains("tokenizer.ggml.pre")) {
    MODSERVE_ASSIGN_OR_RETURN(std::string_view p, file.GetString("tokenizer.ggml.pre"));
    if (!p.empty()) pre = std::string(p);  // llama.cpp reads an empty name as "default"
  }
  const PreTokenizer* spec = nullptr;
  for (const PreTokenizer& p : PreTokenizers()) {
    if (std::find(p.names.begin(), p.names.end(), pre) != p.names.end()) spec = &p;
  }
  if (spec == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.path(), ": metadata key 'tokenizer.ggml.pre' names pre-tokenizer '",
        GgufPrintable(pre),
        "', which is not supported (supported: ", JoinNames(SupportedGgufPreTokenizers()), ")"));
  }
  for (std::string_view pattern : spec->patterns) {
    absl::StatusOr<std::unique_ptr<Pcre2Regex>> re = Pcre2Regex::Compile(pattern);
    if (!re.ok()) return absl::InternalError(std::string(re.status().message()));
    tok->splits_.push_back(*std::move(re));
  }
  tok->add_bos_ = spec->add_bos;
  MODSERVE_RETURN_IF_ERROR(tok->LoadCommon(file, /*spm=*/false));

  MODSERVE_ASSIGN_OR_RETURN(absl::Span<const std::string_view> merges,
                            Required(file.GetStringArray("tokenizer.ggml.merges")));
  std::vector<std::pair<std::string_view, std::string_view>> pairs;
  pairs.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string_view m = merges[rank];
    // The separator is the first space after the first byte (a left part may start with one).
    const size_t space = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
    if (space == std::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": metadata key 'tokenizer.ggml.merges': entry #", rank, " '",
                       GgufPrintable(m), "' is not two spellings separated by a space"));
    }
    pairs.emplace_back(m.substr(0, space), m.substr(space + 1));
  }
  std::vector<std::pair<std::string_view, int32_t>> spellings;
  spellings.reserve(tok->tokens_.size());
  for (size_t id = 0; id < tok->tokens_.size(); ++id) {
    spellings.emplace_back(tok->tokens_[id], static_cast<int32_t>(id));
  }
  internal::BpeModelOptions options;
  options.ignore_merges = spec->ignore_merges;
  options.first_rank_wins = true;
  options.merges_by_spelling = true;
  MODSERVE_ASSIGN_OR_RETURN(internal::BpeModel bpe,
                            internal::BpeModel::Create(spellings, pairs, options));
  tok->bpe_ = std::move(bpe);
  tok->BuildPieces();
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

absl::Status GgufBpeTokenizer::EncodeText(std::string_view text, bool /*after_literal*/,
                                          std::vector<int32_t>* ids) const {
  std::vector<std::string_view> pieces{text};
  std::vector<std::string_view> next;
  std::vector<std::pair<size_t, size_t>> matches;
  for (const auto& regex : splits_) {
    next.clear();
    for (std::string_view p : pieces) {
      MODSERVE_RETURN_IF_ERROR(SplitIsolated(*regex, p, &next, &matches));
    }
    std::swap(pieces, next);
  }
  for (std::string_view p : pieces) bpe_->EncodeWord(p, ids);
  return absl::OkStatus();
}

// ---- "llama": SentencePiece-style BPE over scores ----

class GgufSpmTokenizer final : public GgufTokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(const GgufFile& file);

 private:
  absl::Status EncodeText(std::string_view text, bool after_literal,
                          std::vector<int32_t>* ids) const override;
  std::string NormalPiece(int32_t id) const override {
    std::string piece = tokens_[id];
    ReplaceAll(&piece, kSpmSpace, " ");
    return piece;
  }
  // The byte token for `b`: <0xXX>, else the one-byte spelling, else unk; nullopt if none.
  std::optional<int32_t> ByteToken(uint8_t b) const;

  std::vector<float> scores_;
};

absl::StatusOr<std::unique_ptr<Tokenizer>> GgufSpmTokenizer::Create(const GgufFile& file) {
  std::unique_ptr<GgufSpmTokenizer> tok(new GgufSpmTokenizer());
  tok->add_bos_ = true;
  tok->add_space_prefix_ = true;
  MODSERVE_RETURN_IF_ERROR(tok->LoadCommon(file, /*spm=*/true));
  const size_t n = tok->tokens_.size();
  tok->scores_.assign(n, 0.0f);
  if (file.Contains("tokenizer.ggml.scores")) {
    absl::StatusOr<std::vector<float>> scores = file.GetF32Array("tokenizer.ggml.scores");
    if (!scores.ok()) {
      // llama.cpp also takes integer scores.
      absl::StatusOr<std::vector<int32_t>> iscores = file.GetI32Array("tokenizer.ggml.scores");
      if (!iscores.ok()) return scores.status();
      scores = std::vector<float>(iscores->begin(), iscores->end());
    }
    if (scores->size() < n) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": metadata key 'tokenizer.ggml.scores' has ", scores->size(),
                       " entries for ", n, " tokens"));
    }
    std::copy(scores->begin(), scores->begin() + n, tok->scores_.begin());
  }
  tok->BuildPieces();
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

std::optional<int32_t> GgufSpmTokenizer::ByteToken(uint8_t b) const {
  static constexpr char kHex[] = "0123456789ABCDEF";
  const char name[6] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
  if (auto id = TokenToId(std::string_view(name, 6))) return id;
  const char raw = static_cast<char>(b);
  if (auto id = TokenToId(std::string_view(&raw, 1))) return id;
  return unk_id_;
}

absl::Status GgufSpmTokenizer::EncodeText(std::string_view raw, bool after_literal,
                                          std::vector<int32_t>* ids) const {
  std::string text;
  if (add_space_prefix_ && after_literal) text = " ";
  text.append(raw);
  ReplaceAll(&text, " ", kSpmSpace);

  // Symbols are runs of whole characters; merging the best-scoring adjacent pair whose
  // spelling is a token (ties: leftmost), until none is.
  struct Symbol {
    size_t begin;
    size_t len;  // 0: merged into the symbol on its left
    int32_t prev;
    int32_t next;
  };
  struct Bigram {
    float score;
    int32_t left;
    int32_t right;
    size_t len;
  };
  auto worse = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::vector<Symbol> symbols;
  for (size_t pos = 0; pos < text.size();) {
    const auto lead = static_cast<unsigned char>(text[pos]);
    const size_t len = std::min<size_t>(lead < 0xC0   ? 1
                                        : lead < 0xE0 ? 2
                                        : lead < 0xF0 ? 3
                                                      : 4,
                                        text.size() - pos);
    const int32_t idx = static_cast<int32_t>(symbols.size());
    symbols.push_back({pos, len, idx - 1, idx + 1});
    pos += len;
  }
  if (symbols.empty()) return absl::OkStatus();
  symbols.back().next = -1;
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> queue(worse);
  const std::string_view view(text);
  auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const size_t len = symbols[left].len + symbols[right].len;
    auto it = token_to_id_.find(view.substr(symbols[left].begin, len));
    if (it == token_to_id_.end()) return;
    queue.push({scores_[it->second], left, right, len});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const Bigram top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.left];
    Symbol& right = symbols[top.right];
    if (left.len == 0 || right.len == 0 || left.len + right.len != top.len) continue;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    try_add(left.prev, top.left);
    try_add(top.left, left.next);
  }
  for (int32_t i = 0; i != -1; i = symbols[i].next) {
    const std::string_view piece = view.substr(symbols[i].begin, symbols[i].len);
    if (auto it = token_to_id_.find(piece); it != token_to_id_.end()) {
      ids->push_back(it->second);
      continue;
    }
    for (char c : piece) {
      if (std::optional<int32_t> id = ByteToken(static_cast<uint8_t>(c))) ids->push_back(*id);
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string_view> SupportedGgufPreTokenizers() {
  std::vector<std::string_view> names;
  for (const PreTokenizer& p : PreTokenizers()) {
    names.insert(names.end(), p.names.begin(), p.names.end());
  }
  return names;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerFromGguf(const GgufFile& file) {
  MODSERVE_ASSIGN_OR_RETURN(std::string_view model, file.GetString("tokenizer.ggml.model"));
  if (model == "no_vocab" || model == "none") {
    // llama.cpp's marker for a model without a vocabulary (ids only).
    return absl::NotFoundError(absl::StrCat(file.path(), ": metadata key 'tokenizer.ggml.model' "
                                            "is '", std::string(model), "': no tokenizer"));
  }
  if (model == "gpt2") return GgufBpeTokenizer::Create(file);
  if (model == "llama") return GgufSpmTokenizer::Create(file);
  return absl::InvalidArgumentError(
      absl::StrCat(file.path(), ": metadata key 'tokenizer.ggml.model' is '", GgufPrintable(model),
                   "', which is not supported (supported: gpt2, llama)"));
}

}  // namespace modserve::engine
