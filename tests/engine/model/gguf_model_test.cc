// OpenGgufModel/LoadModel on GGUF files written byte by byte here: the same tiny model stored as
// a safetensors directory and as GGUF (llama.cpp names, Q/K rows permuted as llama.cpp's converter
// does, MoD metadata) binds to identical weights; every metadata or tensor problem fails with a
// message naming the key or the tensor.
#include "engine/model/gguf_model.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model/weights.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/real_model.h"
#include "tests/engine/model/checkpoint_test_util.h"
#include "tests/engine/model/gguf_test_util.h"

namespace modserve::engine {
namespace {

using ::modserve::engine::testing::Bf16Tensor;
using ::modserve::engine::testing::F16Tensor;
using ::modserve::engine::testing::F32Tensor;
using ::modserve::engine::testing::GgufBuilder;
using ::modserve::engine::testing::IsOk;
using ::modserve::engine::testing::Numel;
using ::modserve::engine::testing::RandomValues;
using ::modserve::engine::testing::ScratchDir;
using ::modserve::engine::testing::StatusIs;
using ::modserve::engine::testing::TestTensor;
using ::modserve::engine::testing::WriteBytes;
using ::modserve::engine::testing::WriteSafetensors;
namespace mt = ::modserve::engine::testing::ggml_type;
using ::testing::ElementsAre;

// d_model 8, d_ff 12, 3 layers, 2 query heads and 1 kv head of width 6 (not d_model / heads, so
// the file must say llama.attention.key_length), vocab 16; layers 0 and 2 routed, router bias,
// an MLP predictor of width 5.
constexpr int64_t kD = 8, kFf = 12, kLayers = 3, kHeads = 2, kKvHeads = 1, kHeadDim = 6,
                  kVocab = 16, kP = 5;

struct Spec {
  bool mod = true;
  bool tie = false;
};

// The Hugging Face tensors: BF16 matrices, F16 norms, F32 routers and predictors.
std::vector<TestTensor> HfTensors(const Spec& s) {
  std::vector<TestTensor> t;
  uint32_t seed = 7;
  auto add = [&](const std::string& dtype, std::string name, std::vector<int64_t> shape) {
    const std::vector<float> v = RandomValues(Numel(shape), seed++);
    if (dtype == "BF16") t.push_back(Bf16Tensor(std::move(name), shape, v));
    if (dtype == "F16") t.push_back(F16Tensor(std::move(name), shape, v));
    if (dtype == "F32") t.push_back(F32Tensor(std::move(name), shape, v));
  };
  add("BF16", "model.embed_tokens.weight", {kVocab, kD});
  add("F16", "model.norm.weight", {kD});
  if (!s.tie) add("BF16", "lm_head.weight", {kVocab, kD});
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    add("F16", p + "input_layernorm.weight", {kD});
    add("F16", p + "post_attention_layernorm.weight", {kD});
    add("BF16", p + "self_attn.q_proj.weight", {kHeads * kHeadDim, kD});
    add("BF16", p + "self_attn.k_proj.weight", {kKvHeads * kHeadDim, kD});
    add("BF16", p + "self_attn.v_proj.weight", {kKvHeads * kHeadDim, kD});
    add("BF16", p + "self_attn.o_proj.weight", {kD, kHeads * kHeadDim});
    add("BF16", p + "mlp.gate_proj.weight", {kFf, kD});
    add("BF16", p + "mlp.up_proj.weight", {kFf, kD});
    add("BF16", p + "mlp.down_proj.weight", {kD, kFf});
    if (!s.mod || l == 1) continue;
    add("F32", p + "router.weight", {1, kD});
    add("F32", p + "router.bias", {1});
    add("F32", p + "aux_router.0.weight", {kP, kD});
    add("F32", p + "aux_router.0.bias", {kP});
    add("F32", p + "aux_router.2.weight", {1, kP});
    add("F32", p + "aux_router.2.bias", {1});
  }
  return t;
}

std::string HfConfig(const Spec& s) {
  std::string cfg = absl::StrCat(
      R"({"model_type": "llama", "hidden_size": 8, "intermediate_size": 12,)",
      R"( "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 1,)",
      R"( "head_dim": 6, "vocab_size": 16, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,)",
      R"( "rope_theta": 500.0, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": )",
      s.tie ? "true" : "false");
  if (s.mod) {
    cfg += R"(, "mod": {"format_version": 1, "routed_layers": [0, 2], "capacity": 0.25,)"
           R"( "router": {"bias": true, "input": "input_layernorm"}, "weight_fn": "sigmoid",)"
           R"( "scale_target": "block_output", "inference_routing": "predictor_threshold",)"
           R"( "threshold": 0.375, "predictor": {"type": "mlp", "hidden_size": 5,)"
           R"( "activation": "gelu", "bias": true}})";
  }
  return cfg + "}";
}

// llama.cpp's name for a Hugging Face tensor name, spelled out independently of weights.cc.
std::string GgufName(const std::string& hf) {
  static const std::map<std::string, std::string> kGlobal = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"}};
  static const std::map<std::string, std::string> kLayer = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      {"router.weight", "mod_router.weight"},
      {"router.bias", "mod_router.bias"},
      {"aux_router.0.weight", "mod_pred_hidden.weight"},
      {"aux_router.0.bias", "mod_pred_hidden.bias"},
      {"aux_router.2.weight", "mod_pred_out.weight"},
      {"aux_router.2.bias", "mod_pred_out.bias"}};
  if (auto it = kGlobal.find(hf); it != kGlobal.end()) return it->second;
  const size_t dot = hf.find('.', std::string("model.layers.").size());
  const std::string layer = hf.substr(13, dot - 13);
  return absl::StrCat("blk.", layer, ".", kLayer.at(hf.substr(dot + 1)));
}

// llama.cpp's converter permutes q/k rows per head: GGUF row 2i + j = HF row j * hd/2 + i.
std::string PermuteRows(const std::string& bytes, int64_t rows, int64_t head_dim) {
  const size_t row_bytes = bytes.size() / static_cast<size_t>(rows);
  std::string out(bytes.size(), '\0');
  for (int64_t h = 0; h < rows / head_dim; ++h) {
    for (int64_t i = 0; i < head_dim / 2; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t gguf_row = h * head_dim + 2 * i + j;
        const int64_t hf_row = h * head_dim + j * (head_dim / 2) + i;
        std::memcpy(out.data() + gguf_row * row_bytes, bytes.data() + hf_row * row_bytes,
                    row_bytes);
      }
    }
  }
  return out;
}

uint32_t GgmlType(const std::string& dtype) {
  if (dtype == "F32") return mt::kF32;
  if (dtype == "F16") return mt::kF16;
  return mt::kBF16;
}

// Metadata as an editable list: key -> a function that writes that key.
using Meta = std::vector<std::pair<std::string, std::function<void(GgufBuilder&)>>>;

Meta LlamaMetadata() {
  auto u32 = [](std::string k, uint32_t v) {
    return std::make_pair(k, std::function<void(GgufBuilder&)>(
                                 [k, v](GgufBuilder& b) { b.KvU32(k, v); }));
  };
  auto f32 = [](std::string k, float v) {
    return std::make_pair(k, std::function<void(GgufBuilder&)>(
                                 [k, v](GgufBuilder& b) { b.KvF32(k, v); }));
  };
  return {
      {"general.architecture", [](GgufBuilder& b) { b.KvString("general.architecture", "llama"); }},
      u32("llama.embedding_length", kD),
      u32("llama.feed_forward_length", kFf),
      u32("llama.block_count", kLayers),
      u32("llama.attention.head_count", kHeads),
      u32("llama.attention.head_count_kv", kKvHeads),
      u32("llama.attention.key_length", kHeadDim),
      u32("llama.attention.value_length", kHeadDim),
      u32("llama.rope.dimension_count", kHeadDim),
      f32("llama.attention.layer_norm_rms_epsilon", 1e-5f),
      f32("llama.rope.freq_base", 500.0f),
      u32("llama.context_length", 64),
      u32("llama.vocab_size", kVocab),
      u32("tokenizer.ggml.bos_token_id", 1),
      u32("tokenizer.ggml.eos_token_id", 2),
  };
}

Meta ModMetadata() {
  auto str = [](std::string k, std::string v) {
    return std::make_pair(k, std::function<void(GgufBuilder&)>(
                                 [k, v](GgufBuilder& b) { b.KvString(k, v); }));
  };
  auto f64 = [](std::string k, double v) {
    return std::make_pair(k, std::function<void(GgufBuilder&)>(
                                 [k, v](GgufBuilder& b) { b.KvF64(k, v); }));
  };
  auto boolean = [](std::string k, bool v) {
    return std::make_pair(k, std::function<void(GgufBuilder&)>(
                                 [k, v](GgufBuilder& b) { b.KvBool(k, v); }));
  };
  return {
      {"modserve.mod.format_version",
       [](GgufBuilder& b) { b.KvU32("modserve.mod.format_version", 1); }},
      {"modserve.mod.routed_layers",
       [](GgufBuilder& b) { b.KvI32Array("modserve.mod.routed_layers", {0, 2}); }},
      f64("modserve.mod.capacity", 0.25),
      boolean("modserve.mod.router.bias", true),
      str("modserve.mod.router.input", "input_layernorm"),
      str("modserve.mod.weight_fn", "sigmoid"),
      str("modserve.mod.scale_target", "block_output"),
      str("modserve.mod.inference_routing", "predictor_threshold"),
      f64("modserve.mod.threshold", 0.375),
      str("modserve.mod.predictor.type", "mlp"),
      {"modserve.mod.predictor.hidden_size",
       [](GgufBuilder& b) { b.KvU32("modserve.mod.predictor.hidden_size", kP); }},
      str("modserve.mod.predictor.activation", "gelu"),
      boolean("modserve.mod.predictor.bias", true),
  };
}

// `meta` with key `key` written by `write` instead (appended when absent; removed when null).
Meta With(Meta meta, const std::string& key, std::function<void(GgufBuilder&)> write) {
  auto it = std::find_if(meta.begin(), meta.end(), [&](const auto& kv) { return kv.first == key; });
  if (it == meta.end()) {
    if (write) meta.emplace_back(key, std::move(write));
  } else if (write) {
    it->second = std::move(write);
  } else {
    meta.erase(it);
  }
  return meta;
}

Meta Concat(Meta a, const Meta& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Meta DefaultMetadata(const Spec& s) {
  return s.mod ? Concat(LlamaMetadata(), ModMetadata()) : LlamaMetadata();
}

// The GGUF twin of HfTensors(s), Q/K rows permuted as llama.cpp's converter writes them.
GgufBuilder GgufModelBuilder(const std::vector<TestTensor>& hf, const Meta& meta) {
  GgufBuilder b;
  for (const auto& [key, write] : meta) write(b);
  for (const TestTensor& t : hf) {
    std::vector<uint64_t> ne(t.shape.rbegin(), t.shape.rend());
    std::string bytes = t.bytes;
    if (t.name.find("q_proj") != std::string::npos || t.name.find("k_proj") != std::string::npos) {
      bytes = PermuteRows(bytes, t.shape[0], kHeadDim);
    }
    b.Tensor(GgufName(t.name), GgmlType(t.dtype), ne, bytes);
  }
  return b;
}

class GgufModelTest : public ::testing::Test {
 protected:
  absl::StatusOr<LoadedModel> LoadGguf(const GgufBuilder& b) {
    WriteBytes(path_, b.Build());
    return LoadModel(path_);
  }
  ScratchDir dir_;
  const std::string path_ = dir_.File("tiny.gguf");
};

// Every view of `a` holds the same dtype, shape and bytes as the same view of `b`.
void ExpectSameWeights(const ModelWeights& a, const ModelWeights& b) {
  auto same = [](const TensorView& x, const TensorView& y, const std::string& what) {
    SCOPED_TRACE(what);
    ASSERT_EQ(x.empty(), y.empty());
    if (x.empty()) return;
    EXPECT_EQ(x.dtype, y.dtype);
    ASSERT_EQ(x.ShapeString(), y.ShapeString());
    EXPECT_EQ(std::memcmp(x.data, y.data, x.bytes()), 0);
  };
  same(a.embed_tokens, b.embed_tokens, "embed_tokens");
  same(a.norm, b.norm, "norm");
  same(a.lm_head, b.lm_head, "lm_head");
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const LayerWeights &x = a.layers[l], &y = b.layers[l];
    const std::string p = absl::StrCat("layer ", l, " ");
    EXPECT_EQ(x.routed, y.routed);
    same(x.input_layernorm, y.input_layernorm, p + "input_layernorm");
    same(x.q_proj, y.q_proj, p + "q_proj");
    same(x.k_proj, y.k_proj, p + "k_proj");
    same(x.v_proj, y.v_proj, p + "v_proj");
    same(x.o_proj, y.o_proj, p + "o_proj");
    same(x.post_attention_layernorm, y.post_attention_layernorm, p + "post_attention_layernorm");
    same(x.gate_proj, y.gate_proj, p + "gate_proj");
    same(x.up_proj, y.up_proj, p + "up_proj");
    same(x.down_proj, y.down_proj, p + "down_proj");
    same(x.router_weight, y.router_weight, p + "router_weight");
    same(x.router_bias, y.router_bias, p + "router_bias");
    same(x.predictor_hidden_weight, y.predictor_hidden_weight, p + "predictor_hidden_weight");
    same(x.predictor_hidden_bias, y.predictor_hidden_bias, p + "predictor_hidden_bias");
    same(x.predictor_out_weight, y.predictor_out_weight, p + "predictor_out_weight");
    same(x.predictor_out_bias, y.predictor_out_bias, p + "predictor_out_bias");
  }
}

void ExpectSameConfig(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.d_model, b.d_model);
  EXPECT_EQ(a.d_ff, b.d_ff);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.max_seq_len, b.max_seq_len);
  EXPECT_FLOAT_EQ(static_cast<float>(a.rms_norm_eps), static_cast<float>(b.rms_norm_eps));
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  ASSERT_EQ(a.mod.has_value(), b.mod.has_value());
  if (!a.mod) return;
  const ModConfig &x = *a.mod, &y = *b.mod;
  EXPECT_EQ(x.routed_layers, y.routed_layers);
  EXPECT_EQ(x.capacity, y.capacity);
  EXPECT_EQ(x.capacities, y.capacities);
  EXPECT_EQ(x.layer_thresholds, y.layer_thresholds);
  EXPECT_EQ(x.router.bias, y.router.bias);
  EXPECT_EQ(x.router.input, y.router.input);
  EXPECT_EQ(x.weight_fn, y.weight_fn);
  EXPECT_EQ(x.scale_target, y.scale_target);
  EXPECT_EQ(x.inference_routing, y.inference_routing);
  EXPECT_EQ(x.threshold, y.threshold);
  ASSERT_EQ(x.predictor.has_value(), y.predictor.has_value());
  if (!x.predictor) return;
  EXPECT_EQ(x.predictor->type, y.predictor->type);
  EXPECT_EQ(x.predictor->hidden_size, y.predictor->hidden_size);
  EXPECT_EQ(x.predictor->activation, y.predictor->activation);
  EXPECT_EQ(x.predictor->bias, y.predictor->bias);
}

TEST_F(GgufModelTest, GgufAndSafetensorsTwinsBindTheSameWeights) {
  for (const Spec s : {Spec{true, false}, Spec{false, false}, Spec{false, true}, Spec{true, true}}) {
    SCOPED_TRACE(absl::StrCat("mod ", s.mod, " tie ", s.tie));
    const std::vector<TestTensor> hf = HfTensors(s);
    ScratchDir hf_dir;
    WriteBytes(hf_dir.File("config.json"), HfConfig(s));
    WriteSafetensors(hf_dir.File("model.safetensors"), hf);
    absl::StatusOr<LoadedModel> expected = LoadModel(hf_dir.path());
    ASSERT_THAT(expected, IsOk());
    absl::StatusOr<LoadedModel> got = LoadGguf(GgufModelBuilder(hf, DefaultMetadata(s)));
    ASSERT_THAT(got, IsOk());
    ExpectSameConfig(got->config(), expected->config());
    ExpectSameWeights(got->weights(), expected->weights());
    // Q and K are served from un-permuted copies; the rest straight from the mapping.
    EXPECT_TRUE(got->checkpoint().Find("blk.1.attn_q.weight")->copied);
    EXPECT_TRUE(got->checkpoint().Find("blk.1.attn_k.weight")->copied);
    EXPECT_FALSE(got->checkpoint().Find("blk.1.attn_v.weight")->copied);
    EXPECT_EQ(got->config().tie_word_embeddings, s.tie);
  }
}

TEST(GgufRowTest, MatchesLlamaCppPermutation) {
  // head_dim 6: GGUF rows 0..5 of a head hold HF rows 0, 3, 1, 4, 2, 5.
  std::vector<int64_t> gguf_of_hf;
  for (int64_t r = 0; r < 12; ++r) gguf_of_hf.push_back(GgufRowOfHfRow(r, 6));
  EXPECT_THAT(gguf_of_hf, ElementsAre(0, 2, 4, 1, 3, 5, 6, 8, 10, 7, 9, 11));
}

TEST_F(GgufModelTest, EndOfTurnJoinsTheStopTokensAndTheVocabularyMayComeFromTheTokens) {
  Meta meta = With(LlamaMetadata(), "llama.vocab_size", nullptr);
  meta = With(meta, "llama.rope.freq_base", nullptr);
  meta = With(meta, "tokenizer.ggml.bos_token_id", nullptr);
  meta = With(meta, "tokenizer.ggml.tokens", [](GgufBuilder& b) {
    b.KvStringArray("tokenizer.ggml.tokens", std::vector<std::string>(kVocab, "x"));
  });
  meta = With(meta, "tokenizer.ggml.eot_token_id",
              [](GgufBuilder& b) { b.KvU32("tokenizer.ggml.eot_token_id", 5); });
  WriteBytes(path_, GgufModelBuilder({}, meta).Build());
  absl::StatusOr<GgufFile> f = GgufFile::Open(path_);
  ASSERT_THAT(f, IsOk());
  absl::StatusOr<ModelConfig> c = ConfigFromGguf(*f);
  ASSERT_THAT(c, IsOk());
  EXPECT_EQ(c->vocab_size, kVocab);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(2, 5));
  EXPECT_EQ(c->rope_theta, 10000.0);  // llama.cpp's default when freq_base is absent
  EXPECT_FALSE(c->bos_token_id.has_value());
  EXPECT_TRUE(c->tie_word_embeddings);  // no output.weight
  EXPECT_FALSE(c->mod.has_value());
}

// ---- bad metadata: InvalidArgument naming the key ----

class GgufConfigErrorTest : public GgufModelTest {
 protected:
  absl::StatusOr<LoadedModel> LoadWith(const std::string& key,
                                       std::function<void(GgufBuilder&)> write) {
    const Spec s;
    return LoadGguf(GgufModelBuilder(HfTensors(s), With(DefaultMetadata(s), key, write)));
  }
};

TEST_F(GgufConfigErrorTest, UnknownArchitecture) {
  EXPECT_THAT(LoadWith("general.architecture",
                       [](GgufBuilder& b) { b.KvString("general.architecture", "qwen2"); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "architecture \"qwen2\" (metadata key 'general.architecture') is not "
                       "supported"));
  EXPECT_THAT(LoadWith("general.architecture", nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "metadata key 'general.architecture' is missing"));
}

TEST_F(GgufConfigErrorTest, MissingOrMistypedLlamaKeys) {
  for (const char* key : {"llama.block_count", "llama.embedding_length",
                          "llama.feed_forward_length", "llama.attention.head_count",
                          "llama.attention.layer_norm_rms_epsilon", "llama.context_length"}) {
    EXPECT_THAT(LoadWith(key, nullptr),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         absl::StrCat("missing required metadata key '", key, "'")));
  }
  EXPECT_THAT(LoadWith("llama.block_count",
                       [](GgufBuilder& b) { b.KvString("llama.block_count", "three"); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "metadata key 'llama.block_count' has type STRING, expected an integer"));
  EXPECT_THAT(LoadWith("llama.attention.head_count_kv",
                       [](GgufBuilder& b) { b.KvU32("llama.attention.head_count_kv", 3); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "GGUF metadata: 'llama.attention.head_count_kv' must divide"));
  EXPECT_THAT(LoadWith("llama.rope.freq_base",
                       [](GgufBuilder& b) { b.KvF32("llama.rope.freq_base", -1.0f); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'llama.rope.freq_base' must be > 0"));
  EXPECT_THAT(LoadWith("tokenizer.ggml.eos_token_id",
                       [](GgufBuilder& b) { b.KvU32("tokenizer.ggml.eos_token_id", 16); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'tokenizer.ggml.eos_token_id' 16 is outside the vocabulary [0, 16)"));
  EXPECT_THAT(LoadWith("llama.vocab_size", nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "no vocabulary size"));
}

TEST_F(GgufConfigErrorTest, FeaturesTheEngineDoesNotRun) {
  EXPECT_THAT(LoadWith("llama.rope.scaling.type",
                       [](GgufBuilder& b) { b.KvString("llama.rope.scaling.type", "yarn"); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'llama.rope.scaling.type' = \"yarn\": RoPE scaling is not supported"));
  EXPECT_THAT(LoadWith("llama.rope.scaling.type",
                       [](GgufBuilder& b) { b.KvString("llama.rope.scaling.type", "none"); }),
              IsOk());
  EXPECT_THAT(LoadWith("llama.rope.dimension_count",
                       [](GgufBuilder& b) { b.KvU32("llama.rope.dimension_count", 4); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'llama.rope.dimension_count' = 4 differs from the head dimension 6"));
  EXPECT_THAT(LoadWith("llama.expert_count",
                       [](GgufBuilder& b) { b.KvU32("llama.expert_count", 8); }),
              StatusIs(absl::StatusCode::kInvalidArgument, "'llama.expert_count' = 8"));
}

TEST_F(GgufConfigErrorTest, ModKeysFollowConfigJsonRules) {
  EXPECT_THAT(LoadWith("modserve.mod.experts",
                       [](GgufBuilder& b) { b.KvU32("modserve.mod.experts", 8); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "unknown metadata key 'modserve.mod.experts'"));
  EXPECT_THAT(LoadWith("modserve.version", [](GgufBuilder& b) { b.KvU32("modserve.version", 2); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "unknown metadata key 'modserve.version'"));
  EXPECT_THAT(LoadWith("modserve.mod.weight_fn",
                       [](GgufBuilder& b) { b.KvString("modserve.mod.weight_fn", "tanh"); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'modserve.mod.weight_fn' has unknown value \"tanh\""));
  EXPECT_THAT(LoadWith("modserve.mod.format_version",
                       [](GgufBuilder& b) { b.KvU32("modserve.mod.format_version", 2); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'modserve.mod.format_version' must be 1"));
  EXPECT_THAT(LoadWith("modserve.mod.format_version", nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "missing required key 'modserve.mod.format_version'"));
  EXPECT_THAT(LoadWith("modserve.mod.routed_layers",
                       [](GgufBuilder& b) {
                         b.KvI32Array("modserve.mod.routed_layers", {0, 3});
                       }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'modserve.mod.routed_layers' has layer 3, outside [0, 3)"));
  EXPECT_THAT(LoadWith("modserve.mod.routed_layers",
                       [](GgufBuilder& b) { b.KvU32("modserve.mod.routed_layers", 0); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'modserve.mod.routed_layers' has type UINT32, expected an ARRAY"));
  EXPECT_THAT(LoadWith("modserve.mod.threshold",
                       [](GgufBuilder& b) { b.KvF64("modserve.mod.threshold", 1.0); }),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'modserve.mod.threshold' must be in (0, 1)"));
  EXPECT_THAT(LoadWith("modserve.mod.predictor.hidden_size", nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'modserve.mod.predictor.hidden_size'"));
  // The predictor object exists exactly when one of its keys does.
  Meta no_predictor = DefaultMetadata(Spec{});
  for (const char* k : {"modserve.mod.predictor.type", "modserve.mod.predictor.hidden_size",
                        "modserve.mod.predictor.activation", "modserve.mod.predictor.bias"}) {
    no_predictor = With(no_predictor, k, nullptr);
  }
  EXPECT_THAT(LoadGguf(GgufModelBuilder(HfTensors(Spec{}), no_predictor)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "'modserve.mod.inference_routing' is \"predictor_threshold\" but "
                       "'modserve.mod.predictor.type' is missing"));
}

// ---- bad tensors ----

TEST_F(GgufModelTest, UnsupportedTensorTypeNamesTheTensorAndTheType) {
  const Spec s;
  GgufBuilder b;
  for (const auto& [key, write] : DefaultMetadata(s)) write(b);
  for (const TestTensor& t : HfTensors(s)) {
    std::vector<uint64_t> ne(t.shape.rbegin(), t.shape.rend());
    if (t.name == "model.layers.1.mlp.up_proj.weight") {
      // IQ4_NL: 32-element blocks of 18 bytes; pad the row to one block.
      b.Tensor(GgufName(t.name), mt::kIQ4_NL, {32, ne[1]}, std::string(18 * ne[1], '\0'));
    } else {
      b.Tensor(GgufName(t.name), GgmlType(t.dtype), ne, t.bytes);
    }
  }
  EXPECT_THAT(LoadGguf(b), StatusIs(absl::StatusCode::kInvalidArgument,
                                    "tensor 'blk.1.ffn_up.weight' has type IQ4_NL, which "
                                    "modserve does not run"));
}

TEST_F(GgufModelTest, MissingWrongAndExtraTensorsUseGgufNames) {
  const Spec s;
  std::vector<TestTensor> hf = HfTensors(s);
  std::vector<TestTensor> missing = hf;
  std::erase_if(missing, [](const TestTensor& t) {
    return t.name == "model.layers.2.mlp.down_proj.weight";
  });
  EXPECT_THAT(LoadGguf(GgufModelBuilder(missing, DefaultMetadata(s))),
              StatusIs(absl::StatusCode::kDataLoss,
                       "missing tensor 'blk.2.ffn_down.weight' (expected shape [8, 12])"));
  std::vector<TestTensor> router_gone = hf;
  std::erase_if(router_gone,
                [](const TestTensor& t) { return t.name == "model.layers.2.router.weight"; });
  EXPECT_THAT(LoadGguf(GgufModelBuilder(router_gone, DefaultMetadata(s))),
              StatusIs(absl::StatusCode::kDataLoss, "missing tensor 'blk.2.mod_router.weight'"));
  std::vector<TestTensor> wrong = hf;
  for (TestTensor& t : wrong) {
    if (t.name == "model.layers.0.mlp.up_proj.weight") t.shape = {kD, kFf};
  }
  EXPECT_THAT(LoadGguf(GgufModelBuilder(wrong, DefaultMetadata(s))),
              StatusIs(absl::StatusCode::kDataLoss,
                       "tiny.gguf: tensor 'blk.0.ffn_up.weight' has shape [8, 12], expected "
                       "[12, 8]"));
  std::vector<TestTensor> extra = hf;
  extra.push_back(F32Tensor("model.layers.1.router.weight", {1, kD}, RandomValues(kD, 1)));
  EXPECT_THAT(LoadGguf(GgufModelBuilder(extra, DefaultMetadata(s))),
              StatusIs(absl::StatusCode::kDataLoss, "unexpected tensor 'blk.1.mod_router.weight'"));
}

TEST_F(GgufModelTest, NanRouterNamesTheTensor) {
  const Spec s;
  std::vector<TestTensor> hf = HfTensors(s);
  for (TestTensor& t : hf) {
    if (t.name == "model.layers.2.router.weight") {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(t.bytes.data() + 4, &nan, 4);
    }
  }
  EXPECT_THAT(LoadGguf(GgufModelBuilder(hf, DefaultMetadata(s))),
              StatusIs(absl::StatusCode::kDataLoss,
                       path_ + ": tensor 'blk.2.mod_router.weight' has a non-finite value (nan) "
                       "at element 1"));
}

// A norm's weights are read in full at load (d values): a NaN there would make every logit NaN.
TEST_F(GgufModelTest, NanNormNamesTheTensor) {
  const Spec s;
  std::vector<TestTensor> hf = HfTensors(s);
  for (TestTensor& t : hf) {
    if (t.name == "model.layers.1.post_attention_layernorm.weight") {
      const uint16_t nan = 0x7e00;  // F16
      std::memcpy(t.bytes.data() + 2 * 3, &nan, 2);
    }
  }
  EXPECT_THAT(LoadGguf(GgufModelBuilder(hf, DefaultMetadata(s))),
              StatusIs(absl::StatusCode::kDataLoss,
                       path_ + ": tensor 'blk.1.ffn_norm.weight' has a non-finite value (nan) at "
                               "element 3 of 8"));
}

TEST_F(GgufModelTest, HugeLayerCountIsRefusedBeforeAnythingIsSized) {
  const Spec s{false, false};
  Meta meta = With(DefaultMetadata(s), "llama.block_count",
                   [](GgufBuilder& b) { b.KvU32("llama.block_count", 2147483647); });
  EXPECT_THAT(LoadGguf(GgufModelBuilder(HfTensors(s), meta)),
              StatusIs(absl::StatusCode::kDataLoss,
                       "the GGUF metadata (llama.block_count) has 2147483647 layers"));
}

TEST_F(GgufModelTest, LoadModelTellsFilesFromDirectories) {
  EXPECT_THAT(LoadModel(dir_.File("absent.gguf")),
              StatusIs(absl::StatusCode::kNotFound, "absent.gguf: no such file"));
  EXPECT_THAT(LoadModel(dir_.path()), StatusIs(absl::StatusCode::kNotFound, "config.json"));
  WriteBytes(dir_.File("model.safetensors"), std::string(64, '{'));
  EXPECT_THAT(LoadModel(dir_.File("model.safetensors")),
              StatusIs(absl::StatusCode::kDataLoss, "not a GGUF file"));
  std::filesystem::create_directory(dir_.File("dir.gguf"));
  EXPECT_THAT(LoadModel(dir_.File("dir.gguf")),
              StatusIs(absl::StatusCode::kDataLoss, "dir.gguf: not a regular file"));
}

// The real model: its config is SmolLM2-135M-Instruct's published one (30 layers, d_model 576,
// 9 / 3 heads, d_ff 1536, vocab 49152, rope theta 1e5, tied embeddings, context 8192), and its
// tensors bind in the file's types (Q4_1 matrices, a Q8_0 embedding, F32 norms).
TEST(GgufRealModelTest, SmolLm2Binds) {
  MODSERVE_REQUIRE_SMOLLM2(path);
  absl::StatusOr<LoadedModel> m = LoadModel(path);
  ASSERT_THAT(m, IsOk());
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.n_layers, 30);
  EXPECT_EQ(c.d_model, 576);
  EXPECT_EQ(c.n_heads, 9);
  EXPECT_EQ(c.n_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.d_ff, 1536);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.max_seq_len, 8192);
  EXPECT_EQ(c.rope_theta, 100000.0);
  EXPECT_FLOAT_EQ(static_cast<float>(c.rms_norm_eps), 1e-5f);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(2));
  EXPECT_FALSE(c.mod.has_value());
  const ModelWeights& w = m->weights();
  EXPECT_EQ(w.embed_tokens.dtype, DType::kQ8_0);
  EXPECT_EQ(w.embed_tokens.ShapeString(), "[49152, 576]");
  EXPECT_EQ(w.lm_head.data, w.embed_tokens.data);
  EXPECT_EQ(w.norm.dtype, DType::kF32);
  for (const LayerWeights& l : w.layers) {
    EXPECT_EQ(l.q_proj.dtype, DType::kQ4_1);
    EXPECT_EQ(l.q_proj.ShapeString(), "[576, 576]");
    EXPECT_EQ(l.k_proj.ShapeString(), "[192, 576]");
    EXPECT_EQ(l.down_proj.ShapeString(), "[576, 1536]");
    EXPECT_EQ(l.input_layernorm.dtype, DType::kF32);
  }
  // Q and K were un-permuted into copies: 30 * (576 + 192) rows of 576 / 32 Q4_1 blocks.
  uint64_t copied = 0;
  for (const std::string& name : m->checkpoint().Names()) {
    if (m->checkpoint().Find(name)->copied) copied += m->checkpoint().Find(name)->bytes;
  }
  EXPECT_EQ(copied, uint64_t{30} * (576 + 192) * (576 / 32) * 20);
}

// A NaN or an infinity among a quantized tensor's block factors is refused at load, naming the
// tensor, its type, the factor and the block. Without the scan the file loads, and every request
// fails at its first token ("logit of token 0 is nan"). The real model's file, one f16 changed.
TEST(GgufRealModelTest, NonFiniteBlockFactorNamesTheTensorAndTheBlock) {
  MODSERVE_REQUIRE_SMOLLM2(path);
  absl::StatusOr<LoadedModel> m = LoadModel(path);
  ASSERT_THAT(m, IsOk());
  const TensorInfo* up = m->checkpoint().Find("blk.3.ffn_up.weight");  // Q4_1, [1536, 576]
  const TensorInfo* embd = m->checkpoint().Find("token_embd.weight");  // Q8_0, [49152, 576]
  ASSERT_NE(up, nullptr);
  ASSERT_NE(embd, nullptr);
  ASSERT_EQ(up->dtype, DType::kQ4_1);
  ASSERT_EQ(embd->dtype, DType::kQ8_0);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_EQ(bytes.size(), std::filesystem::file_size(path));
  ScratchDir dir;
  const std::string bad = dir.File("bad.gguf");
  // Block 100's m (bytes 2-3 of a 20-byte Q4_1 block) set to an f16 NaN.
  std::string nan_m = bytes;
  nan_m[up->file_offset + 100 * 20 + 2] = '\x00';
  nan_m[up->file_offset + 100 * 20 + 3] = '\x7e';
  WriteBytes(bad, nan_m);
  EXPECT_THAT(LoadModel(bad),
              StatusIs(absl::StatusCode::kDataLoss,
                       bad + ": tensor 'blk.3.ffn_up.weight' (Q4_1) has a non-finite minimum m "
                             "(nan) in block 100 of 27648 (elements 3200 to 3231)"));
  // Block 7's d (bytes 0-1 of a 34-byte Q8_0 block) set to +infinity.
  std::string inf_d = bytes;
  inf_d[embd->file_offset + 7 * 34] = '\x00';
  inf_d[embd->file_offset + 7 * 34 + 1] = '\x7c';
  WriteBytes(bad, inf_d);
  EXPECT_THAT(LoadModel(bad),
              StatusIs(absl::StatusCode::kDataLoss,
                       bad + ": tensor 'token_embd.weight' (Q8_0) has a non-finite scale d (inf) "
                             "in block 7 of 884736 (elements 224 to 255)"));
}

}  // namespace
}  // namespace modserve::engine
