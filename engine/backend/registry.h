// Creates backends by name ("cpu", and "cuda" in builds configured with MODSERVE_CUDA) and lists
// which of them can run on this machine. The only place besides backend/cuda/ that knows CUDA.
#ifndef MODSERVE_ENGINE_BACKEND_REGISTRY_H_
#define MODSERVE_ENGINE_BACKEND_REGISTRY_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/backend.h"

namespace modserve::backend {

struct BackendOptions {
  // CPU backend: threads per op including the caller; CUDA backend: host threads for host work
  // between ops (sampling a step's rows). 0 = all hardware threads.
  int num_threads = 0;
  // CUDA backend: which device.
  int device_ordinal = 0;
  // CPU backend: how its AMX BF16 Gemm may round x (backend.h). The CUDA backend ignores it.
  MatmulPrecision matmul_precision = MatmulPrecision::kHighest;
};

// Every backend name this build knows, whether or not it can run here: {"cpu"} or {"cpu", "cuda"}.
std::vector<std::string> CompiledBackends();

// The backends that CreateBackend() can create on this machine right now (e.g. "cuda" only when
// a device is visible). The conformance suite runs every op on each of them.
std::vector<std::string> AvailableBackends();

// Creates the named backend. Codes: NotFound for an unknown name (the message lists the known
// ones); Unavailable for "cuda" in a build without CUDA (configure with -DMODSERVE_CUDA=ON) or on
// a machine without a usable device; InvalidArgument for bad options; whatever the backend's own
// factory returns otherwise.
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(std::string_view name,
                                                       const BackendOptions& options = {});

}  // namespace modserve::backend

#endif  // MODSERVE_ENGINE_BACKEND_REGISTRY_H_
