// The C entry points of libmodserve_backend_cuda.so, which registry.cc loads with dlopen only when
// a CUDA backend is asked for. Loading it on demand keeps cuBLAS out of every process that does
// not use the GPU: cuBLASLt's 94 KB of thread-local storage would otherwise be static TLS, which
// every thread's stack must hold, and small-stack threads (civetweb's, for /metrics) fail to start.
#include <memory>

#include "absl/status/status.h"
#include "engine/backend/cuda/cuda_backend.h"

extern "C" {

// Same as cuda::VisibleDeviceCount().
__attribute__((visibility("default"))) int modserve_cuda_visible_device_count() {
  return modserve::backend::cuda::VisibleDeviceCount();
}

// Creates the backend; on failure returns null and writes the status to *status.
__attribute__((visibility("default"))) modserve::backend::Backend* modserve_cuda_create_backend(
    const modserve::backend::BackendOptions* options, absl::Status* status) {
  auto backend = modserve::backend::cuda::CreateCudaBackend(*options);
  if (!backend.ok()) {
    *status = backend.status();
    return nullptr;
  }
  *status = absl::OkStatus();
  return backend->release();
}

}  // extern "C"
