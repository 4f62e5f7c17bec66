// BindWeights/LoadModel: tiny checkpoints written here (names spelled out independently of
// weights.cc) bind with the right shapes or fail naming the tensor; the checked-in reference
// checkpoints (tests/testdata/checkpoints/, models/demo*) load.
#include "engine/model/weights.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/model/checkpoint_test_util.h"

namespace modserve::engine {
namespace {

using ::modserve::engine::testing::Bf16Tensor;
using ::modserve::engine::testing::F16Tensor;
using ::modserve::engine::testing::F32Tensor;
using ::modserve::engine::testing::IsOk;
using ::modserve::engine::testing::Numel;
using ::modserve::engine::testing::RandomValues;
using ::modserve::engine::testing::ScratchDir;
using ::modserve::engine::testing::StatusIs;
using ::modserve::engine::testing::TestTensor;
using ::modserve::engine::testing::WriteBytes;
using ::modserve::engine::testing::WriteSafetensors;

// A tiny model: d_model 8, d_ff 12, 3 layers, 2 query heads and 1 kv head of width 6 (so
// q_proj is [12, 8], not square), vocab 16, layers 0 and 2 routed.
struct TinySpec {
  bool mod = true;
  bool tie = false;
  bool router_bias = true;
  std::string predictor = "mlp";  // "", "mlp" or "linear"
  bool predictor_bias = true;
};

constexpr int64_t kD = 8, kFf = 12, kLayers = 3, kHeads = 2, kKvHeads = 1, kHeadDim = 6,
                  kVocab = 16, kP = 5;

std::string TinyConfig(const TinySpec& s) {
  std::string cfg = absl::StrCat(
      R"({"model_type": "llama", "hidden_size": )", kD, R"(, "intermediate_size": )", kFf,
      R"(, "num_hidden_layers": )", kLayers, R"(, "num_attention_heads": )", kHeads,
      R"(, "num_key_value_heads": )", kKvHeads, R"(, "head_dim": )", kHeadDim,
      R"(, "vocab_size": )", kVocab, R"(, "max_position_embeddings": 64, "tie_word_embeddings": )",
      s.tie ? "true" : "false");
  if (s.mod) {
    absl::StrAppend(&cfg, R"(, "mod": {"format_version": 1, "routed_layers": [0, 2],)",
                    R"( "router": {"bias": )", s.router_bias ? "true" : "false", "}");
    if (s.predictor == "mlp") {
      absl::StrAppend(&cfg, R"(, "inference_routing": "predictor_threshold", "predictor": )",
                      R"({"type": "mlp", "hidden_size": )", kP, R"(, "activation": "relu", )",
                      R"("bias": )", s.predictor_bias ? "true" : "false", "}");
    } else if (s.predictor == "linear") {
      absl::StrAppend(&cfg, R"(, "predictor": {"type": "linear", "bias": )",
                      s.predictor_bias ? "true" : "false", "}");
    }
    cfg += "}";
  }
  return cfg + "}";
}

// The tensors DESIGN.md section 3 names for `s`: BF16 matrices, F16 norms, F32 routers.
std::vector<TestTensor> TinyTensors(const TinySpec& s) {
  std::vector<TestTensor> t;
  uint32_t seed = 100;
  auto bf16 = [&](std::string name, std::vector<int64_t> shape) {
    t.push_back(Bf16Tensor(std::move(name), shape, RandomValues(Numel(shape), seed++)));
  };
  auto f16 = [&](std::string name, std::vector<int64_t> shape) {
    t.push_back(F16Tensor(std::move(name), shape, RandomValues(Numel(shape), seed++)));
  };
  auto f32 = [&](std::string name, std::vector<int64_t> shape) {
    t.push_back(F32Tensor(std::move(name), shape, RandomValues(Numel(shape), seed++)));
  };
  bf16("model.embed_tokens.weight", {kVocab, kD});
  f16("model.norm.weight", {kD});
  if (!s.tie) bf16("lm_head.weight", {kVocab, kD});
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    f16(p + "input_layernorm.weight", {kD});
    f16(p + "post_attention_layernorm.weight", {kD});
    bf16(p + "self_attn.q_proj.weight", {kHeads * kHeadDim, kD});
    bf16(p + "self_attn.k_proj.weight", {kKvHeads * kHeadDim, kD});
    bf16(p + "self_attn.v_proj.weight", {kKvHeads * kHeadDim, kD});
    bf16(p + "self_attn.o_proj.weight", {kD, kHeads * kHeadDim});
    bf16(p + "mlp.gate_proj.weight", {kFf, kD});
    bf16(p + "mlp.up_proj.weight", {kFf, kD});
    bf16(p + "mlp.down_proj.weight", {kD, kFf});
    if (!s.mod || l == 1) continue;
    f32(p + "router.weight", {1, kD});
    if (s.router_bias) f32(p + "router.bias", {1});
    if (s.predictor == "mlp") {
      f32(p + "aux_router.0.weight", {kP, kD});
      f32(p + "aux_router.2.weight", {1, kP});
      if (s.predictor_bias) {
        f32(p + "aux_router.0.bias", {kP});
        f32(p + "aux_router.2.bias", {1});
      }
    } else if (s.predictor == "linear") {
      f32(p + "aux_router.weight", {1, kD});
      if (s.predictor_bias) f32(p + "aux_router.bias", {1});
    }
  }
  return t;
}

void WriteModel(const ScratchDir& dir, const TinySpec& s, const std::vector<TestTensor>& t) {
  WriteBytes(dir.File("config.json"), TinyConfig(s));
  WriteSafetensors(dir.File("model.safetensors"), t);
}

absl::StatusOr<LoadedModel> LoadTiny(const ScratchDir& dir, const TinySpec& s,
                                     const std::vector<TestTensor>& t) {
  WriteModel(dir, s, t);
  return LoadModel(dir.path());
}

std::vector<TestTensor> Without(std::vector<TestTensor> t, const std::string& name) {
  std::erase_if(t, [&](const TestTensor& x) { return x.name == name; });
  return t;
}

void ExpectShape(const TensorView& v, std::vector<int64_t> shape, DType dtype) {
  ASSERT_FALSE(v.empty());
  EXPECT_EQ(v.dtype, dtype);
  ASSERT_EQ(v.ndim, static_cast<int>(shape.size()));
  for (int i = 0; i < v.ndim; ++i) EXPECT_EQ(v.shape[i], shape[i]) << "dim " << i;
}

TEST(WeightsTest, BindsEveryTensorWithItsShape) {
  ScratchDir dir;
  const TinySpec spec;
  absl::StatusOr<LoadedModel> m = LoadTiny(dir, spec, TinyTensors(spec));
  ASSERT_THAT(m, IsOk());
  const ModelWeights& w = m->weights();
  ExpectShape(w.embed_tokens, {kVocab, kD}, DType::kBF16);
  ExpectShape(w.norm, {kD}, DType::kF16);
  ExpectShape(w.lm_head, {kVocab, kD}, DType::kBF16);
  EXPECT_NE(w.lm_head.data, w.embed_tokens.data);
  ASSERT_EQ(w.layers.size(), static_cast<size_t>(kLayers));
  for (int l = 0; l < kLayers; ++l) {
    SCOPED_TRACE(l);
    const LayerWeights& lw = w.layers[l];
    ExpectShape(lw.input_layernorm, {kD}, DType::kF16);
    ExpectShape(lw.post_attention_layernorm, {kD}, DType::kF16);
    ExpectShape(lw.q_proj, {kHeads * kHeadDim, kD}, DType::kBF16);
    ExpectShape(lw.k_proj, {kKvHeads * kHeadDim, kD}, DType::kBF16);
    ExpectShape(lw.v_proj, {kKvHeads * kHeadDim, kD}, DType::kBF16);
    ExpectShape(lw.o_proj, {kD, kHeads * kHeadDim}, DType::kBF16);
    ExpectShape(lw.gate_proj, {kFf, kD}, DType::kBF16);
    ExpectShape(lw.up_proj, {kFf, kD}, DType::kBF16);
    ExpectShape(lw.down_proj, {kD, kFf}, DType::kBF16);
    EXPECT_EQ(lw.routed, l != 1);
    if (l == 1) {
      EXPECT_TRUE(lw.router_weight.empty());
      EXPECT_TRUE(lw.router_bias.empty());
      EXPECT_TRUE(lw.predictor_hidden_weight.empty());
      EXPECT_TRUE(lw.predictor_out_weight.empty());
      continue;
    }
    ExpectShape(lw.router_weight, {1, kD}, DType::kF32);
    ExpectShape(lw.router_bias, {1}, DType::kF32);
    ExpectShape(lw.predictor_hidden_weight, {kP, kD}, DType::kF32);
    ExpectShape(lw.predictor_hidden_bias, {kP}, DType::kF32);
    ExpectShape(lw.predictor_out_weight, {1, kP}, DType::kF32);
    ExpectShape(lw.predictor_out_bias, {1}, DType::kF32);
  }
  // Each view is the checkpoint's own bytes, under the name DESIGN.md gives it.
  const Checkpoint& ckpt = m->checkpoint();
  EXPECT_EQ(w.layers[2].predictor_out_weight.data,
            ckpt.Get("model.layers.2.aux_router.2.weight")->data);
  EXPECT_EQ(w.layers[0].k_proj.data, ckpt.Get("model.layers.0.self_attn.k_proj.weight")->data);
  EXPECT_EQ(w.layers[1].down_proj.data, ckpt.Get("model.layers.1.mlp.down_proj.weight")->data);
  EXPECT_EQ(w.layers[2].router_bias.data, ckpt.Get("model.layers.2.router.bias")->data);
  EXPECT_EQ(m->config().mod->predictor->activation, Activation::kRelu);
}

TEST(WeightsTest, ValuesMatchWhatWasWritten) {
  ScratchDir dir;
  const TinySpec spec;
  const std::vector<TestTensor> tensors = TinyTensors(spec);
  absl::StatusOr<LoadedModel> m = LoadTiny(dir, spec, tensors);
  ASSERT_THAT(m, IsOk());
  for (const TestTensor& t : tensors) {
    if (t.name != "model.layers.0.router.weight") continue;
    const TensorView& v = m->weights().layers[0].router_weight;
    ASSERT_EQ(v.bytes(), t.bytes.size());
    EXPECT_EQ(std::memcmp(v.data, t.bytes.data(), t.bytes.size()), 0);
  }
}

TEST(WeightsTest, LinearPredictorFillsOnlyTheOutputLayer) {
  ScratchDir dir;
  TinySpec spec;
  spec.predictor = "linear";
  absl::StatusOr<LoadedModel> m = LoadTiny(dir, spec, TinyTensors(spec));
  ASSERT_THAT(m, IsOk());
  const LayerWeights& lw = m->weights().layers[2];
  EXPECT_TRUE(lw.predictor_hidden_weight.empty());
  EXPECT_TRUE(lw.predictor_hidden_bias.empty());
  ExpectShape(lw.predictor_out_weight, {1, kD}, DType::kF32);
  ExpectShape(lw.predictor_out_bias, {1}, DType::kF32);
  EXPECT_EQ(lw.predictor_out_weight.data,
            m->checkpoint().Get("model.layers.2.aux_router.weight")->data);
}

TEST(WeightsTest, NoBiasesWhenTheConfigSaysNone) {
  ScratchDir dir;
  TinySpec spec;
  spec.router_bias = false;
  spec.predictor_bias = false;
  absl::StatusOr<LoadedModel> m = LoadTiny(dir, spec, TinyTensors(spec));
  ASSERT_THAT(m, IsOk());
  const LayerWeights& lw = m->weights().layers[0];
  ExpectShape(lw.router_weight, {1, kD}, DType::kF32);
  EXPECT_TRUE(lw.router_bias.empty());
  EXPECT_FALSE(lw.predictor_hidden_weight.empty());
  EXPECT_TRUE(lw.predictor_hidden_bias.empty());
  EXPECT_TRUE(lw.predictor_out_bias.empty());
}

TEST(WeightsTest, BiasTheConfigDoesNotDeclareIsUnexpected) {
  ScratchDir dir;
  TinySpec spec;
  spec.router_bias = false;
  std::vector<TestTensor> t = TinyTensors(spec);
  t.push_back(F32Tensor("model.layers.2.router.bias", {1}, {0.5f}));
  EXPECT_THAT(LoadTiny(dir, spec, t), StatusIs(absl::StatusCode::kDataLoss,
                                               "unexpected tensor 'model.layers.2.router.bias'"));
}

TEST(WeightsTest, DenseModelBindsWithoutRouters) {
  ScratchDir dir;
  TinySpec spec;
  spec.mod = false;
  absl::StatusOr<LoadedModel> m = LoadTiny(dir, spec, TinyTensors(spec));
  ASSERT_THAT(m, IsOk());
  for (const LayerWeights& lw : m->weights().layers) {
    EXPECT_FALSE(lw.routed);
    EXPECT_TRUE(lw.router_weight.empty());
  }
  EXPECT_EQ(ExpectedTensorNames(m->config()).size(), 3u + 9u * kLayers);
}

TEST(WeightsTest, RouterTensorInADenseModelIsUnexpected) {
  ScratchDir dir;
  TinySpec dense;
  dense.mod = false;
  std::vector<TestTensor> t = TinyTensors(dense);
  t.push_back(F32Tensor("model.layers.1.router.weight", {1, kD}, RandomValues(kD, 9)));
  EXPECT_THAT(
      LoadTiny(dir, dense, t),
      StatusIs(absl::StatusCode::kDataLoss, "unexpected tensor 'model.layers.1.router.weight'"));
}

TEST(WeightsTest, TiedEmbeddingsServeAsLmHead) {
  ScratchDir dir;
  TinySpec spec;
  spec.tie = true;
  absl::StatusOr<LoadedModel> m = LoadTiny(dir, spec, TinyTensors(spec));
  ASSERT_THAT(m, IsOk());
  EXPECT_EQ(m->weights().lm_head.data, m->weights().embed_tokens.data);
  ExpectShape(m->weights().lm_head, {kVocab, kD}, DType::kBF16);
}

TEST(WeightsTest, StoredLmHeadOfATiedModelIsIgnored) {
  ScratchDir dir;
  TinySpec spec;
  spec.tie = true;
  std::vector<TestTensor> t = TinyTensors(spec);
  t.push_back(Bf16Tensor("lm_head.weight", {kVocab, kD}, RandomValues(kVocab * kD, 11)));
  absl::StatusOr<LoadedModel> m = LoadTiny(dir, spec, t);
  ASSERT_THAT(m, IsOk());
  EXPECT_EQ(m->weights().lm_head.data, m->weights().embed_tokens.data);
}

TEST(WeightsTest, RotaryInvFreqBuffersAreIgnored) {
  ScratchDir dir;
  const TinySpec spec;
  std::vector<TestTensor> t = TinyTensors(spec);
  t.push_back(F32Tensor("model.layers.0.self_attn.rotary_emb.inv_freq", {kHeadDim / 2},
                        RandomValues(kHeadDim / 2, 12)));
  EXPECT_THAT(LoadTiny(dir, spec, t), IsOk());
}

TEST(WeightsTest, UntiedModelWithoutLmHeadFails) {
  ScratchDir dir;
  const TinySpec spec;
  EXPECT_THAT(LoadTiny(dir, spec, Without(TinyTensors(spec), "lm_head.weight")),
              StatusIs(absl::StatusCode::kDataLoss,
                       "missing tensor 'lm_head.weight' (expected shape [16, 8])"));
}

TEST(WeightsTest, MissingTensorIsNamed) {
  ScratchDir dir;
  const TinySpec spec;
  EXPECT_THAT(LoadTiny(dir, spec, Without(TinyTensors(spec), "model.layers.2.aux_router.0.bias")),
              StatusIs(absl::StatusCode::kDataLoss,
                       "missing tensor 'model.layers.2.aux_router.0.bias' (expected shape [5])"));
}

TEST(WeightsTest, MissingTensorErrorNamesTheDirectory) {
  ScratchDir dir;
  const TinySpec spec;
  EXPECT_THAT(LoadTiny(dir, spec, Without(TinyTensors(spec), "model.norm.weight")),
              StatusIs(absl::StatusCode::kDataLoss, dir.path() + ": "));
}

TEST(WeightsTest, WrongShapeNamesFoundAndExpected) {
  ScratchDir dir;
  const TinySpec spec;
  std::vector<TestTensor> t = Without(TinyTensors(spec), "model.layers.1.self_attn.k_proj.weight");
  // The transpose of the right shape: same element count, wrong layout.
  t.push_back(Bf16Tensor("model.layers.1.self_attn.k_proj.weight", {kD, kKvHeads * kHeadDim},
                         RandomValues(kD * kKvHeads * kHeadDim, 13)));
  EXPECT_THAT(LoadTiny(dir, spec, t),
              StatusIs(absl::StatusCode::kDataLoss,
                       "tensor 'model.layers.1.self_attn.k_proj.weight' has shape [8, 6], "
                       "expected [6, 8]"));
}

TEST(WeightsTest, RouterOfWrongRankIsAShapeError) {
  ScratchDir dir;
  const TinySpec spec;
  std::vector<TestTensor> t = Without(TinyTensors(spec), "model.layers.0.router.weight");
  t.push_back(F32Tensor("model.layers.0.router.weight", {kD}, RandomValues(kD, 14)));
  EXPECT_THAT(LoadTiny(dir, spec, t),
              StatusIs(absl::StatusCode::kDataLoss,
                       "tensor 'model.layers.0.router.weight' has shape [8], expected [1, 8]"));
}

TEST(WeightsTest, UnexpectedTensorIsNamed) {
  ScratchDir dir;
  const TinySpec spec;
  std::vector<TestTensor> t = TinyTensors(spec);
  t.push_back(F32Tensor("model.layers.0.block.router.weight", {1, kD}, RandomValues(kD, 15)));
  t.push_back(F32Tensor("zzz.extra", {1}, {1.0f}));
  EXPECT_THAT(LoadTiny(dir, spec, t),
              StatusIs(absl::StatusCode::kDataLoss,
                       "unexpected tensor 'model.layers.0.block.router.weight' (and 1 more)"));
}

TEST(WeightsTest, NanRouterIsDataLoss) {
  ScratchDir dir;
  const TinySpec spec;
  std::vector<TestTensor> t = Without(TinyTensors(spec), "model.layers.2.router.weight");
  std::vector<float> w = RandomValues(kD, 16);
  w[3] = std::numeric_limits<float>::quiet_NaN();
  t.push_back(F32Tensor("model.layers.2.router.weight", {1, kD}, w));
  EXPECT_THAT(LoadTiny(dir, spec, t),
              StatusIs(absl::StatusCode::kDataLoss,
                       "tensor 'model.layers.2.router.weight' has a non-finite value (nan) at "
                       "element 3"));
}

TEST(WeightsTest, InfinitePredictorInBf16IsDataLoss) {
  ScratchDir dir;
  const TinySpec spec;
  std::vector<TestTensor> t = Without(TinyTensors(spec), "model.layers.0.aux_router.2.bias");
  t.push_back(Bf16Tensor("model.layers.0.aux_router.2.bias", {1},
                         {std::numeric_limits<float>::infinity()}));
  EXPECT_THAT(LoadTiny(dir, spec, t),
              StatusIs(absl::StatusCode::kDataLoss,
                       "tensor 'model.layers.0.aux_router.2.bias' has a non-finite value (inf)"));
}

TEST(WeightsTest, BadConfigIsInvalidArgument) {
  ScratchDir dir;
  const TinySpec spec;
  WriteModel(dir, spec, TinyTensors(spec));
  WriteBytes(dir.File("config.json"), R"({"hidden_size": 8})");
  EXPECT_THAT(LoadModel(dir.path()),
              StatusIs(absl::StatusCode::kInvalidArgument, "'num_hidden_layers'"));
}

TEST(WeightsTest, LoadedModelKeepsViewsValidWhenMoved) {
  ScratchDir dir;
  const TinySpec spec;
  const std::vector<TestTensor> tensors = TinyTensors(spec);
  absl::StatusOr<LoadedModel> loaded = LoadTiny(dir, spec, tensors);
  ASSERT_THAT(loaded, IsOk());
  LoadedModel first = *std::move(loaded);
  LoadedModel second = std::move(first);
  const TensorView& embed = second.weights().embed_tokens;
  EXPECT_EQ(embed.data, second.checkpoint().Get("model.embed_tokens.weight")->data);
  EXPECT_EQ(std::memcmp(embed.data, tensors[0].bytes.data(), tensors[0].bytes.size()), 0);
}

// A MoD adapter (DESIGN.md section 3.2) over the tiny dense model: base/ holds the dense
// checkpoint, adapter/ the config ({base_model, mod}) and adapter.safetensors with the routers
// of layers 0 and 2 (with bias) and their MLP predictors.
struct TinyAdapter {
  ScratchDir root;
  std::string base_dir, adapter_dir;
  std::vector<TestTensor> base_tensors, router_tensors;
  std::string mod_json = R"({"format_version": 1, "routed_layers": [2, 0], "capacity": [0.5, 0.75],
    "router": {"bias": true, "input": "input_layernorm"}, "weight_fn": "one",
    "inference_routing": "predictor_threshold", "layer_thresholds": [0.3, 0.6],
    "predictor": {"type": "mlp", "hidden_size": 5, "activation": "relu", "bias": true}})";

  TinyAdapter() {
    base_dir = root.File("base");
    adapter_dir = root.File("adapter");
    std::filesystem::create_directories(base_dir);
    std::filesystem::create_directories(adapter_dir);
    TinySpec dense;
    dense.mod = false;
    base_tensors = TinyTensors(dense);
    WriteBytes(base_dir + "/config.json", TinyConfig(dense));
    WriteSafetensors(base_dir + "/model.safetensors", base_tensors);
    // The routed layers' router and predictor tensors of the MoD tiny model.
    for (const TestTensor& t : TinyTensors(TinySpec{})) {
      if (absl::StrContains(t.name, "router")) router_tensors.push_back(t);
    }
  }
  absl::StatusOr<LoadedModel> Load(const std::string& base_model = "../base") {
    WriteBytes(adapter_dir + "/config.json",
               absl::StrCat(R"({"base_model": ")", base_model, R"(", "mod": )", mod_json, "}"));
    WriteSafetensors(adapter_dir + "/adapter.safetensors", router_tensors);
    return LoadModel(adapter_dir);
  }
};

TEST(WeightsTest, AdapterBindsRoutersOverTheBaseWeights) {
  TinyAdapter a;
  absl::StatusOr<LoadedModel> m = a.Load();
  ASSERT_THAT(m, IsOk());
  const ModelConfig& cfg = m->config();
  ASSERT_TRUE(cfg.mod.has_value());
  EXPECT_EQ(cfg.mod->routed_layers, (std::vector<int>{0, 2}));
  EXPECT_EQ(cfg.mod->capacities, (std::vector<double>{0.75, 0.5}));
  EXPECT_EQ(cfg.mod->layer_thresholds, (std::vector<double>{0.6, 0.3}));
  EXPECT_EQ(cfg.d_model, kD);
  ASSERT_NE(m->adapter(), nullptr);
  const ModelWeights& w = m->weights();
  // Dense tensors come from the base file, routers from the adapter's.
  EXPECT_EQ(w.layers[1].q_proj.data, m->checkpoint().Get("model.layers.1.self_attn.q_proj.weight")->data);
  EXPECT_FALSE(w.layers[1].routed);
  for (int l : {0, 2}) {
    const LayerWeights& lw = w.layers[l];
    EXPECT_TRUE(lw.routed);
    const std::string p = absl::StrCat("model.layers.", l, ".");
    EXPECT_EQ(lw.router_weight.data, m->adapter()->Get(p + "router.weight")->data);
    EXPECT_EQ(lw.router_bias.data, m->adapter()->Get(p + "router.bias")->data);
    EXPECT_EQ(lw.predictor_hidden_weight.data, m->adapter()->Get(p + "aux_router.0.weight")->data);
    ExpectShape(lw.predictor_out_weight, {1, kP}, DType::kF32);
  }
  for (const TestTensor& t : a.router_tensors) {
    if (t.name != "model.layers.2.router.weight") continue;
    EXPECT_EQ(std::memcmp(w.layers[2].router_weight.data, t.bytes.data(), t.bytes.size()), 0);
  }
  EXPECT_EQ(m->tokenizer_path(), std::filesystem::path(a.base_dir).lexically_normal().string());
  // Moving the model keeps both files' views valid.
  LoadedModel moved = *std::move(m);
  EXPECT_EQ(moved.weights().layers[0].router_weight.data,
            moved.adapter()->Get("model.layers.0.router.weight")->data);
}

TEST(WeightsTest, AdapterWithAMissingBaseNamesBothFiles) {
  TinyAdapter a;
  EXPECT_THAT(a.Load("../nowhere.gguf"),
              StatusIs(absl::StatusCode::kNotFound,
                       absl::StrCat(a.adapter_dir, "/config.json: base model '../nowhere.gguf' (",
                                    a.root.path(), "/nowhere.gguf) does not exist")));
}

TEST(WeightsTest, AdapterRouterThatDoesNotFitTheBaseNamesBothFiles) {
  TinyAdapter a;
  for (TestTensor& t : a.router_tensors) {
    if (t.name == "model.layers.2.router.weight") {
      t = F32Tensor(t.name, {1, kD + 1}, RandomValues(kD + 1, 7));
    }
  }
  EXPECT_THAT(a.Load(), StatusIs(absl::StatusCode::kDataLoss,
                                 absl::StrCat(a.adapter_dir, "/adapter.safetensors: tensor "
                                              "'model.layers.2.router.weight' has shape [1, 9], "
                                              "but the base model ", a.base_dir, " needs [1, 8]")));
}

TEST(WeightsTest, AdapterRoutedLayerOutsideTheBaseNamesBothFiles) {
  TinyAdapter a;
  a.mod_json = R"({"format_version": 1, "routed_layers": [0, 3]})";
  EXPECT_THAT(a.Load(), StatusIs(absl::StatusCode::kInvalidArgument,
                                 absl::StrCat(a.adapter_dir, "/config.json: 'mod.routed_layers' has "
                                              "layer 3, outside [0, 3) (base model ", a.base_dir,
                                              ", 3 layers)")));
}

TEST(WeightsTest, AdapterMissingRouterNamesBothFiles) {
  TinyAdapter a;
  a.router_tensors = Without(a.router_tensors, "model.layers.0.aux_router.2.bias");
  EXPECT_THAT(a.Load(), StatusIs(absl::StatusCode::kDataLoss,
                                 absl::StrCat("adapter.safetensors: missing tensor "
                                              "'model.layers.0.aux_router.2.bias' (expected shape "
                                              "[1] for the base model ", a.base_dir, ")")));
}

TEST(WeightsTest, AdapterHoldingADenseWeightIsRejected) {
  TinyAdapter a;
  a.router_tensors.push_back(a.base_tensors[0]);
  EXPECT_THAT(a.Load(), StatusIs(absl::StatusCode::kDataLoss,
                                 "unexpected tensor 'model.embed_tokens.weight'"));
}

TEST(WeightsTest, AdapterNanRouterIsDataLoss) {
  TinyAdapter a;
  for (TestTensor& t : a.router_tensors) {
    if (t.name == "model.layers.0.router.bias") {
      t = F32Tensor(t.name, {1}, {std::numeric_limits<float>::quiet_NaN()});
    }
  }
  EXPECT_THAT(a.Load(), StatusIs(absl::StatusCode::kDataLoss, "model.layers.0.router.bias"));
}

TEST(WeightsTest, AdapterWithoutTensorFileIsNotFound) {
  TinyAdapter a;
  ASSERT_THAT(a.Load(), IsOk());
  std::filesystem::remove(a.adapter_dir + "/adapter.safetensors");
  EXPECT_THAT(LoadModel(a.adapter_dir),
              StatusIs(absl::StatusCode::kNotFound, absl::StrCat("adapter.safetensors: no such "
                                                                  "file (the routers of the "
                                                                  "adapter for ", a.base_dir)));
}

TEST(WeightsTest, AdapterOverAMoDBaseIsRejected) {
  TinyAdapter a;
  const TinySpec mod;
  WriteBytes(a.base_dir + "/config.json", TinyConfig(mod));
  WriteSafetensors(a.base_dir + "/model.safetensors", TinyTensors(mod));
  EXPECT_THAT(a.Load(), StatusIs(absl::StatusCode::kInvalidArgument,
                                 "is itself a MoD model; an adapter's base must be dense"));
}

TEST(WeightsTest, AdapterConfigWithAnUnknownKeyIsRejected) {
  TinyAdapter a;
  ASSERT_THAT(a.Load(), IsOk());
  WriteBytes(a.adapter_dir + "/config.json",
             R"({"base_model": "../base", "hidden_size": 8, "mod": {"format_version": 1,
                 "routed_layers": [0]}})");
  EXPECT_THAT(LoadModel(a.adapter_dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "unknown key 'hidden_size' in an adapter config"));
  WriteBytes(a.adapter_dir + "/config.json", R"({"base_model": 3, "mod": {}})");
  EXPECT_THAT(LoadModel(a.adapter_dir),
              StatusIs(absl::StatusCode::kInvalidArgument, "'base_model' must be a non-empty"));
}

TEST(WeightsTest, AdapterAbsoluteBasePathLoads) {
  TinyAdapter a;
  EXPECT_THAT(a.Load(a.base_dir), IsOk());
}

// Checkpoints written by the PyTorch reference (tools/modref/checkpoint.py). Each must load,
// bind every tensor and hold nothing else.
void ExpectReferenceCheckpointLoads(const std::string& model_dir) {
  SCOPED_TRACE(model_dir);
  absl::StatusOr<LoadedModel> m = LoadModel(model_dir);
  ASSERT_THAT(m, IsOk());
  const ModelConfig& cfg = m->config();
  const ModelWeights& w = m->weights();
  ASSERT_EQ(static_cast<int64_t>(w.layers.size()), cfg.n_layers);
  ExpectShape(w.lm_head, {cfg.vocab_size, cfg.d_model}, w.lm_head.dtype);
  uint64_t bound_bytes = 0, adapter_bytes = 0;
  for (const std::string& name : ExpectedTensorNames(cfg)) {
    if (m->adapter() != nullptr && m->adapter()->Contains(name)) {
      adapter_bytes += m->adapter()->Find(name)->bytes;  // an adapter's routers
    } else {
      bound_bytes += m->checkpoint().Find(name)->bytes;
    }
  }
  if (m->adapter() != nullptr) {
    EXPECT_EQ(adapter_bytes, m->adapter()->total_bytes());
  }
  const bool stored_tied_head =
      cfg.tie_word_embeddings && m->checkpoint().Contains("lm_head.weight");
  EXPECT_EQ(bound_bytes + (stored_tied_head ? m->checkpoint().Find("lm_head.weight")->bytes : 0),
            m->checkpoint().total_bytes());
  for (int l = 0; l < cfg.n_layers; ++l) {
    const LayerWeights& lw = w.layers[l];
    EXPECT_EQ(lw.routed, cfg.IsRouted(l));
    EXPECT_EQ(lw.router_weight.empty(), !cfg.IsRouted(l));
    const bool has_predictor = cfg.IsRouted(l) && cfg.mod->predictor.has_value();
    EXPECT_EQ(lw.predictor_out_weight.empty(), !has_predictor);
    EXPECT_FALSE(lw.q_proj.empty());
  }
}

std::vector<std::string> ModelDirsUnder(const std::string& root) {
  std::vector<std::string> dirs;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) {
    if (std::filesystem::exists(entry.path() / "config.json")) dirs.push_back(entry.path());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

TEST(WeightsTest, LoadsReferenceTestCheckpoints) {
  const std::vector<std::string> dirs =
      ModelDirsUnder(std::string(MODSERVE_SOURCE_DIR) + "/tests/testdata/checkpoints");
  if (dirs.empty()) GTEST_SKIP() << "no checkpoints under tests/testdata/checkpoints yet";
  for (const std::string& dir : dirs) ExpectReferenceCheckpointLoads(dir);
}

TEST(WeightsTest, LoadsDemoCheckpoints) {
  int found = 0;
  for (const char* name : {"demo", "demo-dense"}) {
    const std::string dir = absl::StrCat(MODSERVE_SOURCE_DIR, "/models/", name);
    if (!std::filesystem::exists(dir + "/config.json")) continue;
    ++found;
    ExpectReferenceCheckpointLoads(dir);
  }
  if (found == 0) GTEST_SKIP() << "models/demo and models/demo-dense have no config.json yet";
}

}  // namespace
}  // namespace modserve::engine
