// ExportGguf: every checked-in reference checkpoint (dense, tied, MoD with each predictor kind,
// sharded, odd head_dim) exported and loaded back gives the same config, and weights that equal
// quantize-then-dequantize of the source row at the same position (so names, shapes, the Q/K row
// order and the metadata all round-trip); F32 exports are exact. Fallback types, the tokenizer
// metadata and the refusals are checked too.
#include "tools/gguf_export.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/quant.h"
#include "engine/model/gguf.h"
#include "engine/model/weights.h"
#include "engine/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/engine/model/checkpoint_test_util.h"

namespace modserve::tools {
namespace {

using engine::GgufFile;
using engine::LoadedModel;
using engine::ModelConfig;
using engine::testing::IsOk;
using engine::testing::ScratchDir;
using engine::testing::StatusIs;
using ::testing::HasSubstr;

const std::string kCheckpoints = std::string(MODSERVE_SOURCE_DIR) + "/tests/testdata/checkpoints";

std::vector<std::string> ReferenceCheckpoints() {
  std::vector<std::string> dirs;
  for (const auto& e : std::filesystem::directory_iterator(kCheckpoints)) {
    if (e.is_directory()) dirs.push_back(e.path().string());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

std::vector<float> Row(const TensorView& v, int64_t r) {
  const int64_t row_len = v.shape[v.ndim - 1];
  std::vector<float> out(static_cast<size_t>(row_len));
  const uint8_t* base = static_cast<const uint8_t*>(v.data);
  quant::DequantizeRow(v.dtype, base + static_cast<size_t>(r) * DTypeRowBytes(v.dtype, row_len),
                       row_len, out.data());
  return out;
}

// What a row of `src` becomes when stored as `type`.
std::vector<float> RoundTrip(const std::vector<float>& row, DType type) {
  std::vector<uint8_t> blocks(DTypeRowBytes(type, static_cast<int64_t>(row.size())));
  EXPECT_THAT(quant::QuantizeRow(type, row.data(), static_cast<int64_t>(row.size()), blocks.data()),
              IsOk());
  std::vector<float> out(row.size());
  quant::DequantizeRow(type, blocks.data(), static_cast<int64_t>(row.size()), out.data());
  return out;
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
  // GGUF stores these two as FLOAT32, as llama.cpp reads them.
  EXPECT_EQ(static_cast<float>(a.rms_norm_eps), static_cast<float>(b.rms_norm_eps));
  EXPECT_EQ(static_cast<float>(a.rope_theta), static_cast<float>(b.rope_theta));
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);  // at most two in these checkpoints
  ASSERT_EQ(a.mod.has_value(), b.mod.has_value());
  if (!a.mod) return;
  EXPECT_EQ(a.mod->routed_layers, b.mod->routed_layers);
  EXPECT_EQ(a.mod->capacity, b.mod->capacity);
  EXPECT_EQ(a.mod->capacities, b.mod->capacities);
  EXPECT_EQ(a.mod->layer_thresholds, b.mod->layer_thresholds);
  EXPECT_EQ(a.mod->router.bias, b.mod->router.bias);
  EXPECT_EQ(a.mod->router.input, b.mod->router.input);
  EXPECT_EQ(a.mod->weight_fn, b.mod->weight_fn);
  EXPECT_EQ(a.mod->scale_target, b.mod->scale_target);
  EXPECT_EQ(a.mod->inference_routing, b.mod->inference_routing);
  EXPECT_EQ(a.mod->threshold, b.mod->threshold);
  ASSERT_EQ(a.mod->predictor.has_value(), b.mod->predictor.has_value());
  if (!a.mod->predictor) return;
  EXPECT_EQ(a.mod->predictor->type, b.mod->predictor->type);
  EXPECT_EQ(a.mod->predictor->hidden_size, b.mod->predictor->hidden_size);
  EXPECT_EQ(a.mod->predictor->activation, b.mod->predictor->activation);
  EXPECT_EQ(a.mod->predictor->bias, b.mod->predictor->bias);
}

// Exports `dir` as `type` and checks the loaded result against the source, row by row.
void CheckRoundTrip(const std::string& dir, DType type) {
  SCOPED_TRACE(absl::StrCat(dir, " as ", std::string(DTypeName(type))));
  ScratchDir out;
  ExportOptions opts;
  opts.model_dir = dir;
  opts.out_path = out.File("model.gguf");
  opts.weight_type = type;
  opts.allow_no_tokenizer = true;
  std::vector<std::string> log;
  ASSERT_THAT(ExportGguf(opts, [&](std::string_view l) { log.emplace_back(l); }), IsOk());
  if (!std::filesystem::exists(dir + "/tokenizer.json")) {
    // No tokenizer: llama.cpp's "no vocabulary" marker, so that llama.cpp loads the file too.
    absl::StatusOr<GgufFile> f = GgufFile::Open(opts.out_path);
    ASSERT_THAT(f, IsOk());
    EXPECT_EQ(f->GetString("tokenizer.ggml.model").value_or(""), "no_vocab");
  }
  absl::StatusOr<LoadedModel> src = engine::LoadModel(dir);
  ASSERT_THAT(src, IsOk());
  absl::StatusOr<LoadedModel> got = engine::LoadModel(opts.out_path);
  ASSERT_THAT(got, IsOk());
  ExpectSameConfig(src->config(), got->config());

  for (const engine::TensorNamePair& t : engine::TensorNameTable(src->config())) {
    SCOPED_TRACE(t.gguf_name);
    // A MoD adapter (adapter_per_layer_router) keeps its routers in its own file.
    const engine::Checkpoint& from =
        src->adapter() != nullptr && src->adapter()->Contains(t.hf_name) ? *src->adapter()
                                                                         : src->checkpoint();
    absl::StatusOr<TensorView> a = from.Get(t.hf_name);
    absl::StatusOr<TensorView> b = got->checkpoint().Get(t.gguf_name);
    ASSERT_THAT(a, IsOk());
    ASSERT_THAT(b, IsOk());
    ASSERT_EQ(a->ShapeString(), b->ShapeString());
    const bool matrix = t.shape.size() == 2 && t.gguf_name.find(".mod_") == std::string::npos;
    const int64_t row_len = t.shape.back();
    DType expected = matrix ? type : DType::kF32;
    if (row_len % DTypeBlockElems(expected) != 0) {
      expected = row_len % 32 == 0 && DTypeIsQuantized(expected) ? DType::kQ8_0 : DType::kF16;
      EXPECT_THAT(absl::StrJoin(log, "\n"),
                  HasSubstr(absl::StrCat(t.gguf_name, ": rows of ", row_len)));
    }
    EXPECT_EQ(b->dtype, expected);
    const int64_t rows = a->numel() / row_len;
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> want = RoundTrip(Row(*a, r), expected);
      ASSERT_EQ(Row(*b, r), want) << "row " << r;
    }
  }
}

TEST(GgufExportTest, EveryReferenceCheckpointRoundTripsExactlyAsF32) {
  const std::vector<std::string> dirs = ReferenceCheckpoints();
  ASSERT_GE(dirs.size(), 8u);
  for (const std::string& dir : dirs) CheckRoundTrip(dir, DType::kF32);
}

TEST(GgufExportTest, QuantizedExportsHoldTheQuantizedSourceRows) {
  for (const std::string& dir : ReferenceCheckpoints()) {
    for (DType t : {DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ4_0, DType::kQ4_1,
                    DType::kQ6_K, DType::kF16, DType::kBF16}) {
      CheckRoundTrip(dir, t);
    }
  }
}

TEST(GgufExportTest, DemoTokenizerBecomesLlamaCppMetadata) {
  const std::string demo = std::string(MODSERVE_SOURCE_DIR) + "/models/demo";
  ScratchDir out;
  ExportOptions opts;
  opts.model_dir = demo;
  opts.out_path = out.File("demo.gguf");
  ASSERT_THAT(ExportGguf(opts, [](std::string_view) {}), IsOk());
  absl::StatusOr<GgufFile> f = GgufFile::Open(opts.out_path);
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ(*f->GetString("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*f->GetString("tokenizer.ggml.pre"), "gpt-2");
  EXPECT_EQ(*f->GetU32("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(*f->GetU32("tokenizer.ggml.eos_token_id"), 2u);
  EXPECT_TRUE(*f->GetBool("tokenizer.ggml.add_bos_token"));

  // Against tokenizer.json itself: every id's piece, the merges in order, specials as control.
  std::ifstream in(demo + "/tokenizer.json");
  const nlohmann::json tok = nlohmann::json::parse(in);
  auto tokens = f->GetStringArray("tokenizer.ggml.tokens");
  ASSERT_THAT(tokens, IsOk());
  ASSERT_EQ(tokens->size(), 2048u);
  for (const auto& [piece, id] : tok["model"]["vocab"].items()) {
    EXPECT_EQ((*tokens)[id.get<size_t>()], piece);
  }
  auto types = f->GetI32Array("tokenizer.ggml.token_type");
  ASSERT_THAT(types, IsOk());
  for (const auto& a : tok["added_tokens"]) {
    EXPECT_EQ((*tokens)[a["id"].get<size_t>()], a["content"].get<std::string>());
    EXPECT_EQ((*types)[a["id"].get<size_t>()], 3);  // CONTROL
  }
  EXPECT_EQ((*types)[100], 1);  // NORMAL
  auto merges = f->GetStringArray("tokenizer.ggml.merges");
  ASSERT_THAT(merges, IsOk());
  ASSERT_EQ(merges->size(), tok["model"]["merges"].size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const auto& m = tok["model"]["merges"][i];
    EXPECT_EQ((*merges)[i], m[0].get<std::string>() + " " + m[1].get<std::string>());
  }
}

// The exported tokenizer metadata, read back by the engine's GGUF tokenizer, tokenizes as the
// tokenizer.json it came from: same ids (BOS added as the post-processor says), same text back.
TEST(GgufExportTest, DemoTokenizerEncodesLikeItsTokenizerJson) {
  const std::string demo = std::string(MODSERVE_SOURCE_DIR) + "/models/demo";
  ScratchDir out;
  ExportOptions opts;
  opts.model_dir = demo;
  opts.out_path = out.File("demo.gguf");
  ASSERT_THAT(ExportGguf(opts, [](std::string_view) {}), IsOk());
  absl::StatusOr<std::unique_ptr<engine::Tokenizer>> want = engine::LoadTokenizer(demo);
  absl::StatusOr<std::unique_ptr<engine::Tokenizer>> got = engine::LoadTokenizer(opts.out_path);
  ASSERT_THAT(want, IsOk());
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ((*got)->vocab_size(), (*want)->vocab_size());
  EXPECT_EQ((*got)->bos_id(), (*want)->bos_id());
  for (const char* text : {"The trouble with computers is", "Q: What is a computer?\nA:",
                           "  two  spaces, tabs\tand 1234567 digits; 'quotes' don't", "",
                           "caf\xc3\xa9 na\xc3\xafve \xe2\x80\x94 \xf0\x9f\x99\x82",
                           "<|eos|> a special token in text"}) {
    SCOPED_TRACE(text);
    for (bool special : {true, false}) {
      absl::StatusOr<std::vector<int32_t>> a = (*want)->Encode(text, special);
      absl::StatusOr<std::vector<int32_t>> b = (*got)->Encode(text, special);
      ASSERT_THAT(a, IsOk());
      ASSERT_THAT(b, IsOk());
      EXPECT_EQ(*b, *a);
      EXPECT_EQ(*(*got)->Decode(*b, true), *(*want)->Decode(*a, true));
    }
  }
}

// The rows of a tensor are quantized on several threads; the file must not depend on how many.
TEST(GgufExportTest, TheFileIsTheSameForEveryThreadCount) {
  const std::string demo = std::string(MODSERVE_SOURCE_DIR) + "/models/demo";
  ScratchDir out;
  for (DType type : {DType::kQ4_K, DType::kQ8_0}) {
    SCOPED_TRACE(std::string(DTypeName(type)));
    std::string first;
    for (int threads : {1, 2, 3, 7}) {
      ExportOptions opts;
      opts.model_dir = demo;
      opts.out_path = out.File(absl::StrCat("demo-", threads, ".gguf"));
      opts.weight_type = type;
      opts.num_threads = threads;
      ASSERT_THAT(ExportGguf(opts, [](std::string_view) {}), IsOk());
      std::ifstream in(opts.out_path, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      ASSERT_GT(bytes.size(), 1000u);
      if (threads == 1) {
        first = bytes;
      } else {
        EXPECT_TRUE(bytes == first) << threads << " threads";
      }
    }
  }
}

TEST(GgufExportTest, Refusals) {
  ScratchDir out;
  ExportOptions opts;
  opts.out_path = out.File("x.gguf");
  opts.model_dir = kCheckpoints + "/dense";
  EXPECT_THAT(ExportGguf(opts, [](std::string_view) {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "tokenizer.json: no such file"));
  EXPECT_FALSE(std::filesystem::exists(opts.out_path));
  opts.model_dir = out.File("absent");
  EXPECT_THAT(ExportGguf(opts, [](std::string_view) {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "not a checkpoint directory"));
  opts.model_dir = kCheckpoints + "/dense";
  opts.allow_no_tokenizer = true;
  opts.weight_type = DType::kI32;
  EXPECT_THAT(ExportGguf(opts, [](std::string_view) {}),
              StatusIs(absl::StatusCode::kInvalidArgument, "I32 is not a weight type"));
  EXPECT_EQ(ParseWeightType("q4_k"), DType::kQ4_K);
  EXPECT_EQ(ParseWeightType("Q8_0"), DType::kQ8_0);
  EXPECT_EQ(ParseWeightType("q5_k"), DType::kQ5_K);
  EXPECT_EQ(ParseWeightType("q3_k"), std::nullopt);
}

}  // namespace
}  // namespace modserve::tools
