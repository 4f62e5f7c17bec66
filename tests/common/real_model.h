// The real reference model for C++ tests: SmolLM2-135M-Instruct (Q4_1 GGUF) that
// tools/fetch_models.sh places under models/smollm2/. Without it a test fails in CI (CI=true),
// where tools/test.sh has fetched it, and skips on a developer machine without network.
//
//   TEST(X, Y) { MODSERVE_REQUIRE_SMOLLM2(path); ... LoadModel(path) ... }
#ifndef MODSERVE_TESTS_COMMON_REAL_MODEL_H_
#define MODSERVE_TESTS_COMMON_REAL_MODEL_H_

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace modserve::testing {

inline std::string SmolLm2Path() {
  return std::string(MODSERVE_SOURCE_DIR) + "/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
}

inline bool InCi() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::strcmp(ci, "true") == 0;
}

}  // namespace modserve::testing

// Declares `const std::string var` = the model's path, or ends the test: FAIL in CI, SKIP
// elsewhere.
#define MODSERVE_REQUIRE_SMOLLM2(var)                                                       \
  const std::string var = ::modserve::testing::SmolLm2Path();                               \
  if (!std::filesystem::is_regular_file(var)) {                                             \
    if (::modserve::testing::InCi()) {                                                      \
      FAIL() << var << " is missing in CI (tools/test.sh runs tools/fetch_models.sh first)"; \
    }                                                                                       \
    GTEST_SKIP() << var << " is missing: run `bash tools/fetch_models.sh`";                 \
  }

#endif  // MODSERVE_TESTS_COMMON_REAL_MODEL_H_
