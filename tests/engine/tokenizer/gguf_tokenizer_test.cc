// LoadTokenizerFromGguf against llama.cpp's own tokenizer: goldens recorded by
// tests/testdata/tokenizer/gguf/make_goldens.py from llama.cpp on the same metadata (every
// supported pre-tokenizer over a small BPE vocabulary, SentencePiece-style variants, and the real
// SmolLM2 file), plus clear errors for missing or malformed tokenizer metadata.
#include "engine/tokenizer/gguf_tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/gguf.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/common/real_model.h"
#include "tests/engine/model/gguf_test_util.h"

namespace modserve::engine {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;
using testing::GgufBuilder;

const std::string kDir = std::string(MODSERVE_SOURCE_DIR) + "/tests/testdata/tokenizer/gguf";

const Json& LoadJson(const std::string& name) {
  static auto* cache = new std::map<std::string, Json>();
  auto it = cache->find(name);
  if (it == cache->end()) {
    std::ifstream in(kDir + "/" + name);
    std::stringstream s;
    s << in.rdbuf();
    it = cache->emplace(name, Json::parse(s.str(), nullptr, /*allow_exceptions=*/false)).first;
  }
  return it->second;
}

// `name`.gguf under the test temp dir, prefixed with the running test's name: ctest runs the
// tests of this file as processes side by side, and two writing one path raced.
std::string TempGguf(const std::string& name) {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string test =
      info == nullptr ? "" : absl::StrCat(info->test_suite_name(), ".", info->name(), "_");
  std::replace(test.begin(), test.end(), '/', '_');
  return absl::StrCat(::testing::TempDir(), "/", test, name, ".gguf");
}

// Writes `contents` to a fresh file under the test temp dir, opens it and removes the name (the
// open file's mapping stays valid), so that no run leaves files behind.
absl::StatusOr<GgufFile> WriteAndOpen(const std::string& name, const std::string& contents) {
  const std::string path = TempGguf(name);
  std::ofstream(path, std::ios::binary) << contents;
  absl::StatusOr<GgufFile> file = GgufFile::Open(path);
  std::filesystem::remove(path);
  return file;
}

// The vocabulary of `vocab_name` as the golden script writes it, then `keys` in order.
GgufBuilder VocabGguf(const std::string& vocab_name, const Json& keys) {
  const Json& v = LoadJson("vocab_" + vocab_name + ".json");
  GgufBuilder b;
  b.KvString("general.architecture", "llama");
  b.KvString("tokenizer.ggml.model", v["model"].get<std::string>());
  b.KvStringArray("tokenizer.ggml.tokens", v["tokens"].get<std::vector<std::string>>());
  b.KvI32Array("tokenizer.ggml.token_type", v["token_type"].get<std::vector<int32_t>>());
  if (v.contains("merges")) {
    b.KvStringArray("tokenizer.ggml.merges", v["merges"].get<std::vector<std::string>>());
  }
  if (v.contains("scores")) {
    b.KvF32Array("tokenizer.ggml.scores", v["scores"].get<std::vector<float>>());
  }
  for (const Json& k : keys) {
    const std::string key = k[0].get<std::string>();
    const std::string kind = k[1].get<std::string>();
    if (kind == "string") b.KvString(key, k[2].get<std::string>());
    if (kind == "u32") b.KvU32(key, k[2].get<uint32_t>());
    if (kind == "bool") b.KvBool(key, k[2].get<bool>());
  }
  return b;
}

// Compares everything a golden record holds with `tok`; `texts` are the record's texts.
void ExpectMatchesLlamaCpp(const Tokenizer& tok, const Json& golden,
                           const std::vector<std::string>& texts, const Json& streams) {
  EXPECT_EQ(tok.vocab_size(), golden["vocab_size"].get<int>());
  const int bos = golden["bos_id"].get<int>();
  const int eos = golden["eos_id"].get<int>();
  EXPECT_EQ(tok.bos_id().value_or(-1), bos);
  EXPECT_EQ(tok.eos_id().value_or(-1), eos);
  const auto special = golden["special_ids"].get<std::vector<int32_t>>();
  const std::set<int32_t> special_set(special.begin(), special.end());
  int special_mismatches = 0;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.IsSpecial(id) != special_set.contains(id) && ++special_mismatches <= 5) {
      ADD_FAILURE() << "IsSpecial(" << id << ") is " << tok.IsSpecial(id) << " for '"
                    << *tok.IdToToken(id) << "'";
    }
  }
  for (const char* field : {"ids", "ids_special"}) {
    // "ids_special" covers the first texts only (BOS and EOS change nothing but the ends).
    const bool add_special = std::string(field) == "ids_special";
    const auto expected = golden[field].get<std::vector<std::vector<int32_t>>>();
    ASSERT_LE(expected.size(), texts.size());
    ASSERT_FALSE(expected.empty());
    int mismatches = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(texts[i], add_special);
      ASSERT_TRUE(ids.ok()) << ids.status();
      if (*ids != expected[i] && ++mismatches <= 3) {
        ADD_FAILURE() << "text #" << i << " (add_special " << add_special << "): '"
                      << texts[i].substr(0, 160) << "'\n  got      "
                      << ::testing::PrintToString(*ids) << "\n  llama.cpp "
                      << ::testing::PrintToString(expected[i]);
      }
    }
    EXPECT_EQ(mismatches, 0) << field << ": of " << expected.size() << " texts";
  }
  const auto ids = streams.get<std::vector<std::vector<int32_t>>>();
  for (const char* field : {"decodes", "decodes_skip_special"}) {
    const bool skip = std::string(field) == "decodes_skip_special";
    const auto expected = golden[field].get<std::vector<std::string>>();
    ASSERT_EQ(expected.size(), ids.size());
    int mismatches = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      absl::StatusOr<std::string> text = tok.Decode(ids[i], skip);
      ASSERT_TRUE(text.ok()) << text.status();
      if (*text != expected[i] && ++mismatches <= 3) {
        ADD_FAILURE() << "stream #" << i << " " << ::testing::PrintToString(ids[i])
                      << " (skip_special " << skip << ")\n  got      '" << *text
                      << "'\n  llama.cpp '" << expected[i] << "'";
      }
    }
    EXPECT_EQ(mismatches, 0) << field << ": of " << ids.size() << " streams";
  }
}

std::vector<std::string> CaseNames() {
  std::vector<std::string> names;
  const Json& g = LoadJson("goldens.json");
  if (g.is_discarded() || !g.contains("cases")) return {"missing_goldens"};
  for (const Json& c : g["cases"]) names.push_back(c["name"].get<std::string>());
  return names;
}

class GgufTokenizerGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufTokenizerGoldenTest, MatchesLlamaCpp) {
  const Json& g = LoadJson("goldens.json");
  ASSERT_FALSE(g.is_discarded()) << kDir << "/goldens.json does not parse";
  const Json* golden = nullptr;
  for (const Json& c : g["cases"]) {
    if (c["name"] == GetParam()) golden = &c;
  }
  ASSERT_NE(golden, nullptr);
  const std::string vocab = (*golden)["vocab"].get<std::string>();
  absl::StatusOr<GgufFile> file =
      WriteAndOpen(GetParam(), VocabGguf(vocab, (*golden)["keys"]).Build());
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadTokenizerFromGguf(*file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::vector<std::string> texts;
  for (const Json& i : (*golden)["texts"]) texts.push_back(g["texts"][i.get<size_t>()]);
  ExpectMatchesLlamaCpp(**tok, *golden, texts, g["streams"][vocab]);
  EXPECT_EQ((*tok)->chat_template(), "{{ messages }}");
}

INSTANTIATE_TEST_SUITE_P(Cases, GgufTokenizerGoldenTest, ::testing::ValuesIn(CaseNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = 'X';
                           }
                           return name;
                         });

TEST(GgufTokenizerTest, EverySupportedPreTokenizerLoads) {
  // The goldens cover one name per group; every other name must at least load.
  for (std::string_view pre : SupportedGgufPreTokenizers()) {
    Json keys = Json::array({Json::array({"tokenizer.ggml.pre", "string", std::string(pre)}),
                             Json::array({"tokenizer.ggml.bos_token_id", "u32", 1}),
                             Json::array({"tokenizer.ggml.eos_token_id", "u32", 2})});
    absl::StatusOr<GgufFile> file = WriteAndOpen("pre", VocabGguf("bpe", keys).Build());
    ASSERT_TRUE(file.ok()) << file.status();
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadTokenizerFromGguf(*file);
    ASSERT_TRUE(tok.ok()) << pre << ": " << tok.status();
    absl::StatusOr<std::vector<int32_t>> ids = (*tok)->Encode("Hello world 123", false);
    ASSERT_TRUE(ids.ok()) << pre;
    EXPECT_FALSE(ids->empty()) << pre;
  }
}

TEST(GgufTokenizerTest, SmolLm2MatchesLlamaCpp) {
  MODSERVE_REQUIRE_SMOLLM2(path);
  const Json& g = LoadJson("smollm2.json");
  ASSERT_FALSE(g.is_discarded());
  // Through LoadTokenizer, as the engine loads it.
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadTokenizer(path);
  ASSERT_TRUE(tok.ok()) << tok.status();
  ExpectMatchesLlamaCpp(**tok, g, g["texts"].get<std::vector<std::string>>(), g["streams"]);
  EXPECT_THAT((*tok)->chat_template(), HasSubstr("<|im_start|>"));
  // The model's own reference point: the prompt of its greedy example.
  absl::StatusOr<std::vector<int32_t>> ids = (*tok)->Encode("The capital of France is", true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ((*tok)->Decode(*ids, false).value_or(""), "The capital of France is");
}

// ---- bad metadata: a clear error naming the key ----

// A minimal valid "gpt2" tokenizer, with `skip` left out and `extra` appended.
GgufBuilder TinyBpe(const std::string& skip = "", bool with_merges = true) {
  GgufBuilder b;
  if (skip != "tokenizer.ggml.model") b.KvString("tokenizer.ggml.model", "gpt2");
  if (skip != "tokenizer.ggml.tokens") b.KvStringArray("tokenizer.ggml.tokens", {"a", "b", "ab"});
  if (skip != "tokenizer.ggml.token_type") b.KvI32Array("tokenizer.ggml.token_type", {1, 1, 1});
  if (with_merges) b.KvStringArray("tokenizer.ggml.merges", {"a b"});
  return b;
}

absl::Status LoadStatus(const GgufBuilder& b, const std::string& name) {
  absl::StatusOr<GgufFile> file = WriteAndOpen(name, b.Build());
  if (!file.ok()) return file.status();
  return LoadTokenizerFromGguf(*file).status();
}

TEST(GgufTokenizerTest, TinyVocabularyLoadsAndMerges) {
  absl::StatusOr<GgufFile> file = WriteAndOpen("tiny", TinyBpe().Build());
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadTokenizerFromGguf(*file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->Encode("abba", true).value(), (std::vector<int32_t>{2, 1, 0}));
  EXPECT_FALSE((*tok)->bos_id().has_value());
  EXPECT_EQ((*tok)->chat_template(), "");
}

TEST(GgufTokenizerTest, MissingKeysAreNamed) {
  // Without tokenizer.ggml.model the file has no tokenizer (the engine then runs without one).
  absl::Status s = LoadStatus(TinyBpe("tokenizer.ggml.model"), "no_model");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr("'tokenizer.ggml.model'"));
  GgufBuilder no_vocab;
  no_vocab.KvString("tokenizer.ggml.model", "no_vocab");
  s = LoadStatus(no_vocab, "no_vocab");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  // With it, a missing part is malformed metadata.
  s = LoadStatus(TinyBpe("tokenizer.ggml.tokens"), "no_tokens");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("'tokenizer.ggml.tokens'"));
  s = LoadStatus(TinyBpe("", /*with_merges=*/false), "no_merges");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("'tokenizer.ggml.merges'"));
}

TEST(GgufTokenizerTest, UnsupportedModelsAndPreTokenizersAreNamed) {
  GgufBuilder bert;
  bert.KvString("tokenizer.ggml.model", "bert");
  absl::Status s = LoadStatus(bert, "bert");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'bert'"));
  EXPECT_THAT(s.message(), HasSubstr("gpt2, llama"));

  s = LoadStatus(TinyBpe().KvString("tokenizer.ggml.pre", "no-such-pre"), "pre");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'no-such-pre'"));
  EXPECT_THAT(s.message(), HasSubstr("smollm"));  // the supported ones are listed
}

TEST(GgufTokenizerTest, MalformedValuesAreNamed) {
  struct Case {
    std::string name;
    GgufBuilder builder;
    std::string key;
  };
  std::vector<Case> cases;
  {
    GgufBuilder b;
    b.KvString("tokenizer.ggml.model", "gpt2").KvU32("tokenizer.ggml.tokens", 3);
    cases.push_back({"tokens_not_array", b, "tokenizer.ggml.tokens"});
  }
  {
    GgufBuilder b;
    b.KvString("tokenizer.ggml.model", "gpt2").KvStringArray("tokenizer.ggml.tokens", {});
    cases.push_back({"tokens_empty", b, "tokenizer.ggml.tokens"});
  }
  {
    GgufBuilder b;
    b.KvString("tokenizer.ggml.model", "gpt2")
        .KvStringArray("tokenizer.ggml.tokens", {"a", "b", "ab"})
        .KvI32Array("tokenizer.ggml.token_type", {1, 1});
    cases.push_back({"types_short", b, "tokenizer.ggml.token_type"});
  }
  {
    GgufBuilder b;
    b.KvString("tokenizer.ggml.model", "gpt2")
        .KvStringArray("tokenizer.ggml.tokens", {"a", "b", "ab"})
        .KvStringArray("tokenizer.ggml.token_type", {"x", "y", "z"});
    cases.push_back({"types_strings", b, "tokenizer.ggml.token_type"});
  }
  {
    GgufBuilder b = TinyBpe("", false);
    b.KvStringArray("tokenizer.ggml.merges", {"ab"});
    cases.push_back({"merge_no_space", b, "tokenizer.ggml.merges"});
  }
  cases.push_back({"bos_wrong_type", TinyBpe().KvString("tokenizer.ggml.bos_token_id", "1"),
                   "tokenizer.ggml.bos_token_id"});
  cases.push_back({"add_bos_wrong_type", TinyBpe().KvU32("tokenizer.ggml.add_bos_token", 1),
                   "tokenizer.ggml.add_bos_token"});
  cases.push_back({"add_bos_without_bos", TinyBpe().KvBool("tokenizer.ggml.add_bos_token", true),
                   "tokenizer.ggml.bos_token_id"});
  cases.push_back({"add_bos_bos_out_of_range",
                   TinyBpe()
                       .KvBool("tokenizer.ggml.add_bos_token", true)
                       .KvU32("tokenizer.ggml.bos_token_id", 3),
                   "tokenizer.ggml.bos_token_id"});
  cases.push_back({"add_eos_without_eos", TinyBpe().KvBool("tokenizer.ggml.add_eos_token", true),
                   "tokenizer.ggml.eos_token_id"});
  cases.push_back({"template_not_string", TinyBpe().KvU32("tokenizer.chat_template", 7),
                   "tokenizer.chat_template"});
  {
    GgufBuilder b;
    b.KvString("tokenizer.ggml.model", "llama")
        .KvStringArray("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"})
        .KvF32Array("tokenizer.ggml.scores", {0, 0, 0});
    cases.push_back({"scores_short", b, "tokenizer.ggml.scores"});
  }
  for (const Case& c : cases) {
    absl::Status s = LoadStatus(c.builder, c.name);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("'" + c.key + "'")) << c.name;
  }
}

TEST(GgufTokenizerTest, OutOfRangeSpecialIdsAreIgnored) {
  absl::StatusOr<GgufFile> file =
      WriteAndOpen("oor", TinyBpe()
                              .KvU32("tokenizer.ggml.bos_token_id", 99)
                              .KvU32("tokenizer.ggml.eos_token_id", 2)
                              .KvU32("tokenizer.ggml.padding_token_id", 1000)
                              .Build());
  ASSERT_TRUE(file.ok());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadTokenizerFromGguf(*file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_FALSE((*tok)->bos_id().has_value());
  EXPECT_EQ((*tok)->eos_id(), 2);
}

TEST(GgufTokenizerTest, LoadTokenizerTakesGgufFiles) {
  const std::string path = TempGguf("tiny");
  std::ofstream(path, std::ios::binary) << TinyBpe().Build();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadTokenizer(path);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 3);
  // A .gguf name that is no GGUF file is the reader's error, not "no tokenizer.json".
  const std::string bad = TempGguf("bad");
  std::ofstream(bad, std::ios::binary) << "not gguf";
  EXPECT_EQ(LoadTokenizer(bad).status().code(), absl::StatusCode::kDataLoss);
  std::filesystem::remove(path);
  std::filesystem::remove(bad);
}

TEST(GgufTokenizerTest, InvalidUtf8AndBadIdsAreRefused) {
  absl::StatusOr<GgufFile> file = WriteAndOpen("utf8", TinyBpe().Build());
  ASSERT_TRUE(file.ok());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadTokenizerFromGguf(*file);
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ((*tok)->Encode("a\xff", false).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*tok)->Decode(std::vector<int32_t>{0, 3}, false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*tok)->Decode(std::vector<int32_t>{-1}, false).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace modserve::engine
