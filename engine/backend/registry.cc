// The name -> factory table of compiled-in backends. An explicit table rather than static
// self-registration, which static libraries silently drop at link time.
//
// CUDA: in builds with MODSERVE_WITH_CUDA the CUDA backend is a separate shared library,
// libmodserve_backend_cuda_plugin.so (engine/backend/cuda/plugin.cc), loaded with dlopen the
// first time it is needed, so processes that never use the GPU never map cuBLAS.
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
#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <mutex>
#endif

namespace modserve::backend {
namespace {

constexpr std::string_view kCpu = "cpu";
constexpr std::string_view kCuda = "cuda";

absl::StatusOr<std::unique_ptr<Backend>> CreateCpu(const BackendOptions& options) {
  cpu::CpuBackendOptions cpu_options;
  cpu_options.num_threads = options.num_threads;
  cpu_options.matmul_precision = options.matmul_precision;
  MODSERVE_ASSIGN_OR_RETURN(std::unique_ptr<cpu::CpuBackend> backend,
                            cpu::CpuBackend::Create(cpu_options));
  return std::unique_ptr<Backend>(std::move(backend));
}

#if defined(MODSERVE_WITH_CUDA) && MODSERVE_WITH_CUDA
constexpr char kCudaPlugin[] = "libmodserve_backend_cuda_plugin.so";

struct CudaPlugin {
  int (*visible_device_count)() = nullptr;
  Backend* (*create)(const BackendOptions*, absl::Status*) = nullptr;
  std::string error;  // why it could not be loaded
};

// Looks in $MODSERVE_CUDA_PLUGIN, then <dir of the executable>/../lib (the build tree and the
// install layout), then the dynamic linker's search path. Loaded once; never unloaded.
const CudaPlugin& LoadCudaPlugin() {
  static CudaPlugin plugin;
  static std::once_flag once;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("MODSERVE_CUDA_PLUGIN"); env != nullptr && *env != 0) {
      candidates.emplace_back(env);
    }
    char exe[PATH_MAX];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
      std::string dir(exe, static_cast<size_t>(n));
      dir = dir.substr(0, dir.rfind('/'));
      candidates.push_back(dir + "/../lib/" + kCudaPlugin);
      candidates.push_back(dir + "/" + kCudaPlugin);
    }
    candidates.emplace_back(kCudaPlugin);
    std::vector<std::string> errors;
    for (const std::string& path : candidates) {
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        errors.push_back(dlerror());
        continue;
      }
      plugin.visible_device_count = reinterpret_cast<int (*)()>(
          dlsym(handle, "modserve_cuda_visible_device_count"));
      plugin.create = reinterpret_cast<Backend* (*)(const BackendOptions*, absl::Status*)>(
          dlsym(handle, "modserve_cuda_create_backend"));
      if (plugin.visible_device_count != nullptr && plugin.create != nullptr) return;
      errors.push_back(path + ": missing entry points");
      plugin.visible_device_count = nullptr;
      plugin.create = nullptr;
    }
    plugin.error = absl::StrJoin(errors, "; ");
  });
  return plugin;
}
#endif

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
  const CudaPlugin& plugin = LoadCudaPlugin();
  if (plugin.visible_device_count != nullptr && plugin.visible_device_count() > 0) {
    names.emplace_back(kCuda);
  }
#endif
  return names;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view name,
                                                       const BackendOptions& options) {
  if (name == kCpu) return CreateCpu(options);
  if (name == kCuda) {
#if defined(MODSERVE_WITH_CUDA) && MODSERVE_WITH_CUDA
    const CudaPlugin& plugin = LoadCudaPlugin();
    if (plugin.create == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("backend 'cuda': cannot load ", kCudaPlugin, ": ", plugin.error));
    }
    // Unavailable ("no CUDA device visible ...", or a bad ordinal) comes from the factory.
    absl::Status status;
    Backend* backend = plugin.create(&options, &status);
    if (backend == nullptr) return status;
    return std::unique_ptr<Backend>(backend);
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
