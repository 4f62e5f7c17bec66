// The real reference model, SmolLM2-135M-Instruct Q4_1, over the whole held-out passage of
// tests/testdata/smollm2/logprobs.json (2,109 tokens of The Jargon File; goldens by
// make_goldens.py there): teacher-forced log-probabilities within the bounds of
// smollm2_golden.h of the float64 reference that dequantizes the same GGUF, perplexity within 1%.
// About 35 CPU-seconds in a release build, so it carries the label `slow`:
//   ctest --test-dir build -R SmolLm2HeldoutTest --output-on-failure
#include <string>

#include "gtest/gtest.h"
#include "tests/common/real_model.h"
#include "tests/engine/smollm2_golden.h"

namespace modserve::engine {
namespace {

TEST(SmolLm2HeldoutTest, TeacherForcedLogprobsMatchReference) {
  MODSERVE_REQUIRE_SMOLLM2(path);
  smollm2_golden::CheckTeacherForcedLogprobs(path, static_cast<size_t>(-1));
}

}  // namespace
}  // namespace modserve::engine
