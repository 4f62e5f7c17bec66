// UTF-8 helpers against Python's codec (golden cases from tools/make_tokenizer_goldens.py) and
// AppendUtf8 against the codec's encoder via round trips.
#include "engine/tokenizer/utf8.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "nlohmann/json.hpp"

namespace modserve::engine {
namespace {

using Json = nlohmann::json;

Json ReadGolden() {
  std::ifstream in(std::string(MODSERVE_SOURCE_DIR) + "/tests/testdata/tokenizer/utf8.json");
  std::ostringstream s;
  s << in.rdbuf();
  return Json::parse(s.str());
}

// Python's bytes.decode("utf-8", errors="replace") is the reference for lossy repair.
TEST(Utf8Test, ReplaceInvalidMatchesPython) {
  const Json golden = ReadGolden();
  for (const Json& c : golden["cases"]) {
    const std::string hex = c[0].get<std::string>();
    std::string bytes;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) {
      bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    }
    const std::string expected = c[1].get<std::string>();
    EXPECT_EQ(ReplaceInvalidUtf8(bytes), expected) << "bytes " << hex;
    EXPECT_EQ(IsValidUtf8(bytes), bytes == expected) << "bytes " << hex;
    // Cutting off an incomplete tail never changes the repair of what comes before it.
    const size_t tail = IncompleteUtf8SuffixLength(bytes);
    const std::string head = bytes.substr(0, bytes.size() - tail);
    EXPECT_EQ(ReplaceInvalidUtf8(head) + ReplaceInvalidUtf8(bytes.substr(head.size())), expected)
        << "bytes " << hex;
  }
}

TEST(Utf8Test, AppendUtf8RoundTripsThroughValidation) {
  for (char32_t cp :
       {0x0u, 0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xD7FFu, 0xE000u, 0xFFFFu, 0x10000u, 0x10FFFFu}) {
    std::string s;
    AppendUtf8(cp, &s);
    EXPECT_TRUE(IsValidUtf8(s)) << static_cast<uint32_t>(cp);
    EXPECT_EQ(s.size(), cp < 0x80 ? 1u : cp < 0x800 ? 2u : cp < 0x10000 ? 3u : 4u);
    // Every proper prefix of a multi-byte character is an incomplete tail of that length.
    for (size_t n = 1; n < s.size(); ++n) EXPECT_EQ(IncompleteUtf8SuffixLength(s.substr(0, n)), n);
  }
}

}  // namespace
}  // namespace modserve::engine
