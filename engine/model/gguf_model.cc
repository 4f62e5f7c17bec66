// GGUF metadata -> ModelConfig through config.json's own validator: the metadata is rewritten as
// the config.json it stands for and given to ParseConfig, so both formats obey one set of rules;
// ParseConfig's messages are translated back to the GGUF key names.
#include "engine/model/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "engine/common/status_macros.h"
#include "nlohmann/json.hpp"

namespace modserve::engine {
namespace {

using Json = nlohmann::json;

// Debian's Abseil has its own string_view, which StrCat wants.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// kFloatOrArray: a FLOAT32/FLOAT64 or an ARRAY of them (a per-routed-layer list).
enum class Kind : uint8_t { kInt, kFloat, kBool, kString, kIntArray, kFloatArray, kFloatOrArray };

struct KeySpec {
  GgufConfigKey key;
  Kind kind;
  bool required;
};

// Keys read by the generic path below; eos/eot, the vocabulary size and head_dim have extra
// rules and are read by hand. The json_key is a '/'-free dotted path into config.json.
constexpr KeySpec kSpecs[] = {
    {{"llama.embedding_length", "hidden_size"}, Kind::kInt, true},
    {{"llama.block_count", "num_hidden_layers"}, Kind::kInt, true},
    {{"llama.feed_forward_length", "intermediate_size"}, Kind::kInt, true},
    {{"llama.attention.head_count", "num_attention_heads"}, Kind::kInt, true},
    {{"llama.attention.head_count_kv", "num_key_value_heads"}, Kind::kInt, false},
    {{"llama.attention.key_length", "head_dim"}, Kind::kInt, false},
    {{"llama.attention.layer_norm_rms_epsilon", "rms_norm_eps"}, Kind::kFloat, true},
    {{"llama.rope.freq_base", "rope_theta"}, Kind::kFloat, false},
    {{"llama.context_length", "max_position_embeddings"}, Kind::kInt, true},
    {{"llama.vocab_size", "vocab_size"}, Kind::kInt, false},
    {{"tokenizer.ggml.bos_token_id", "bos_token_id"}, Kind::kInt, false},
    {{"tokenizer.ggml.eos_token_id", "eos_token_id"}, Kind::kInt, false},
    {{"modserve.mod.format_version", "mod.format_version"}, Kind::kInt, false},
    {{"modserve.mod.routed_layers", "mod.routed_layers"}, Kind::kIntArray, false},
    {{"modserve.mod.capacity", "mod.capacity"}, Kind::kFloatOrArray, false},
    {{"modserve.mod.router.bias", "mod.router.bias"}, Kind::kBool, false},
    {{"modserve.mod.router.input", "mod.router.input"}, Kind::kString, false},
    {{"modserve.mod.weight_fn", "mod.weight_fn"}, Kind::kString, false},
    {{"modserve.mod.scale_target", "mod.scale_target"}, Kind::kString, false},
    {{"modserve.mod.inference_routing", "mod.inference_routing"}, Kind::kString, false},
    {{"modserve.mod.threshold", "mod.threshold"}, Kind::kFloat, false},
    {{"modserve.mod.layer_thresholds", "mod.layer_thresholds"}, Kind::kFloatArray, false},
    {{"modserve.mod.predictor.type", "mod.predictor.type"}, Kind::kString, false},
    {{"modserve.mod.predictor.hidden_size", "mod.predictor.hidden_size"}, Kind::kInt, false},
    {{"modserve.mod.predictor.activation", "mod.predictor.activation"}, Kind::kString, false},
    {{"modserve.mod.predictor.bias", "mod.predictor.bias"}, Kind::kBool, false},
};

constexpr std::string_view kEotKey = "tokenizer.ggml.eot_token_id";
constexpr std::string_view kTokensKey = "tokenizer.ggml.tokens";
constexpr std::string_view kValueLengthKey = "llama.attention.value_length";
constexpr std::string_view kRopeDimKey = "llama.rope.dimension_count";

std::string Key(std::string_view k) { return absl::StrCat("'", Sv(k), "'"); }

absl::Status Invalid(const GgufFile& f, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", what));
}

// A missing key read with a getter comes back NotFound; in a model's metadata that is a bad
// file, as a missing config.json key is.
absl::Status Required(absl::Status s) {
  return absl::IsNotFound(s) ? absl::InvalidArgumentError(s.message()) : s;
}

Json::json_pointer Pointer(std::string_view dotted) {
  return Json::json_pointer(absl::StrCat("/", absl::StrReplaceAll(Sv(dotted), {{".", "/"}})));
}

absl::StatusOr<Json> ReadValue(const GgufFile& f, const KeySpec& spec) {
  const std::string_view key = spec.key.gguf_key;
  switch (spec.kind) {
    case Kind::kInt: {
      MODSERVE_ASSIGN_OR_RETURN(const int64_t v, f.GetI64(key));
      return Json(v);
    }
    case Kind::kFloat: {
      MODSERVE_ASSIGN_OR_RETURN(const double v, f.GetF64(key));
      if (!std::isfinite(v)) {
        return Invalid(f, absl::StrCat("metadata key ", Key(key), " must be finite, got ", v));
      }
      return Json(v);
    }
    case Kind::kBool: {
      MODSERVE_ASSIGN_OR_RETURN(const bool v, f.GetBool(key));
      return Json(v);
    }
    case Kind::kString: {
      MODSERVE_ASSIGN_OR_RETURN(const std::string_view v, f.GetString(key));
      return Json(std::string(v));
    }
    case Kind::kIntArray: {
      MODSERVE_ASSIGN_OR_RETURN(const std::vector<int64_t> v, f.GetI64Array(key));
      return Json(v);
    }
    case Kind::kFloatOrArray:
      if (const GgufValue* g = f.Find(key); g == nullptr || g->type != GgufType::kArray) {
        return ReadValue(f, KeySpec{spec.key, Kind::kFloat, spec.required});
      }
      [[fallthrough]];
    case Kind::kFloatArray: {
      MODSERVE_ASSIGN_OR_RETURN(const std::vector<double> v, f.GetF64Array(key));
      for (double x : v) {
        if (!std::isfinite(x)) {
          return Invalid(f, absl::StrCat("metadata key ", Key(key), " must be finite, got ", x));
        }
      }
      return Json(v);
    }
  }
  return Json();
}

// Rewrites a ParseConfig message ("config.json: 'mod.weight_fn' has ...") in GGUF terms.
std::string Translate(const GgufFile& f, std::string_view message) {
  std::string m(message);
  constexpr std::string_view kPrefix = "config.json: ";
  if (absl::StartsWith(m, Sv(kPrefix))) m.erase(0, kPrefix.size());
  std::vector<std::pair<std::string, std::string>> replacements;
  for (const KeySpec& s : kSpecs) {
    replacements.emplace_back(Key(s.key.json_key), Key(s.key.gguf_key));
  }
  replacements.emplace_back("'mod.predictor'", "'modserve.mod.predictor.type'");
  replacements.emplace_back("'mod.router'", "'modserve.mod.router.*'");
  std::vector<std::pair<absl::string_view, absl::string_view>> views;
  for (const auto& [from, to] : replacements) views.emplace_back(from, to);
  return absl::StrCat(f.path(), ": GGUF metadata: ", absl::StrReplaceAll(m, views));
}

// The features of llama.cpp's llama architecture that the engine does not run.
absl::Status CheckUnsupported(const GgufFile& f) {
  if (const GgufValue* v = f.Find("llama.rope.scaling.type"); v != nullptr) {
    MODSERVE_ASSIGN_OR_RETURN(const std::string_view type, f.GetString("llama.rope.scaling.type"));
    if (type != "none") {
      return Invalid(f, absl::StrCat("metadata key 'llama.rope.scaling.type' = \"",
                                     GgufPrintable(type), "\": RoPE scaling is not supported"));
    }
  } else if (f.Contains("llama.rope.scaling.factor")) {
    MODSERVE_ASSIGN_OR_RETURN(const double factor, f.GetF64("llama.rope.scaling.factor"));
    if (factor != 1.0) {
      return Invalid(f, absl::StrCat("metadata key 'llama.rope.scaling.factor' = ", factor,
                                     ": RoPE scaling is not supported"));
    }
  }
  if (f.Contains("llama.expert_count")) {
    MODSERVE_ASSIGN_OR_RETURN(const uint64_t experts, f.GetU64("llama.expert_count"));
    if (experts > 0) {
      return Invalid(f, absl::StrCat("metadata key 'llama.expert_count' = ", experts,
                                     ": mixture-of-experts models are not supported"));
    }
  }
  return absl::OkStatus();
}

std::string TensorTypeName(uint32_t ggml_type) {
  const GgmlTypeInfo* t = FindGgmlType(ggml_type);
  return t == nullptr ? absl::StrCat("ggml type ", ggml_type) : std::string(t->name);
}

// Layer index of "blk.N.<suffix>", or -1.
int64_t LayerOf(std::string_view name, std::string_view suffix) {
  if (!absl::StartsWith(Sv(name), "blk.") || !absl::EndsWith(Sv(name), Sv(suffix))) return -1;
  const absl::string_view digits = Sv(name).substr(4, name.size() - 4 - suffix.size());
  int64_t l = -1;
  if (digits.empty() || digits.size() > 10 || !absl::SimpleAtoi(digits, &l)) return -1;
  return absl::StrCat(l) == digits ? l : -1;  // no sign, no leading zeros
}

}  // namespace

absl::Span<const GgufConfigKey> GgufConfigKeys() {
  static const std::vector<GgufConfigKey>* keys = [] {
    auto* v = new std::vector<GgufConfigKey>;
    for (const KeySpec& s : kSpecs) v->push_back(s.key);
    return v;
  }();
  return *keys;
}

int64_t GgufRowOfHfRow(int64_t hf_row, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  const int64_t head = hf_row / head_dim, r = hf_row % head_dim;
  return head * head_dim + 2 * (r % half) + r / half;
}

absl::StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& f) {
  absl::StatusOr<std::string_view> arch = f.GetString("general.architecture");
  if (!arch.ok()) return Required(arch.status());
  if (*arch != kGgufArchitecture) {
    return Invalid(f, absl::StrCat("architecture \"", GgufPrintable(*arch),
                                   "\" (metadata key 'general.architecture') is not supported; "
                                   "modserve runs \"llama\" models"));
  }
  MODSERVE_RETURN_IF_ERROR(CheckUnsupported(f));

  // Any modserve.* key must be one this version knows: a newer writer's key is an error, never
  // silently dropped (as an unknown key inside config.json's `mod`).
  std::vector<std::string_view> known;
  for (const KeySpec& s : kSpecs) {
    if (absl::StartsWith(Sv(s.key.gguf_key), "modserve.")) known.push_back(s.key.gguf_key);
  }
  for (const auto& [key, value] : f.metadata()) {
    if (!absl::StartsWith(Sv(key), "modserve.")) continue;
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      std::vector<absl::string_view> names;
      for (std::string_view k : known) names.push_back(Sv(k));
      return Invalid(f, absl::StrCat("unknown metadata key '", GgufPrintable(key),
                                     "' (known modserve keys: ", absl::StrJoin(names, ", "), ")"));
    }
  }

  Json cfg = Json::object();
  cfg["model_type"] = "llama";
  for (const KeySpec& s : kSpecs) {
    if (!f.Contains(s.key.gguf_key)) {
      if (s.required) {
        return Invalid(f, absl::StrCat("missing required metadata key ", Key(s.key.gguf_key)));
      }
      continue;
    }
    MODSERVE_ASSIGN_OR_RETURN(Json v, ReadValue(f, s));
    cfg[Pointer(s.key.json_key)] = std::move(v);
  }

  // The vocabulary size: llama.vocab_size, else the tokenizer's token count (as llama.cpp).
  if (!cfg.contains("vocab_size")) {
    if (!f.Contains(kTokensKey)) {
      return Invalid(f, "no vocabulary size: the metadata has neither 'llama.vocab_size' nor "
                        "'tokenizer.ggml.tokens'");
    }
    MODSERVE_ASSIGN_OR_RETURN(const auto tokens, f.GetStringArray(kTokensKey));
    cfg["vocab_size"] = static_cast<int64_t>(tokens.size());
  }
  // End of generation: the eos token and, for chat models, the end-of-turn token.
  if (f.Contains(kEotKey)) {
    MODSERVE_ASSIGN_OR_RETURN(const int64_t eot, f.GetI64(kEotKey));
    const int64_t vocab = cfg["vocab_size"].get<int64_t>();
    if (eot < 0 || eot >= vocab) {
      return Invalid(f, absl::StrCat("metadata key ", Key(kEotKey), " = ", eot,
                                     " is outside the vocabulary [0, ", vocab, ")"));
    }
    Json eos = Json::array();
    if (cfg.contains("eos_token_id")) eos.push_back(cfg["eos_token_id"]);
    if (eos.empty() || eos[0].get<int64_t>() != eot) eos.push_back(eot);
    cfg["eos_token_id"] = eos;
  }
  // head_dim: the key length, else d_model / n_heads; values and the rotary part must match it.
  if (cfg["hidden_size"].get<int64_t>() > 0 && cfg["num_attention_heads"].get<int64_t>() > 0) {
    const int64_t head_dim = cfg.contains("head_dim") ? cfg["head_dim"].get<int64_t>()
                                                      : cfg["hidden_size"].get<int64_t>() /
                                                            cfg["num_attention_heads"].get<int64_t>();
    for (std::string_view key : {kValueLengthKey, kRopeDimKey}) {
      if (!f.Contains(key)) continue;
      MODSERVE_ASSIGN_OR_RETURN(const int64_t v, f.GetI64(key));
      if (v != head_dim) {
        return Invalid(f, absl::StrCat("metadata key ", Key(key), " = ", v,
                                       " differs from the head dimension ", head_dim,
                                       key == kRopeDimKey ? " (partial rotary embeddings are not "
                                                            "supported)"
                                                          : " (not supported)"));
      }
    }
  }
  cfg["tie_word_embeddings"] = f.FindTensor("output.weight") == nullptr;

  absl::StatusOr<ModelConfig> config =
      ParseConfig(cfg.dump(-1, ' ', false, Json::error_handler_t::replace));
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        Translate(f, std::string(config.status().message())));
  }
  config->torch_dtype = "gguf";
  return config;
}

absl::StatusOr<GgufModel> OpenGgufModel(const std::string& path) {
  MODSERVE_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(path));
  MODSERVE_ASSIGN_OR_RETURN(ModelConfig config, ConfigFromGguf(file));
  const std::string file_name = std::filesystem::path(path).filename().string();

  std::vector<Checkpoint::AdoptedTensor> tensors;
  std::vector<std::unique_ptr<uint8_t[]>> owned;
  for (const GgufTensor& t : file.tensors()) {
    if (!t.dtype.has_value()) {
      return Invalid(file, absl::StrCat("tensor '", GgufPrintable(t.name), "' has type ",
                                        TensorTypeName(t.ggml_type),
                                        ", which modserve does not run (supported: F32, F16, "
                                        "BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)"));
    }
    Checkpoint::AdoptedTensor a;
    a.name = std::string(t.name);
    a.info.dtype = *t.dtype;
    a.info.shape = t.shape();
    a.info.file = file_name;
    a.info.file_offset = file.data_offset() + t.offset;
    a.info.bytes = t.bytes;
    a.data = t.data;

    // Q and K: rows back in rotate-half order, in a copy (rows are whole quantized blocks).
    const int64_t lq = LayerOf(t.name, ".attn_q.weight");
    const int64_t lk = LayerOf(t.name, ".attn_k.weight");
    const int64_t l = std::max(lq, lk);
    const int64_t heads = lq >= 0 ? config.n_heads : config.n_kv_heads;
    const int64_t rows = t.ndim == 2 ? t.ne[1] : 0;
    if (l >= 0 && l < config.n_layers && rows == heads * config.head_dim && rows > 0) {
      const uint64_t row_bytes = t.bytes / static_cast<uint64_t>(rows);
      auto copy = std::make_unique<uint8_t[]>(std::max<uint64_t>(t.bytes, 1));
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t src = GgufRowOfHfRow(r, config.head_dim);
        std::memcpy(copy.get() + static_cast<uint64_t>(r) * row_bytes,
                    t.data + static_cast<uint64_t>(src) * row_bytes, row_bytes);
      }
      a.data = copy.get();
      a.info.copied = true;
      owned.push_back(std::move(copy));
    }
    tensors.push_back(std::move(a));
  }
  MODSERVE_ASSIGN_OR_RETURN(
      Checkpoint ckpt, Checkpoint::Adopt(std::move(file).ReleaseMapping(), std::move(tensors),
                                         std::move(owned)));
  return GgufModel{std::move(config), std::move(ckpt)};
}

}  // namespace modserve::engine
