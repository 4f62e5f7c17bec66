// The backend registry: names, availability and the status codes of failed creation.
#include "engine/backend/registry.h"

#include <stdlib.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cpu/kernels.h"
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

// MODSERVE_CPU_ISA=<name> runs that kernel table instead of the best one; a name that is no table
// is InvalidArgument, one this CPU cannot run Unavailable, each naming the variable.
TEST(RegistryTest, CpuIsaEnvironmentVariablePicksTheKernelTable) {
  struct Restore {
    ~Restore() { unsetenv("MODSERVE_CPU_ISA"); }
  } restore;
  for (cpu::Isa isa : {cpu::Isa::kScalar, cpu::Isa::kAvx2, cpu::Isa::kAvx512,
                       cpu::Isa::kAvx512Vnni, cpu::Isa::kAmx}) {
    const std::string name(cpu::IsaName(isa));
    ASSERT_EQ(cpu::IsaFromName(name), isa);
    setenv("MODSERVE_CPU_ISA", name.c_str(), 1);
    auto backend = CreateBackend("cpu", {.num_threads = 1});
    if (!cpu::CpuHasIsa(isa)) {
      ASSERT_FALSE(backend.ok()) << name;
      EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable) << backend.status();
      EXPECT_NE(backend.status().message().find("MODSERVE_CPU_ISA"), absl::string_view::npos);
      continue;
    }
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto* cpu_backend = dynamic_cast<cpu::CpuBackend*>(backend->get());
    ASSERT_NE(cpu_backend, nullptr);
    EXPECT_EQ(cpu_backend->isa(), isa) << name;
  }
  setenv("MODSERVE_CPU_ISA", "avx1024", 1);
  auto bad = CreateBackend("cpu", {.num_threads = 1});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("MODSERVE_CPU_ISA=avx1024"), absl::string_view::npos);
  unsetenv("MODSERVE_CPU_ISA");
  auto best = CreateBackend("cpu", {.num_threads = 1});
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(dynamic_cast<cpu::CpuBackend*>(best->get())->isa(), cpu::BestIsa());
}

}  // namespace
}  // namespace modserve::backend
