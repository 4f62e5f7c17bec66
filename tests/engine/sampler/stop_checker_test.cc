// Checks StopChecker: stop tokens, ignore_eos, length, stop strings inside and across tokens,
// the streaming hold-back, and a seeded comparison with a brute-force re-search of the full text.
#include "engine/sampler/stop_checker.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace modserve::engine {
namespace {

constexpr TokenId kEos = 2;
constexpr TokenId kText = 100;  // any ordinary token

SamplingParams Params(std::vector<std::string> stops, int32_t max_new_tokens = 100) {
  SamplingParams params;
  params.stop_strings = std::move(stops);
  params.max_new_tokens = max_new_tokens;
  return params;
}

// Feeds pieces as ordinary tokens; returns the concatenated emits.
std::string Feed(StopChecker& checker, const std::vector<std::string>& pieces) {
  std::string streamed;
  for (const std::string& piece : pieces) {
    streamed += checker.Append(kText, piece).emit;
    if (checker.finished()) break;
  }
  return streamed;
}

TEST(StopCheckerTest, EosStopsAndItsTextIsDropped) {
  StopChecker checker(Params({}), std::vector<TokenId>{kEos});
  EXPECT_EQ(checker.Append(kText, "Hi").emit, "Hi");
  const StopCheckResult result = checker.Append(kEos, "</s>");
  EXPECT_EQ(result.finish_reason, FinishReason::kStopToken);
  EXPECT_EQ(result.emit, "");
  EXPECT_EQ(checker.text(), "Hi");
  EXPECT_EQ(checker.num_tokens(), 2);
}

TEST(StopCheckerTest, IgnoreEosStillHonoursStopTokenIds) {
  SamplingParams params = Params({});
  params.ignore_eos = true;
  params.stop_token_ids = {7};
  StopChecker checker(params, std::vector<TokenId>{kEos, 3});
  EXPECT_FALSE(checker.Append(kEos, "a").finish_reason.has_value());
  EXPECT_FALSE(checker.Append(3, "b").finish_reason.has_value());
  EXPECT_EQ(checker.Append(7, "c").finish_reason, FinishReason::kStopToken);
  EXPECT_EQ(checker.text(), "ab");
}

TEST(StopCheckerTest, LengthFinishesAtMaxNewTokensAndFlushesWithheldText) {
  StopChecker checker(Params({"xyz"}, 3), std::vector<TokenId>{kEos});
  EXPECT_EQ(checker.Append(kText, "a").emit, "a");
  const StopCheckResult second = checker.Append(kText, "bx");
  EXPECT_EQ(second.emit, "b");
  EXPECT_EQ(second.num_withheld_bytes, 1u);
  const StopCheckResult third = checker.Append(kText, "y");
  EXPECT_EQ(third.finish_reason, FinishReason::kLength);
  EXPECT_EQ(third.emit, "xy");  // no more tokens can complete "xyz"
  EXPECT_EQ(checker.text(), "abxy");
}

TEST(StopCheckerTest, StopTokenTakesPrecedenceOverLength) {
  StopChecker checker(Params({}, 1), std::vector<TokenId>{kEos});
  EXPECT_EQ(checker.Append(kEos, "").finish_reason, FinishReason::kStopToken);
}

TEST(StopCheckerTest, StopStringInsideOneToken) {
  StopChecker checker(Params({"lo w"}), std::vector<TokenId>{kEos});
  const StopCheckResult result = checker.Append(kText, "Hello world");
  EXPECT_EQ(result.finish_reason, FinishReason::kStopString);
  EXPECT_EQ(result.emit, "Hel");
  EXPECT_EQ(checker.text(), "Hel");
  EXPECT_EQ(checker.matched_stop_string(), "lo w");
}

TEST(StopCheckerTest, StopStringAcrossTokensIsNeverStreamed) {
  StopChecker checker(Params({"o wor"}), std::vector<TokenId>{kEos});
  StopCheckResult r = checker.Append(kText, "Hel");
  EXPECT_EQ(r.emit, "Hel");
  r = checker.Append(kText, "lo");
  EXPECT_EQ(r.emit, "l");  // the final "o" may start "o wor"
  EXPECT_EQ(r.num_withheld_bytes, 1u);
  r = checker.Append(kText, " wo");
  EXPECT_EQ(r.emit, "");
  EXPECT_EQ(r.num_withheld_bytes, 4u);
  r = checker.Append(kText, "rld");
  EXPECT_EQ(r.finish_reason, FinishReason::kStopString);
  EXPECT_EQ(r.emit, "");
  EXPECT_EQ(checker.text(), "Hell");
}

TEST(StopCheckerTest, WithheldTextIsReleasedWhenTheMatchBreaks) {
  StopChecker checker(Params({"abc"}), std::vector<TokenId>{kEos});
  EXPECT_EQ(checker.Append(kText, "a").emit, "");
  EXPECT_EQ(checker.Append(kText, "b").emit, "");
  const StopCheckResult r = checker.Append(kText, "x");
  EXPECT_EQ(r.emit, "abx");
  EXPECT_EQ(r.num_withheld_bytes, 0u);
}

TEST(StopCheckerTest, EarliestOccurrenceWins) {
  StopChecker checker(Params({"bc", "abcd"}), std::vector<TokenId>{kEos});
  EXPECT_EQ(checker.Append(kText, "xabcd").finish_reason, FinishReason::kStopString);
  EXPECT_EQ(checker.text(), "x");
  EXPECT_EQ(checker.matched_stop_string(), "abcd");
}

TEST(StopCheckerTest, MultiByteStopStringSpanningTokens) {
  // "→" is three UTF-8 bytes; the tokenizer may hand them over split.
  StopChecker checker(Params({"\xE2\x86\x92"}), std::vector<TokenId>{kEos});
  const std::string streamed = Feed(checker, {"a\xE2", "\x86", "\x92z"});
  EXPECT_EQ(checker.finish_reason(), FinishReason::kStopString);
  EXPECT_EQ(streamed, "a");
  EXPECT_EQ(checker.text(), "a");
}

TEST(StopCheckerTest, FinishReasonNames) {
  EXPECT_EQ(FinishReasonName(FinishReason::kLength), "length");
  EXPECT_EQ(FinishReasonName(FinishReason::kStopToken), "stop_token");
  EXPECT_EQ(FinishReasonName(FinishReason::kStopString), "stop_string");
  EXPECT_EQ(FinishReasonName(FinishReason::kCancelled), "cancelled");
  EXPECT_EQ(FinishReasonName(FinishReason::kError), "error");
}

TEST(StopCheckerDeathTest, AppendAfterFinishChecks) {
  StopChecker checker(Params({}, 1), std::vector<TokenId>{kEos});
  checker.Append(kText, "a");
  EXPECT_DEATH(checker.Append(kText, "b"), "after the request finished");
}

// Brute force: after each token, search the whole text for every stop string; the first token at
// which any occurs ends the request, cut at the earliest occurrence. The held-back length is the
// longest suffix that is a proper prefix of a stop string, found by trying every length.
TEST(StopCheckerTest, MatchesBruteForceOnRandomTextAndSplits) {
  const std::vector<std::string> stops = {"abc", "cab", "bb", "aaaa"};
  std::mt19937 rng(31337);
  for (int trial = 0; trial < 2000; ++trial) {
    const int max_new = 1 + static_cast<int>(rng() % 30);
    StopChecker checker(Params(stops, max_new), std::vector<TokenId>{kEos});
    std::string full, streamed;
    std::optional<FinishReason> expected_reason;
    std::string expected_text;
    for (int t = 0; t < 40 && !checker.finished(); ++t) {
      std::string piece;
      const int len = static_cast<int>(rng() % 4);  // empty pieces happen (partial characters)
      for (int i = 0; i < len; ++i) piece += "abcx"[rng() % 4];
      full += piece;
      const StopCheckResult r = checker.Append(kText, piece);
      streamed += r.emit;
      size_t earliest = std::string::npos;
      for (const std::string& s : stops) earliest = std::min(earliest, full.find(s));
      if (earliest != std::string::npos) {
        expected_reason = FinishReason::kStopString;
        expected_text = full.substr(0, earliest);
      } else if (t + 1 >= max_new) {
        expected_reason = FinishReason::kLength;
        expected_text = full;
      }
      ASSERT_EQ(r.finish_reason, expected_reason) << "trial " << trial << " text " << full;
      if (expected_reason.has_value()) break;
      size_t held = 0;
      for (const std::string& s : stops) {
        for (size_t k = 1; k < s.size() && k <= full.size(); ++k) {
          if (full.compare(full.size() - k, k, s, 0, k) == 0) held = std::max(held, k);
        }
      }
      ASSERT_EQ(r.num_withheld_bytes, held) << full;
      ASSERT_EQ(streamed, full.substr(0, full.size() - held)) << full;
    }
    if (!checker.finished()) continue;
    EXPECT_EQ(checker.text(), expected_text);
    EXPECT_EQ(streamed, expected_text) << "trial " << trial;
  }
}

}  // namespace
}  // namespace modserve::engine
