// IncrementalDetokenizer property tests: on the golden corpus encodings and on seeded random id
// streams, for every tokenizer, the streamed pieces concatenate to the full Decode() and each
// piece is whole UTF-8. Plus the hold-back, flush, skip and error behaviours on byte tokens.
#include "engine/tokenizer/incremental_detokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/tokenizer/bpe_tokenizer.h"
#include "engine/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace modserve::engine {
namespace {

using Json = nlohmann::json;

const std::string kDataDir = std::string(MODSERVE_SOURCE_DIR) + "/tests/testdata/tokenizer";

Json ReadJson(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return Json::parse(s.str());
}

// Streams `ids` in chunks whose sizes `chunk` picks, checking every piece; returns the
// concatenation including Flush().
std::string Stream(IncrementalDetokenizer& detok, const std::vector<int32_t>& ids,
                   const std::function<size_t()>& chunk) {
  std::string out;
  size_t pos = 0;
  while (pos < ids.size()) {
    const size_t n = std::min(chunk(), ids.size() - pos);
    absl::StatusOr<std::string> piece = detok.Add(absl::MakeConstSpan(ids).subspan(pos, n));
    EXPECT_TRUE(piece.ok()) << piece.status();
    if (!piece.ok()) return out;
    EXPECT_TRUE(IsValidUtf8(*piece));
    out += *piece;
    pos += n;
  }
  absl::StatusOr<std::string> rest = detok.Flush();
  EXPECT_TRUE(rest.ok()) << rest.status();
  return out + rest.value_or("");
}

class DetokenizerPropertyTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "qwen2_style" && !BpeTokenizerSupportsNfc()) {
      GTEST_SKIP() << "built without ICU: NFC normalizer unsupported";
    }
    auto tok = LoadTokenizer(kDataDir + "/" + GetParam());
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok);
    golden_ = ReadJson(kDataDir + "/" + GetParam() + "/goldens.json");
  }

  void ExpectStreamsLikeDecode(const std::vector<int32_t>& ids, bool skip,
                               const std::function<size_t()>& chunk, const std::string& what) {
    absl::StatusOr<std::string> full = tokenizer_->Decode(ids, skip);
    ASSERT_TRUE(full.ok()) << full.status();
    IncrementalDetokenizer detok(*tokenizer_, skip);
    EXPECT_EQ(Stream(detok, ids, chunk), *full)
        << what << " skip=" << skip << " ids " << ::testing::PrintToString(ids);
  }

  // Random ids biased towards the cases that stress streaming: special/control tokens, single
  // bytes (partial UTF-8) and the shortest tokens (SentencePiece's lone "▁").
  std::vector<int32_t> RandomStream(std::mt19937& rng) {
    std::vector<int32_t> interesting = golden_["special_ids"].get<std::vector<int32_t>>();
    for (int32_t id = 0; id < tokenizer_->vocab_size(); ++id) {
      std::optional<std::string_view> t = tokenizer_->IdToToken(id);
      if (t && (t->size() <= 2 || t->substr(0, 3) == "<0x")) interesting.push_back(id);
    }
    std::uniform_int_distribution<int32_t> any(0, tokenizer_->vocab_size() - 1);
    std::uniform_int_distribution<size_t> pick(0, interesting.size() - 1);
    std::uniform_int_distribution<int> len(1, 40);
    std::bernoulli_distribution biased(0.6);
    std::vector<int32_t> ids(len(rng));
    for (int32_t& id : ids) id = biased(rng) ? interesting[pick(rng)] : any(rng);
    return ids;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  Json golden_;
};

TEST_P(DetokenizerPropertyTest, CorpusStreamsConcatenateToDecode) {
  const auto docs = golden_["corpus_ids_special"].get<std::vector<std::vector<int32_t>>>();
  for (bool skip : {false, true}) {
    for (size_t i = 0; i < docs.size(); ++i) {
      ExpectStreamsLikeDecode(
          docs[i], skip, [] { return size_t{1}; }, "doc #" + std::to_string(i));
    }
  }
}

TEST_P(DetokenizerPropertyTest, SampleStreamsConcatenateToDecode) {
  const auto samples = golden_["sample_ids_special"].get<std::vector<std::vector<int32_t>>>();
  for (bool skip : {false, true}) {
    for (size_t i = 0; i < samples.size(); ++i) {
      ExpectStreamsLikeDecode(
          samples[i], skip, [] { return size_t{1}; }, "sample #" + std::to_string(i));
    }
  }
}

TEST_P(DetokenizerPropertyTest, RandomStreamsConcatenateToDecode) {
  std::mt19937 rng(20240601);
  std::uniform_int_distribution<size_t> chunk(1, 4);
  for (int trial = 0; trial < 2000; ++trial) {
    const std::vector<int32_t> ids = RandomStream(rng);
    const bool skip = trial % 2 == 1;
    ExpectStreamsLikeDecode(
        ids, skip, [] { return size_t{1}; }, "trial " + std::to_string(trial));
    ExpectStreamsLikeDecode(
        ids, skip, [&] { return chunk(rng); }, "chunked trial " + std::to_string(trial));
    if (HasFailure()) return;
  }
}

// With the prompt as context, the streamed text is the full decode minus the prompt's decode
// (whenever the latter is a prefix, i.e. the prompt does not end inside a character): this is
// where SentencePiece's first-piece space rule shows.
TEST_P(DetokenizerPropertyTest, PromptContextKeepsLeadingSpace) {
  const auto docs = golden_["corpus_ids_special"].get<std::vector<std::vector<int32_t>>>();
  std::mt19937 rng(7);
  int checked = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    if (docs[i].size() < 3) continue;
    std::uniform_int_distribution<size_t> cut(1, docs[i].size() - 1);
    const size_t k = cut(rng);
    const std::vector<int32_t> prompt(docs[i].begin(), docs[i].begin() + k);
    const std::vector<int32_t> generated(docs[i].begin() + k, docs[i].end());
    const std::string full = *tokenizer_->Decode(docs[i], true);
    const std::string prompt_text = *tokenizer_->Decode(prompt, true);
    if (full.compare(0, prompt_text.size(), prompt_text) != 0) continue;
    IncrementalDetokenizer detok(*tokenizer_, true, prompt);
    EXPECT_EQ(Stream(detok, generated, [] { return size_t{1}; }), full.substr(prompt_text.size()))
        << "doc #" << i << " cut at " << k;
    ++checked;
  }
  EXPECT_GT(checked, static_cast<int>(docs.size()) / 2);
}

INSTANTIATE_TEST_SUITE_P(IncrementalDetokenizerTest, DetokenizerPropertyTest,
                         ::testing::Values("demo", "llama3_style", "qwen2_style", "sp"));

class IncrementalDetokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = LoadTokenizer(kDataDir + "/demo");
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok);
  }
  // The byte-level token for one raw byte (GPT-2's printable alias of 0xC3 is "Ã", of 0xA9 "©").
  int32_t ByteToken(const char* spelling) {
    std::optional<int32_t> id = tokenizer_->TokenToId(spelling);
    EXPECT_TRUE(id.has_value()) << spelling;
    return id.value_or(0);
  }
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(IncrementalDetokenizerTest, HoldsBackIncompleteCharacter) {
  IncrementalDetokenizer detok(*tokenizer_, false);
  EXPECT_EQ(*detok.Add(*tokenizer_->TokenToId("a")), "a");
  EXPECT_EQ(*detok.Add(ByteToken("Ã")), "");   // 0xC3: first byte of "é"
  EXPECT_EQ(*detok.Add(ByteToken("©")), "é");  // 0xA9 completes it
  EXPECT_EQ(*detok.Flush(), "");
}

TEST_F(IncrementalDetokenizerTest, FlushReplacesDanglingBytes) {
  IncrementalDetokenizer detok(*tokenizer_, false);
  EXPECT_EQ(*detok.Add(*tokenizer_->TokenToId("a")), "a");
  EXPECT_EQ(*detok.Add(ByteToken("Ã")), "");
  EXPECT_EQ(*detok.Flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(*detok.Flush(), "");  // nothing is emitted twice
}

TEST_F(IncrementalDetokenizerTest, SkipsSpecialTokensWhenAsked) {
  const int32_t bos = *tokenizer_->TokenToId("<|bos|>");
  const std::vector<int32_t> ids = *tokenizer_->Encode("Hi there", true);
  ASSERT_EQ(ids.front(), bos);
  IncrementalDetokenizer skipping(*tokenizer_, true);
  IncrementalDetokenizer keeping(*tokenizer_, false);
  std::string skipped, kept;
  for (int32_t id : ids) {
    skipped += *skipping.Add(id);
    kept += *keeping.Add(id);
  }
  EXPECT_EQ(skipped + *skipping.Flush(), "Hi there");
  EXPECT_EQ(kept + *keeping.Flush(), "<|bos|>Hi there");
}

TEST_F(IncrementalDetokenizerTest, BadIdIsInvalidArgumentAndNotKept) {
  IncrementalDetokenizer detok(*tokenizer_, false);
  EXPECT_EQ(*detok.Add(*tokenizer_->TokenToId("a")), "a");
  EXPECT_EQ(detok.Add(tokenizer_->vocab_size()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(detok.ids().size(), 1u);
  EXPECT_EQ(*detok.Add(*tokenizer_->TokenToId("b")), "b");
}

}  // namespace
}  // namespace modserve::engine
