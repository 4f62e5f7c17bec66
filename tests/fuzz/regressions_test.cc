// Replays every committed fuzz input (the seed corpora under tests/fuzz/corpus/<target>/ and the
// crash reproducers under tests/fuzz/regressions/<target>/) through its target, so a fixed bug
// stays fixed in builds without libFuzzer. A broken contract aborts inside the target with the
// property it broke; memory errors need a sanitizer build (the asan-ubsan preset).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_targets.h"

namespace modserve::fuzz {
namespace {

namespace fs = std::filesystem;

const fs::path kFuzzDir = fs::path(MODSERVE_SOURCE_DIR) / "tests" / "fuzz";

std::vector<fs::path> FilesIn(const fs::path& dir) {
  std::vector<fs::path> files;
  if (!fs::is_directory(dir)) return files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string ReadBytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class FuzzCorpusTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FuzzCorpusTest, ReplaysEveryCommittedInput) {
  const FuzzFn fn = FindTarget(GetParam());
  ASSERT_NE(fn, nullptr) << GetParam();
  std::vector<fs::path> inputs = FilesIn(kFuzzDir / "corpus" / GetParam());
  ASSERT_FALSE(inputs.empty()) << "no seed corpus in " << (kFuzzDir / "corpus" / GetParam());
  for (const fs::path& p : FilesIn(kFuzzDir / "regressions" / GetParam())) inputs.push_back(p);
  for (const fs::path& p : inputs) {
    SCOPED_TRACE(p.string());
    const std::string bytes = ReadBytes(p);
    EXPECT_EQ(fn(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzCorpusTest,
                         ::testing::Values("checkpoint", "gguf", "config", "bpe_json", "tokenizer_encode",
                                           "tokenizer_decode", "detokenizer", "request",
                                           "openai_request", "jinja", "http_request"));

}  // namespace
}  // namespace modserve::fuzz
