// ParseConfig/LoadConfig: valid MoD and dense configs give the right values; every malformed
// config of the reference's rule list (tools/modref/config.py) is rejected naming its key.
#include "engine/model/config.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/model/checkpoint_test_util.h"

namespace modserve::engine {
namespace {

using ::modserve::engine::testing::IsOk;
using ::modserve::engine::testing::ScratchDir;
using ::modserve::engine::testing::StatusIs;
using ::modserve::engine::testing::WriteBytes;
using Json = nlohmann::json;

// Every key set to a non-default value, as tools/modref/config.py's to_json() writes it.
constexpr char kModConfig[] = R"({
  "model_type": "llama",
  "architectures": ["LlamaMoDForCausalLM"],
  "hidden_size": 64,
  "intermediate_size": 160,
  "num_hidden_layers": 4,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "head_dim": 32,
  "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0,
  "vocab_size": 256,
  "max_position_embeddings": 128,
  "tie_word_embeddings": true,
  "bos_token_id": 1,
  "eos_token_id": [2, 3],
  "torch_dtype": "bfloat16",
  "hidden_act": "silu",
  "mod": {
    "format_version": 1,
    "routed_layers": [3, 1],
    "capacity": 0.25,
    "router": {"bias": true, "input": "input_layernorm"},
    "weight_fn": "sigmoid",
    "scale_target": "block_output",
    "inference_routing": "predictor_threshold",
    "threshold": 0.4,
    "predictor": {"type": "mlp", "hidden_size": 24, "activation": "gelu", "bias": false}
  }
})";

// A plain Hugging Face Llama config: no `mod`, no head_dim, a single eos id.
constexpr char kDenseConfig[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "hidden_size": 96,
  "intermediate_size": 256,
  "num_hidden_layers": 3,
  "num_attention_heads": 6,
  "vocab_size": 1000,
  "max_position_embeddings": 2048,
  "eos_token_id": 2,
  "attention_bias": false,
  "mlp_bias": false,
  "rope_scaling": null,
  "torch_dtype": "float16"
})";

TEST(ConfigTest, ParsesModConfig) {
  absl::StatusOr<ModelConfig> cfg = ParseConfig(kModConfig);
  ASSERT_THAT(cfg, IsOk());
  EXPECT_EQ(cfg->d_model, 64);
  EXPECT_EQ(cfg->d_ff, 160);
  EXPECT_EQ(cfg->n_layers, 4);
  EXPECT_EQ(cfg->n_heads, 4);
  EXPECT_EQ(cfg->n_kv_heads, 2);
  EXPECT_EQ(cfg->head_dim, 32);  // given explicitly, not 64 / 4
  EXPECT_EQ(cfg->vocab_size, 256);
  EXPECT_EQ(cfg->max_seq_len, 128);
  EXPECT_DOUBLE_EQ(cfg->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(cfg->rope_theta, 500000.0);
  EXPECT_TRUE(cfg->tie_word_embeddings);
  EXPECT_EQ(cfg->bos_token_id, 1);
  EXPECT_THAT(cfg->eos_token_ids, ::testing::ElementsAre(2, 3));
  EXPECT_EQ(cfg->torch_dtype, "bfloat16");
  ASSERT_TRUE(cfg->mod.has_value());
  const ModConfig& m = *cfg->mod;
  EXPECT_EQ(m.format_version, 1);
  EXPECT_THAT(m.routed_layers, ::testing::ElementsAre(1, 3));  // sorted
  EXPECT_DOUBLE_EQ(m.capacity, 0.25);
  EXPECT_TRUE(m.router.bias);
  EXPECT_EQ(m.router.input, RouterInput::kInputLayernorm);
  EXPECT_EQ(m.weight_fn, WeightFn::kSigmoid);
  EXPECT_EQ(m.scale_target, ScaleTarget::kBlockOutput);
  EXPECT_EQ(m.inference_routing, InferenceRouting::kPredictorThreshold);
  EXPECT_DOUBLE_EQ(m.threshold, 0.4);
  ASSERT_TRUE(m.predictor.has_value());
  EXPECT_EQ(m.predictor->type, PredictorType::kMlp);
  EXPECT_EQ(m.predictor->hidden_size, 24);
  EXPECT_EQ(m.predictor->activation, Activation::kGelu);
  EXPECT_FALSE(m.predictor->bias);
  EXPECT_FALSE(cfg->IsRouted(0));
  EXPECT_TRUE(cfg->IsRouted(1));
  EXPECT_FALSE(cfg->IsRouted(2));
  EXPECT_TRUE(cfg->IsRouted(3));
  EXPECT_FALSE(cfg->IsRouted(4));
  EXPECT_FALSE(cfg->IsRouted(-1));
}

// Per-layer lists follow routed_layers as written ([3, 1] here) and come out in layer order.
TEST(ConfigTest, ParsesPerLayerCapacitiesAndThresholds) {
  Json j = Json::parse(kModConfig);
  j["mod"]["capacity"] = {0.75, 0.5};
  j["mod"]["layer_thresholds"] = {0.2, 0.9};
  j["mod"]["weight_fn"] = "one";
  absl::StatusOr<ModelConfig> cfg = ParseConfig(j.dump());
  ASSERT_THAT(cfg, IsOk());
  const ModConfig& m = *cfg->mod;
  EXPECT_EQ(m.routed_layers, (std::vector<int>{1, 3}));
  EXPECT_EQ(m.capacities, (std::vector<double>{0.5, 0.75}));
  EXPECT_EQ(m.capacity, 0.75);  // the largest
  EXPECT_EQ(m.layer_thresholds, (std::vector<double>{0.9, 0.2}));
  EXPECT_EQ(m.weight_fn, WeightFn::kOne);
  EXPECT_EQ(EnumName(m.weight_fn), "one");
}

TEST(ConfigTest, OneCapacityFillsEveryRoutedLayer) {
  absl::StatusOr<ModelConfig> cfg = ParseConfig(kModConfig);
  ASSERT_THAT(cfg, IsOk());
  EXPECT_EQ(cfg->mod->capacities, (std::vector<double>{0.25, 0.25}));
  EXPECT_TRUE(cfg->mod->layer_thresholds.empty());
}

// DESIGN.md section 2: tau_l(r) = sigmoid(logit(tau_l) + logit(r) - logit(tau_0)).
// The cut against the rule it replaces, evaluated directly: the cut itself stays out, the next f32
// above it is routed in, and so is every sampled z above it (and none below), for thresholds that
// are f32 values and thresholds that are not (calibrated per-layer ones), near 0 and near 1.
TEST(ConfigTest, RouterZCutIsTheSigmoidRuleAsOneComparison) {
  auto rule = [](float z, double tau) {
    return 1.0 / (1.0 + std::exp(-static_cast<double>(z))) > tau;
  };
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> zd(-40.0f, 40.0f);
  for (double tau : {0.5, 0.25, 0.3, 0.1234567890123, 1e-12, 0.999999, 0.5 + 1e-16,
                     1.0 / 3.0, 0.87654321}) {
    const float cut = RouterZCut(tau);
    ASSERT_TRUE(std::isfinite(cut)) << tau;
    EXPECT_FALSE(rule(cut, tau)) << tau;
    EXPECT_TRUE(rule(std::nextafter(cut, INFINITY), tau)) << tau;
    for (int i = 0; i < 2000; ++i) {
      // Half of the samples within a few thousand ulps of the cut, where a wrong cut would show.
      const float z = i % 2 == 0 ? zd(rng)
                                 : cut + static_cast<float>(static_cast<int>(rng() % 8001) - 4000) *
                                             std::max(std::abs(cut), 1e-30f) * 1.2e-7f;
      EXPECT_EQ(z > cut, rule(z, tau)) << "tau " << tau << " z " << z << " cut " << cut;
    }
  }
  // 1 routes nothing in: the sigmoid never exceeds it.
  EXPECT_EQ(RouterZCut(1.0), INFINITY);
  EXPECT_FALSE(std::nanf("") > RouterZCut(0.5));
}

TEST(ConfigTest, LayerThresholdMovesAlongTheLogitAxis) {
  ModConfig m;
  m.routed_layers = {1, 3};
  m.threshold = 0.4;
  // Without per-layer thresholds every layer uses the request's.
  EXPECT_EQ(LayerThreshold(m, 0, 0.4), 0.4);
  EXPECT_EQ(LayerThreshold(m, 1, 0.73), 0.73);
  m.layer_thresholds = {0.2, 0.4};
  // At the default request threshold: exactly tau_l.
  EXPECT_EQ(LayerThreshold(m, 0, 0.4), 0.2);
  EXPECT_EQ(LayerThreshold(m, 1, 0.4), 0.4);
  // A layer whose tau_l is the default follows the request exactly.
  EXPECT_EQ(LayerThreshold(m, 1, 0.73), 0.73);
  // Elsewhere the shift in logit space: logit(0.2) + logit(0.6) - logit(0.4) = logit(0.2) +
  // 2 logit(0.6), as logit(0.4) = -logit(0.6).
  const double logit = std::log(0.2 / 0.8) + 2.0 * std::log(0.6 / 0.4);
  EXPECT_NEAR(LayerThreshold(m, 0, 0.6), 1.0 / (1.0 + std::exp(-logit)), 1e-15);
  // Monotone in the request threshold: a higher r never routes more tokens.
  double prev = 0.0;
  for (double r : {0.01, 0.1, 0.3, 0.4, 0.5, 0.9, 0.999}) {
    const double t = LayerThreshold(m, 0, r);
    EXPECT_GT(t, prev) << r;
    EXPECT_LT(t, 1.0) << r;
    prev = t;
  }
}

TEST(ConfigTest, ParsesDenseConfigWithDefaults) {
  absl::StatusOr<ModelConfig> cfg = ParseConfig(kDenseConfig);
  ASSERT_THAT(cfg, IsOk());
  EXPECT_EQ(cfg->d_model, 96);
  EXPECT_EQ(cfg->n_heads, 6);
  EXPECT_EQ(cfg->n_kv_heads, 6);  // defaults to n_heads
  EXPECT_EQ(cfg->head_dim, 16);   // defaults to d_model / n_heads
  EXPECT_DOUBLE_EQ(cfg->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(cfg->rope_theta, 10000.0);
  EXPECT_FALSE(cfg->tie_word_embeddings);
  EXPECT_FALSE(cfg->bos_token_id.has_value());
  EXPECT_THAT(cfg->eos_token_ids, ::testing::ElementsAre(2));
  EXPECT_EQ(cfg->torch_dtype, "float16");
  EXPECT_FALSE(cfg->mod.has_value());
  for (int l = 0; l < 3; ++l) EXPECT_FALSE(cfg->IsRouted(l));
}

TEST(ConfigTest, ModDefaultsFillUnsetKeys) {
  Json j = Json::parse(kDenseConfig);
  j["mod"] = {{"format_version", 1}, {"routed_layers", {1}}, {"router", nullptr}};
  absl::StatusOr<ModelConfig> cfg = ParseConfig(j.dump());
  ASSERT_THAT(cfg, IsOk());
  ASSERT_TRUE(cfg->mod.has_value());
  const ModConfig& m = *cfg->mod;
  EXPECT_DOUBLE_EQ(m.capacity, 0.125);
  EXPECT_FALSE(m.router.bias);
  EXPECT_EQ(m.router.input, RouterInput::kResidual);
  EXPECT_EQ(m.weight_fn, WeightFn::kIdentity);
  EXPECT_EQ(m.scale_target, ScaleTarget::kUpdate);
  EXPECT_EQ(m.inference_routing, InferenceRouting::kRouterThreshold);
  EXPECT_DOUBLE_EQ(m.threshold, 0.5);
  EXPECT_FALSE(m.predictor.has_value());
}

TEST(ConfigTest, LinearPredictorIgnoresMlpKeys) {
  Json j = Json::parse(kModConfig);
  j["mod"]["predictor"] = {{"type", "linear"}, {"hidden_size", 0}, {"activation", "nope"}};
  absl::StatusOr<ModelConfig> cfg = ParseConfig(j.dump());
  ASSERT_THAT(cfg, IsOk());
  EXPECT_EQ(cfg->mod->predictor->type, PredictorType::kLinear);
  EXPECT_EQ(cfg->mod->predictor->hidden_size, 0);
  EXPECT_TRUE(cfg->mod->predictor->bias);  // default true
}

TEST(ConfigTest, NullModIsDense) {
  Json j = Json::parse(kModConfig);
  j["mod"] = nullptr;
  absl::StatusOr<ModelConfig> cfg = ParseConfig(j.dump());
  ASSERT_THAT(cfg, IsOk());
  EXPECT_FALSE(cfg->mod.has_value());
}

TEST(ConfigTest, UnknownValueMessageIsExact) {
  Json j = Json::parse(kModConfig);
  j["mod"]["weight_fn"] = "foo";
  absl::StatusOr<ModelConfig> cfg = ParseConfig(j.dump());
  EXPECT_EQ(cfg.status(),
            absl::InvalidArgumentError("config.json: 'mod.weight_fn' has unknown value \"foo\" "
                                       "(expected one of \"identity\", \"sigmoid\", \"one\")"));
}

TEST(ConfigTest, RejectsTextThatIsNotAJsonObject) {
  EXPECT_THAT(ParseConfig("{\"hidden_size\": 64,"),
              StatusIs(absl::StatusCode::kInvalidArgument, "not valid JSON"));
  EXPECT_THAT(ParseConfig("[1, 2]"),
              StatusIs(absl::StatusCode::kInvalidArgument, "top level must be an object"));
}

// One malformed config per row: `edits` applied to kModConfig (a null `value` with
// `remove` deletes the key), then the error must be InvalidArgument and mention `expect`.
struct Edit {
  std::string path;   // dotted, e.g. "mod.router.bias"
  std::string value;  // JSON text; ignored when remove
  bool remove = false;
};
struct BadRow {
  std::string label;
  std::vector<Edit> edits;
  std::string expect;  // a substring of the message: the key, often with the bad value
};

Edit Set(std::string path, std::string value) { return {std::move(path), std::move(value)}; }
Edit Del(std::string path) { return {std::move(path), "", true}; }

void Apply(Json& j, const Edit& e) {
  Json* node = &j;
  std::string path = e.path;
  for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.')) {
    node = &(*node)[path.substr(0, dot)];
    path = path.substr(dot + 1);
  }
  if (e.remove) {
    node->erase(path);
  } else {
    (*node)[path] = Json::parse(e.value);
  }
}

const std::vector<BadRow>& BadRows() {
  static const auto* rows = new std::vector<BadRow>{
      {"ModelTypeNotLlama", {Set("model_type", R"("mistral")")}, "'model_type'"},
      {"HiddenSizeMissing", {Del("hidden_size")}, "missing required key 'hidden_size'"},
      {"HiddenSizeZero", {Set("hidden_size", "0")}, "'hidden_size'"},
      {"HiddenSizeBool", {Set("hidden_size", "true")}, "'hidden_size'"},
      {"HiddenSizeFloat", {Set("hidden_size", "64.0")}, "'hidden_size'"},
      {"HiddenSizeTooBig", {Set("hidden_size", "3000000000")}, "'hidden_size'"},
      {"LayersNegative", {Set("num_hidden_layers", "-1")}, "'num_hidden_layers'"},
      {"LayersMissing", {Del("num_hidden_layers")}, "'num_hidden_layers'"},
      {"HeadsString", {Set("num_attention_heads", R"("4")")}, "'num_attention_heads'"},
      {"KvHeadsNotDivisor", {Set("num_key_value_heads", "3")}, "'num_key_value_heads'"},
      {"KvHeadsZero", {Set("num_key_value_heads", "0")}, "'num_key_value_heads'"},
      {"KvHeadsNull", {Set("num_key_value_heads", "null")}, "'num_key_value_heads'"},
      {"HeadDimOdd", {Set("head_dim", "15")}, "'head_dim' must be an even integer"},
      {"HeadDimZero", {Set("head_dim", "0")}, "'head_dim'"},
      {"HeadDimDefaultNotMultiple",
       {Del("head_dim"), Set("hidden_size", "66")},
       "'hidden_size' 66 is not a multiple of num_attention_heads 4"},
      {"HeadDimDefaultOdd",
       {Del("head_dim"), Set("hidden_size", "12")},
       "'head_dim' must be an even integer"},  // 12 / 4 = 3
      {"VocabMissing", {Del("vocab_size")}, "missing required key 'vocab_size'"},
      {"EosOutsideVocab", {Set("eos_token_id", "256")}, "'eos_token_id' 256"},
      {"EosNegativeInList", {Set("eos_token_id", "[2, -1]")}, "'eos_token_id' -1"},
      {"EosNotInts", {Set("eos_token_id", R"([2, "x"])")}, "'eos_token_id'"},
      {"EosString", {Set("eos_token_id", R"("2")")}, "'eos_token_id'"},
      {"BosOutsideVocab", {Set("bos_token_id", "256")}, "'bos_token_id'"},
      {"BosNegative", {Set("bos_token_id", "-1")}, "'bos_token_id'"},
      {"BosString", {Set("bos_token_id", R"("1")")}, "'bos_token_id'"},
      {"EpsZero", {Set("rms_norm_eps", "0")}, "'rms_norm_eps'"},
      {"EpsString", {Set("rms_norm_eps", R"("1e-5")")}, "'rms_norm_eps'"},
      {"EpsNull", {Set("rms_norm_eps", "null")}, "'rms_norm_eps'"},
      {"ThetaNegative", {Set("rope_theta", "-1")}, "'rope_theta'"},
      {"RopeScaling",
       {Set("rope_scaling", R"({"type": "linear", "factor": 2.0})")},
       "'rope_scaling' is not supported"},
      {"HiddenActGelu", {Set("hidden_act", R"("gelu")")}, "'hidden_act'"},
      {"AttentionBias", {Set("attention_bias", "true")}, "'attention_bias'"},
      {"MlpBias", {Set("mlp_bias", "true")}, "'mlp_bias'"},
      {"TieNotBool", {Set("tie_word_embeddings", "1")}, "'tie_word_embeddings'"},
      {"IntermediateMissing", {Del("intermediate_size")}, "'intermediate_size'"},
      {"MaxPositionZero", {Set("max_position_embeddings", "0")}, "'max_position_embeddings'"},
      {"ModNotObject", {Set("mod", "[1]")}, "'mod' must be an object"},
      {"ModUnknownKey", {Set("mod.top_k", "2")}, "unknown key 'mod.top_k'"},
      {"ModCapacityFactorKey", {Set("mod.capacity_factor", "0.5")}, "'mod.capacity_factor'"},
      {"FormatVersionMissing", {Del("mod.format_version")}, "'mod.format_version'"},
      {"FormatVersionTwo", {Set("mod.format_version", "2")}, "'mod.format_version' must be 1"},
      {"FormatVersionString", {Set("mod.format_version", R"("1")")}, "'mod.format_version'"},
      {"FormatVersionBool", {Set("mod.format_version", "true")}, "'mod.format_version'"},
      {"RoutedLayersMissing", {Del("mod.routed_layers")}, "'mod.routed_layers'"},
      {"RoutedLayersNotList", {Set("mod.routed_layers", "1")}, "'mod.routed_layers'"},
      {"RoutedLayerFloat", {Set("mod.routed_layers", "[1.5]")}, "'mod.routed_layers'"},
      {"RoutedLayerBool", {Set("mod.routed_layers", "[true]")}, "'mod.routed_layers'"},
      {"RoutedLayerTooHigh",
       {Set("mod.routed_layers", "[1, 4]")},
       "'mod.routed_layers' has layer 4"},
      {"RoutedLayerNegative",
       {Set("mod.routed_layers", "[-1]")},
       "'mod.routed_layers' has layer -1"},
      {"RoutedLayerDuplicate",
       {Set("mod.routed_layers", "[1, 3, 1]")},
       "'mod.routed_layers' repeats a layer"},
      {"CapacityZero", {Set("mod.capacity", "0")}, "'mod.capacity'"},
      {"CapacityAboveOne", {Set("mod.capacity", "1.5")}, "'mod.capacity'"},
      {"CapacityString", {Set("mod.capacity", R"("0.5")")}, "'mod.capacity'"},
      {"CapacityListTooShort", {Set("mod.capacity", "[0.5]")}, "'mod.capacity' has 1 values"},
      {"CapacityListOfStrings", {Set("mod.capacity", R"(["0.5", "0.5"])")}, "'mod.capacity'"},
      {"CapacityListAboveOne", {Set("mod.capacity", "[0.5, 1.5]")}, "'mod.capacity'"},
      {"CapacityListZero", {Set("mod.capacity", "[0, 0.5]")}, "'mod.capacity'"},
      {"RouterNotObject", {Set("mod.router", R"("residual")")}, "'mod.router' must be an object"},
      {"RouterUnknownKey", {Set("mod.router.scale", "2")}, "unknown key 'mod.router.scale'"},
      {"RouterBiasNotBool", {Set("mod.router.bias", R"("yes")")}, "'mod.router.bias'"},
      {"RouterInputUnknown", {Set("mod.router.input", R"("output")")}, "'mod.router.input'"},
      {"WeightFnUnknown", {Set("mod.weight_fn", R"("tanh")")}, "'mod.weight_fn'"},
      {"WeightFnNull", {Set("mod.weight_fn", "null")}, "'mod.weight_fn'"},
      {"ScaleTargetUnknown", {Set("mod.scale_target", R"("residual")")}, "'mod.scale_target'"},
      {"InferenceRoutingTopk",
       {Set("mod.inference_routing", R"("topk")")},
       "'mod.inference_routing'"},
      {"ThresholdZero", {Set("mod.threshold", "0")}, "'mod.threshold'"},
      {"ThresholdOne", {Set("mod.threshold", "1")}, "'mod.threshold'"},
      {"LayerThresholdsNumber", {Set("mod.layer_thresholds", "0.5")}, "'mod.layer_thresholds'"},
      {"LayerThresholdsTooLong",
       {Set("mod.layer_thresholds", "[0.5, 0.5, 0.5]")},
       "'mod.layer_thresholds' has 3 values for 2 routed layers"},
      {"LayerThresholdsOne", {Set("mod.layer_thresholds", "[0.5, 1]")}, "'mod.layer_thresholds'"},
      {"LayerThresholdsBool",
       {Set("mod.layer_thresholds", "[0.5, true]")},
       "'mod.layer_thresholds'"},
      {"PredictorNotObject", {Set("mod.predictor", "[]")}, "'mod.predictor' must be an object"},
      {"PredictorUnknownKey",
       {Set("mod.predictor.layers", "2")},
       "unknown key 'mod.predictor.layers'"},
      {"PredictorTypeUnknown", {Set("mod.predictor.type", R"("conv")")}, "'mod.predictor.type'"},
      {"PredictorHiddenMissing",
       {Del("mod.predictor.hidden_size")},
       "missing required key 'mod.predictor.hidden_size'"},
      {"PredictorHiddenZero",
       {Set("mod.predictor.hidden_size", "0")},
       "'mod.predictor.hidden_size'"},
      {"PredictorActivationUnknown",
       {Set("mod.predictor.activation", R"("tanh")")},
       "'mod.predictor.activation'"},
      {"PredictorBiasNotBool", {Set("mod.predictor.bias", "1")}, "'mod.predictor.bias'"},
      {"PredictorThresholdWithoutPredictor",
       {Set("mod.predictor", "null")},
       "'mod.predictor' is missing"},
  };
  return *rows;
}

class ConfigBadRowTest : public ::testing::TestWithParam<BadRow> {};

TEST_P(ConfigBadRowTest, IsInvalidArgumentNamingTheKey) {
  Json j = Json::parse(kModConfig);
  for (const Edit& e : GetParam().edits) Apply(j, e);
  EXPECT_THAT(ParseConfig(j.dump()),
              StatusIs(absl::StatusCode::kInvalidArgument, GetParam().expect));
}

INSTANTIATE_TEST_SUITE_P(ConfigTest, ConfigBadRowTest, ::testing::ValuesIn(BadRows()),
                         [](const ::testing::TestParamInfo<BadRow>& info) {
                           return info.param.label;
                         });

TEST(ConfigTest, LoadConfigReadsTheDirectory) {
  ScratchDir dir;
  WriteBytes(dir.File("config.json"), kModConfig);
  absl::StatusOr<ModelConfig> cfg = LoadConfig(dir.path());
  ASSERT_THAT(cfg, IsOk());
  EXPECT_EQ(cfg->head_dim, 32);
}

TEST(ConfigTest, LoadConfigMissingFileIsNotFound) {
  ScratchDir dir;
  EXPECT_THAT(LoadConfig(dir.path()),
              StatusIs(absl::StatusCode::kNotFound, dir.File("config.json")));
}

TEST(ConfigTest, LoadConfigErrorNamesThePath) {
  ScratchDir dir;
  WriteBytes(dir.File("config.json"), "{not json");
  EXPECT_THAT(LoadConfig(dir.path()), StatusIs(absl::StatusCode::kInvalidArgument,
                                               dir.File("config.json") + ": not valid JSON"));
}

}  // namespace
}  // namespace modserve::engine
