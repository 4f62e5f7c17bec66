// The backend registry: names, availability and the status codes of failed creation.
#include "engine/backend/registry.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace modserve::backend {
namespace {

TEST(RegistryTest, CpuIsAlwaysAvailableAndCreatable) {
  const std::vector<std::string> available = AvailableBackends();
  EXPECT_NE(std::find(available.begin(), available.end(), "cpu"), available.end());
  auto backend = CreateBackend("cpu", {.num_threads = 2});
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_EQ((*backend)->name(), "cpu");
  EXPECT_EQ((*backend)->device(), Device::kCpu);
}

TEST(RegistryTest, AvailableBackendsAreCompiledBackends) {
  const std::vector<std::string> compiled = CompiledBackends();
  for (const std::string& name : AvailableBackends()) {
    EXPECT_NE(std::find(compiled.begin(), compiled.end(), name), compiled.end()) << name;
  }
}

TEST(RegistryTest, UnknownNameIsNotFoundAndListsKnownNames) {
  auto backend = CreateBackend("tpu");
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(backend.status().message().find("cpu"), absl::string_view::npos) << backend.status();
}

TEST(RegistryTest, CudaWithoutCudaBuildOrDeviceIsUnavailable) {
  const std::vector<std::string> available = AvailableBackends();
  if (std::find(available.begin(), available.end(), "cuda") != available.end()) {
    GTEST_SKIP() << "a CUDA device is usable here; the unavailable path cannot be observed";
  }
  auto backend = CreateBackend("cuda");
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable) << backend.status();
}

TEST(RegistryTest, NegativeThreadCountIsInvalidArgument) {
  auto backend = CreateBackend("cpu", {.num_threads = -1});
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace modserve::backend
