// The name -> factory table of compiled-in backends. An explicit table rather than static
// self-registration, which static libraries silently drop at link time.
//
// CUDA hook: when MODSERVE_WITH_CUDA is defined this file includes
// engine/backend/cuda/cuda_backend.h, which declares in modserve::backend::cuda
//   int VisibleDeviceCount();  // 0 when the driver or device is missing; never fails
//   absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options);
#include "engine/backend/registry.h"

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/common/status_macros.h"

#if defined(MODSERVE_WITH_CUDA) && MODSERVE_WITH_CUDA
#include "engine/backend/cuda/cuda_backend.h"
#endif

namespace modserve::backend {
namespace {

constexpr std::string_view kCpu = "cpu";
constexpr std::string_view kCuda = "cuda";

absl::StatusOr<std::unique_ptr<Backend>> CreateCpu(const BackendOptions& options) {
  cpu::CpuBackendOptions cpu_options;
  cpu_options.num_threads = options.num_threads;
  MODSERVE_ASSIGN_OR_RETURN(std::unique_ptr<cpu::CpuBackend> backend,
                            cpu::CpuBackend::Create(cpu_options));
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace

std::vector<std::string> CompiledBackends() {
  std::vector<std::string> names = {std::string(kCpu)};
#if defined(MODSERVE_WITH_CUDA) && MODSERVE_WITH_CUDA
  names.emplace_back(kCuda);
#endif
  return names;
}

std::vector<std::string> AvailableBackends() {
  std::vector<std::string> names = {std::string(kCpu)};
#if defined(MODSERVE_WITH_CUDA) && MODSERVE_WITH_CUDA
  if (cuda::VisibleDeviceCount() > 0) names.emplace_back(kCuda);
#endif
  return names;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view name,
                                                       const BackendOptions& options) {
  if (name == kCpu) return CreateCpu(options);
  if (name == kCuda) {
#if defined(MODSERVE_WITH_CUDA) && MODSERVE_WITH_CUDA
    // Unavailable ("no CUDA device visible ...", or a bad ordinal) comes from the factory.
    return cuda::CreateCudaBackend(options);
#else
    return absl::UnavailableError(
        "backend 'cuda' is not compiled into this build (configure with -DMODSERVE_CUDA=ON)");
#endif
  }
  return absl::NotFoundError(
      absl::StrCat("unknown backend '", std::string(name),
                   "'; known backends: ", absl::StrJoin(CompiledBackends(), ", ")));
}

}  // namespace modserve::backend
