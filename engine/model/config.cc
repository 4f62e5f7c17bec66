// Parses config.json with nlohmann::json and validates it in the order tools/modref/config.py
// does, so both sides reject the same files with the same first error. No JSON type leaves here.
#include "engine/model/config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/types/span.h"
#include "engine/common/status_macros.h"
#include "nlohmann/json.hpp"

namespace modserve::engine {
namespace {

using Json = nlohmann::json;

// Sizes and token ids become int64/int32 in the engine; the reference's unbounded Python ints
// have no such limit, so this is the one rule C++ adds.
constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();

constexpr absl::string_view kModKeys[] = {
    "format_version",    "routed_layers", "capacity",         "router",   "weight_fn",
    "scale_target",      "inference_routing", "threshold", "layer_thresholds", "predictor"};
constexpr absl::string_view kRouterKeys[] = {"bias", "input"};
constexpr absl::string_view kPredictorKeys[] = {"type", "hidden_size", "activation", "bias"};

absl::Status Error(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", message));
}

// The value as JSON text, cut short so that a huge value cannot flood a log line.
std::string Render(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  constexpr size_t kMaxChars = 80;
  if (s.size() > kMaxChars) s = s.substr(0, kMaxChars) + "...";
  return s;
}

// Python's dict.get(): nullptr when the key is absent (a present null is returned as null).
const Json* Find(const Json& obj, absl::string_view key) {
  auto it = obj.find(std::string(key));
  return it == obj.end() ? nullptr : &*it;
}

// An integer that is not a bool and fits int64; JSON floats such as 2.0 are not integers
// (as in the reference, where json.loads gives a float).
std::optional<int64_t> AsInt(const Json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return std::nullopt;
}

bool InRange(std::optional<int64_t> v, int64_t lo, int64_t hi) {
  return v.has_value() && *v >= lo && *v <= hi;
}

// Python truthiness, for keys the reference tests with `if cfg.get(key, False)`.
bool Truthy(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return false;
    case Json::value_t::boolean:
      return v.get<bool>();
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float:
      return v.get<double>() != 0.0;
    case Json::value_t::string:
    case Json::value_t::array:
    case Json::value_t::object:
    case Json::value_t::binary:
      return !v.empty();
    case Json::value_t::discarded:
      return false;
  }
  return false;
}

absl::StatusOr<int64_t> RequiredInt(const Json& cfg, absl::string_view key, int64_t lo = 1) {
  const Json* v = Find(cfg, key);
  if (v == nullptr) return Error(absl::StrCat("missing required key '", key, "'"));
  const std::optional<int64_t> i = AsInt(*v);
  if (!InRange(i, lo, kMaxInt)) {
    return Error(absl::StrCat("'", key, "' must be an integer in [", lo, ", ", kMaxInt, "], got ",
                              Render(*v)));
  }
  return *i;
}

absl::StatusOr<double> OptionalNumber(const Json& obj, absl::string_view key, double default_value,
                                      absl::string_view prefix = "") {
  const Json* v = Find(obj, key);
  if (v == nullptr) return default_value;
  if (!v->is_number() || !std::isfinite(v->get<double>())) {
    return Error(absl::StrCat("'", prefix, key, "' must be a finite number, got ", Render(*v)));
  }
  return v->get<double>();
}

absl::StatusOr<bool> OptionalBool(const Json& obj, absl::string_view key, bool default_value,
                                  absl::string_view prefix) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return default_value;
  if (!v->is_boolean()) {
    return Error(absl::StrCat("'", prefix, key, "' must be true or false, got ", Render(*v)));
  }
  return v->get<bool>();
}

// One of a closed set of strings; `names` lists them in enum order, the first being the default
// only where `default_value` says so.
template <typename Enum>
absl::StatusOr<Enum> Choice(const Json& obj, absl::string_view key, Enum default_value,
                            std::initializer_list<absl::string_view> names,
                            absl::string_view prefix) {
  const Json* v = Find(obj, key);
  if (v == nullptr) return default_value;
  if (v->is_string()) {
    const std::string& s = v->get_ref<const std::string&>();
    int idx = 0;
    for (absl::string_view name : names) {
      if (s == name) return static_cast<Enum>(idx);
      ++idx;
    }
  }
  std::string expected;
  for (absl::string_view name : names) {
    absl::StrAppend(&expected, expected.empty() ? "" : ", ", "\"", name, "\"");
  }
  return Error(absl::StrCat("'", prefix, key, "' has unknown value ", Render(*v),
                            " (expected one of ", expected, ")"));
}

// A list of finite numbers with one entry per routed layer (`key` is "capacity" or
// "layer_thresholds"), in the order routed_layers is written.
absl::StatusOr<std::vector<double>> PerLayer(const Json& v, absl::string_view key,
                                             size_t num_routed) {
  bool numbers = v.is_array();
  if (numbers) {
    for (const Json& x : v) numbers = numbers && x.is_number() && std::isfinite(x.get<double>());
  }
  if (!numbers) {
    return Error(absl::StrCat("'mod.", key, "' must be a list of numbers, one per routed layer, got ",
                              Render(v)));
  }
  if (v.size() != num_routed) {
    return Error(absl::StrCat("'mod.", key, "' has ", v.size(), " values for ", num_routed,
                              " routed layers"));
  }
  std::vector<double> out;
  for (const Json& x : v) out.push_back(x.get<double>());
  return out;
}

absl::Status CheckKeys(const Json& obj, absl::Span<const absl::string_view> allowed,
                       absl::string_view where) {
  if (!obj.is_object()) {
    return Error(absl::StrCat("'", where, "' must be an object, got ", Render(obj)));
  }
  for (const auto& [key, value] : obj.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      return Error(absl::StrCat("unknown key '", where, ".", key,
                                "' (known keys: ", absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ModConfig> ParseMod(const Json& obj, int64_t n_layers) {
  MODSERVE_RETURN_IF_ERROR(CheckKeys(obj, kModKeys, "mod"));
  ModConfig mod;
  const Json* version = Find(obj, "format_version");
  if (version == nullptr) return Error("missing required key 'mod.format_version'");
  // The reference compares with `!= 1`, under which 1.0 is also version 1.
  if (!version->is_number() || version->get<double>() != 1.0) {
    return Error(absl::StrCat("'mod.format_version' must be 1, got ", Render(*version)));
  }
  mod.format_version = 1;

  const Json* routed = Find(obj, "routed_layers");
  if (routed == nullptr) return Error("missing required key 'mod.routed_layers'");
  bool all_ints = routed->is_array();
  if (all_ints) {
    for (const Json& i : *routed) all_ints = all_ints && AsInt(i).has_value();
  }
  if (!all_ints) {
    return Error(
        absl::StrCat("'mod.routed_layers' must be a list of layer indices, got ", Render(*routed)));
  }
  for (const Json& i : *routed) {
    const int64_t l = *AsInt(i);
    if (l < 0 || l >= n_layers) {
      return Error(
          absl::StrCat("'mod.routed_layers' has layer ", l, ", outside [0, ", n_layers, ")"));
    }
    mod.routed_layers.push_back(static_cast<int>(l));
  }
  // Per-layer lists follow routed_layers as written; they are put in layer order with it.
  std::vector<size_t> order(mod.routed_layers.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return mod.routed_layers[a] < mod.routed_layers[b];
  });
  auto in_layer_order = [&](const std::vector<double>& v) {
    std::vector<double> out;
    for (size_t i : order) out.push_back(v[i]);
    return out;
  };
  std::sort(mod.routed_layers.begin(), mod.routed_layers.end());
  if (std::adjacent_find(mod.routed_layers.begin(), mod.routed_layers.end()) !=
      mod.routed_layers.end()) {
    return Error(absl::StrCat("'mod.routed_layers' repeats a layer: ", Render(*routed)));
  }

  const size_t num_routed = mod.routed_layers.size();
  if (const Json* cap = Find(obj, "capacity"); cap != nullptr && cap->is_array()) {
    MODSERVE_ASSIGN_OR_RETURN(mod.capacities, PerLayer(*cap, "capacity", num_routed));
    for (double c : mod.capacities) {
      if (!(c > 0.0 && c <= 1.0)) {
        return Error(absl::StrCat("'mod.capacity' must be in (0, 1], got ", c));
      }
    }
    mod.capacities = in_layer_order(mod.capacities);
    mod.capacity = mod.capacities.empty()
                       ? 0.125
                       : *std::max_element(mod.capacities.begin(), mod.capacities.end());
  } else {
    MODSERVE_ASSIGN_OR_RETURN(mod.capacity, OptionalNumber(obj, "capacity", 0.125, "mod."));
    if (!(mod.capacity > 0.0 && mod.capacity <= 1.0)) {
      return Error(absl::StrCat("'mod.capacity' must be in (0, 1], got ", mod.capacity));
    }
    mod.capacities.assign(num_routed, mod.capacity);
  }
  static const Json kEmptyObject = Json::object();
  const Json* router = Find(obj, "router");
  if (router == nullptr || router->is_null()) router = &kEmptyObject;
  MODSERVE_RETURN_IF_ERROR(CheckKeys(*router, kRouterKeys, "mod.router"));
  MODSERVE_ASSIGN_OR_RETURN(mod.threshold, OptionalNumber(obj, "threshold", 0.5, "mod."));
  if (!(mod.threshold > 0.0 && mod.threshold < 1.0)) {
    return Error(absl::StrCat("'mod.threshold' must be in (0, 1), got ", mod.threshold));
  }
  if (const Json* lt = Find(obj, "layer_thresholds"); lt != nullptr && !lt->is_null()) {
    MODSERVE_ASSIGN_OR_RETURN(mod.layer_thresholds, PerLayer(*lt, "layer_thresholds", num_routed));
    for (double t : mod.layer_thresholds) {
      if (!(t > 0.0 && t < 1.0)) {
        return Error(absl::StrCat("'mod.layer_thresholds' must be in (0, 1), got ", t));
      }
    }
    mod.layer_thresholds = in_layer_order(mod.layer_thresholds);
  }
  MODSERVE_ASSIGN_OR_RETURN(mod.router.bias, OptionalBool(*router, "bias", false, "mod.router."));
  MODSERVE_ASSIGN_OR_RETURN(mod.router.input,
                            Choice(*router, "input", RouterInput::kResidual,
                                   {"residual", "input_layernorm"}, "mod.router."));
  MODSERVE_ASSIGN_OR_RETURN(mod.weight_fn, Choice(obj, "weight_fn", WeightFn::kIdentity,
                                                  {"identity", "sigmoid", "one"}, "mod."));
  MODSERVE_ASSIGN_OR_RETURN(mod.scale_target, Choice(obj, "scale_target", ScaleTarget::kUpdate,
                                                     {"update", "block_output"}, "mod."));
  MODSERVE_ASSIGN_OR_RETURN(mod.inference_routing,
                            Choice(obj, "inference_routing", InferenceRouting::kRouterThreshold,
                                   {"router_threshold", "predictor_threshold"}, "mod."));

  const Json* pred = Find(obj, "predictor");
  if (pred != nullptr && !pred->is_null()) {
    MODSERVE_RETURN_IF_ERROR(CheckKeys(*pred, kPredictorKeys, "mod.predictor"));
    PredictorConfig p;
    MODSERVE_ASSIGN_OR_RETURN(
        p.type, Choice(*pred, "type", PredictorType::kMlp, {"mlp", "linear"}, "mod.predictor."));
    MODSERVE_ASSIGN_OR_RETURN(p.bias, OptionalBool(*pred, "bias", true, "mod.predictor."));
    if (p.type == PredictorType::kMlp) {
      const Json* hs = Find(*pred, "hidden_size");
      if (hs == nullptr) return Error("missing required key 'mod.predictor.hidden_size'");
      const std::optional<int64_t> h = AsInt(*hs);
      if (!InRange(h, 1, kMaxInt)) {
        return Error(absl::StrCat("'mod.predictor.hidden_size' must be an integer in [1, ", kMaxInt,
                                  "], got ", Render(*hs)));
      }
      p.hidden_size = *h;
      MODSERVE_ASSIGN_OR_RETURN(p.activation, Choice(*pred, "activation", Activation::kSilu,
                                                     {"silu", "gelu", "relu"}, "mod.predictor."));
    }
    mod.predictor = p;
  }
  if (mod.inference_routing == InferenceRouting::kPredictorThreshold && !mod.predictor) {
    return Error(
        "'mod.inference_routing' is \"predictor_threshold\" but 'mod.predictor' is missing");
  }
  return mod;
}

absl::StatusOr<ModelConfig> ParseConfigJson(const Json& cfg) {
  if (!cfg.is_object()) return Error("top level must be an object");
  ModelConfig mc;
  if (const Json* mt = Find(cfg, "model_type"); mt != nullptr && *mt != "llama") {
    return Error(absl::StrCat("'model_type' must be \"llama\", got ", Render(*mt)));
  }
  MODSERVE_ASSIGN_OR_RETURN(mc.d_model, RequiredInt(cfg, "hidden_size"));
  MODSERVE_ASSIGN_OR_RETURN(mc.n_layers, RequiredInt(cfg, "num_hidden_layers"));
  MODSERVE_ASSIGN_OR_RETURN(mc.n_heads, RequiredInt(cfg, "num_attention_heads"));
  mc.n_kv_heads = mc.n_heads;
  if (const Json* kv = Find(cfg, "num_key_value_heads"); kv != nullptr) {
    const std::optional<int64_t> v = AsInt(*kv);
    if (!InRange(v, 1, kMaxInt) || mc.n_heads % *v != 0) {
      return Error(absl::StrCat("'num_key_value_heads' must divide num_attention_heads (",
                                mc.n_heads, "), got ", Render(*kv)));
    }
    mc.n_kv_heads = *v;
  }
  // A missing head_dim defaults to hidden_size / num_attention_heads, then meets the same rule.
  const Json* head_dim = Find(cfg, "head_dim");
  Json head_dim_value;
  if (head_dim == nullptr || head_dim->is_null()) {
    if (mc.d_model % mc.n_heads != 0) {
      return Error(absl::StrCat("'hidden_size' ", mc.d_model,
                                " is not a multiple of num_attention_heads ", mc.n_heads,
                                " and 'head_dim' is not given"));
    }
    head_dim_value = mc.d_model / mc.n_heads;
  } else {
    head_dim_value = *head_dim;
  }
  const std::optional<int64_t> hd = AsInt(head_dim_value);
  if (!InRange(hd, 2, kMaxInt) || *hd % 2 != 0) {
    return Error(absl::StrCat("'head_dim' must be an even integer in [2, ", kMaxInt, "], got ",
                              Render(head_dim_value)));
  }
  mc.head_dim = *hd;

  MODSERVE_ASSIGN_OR_RETURN(mc.vocab_size, RequiredInt(cfg, "vocab_size"));
  if (const Json* eos = Find(cfg, "eos_token_id"); eos != nullptr && !eos->is_null()) {
    std::vector<int64_t> ids;
    bool ok = true;
    if (std::optional<int64_t> one = AsInt(*eos)) {
      ids.push_back(*one);
    } else if (eos->is_array()) {
      for (const Json& e : *eos) {
        const std::optional<int64_t> id = AsInt(e);
        ok = ok && id.has_value();
        if (id) ids.push_back(*id);
      }
    } else {
      ok = false;
    }
    if (!ok) {
      return Error(
          absl::StrCat("'eos_token_id' must be an integer or a list of them, got ", Render(*eos)));
    }
    for (int64_t e : ids) {
      if (e < 0 || e >= mc.vocab_size) {
        return Error(absl::StrCat("'eos_token_id' ", e, " is outside the vocabulary [0, ",
                                  mc.vocab_size, ")"));
      }
      mc.eos_token_ids.push_back(static_cast<int32_t>(e));
    }
  }
  if (const Json* bos = Find(cfg, "bos_token_id"); bos != nullptr && !bos->is_null()) {
    const std::optional<int64_t> v = AsInt(*bos);
    if (!InRange(v, 0, mc.vocab_size - 1)) {
      return Error(absl::StrCat("'bos_token_id' must be a token id below vocab_size ",
                                mc.vocab_size, ", got ", Render(*bos)));
    }
    mc.bos_token_id = static_cast<int32_t>(*v);
  }
  MODSERVE_ASSIGN_OR_RETURN(mc.rms_norm_eps, OptionalNumber(cfg, "rms_norm_eps", 1e-6));
  if (mc.rms_norm_eps <= 0) {
    return Error(absl::StrCat("'rms_norm_eps' must be > 0, got ", mc.rms_norm_eps));
  }
  MODSERVE_ASSIGN_OR_RETURN(mc.rope_theta, OptionalNumber(cfg, "rope_theta", 10000.0));
  if (mc.rope_theta <= 0) {
    return Error(absl::StrCat("'rope_theta' must be > 0, got ", mc.rope_theta));
  }
  if (const Json* rs = Find(cfg, "rope_scaling"); rs != nullptr && !rs->is_null()) {
    return Error(absl::StrCat("'rope_scaling' is not supported, got ", Render(*rs)));
  }
  if (const Json* act = Find(cfg, "hidden_act"); act != nullptr && *act != "silu") {
    return Error(absl::StrCat("'hidden_act' must be \"silu\", got ", Render(*act)));
  }
  for (absl::string_view key :
       {absl::string_view("attention_bias"), absl::string_view("mlp_bias")}) {
    if (const Json* b = Find(cfg, key); b != nullptr && Truthy(*b)) {
      return Error(absl::StrCat("'", key, "' = ", Render(*b), " is not supported"));
    }
  }
  MODSERVE_ASSIGN_OR_RETURN(mc.tie_word_embeddings,
                            OptionalBool(cfg, "tie_word_embeddings", false, ""));
  MODSERVE_ASSIGN_OR_RETURN(mc.d_ff, RequiredInt(cfg, "intermediate_size"));
  MODSERVE_ASSIGN_OR_RETURN(mc.max_seq_len, RequiredInt(cfg, "max_position_embeddings"));
  // Informational only; the reference stringifies whatever is there, so no value is an error.
  if (const Json* dt = Find(cfg, "torch_dtype"); dt != nullptr) {
    mc.torch_dtype = dt->is_string() ? dt->get<std::string>() : Render(*dt);
  }
  if (const Json* mod = Find(cfg, "mod"); mod != nullptr && !mod->is_null()) {
    MODSERVE_ASSIGN_OR_RETURN(mc.mod, ParseMod(*mod, mc.n_layers));
  }
  return mc;
}

}  // namespace

double LayerThreshold(const ModConfig& mod, size_t k, double request_threshold) {
  if (mod.layer_thresholds.empty()) return request_threshold;
  const double tau_l = mod.layer_thresholds[k];
  const double tau_0 = mod.threshold;
  if (request_threshold == tau_0) return tau_l;
  if (tau_l == tau_0) return request_threshold;
  auto logit = [](double p) { return std::log(p) - std::log1p(-p); };
  return 1.0 / (1.0 + std::exp(-(logit(tau_l) + logit(request_threshold) - logit(tau_0))));
}

float RouterZCut(double tau) {
  // f32 bit patterns mapped to unsigned keys in value order: negatives reversed below positives.
  auto key = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
  };
  auto value = [](uint32_t k) {
    const uint32_t u = (k & 0x80000000u) != 0 ? (k & 0x7fffffffu) : ~k;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  auto routed = [tau](float z) {
    return 1.0 / (1.0 + std::exp(-static_cast<double>(z))) > tau;
  };
  const float inf = std::numeric_limits<float>::infinity();
  if (!routed(inf)) return inf;
  // routed(value(lo)) is false (the sigmoid of -inf is 0 and tau > 0), routed(value(hi)) true;
  // the rule is monotone in z.
  uint32_t lo = key(-inf), hi = key(inf);
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    (routed(value(mid)) ? hi : lo) = mid;
  }
  return value(lo);
}

bool ModelConfig::IsRouted(int l) const {
  return mod.has_value() &&
         std::binary_search(mod->routed_layers.begin(), mod->routed_layers.end(), l);
}

absl::StatusOr<ModelConfig> ParseConfig(std::string_view json_text) {
  // nlohmann throws on malformed text and on type errors; the checks above are meant to make
  // the latter impossible, but any escapee still becomes a Status rather than a crash.
  try {
    const Json cfg = Json::parse(json_text.begin(), json_text.end());
    return ParseConfigJson(cfg);
  } catch (const Json::parse_error& e) {
    return Error(absl::StrCat("not valid JSON: ", e.what()));
  } catch (const Json::exception& e) {
    return Error(absl::StrCat("unexpected JSON value: ", e.what()));
  }
}

absl::StatusOr<ModelConfig> LoadConfig(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  }
  // A FIFO would block the read below forever, a directory reads as empty text.
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot open for reading"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  absl::StatusOr<ModelConfig> cfg = ParseConfig(text.str());
  if (!cfg.ok()) {
    // Messages start with "config.json: ", so the directory in front makes the full path.
    return absl::Status(cfg.status().code(), absl::StrCat(model_dir, "/", cfg.status().message()));
  }
  return cfg;
}

namespace {

// config.json as JSON, or InvalidArgument naming the file.
absl::StatusOr<Json> ReadJsonFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open for reading"));
  std::ostringstream text;
  text << in.rdbuf();
  try {
    return Json::parse(text.str());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON: ", e.what()));
  }
}

}  // namespace

bool IsAdapterDir(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  absl::StatusOr<Json> j = ReadJsonFile(path);
  return j.ok() && j->is_object() && j->contains("base_model");
}

absl::StatusOr<AdapterConfig> LoadAdapterConfig(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  MODSERVE_ASSIGN_OR_RETURN(const Json j, ReadJsonFile(path));
  auto invalid = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
  };
  if (!j.is_object()) return invalid("top level must be an object");
  for (const auto& [key, value] : j.items()) {
    if (key != "base_model" && key != "mod") {
      return invalid(absl::StrCat("unknown key '", key,
                                  "' in an adapter config (known keys: base_model, mod)"));
    }
  }
  const Json* base = Find(j, "base_model");
  if (base == nullptr || !base->is_string() || base->get_ref<const std::string&>().empty()) {
    return invalid(absl::StrCat("'base_model' must be a non-empty path, got ",
                                base == nullptr ? "nothing" : Render(*base)));
  }
  const Json* mod = Find(j, "mod");
  if (mod == nullptr || mod->is_null()) return invalid("an adapter needs the 'mod' object");
  AdapterConfig a;
  a.base_model = base->get<std::string>();
  const std::filesystem::path p(a.base_model);
  a.base_path = (p.is_absolute() ? p : std::filesystem::path(model_dir) / p).lexically_normal();
  a.mod_json = mod->dump();
  return a;
}

absl::StatusOr<ModelConfig> ApplyAdapter(const ModelConfig& base, const AdapterConfig& adapter,
                                         const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  if (base.mod) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": base model ", adapter.base_path,
                                                   " is itself a MoD model; an adapter's base "
                                                   "must be dense"));
  }
  ModelConfig out = base;
  absl::StatusOr<ModConfig> mod = [&]() -> absl::StatusOr<ModConfig> {
    try {
      return ParseMod(Json::parse(adapter.mod_json), base.n_layers);
    } catch (const Json::exception& e) {
      return Error(absl::StrCat("unexpected JSON value: ", e.what()));
    }
  }();
  if (!mod.ok()) {
    absl::string_view msg = mod.status().message();
    absl::ConsumePrefix(&msg, "config.json: ");
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", msg, " (base model ",
                                                   adapter.base_path, ", ", base.n_layers,
                                                   " layers)"));
  }
  out.mod = *std::move(mod);
  return out;
}

std::string_view EnumName(RouterInput v) {
  switch (v) {
    case RouterInput::kResidual:
      return "residual";
    case RouterInput::kInputLayernorm:
      return "input_layernorm";
  }
  return "?";
}

std::string_view EnumName(WeightFn v) {
  switch (v) {
    case WeightFn::kIdentity:
      return "identity";
    case WeightFn::kSigmoid:
      return "sigmoid";
    case WeightFn::kOne:
      return "one";
  }
  return "?";
}

std::string_view EnumName(ScaleTarget v) {
  switch (v) {
    case ScaleTarget::kUpdate:
      return "update";
    case ScaleTarget::kBlockOutput:
      return "block_output";
  }
  return "?";
}

std::string_view EnumName(InferenceRouting v) {
  switch (v) {
    case InferenceRouting::kRouterThreshold:
      return "router_threshold";
    case InferenceRouting::kPredictorThreshold:
      return "predictor_threshold";
  }
  return "?";
}

std::string_view EnumName(PredictorType v) {
  switch (v) {
    case PredictorType::kMlp:
      return "mlp";
    case PredictorType::kLinear:
      return "linear";
  }
  return "?";
}

std::string_view EnumName(Activation v) {
  switch (v) {
    case Activation::kSilu:
      return "silu";
    case Activation::kGelu:
      return "gelu";
    case Activation::kRelu:
      return "relu";
  }
  return "?";
}

}  // namespace modserve::engine
