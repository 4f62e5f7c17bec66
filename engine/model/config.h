// ModelConfig: the validated contents of a checkpoint's config.json (DESIGN.md section 3), and
// the model glossary (STYLE.md section 3). Parsing only: it reads no weights and sizes no buffers.
#ifndef MODSERVE_ENGINE_MODEL_CONFIG_H_
#define MODSERVE_ENGINE_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace modserve::engine {

// Glossary (the only names used for these quantities anywhere in the engine):
//   d_model      width of the residual stream (HF hidden_size)
//   d_ff         MLP inner width (HF intermediate_size)
//   n_layers     transformer blocks (HF num_hidden_layers); loop index `l`
//   n_heads      query heads; loop index `h`
//   n_kv_heads   key/value heads (grouped-query attention), divides n_heads
//   head_dim     width of one head, even (RoPE rotates pairs)
//   vocab_size   rows of embed_tokens and lm_head
//   max_seq_len  longest position the model was configured for (HF max_position_embeddings)
//   block_size   tokens per KV-cache block (not a model property; see kv_cache/)
//   num_tokens   tokens scheduled in one step (not a model property)

// Closed value sets of the `mod` object; each enumerator names the JSON string it comes from.
enum class RouterInput : uint8_t { kResidual, kInputLayernorm };  // "residual", "input_layernorm"
enum class WeightFn : uint8_t { kIdentity, kSigmoid, kOne };      // "identity", "sigmoid", "one"
enum class ScaleTarget : uint8_t { kUpdate, kBlockOutput };       // "update", "block_output"
enum class InferenceRouting : uint8_t { kRouterThreshold, kPredictorThreshold };
enum class PredictorType : uint8_t { kMlp, kLinear };     // "mlp", "linear"
enum class Activation : uint8_t { kSilu, kGelu, kRelu };  // "silu", "gelu", "relu"

// mod.router: s = w . u + b, u = x (kResidual) or RMSNorm_in(x) (kInputLayernorm).
struct RouterConfig {
  bool bias = false;  // router.bias [1] exists
  RouterInput input = RouterInput::kResidual;
};

// mod.predictor: the causal decision network P_l of DESIGN.md section 2.
//   kMlp:    Linear(d_model, hidden_size, bias) -> activation -> Linear(hidden_size, 1, bias)
//   kLinear: Linear(d_model, 1, bias); hidden_size and activation are unused (0 / kSilu).
// Activation kGelu is the exact (erf) GELU, as torch.nn.GELU() with no approximation.
struct PredictorConfig {
  PredictorType type = PredictorType::kMlp;
  int64_t hidden_size = 0;  // p; >= 1 for kMlp, 0 for kLinear
  Activation activation = Activation::kSilu;
  bool bias = true;
};

// The `mod` object, format_version 1. Defaults are DESIGN.md's table.
struct ModConfig {
  int format_version = 1;
  std::vector<int> routed_layers;  // ascending, unique, each in [0, n_layers)
  // Training top-k fraction, in (0, 1]; not used to serve. With per-layer capacities this is the
  // largest of them (an upper bound for consumers that take one number).
  double capacity = 0.125;
  // One per routed layer, in routed_layers order: `capacity` repeated when config.json gives one
  // number, else its list.
  std::vector<double> capacities;
  RouterConfig router;
  WeightFn weight_fn = WeightFn::kIdentity;
  ScaleTarget scale_target = ScaleTarget::kUpdate;
  InferenceRouting inference_routing = InferenceRouting::kRouterThreshold;
  double threshold = 0.5;  // default request tau on sigmoid(z), in (0, 1)
  // Empty, or one tau_l in (0, 1) per routed layer (routed_layers order): the layer's threshold
  // when the request uses the default `threshold`; see LayerThreshold.
  std::vector<double> layer_thresholds;
  std::optional<PredictorConfig> predictor;  // always set when kPredictorThreshold
};

// tau_l(r) of DESIGN.md section 2: the threshold on sigmoid(z) at the `k`-th routed layer (index
// into routed_layers) for a request whose threshold is r. Without layer_thresholds it is r. With
// them, tau_l moves along the logit axis by as much as r differs from the default tau_0:
//   tau_l(r) = sigmoid(logit(tau_l) + logit(r) - logit(tau_0)),
// which is exactly tau_l at r = tau_0 and exactly r where tau_l = tau_0. Computed in double as
// tools/modref/config.py computes it. r must lie in (0, 1).
double LayerThreshold(const ModConfig& mod, size_t k, double request_threshold);

// The routing rule sigmoid(z) > tau (the sigmoid of the f32 z evaluated in f64 as
// 1 / (1 + exp(-z)), against the f64 tau) as one f32 comparison: the largest f32 value c (in value
// order, -inf and +inf included) whose sigmoid is not above tau. For every f32 z, z > c exactly
// when the rule routes z in (NaN never is). tau in (0, 1]; 1 gives +inf (nothing is routed in).
// Found by bisection over the f32 values (about 32 evaluations of the sigmoid).
float RouterZCut(double tau);

// All sizes are int64_t so that products of two of them (vocab_size * d_model, ...) never
// overflow; each is validated to lie in [1, 2^31 - 1].
struct ModelConfig {
  int64_t d_model = 0;
  int64_t d_ff = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // divides n_heads
  int64_t head_dim = 0;    // even; may differ from d_model / n_heads when config.json says so
  int64_t vocab_size = 0;
  int64_t max_seq_len = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  std::optional<int32_t> bos_token_id;  // in [0, vocab_size)
  std::vector<int32_t> eos_token_ids;   // each in [0, vocab_size); may be empty
  std::string torch_dtype = "float32";  // informational; the weights carry their own dtypes
  std::optional<ModConfig> mod;         // absent for a dense Llama checkpoint

  // True when layer `l` is routed (false for every layer of a dense model).
  bool IsRouted(int l) const;
};

// Parses and validates the text of a config.json, rule for rule as tools/modref/config.py.
// Returns InvalidArgument for malformed JSON or any violated rule; the message starts with
// "config.json: " and names the offending key and its value, e.g.
//   config.json: 'mod.weight_fn' has unknown value "foo" (expected one of "identity", "sigmoid")
// Differences from the reference, both forced by C++ types: integers must also be at most
// 2^31 - 1 (the reference has unbounded ints), and JSON has no NaN/Infinity literals.
absl::StatusOr<ModelConfig> ParseConfig(std::string_view json_text);

// Reads and parses `model_dir`/config.json. NotFound when the file does not exist;
// InvalidArgument as ParseConfig, with the message prefixed by the file's full path.
absl::StatusOr<ModelConfig> LoadConfig(const std::string& model_dir);

// A MoD adapter's config.json (DESIGN.md section 3.2): a dense base model named by path, and the
// `mod` object that applies to it. The router and predictor tensors sit beside it in
// adapter.safetensors (weights.h loads them).
struct AdapterConfig {
  std::string base_model;  // as written in config.json
  std::string base_path;   // resolved: relative to the adapter directory unless absolute
  std::string mod_json;    // the `mod` object, as JSON text
};

// True when `model_dir`/config.json is a JSON object with a "base_model" key. False for anything
// else, including unreadable or malformed files (LoadConfig reports those).
bool IsAdapterDir(const std::string& model_dir);

// Reads an adapter's config.json. InvalidArgument naming the file for malformed JSON, a key
// other than base_model and mod, a base_model that is not a non-empty string, or no mod object.
absl::StatusOr<AdapterConfig> LoadAdapterConfig(const std::string& model_dir);

// `base` (a dense config) with the adapter's `mod` object, validated under config.json's rules
// against the base's layer count. InvalidArgument when `base` already has a mod object or the mod
// object breaks a rule; the message names the adapter's config.json and the base model.
absl::StatusOr<ModelConfig> ApplyAdapter(const ModelConfig& base, const AdapterConfig& adapter,
                                         const std::string& model_dir);

// The JSON spelling of each enum value ("input_layernorm", "predictor_threshold", ...).
std::string_view EnumName(RouterInput v);
std::string_view EnumName(WeightFn v);
std::string_view EnumName(ScaleTarget v);
std::string_view EnumName(InferenceRouting v);
std::string_view EnumName(PredictorType v);
std::string_view EnumName(Activation v);

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_MODEL_CONFIG_H_
