// BpeModel on hand-built merge tables: the byte alphabet, merge order, and the two merge-table
// policies (strict by id as `tokenizers` loads them, by spelling as llama.cpp applies them).
// The front ends' behaviour on real vocabularies is checked against the reference libraries in
// tokenizer_test and gguf_tokenizer_test.
#include "engine/tokenizer/bpe_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace modserve::engine::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Tokens = std::vector<std::pair<std::string_view, int32_t>>;
using Merges = std::vector<std::pair<std::string_view, std::string_view>>;

std::vector<int32_t> Encode(const BpeModel& model, std::string_view bytes) {
  std::vector<int32_t> ids;
  model.EncodeWord(bytes, &ids);
  return ids;
}

TEST(BpeModelTest, ByteAlphabetRoundTripsEveryByte) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string spelled = BytesToByteLevel(all);
  EXPECT_EQ(ByteLevelToBytes(spelled), all);
  EXPECT_EQ(BytesToByteLevel(" "), "\xC4\xA0");      // space is spelled U+0120 'Ġ'
  EXPECT_EQ(BytesToByteLevel("\n"), "\xC4\x8A");     // newline U+010A 'Ċ'
  EXPECT_EQ(BytesToByteLevel("a!~"), "a!~");         // printable ASCII spells itself
  EXPECT_EQ(ByteLevelToBytes("a b"), std::nullopt);  // a raw space is outside the alphabet
}

TEST(BpeModelTest, LowerRankMergesFirstAndTiesGoLeft) {
  // "abc": (b,c) has the lower rank, so "a" + "bc" even though (a,b) is leftmost.
  const Tokens tokens = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}};
  auto model = BpeModel::Create(tokens, Merges{{"b", "c"}, {"a", "b"}}, {});
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_THAT(Encode(*model, "abc"), ElementsAre(0, 4));
  // "abab": both (a,b) pairs have the same rank; left first, then the right one.
  EXPECT_THAT(Encode(*model, "abab"), ElementsAre(3, 3));
  // Long words take the heap path and must agree with the short path.
  std::string long_word;
  for (int i = 0; i < 100; ++i) long_word += "abc";
  std::vector<int32_t> expected;
  for (int i = 0; i < 100; ++i) {
    expected.push_back(0);
    expected.push_back(4);
  }
  EXPECT_EQ(Encode(*model, long_word), expected);
}

TEST(BpeModelTest, RepeatedPairKeepsLastRankUnlessFirstRankWins) {
  // (a,b) listed at rank 0 and again at rank 2; (b,c) at rank 1. Last rank wins: (b,c) first.
  const Tokens tokens = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}};
  const Merges merges = {{"a", "b"}, {"b", "c"}, {"a", "b"}};
  auto last = BpeModel::Create(tokens, merges, {});
  ASSERT_TRUE(last.ok());
  EXPECT_THAT(Encode(*last, "abc"), ElementsAre(0, 4));
  BpeModelOptions options;
  options.first_rank_wins = true;
  auto first = BpeModel::Create(tokens, merges, options);
  ASSERT_TRUE(first.ok());
  EXPECT_THAT(Encode(*first, "abc"), ElementsAre(3, 2));
}

TEST(BpeModelTest, StrictMergesRefuseAResultThatIsNoToken) {
  const Tokens tokens = {{"a", 0}, {"b", 1}};
  auto model = BpeModel::Create(tokens, Merges{{"a", "b"}}, {});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(), HasSubstr("merge #0 'a b'"));
}

TEST(BpeModelTest, MergesBySpellingRunThroughSpellingsThatAreNoToken) {
  // "ab" is no token, but "ab" + "c" -> "abc" is: by spelling, "abc" still forms.
  const Tokens tokens = {{"a", 0}, {"b", 1}, {"c", 2}, {"abc", 3}, {"x", 4}};
  BpeModelOptions options;
  options.merges_by_spelling = true;
  auto model = BpeModel::Create(tokens, Merges{{"a", "b"}, {"ab", "c"}, {"q", "r"}}, options);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_THAT(Encode(*model, "abc"), ElementsAre(3));
  // A final piece that is no token comes out as the one-byte tokens of its spelling.
  EXPECT_THAT(Encode(*model, "abx"), ElementsAre(0, 1, 4));
  // Bytes with no token of their own are dropped.
  EXPECT_THAT(Encode(*model, "zaz"), ElementsAre(0));
}

TEST(BpeModelTest, IgnoreMergesTakesWholeWordTokens) {
  // "abc" is a token but no merge path leads there.
  const Tokens tokens = {{"a", 0}, {"b", 1}, {"c", 2}, {"abc", 3}, {"ab", 4}};
  const Merges merges = {{"a", "b"}};
  auto plain = BpeModel::Create(tokens, merges, {});
  ASSERT_TRUE(plain.ok());
  EXPECT_THAT(Encode(*plain, "abc"), ElementsAre(4, 2));
  BpeModelOptions options;
  options.ignore_merges = true;
  auto ignoring = BpeModel::Create(tokens, merges, options);
  ASSERT_TRUE(ignoring.ok());
  EXPECT_THAT(Encode(*ignoring, "abc"), ElementsAre(3));
  EXPECT_EQ(ignoring->TokenForBytes("abc"), 3);
  EXPECT_EQ(ignoring->TokenForBytes("abcd"), std::nullopt);
}

TEST(BpeModelTest, UnknownBytesBecomeUnkWhenGiven) {
  const Tokens tokens = {{"a", 0}, {"<unk>", 1}};
  BpeModelOptions options;
  options.unk_id = 1;
  auto model = BpeModel::Create(tokens, Merges{}, options);
  ASSERT_TRUE(model.ok());
  EXPECT_THAT(Encode(*model, "aza"), ElementsAre(0, 1, 0));
}

}  // namespace
}  // namespace modserve::engine::internal
