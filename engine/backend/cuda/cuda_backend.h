// The CUDA backend's factory: every op of backend.h on one NVIDIA GPU (cuBLAS GEMMs, hand-written
// GEMV, attention and memory-bound kernels; docs/CUDA.md). This header names no CUDA type, so
// registry.cc and tests include it without the toolkit's headers. Graph capture and device row
// counts are the Backend methods (backend.h); nothing here adds to them.
#ifndef MODSERVE_ENGINE_BACKEND_CUDA_CUDA_BACKEND_H_
#define MODSERVE_ENGINE_BACKEND_CUDA_CUDA_BACKEND_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/backend/backend.h"
#include "engine/backend/registry.h"

namespace modserve::backend::cuda {

// Devices the CUDA runtime can see; 0 when the driver is missing, too old, or no GPU is visible
// (CUDA_VISIBLE_DEVICES). Never fails. Thread-safe.
int VisibleDeviceCount();

// Sizes of the scratch buffers the backend allocates once at creation (so that no op allocates).
// The defaults suit models up to ~70B; tests shrink them to force the chunked paths.
struct CudaTuning {
  // Gemm with n > kGemvMaxRows: bf16 activation planes + f32 plane products (bf16 weights), or
  // widened f32 weight rows (f16 weights). Larger n or m is processed in chunks that fit.
  size_t gemm_scratch_bytes = size_t{128} << 20;
  // cuBLAS workspace, set explicitly so that cuBLAS never allocates (graph-capture safe).
  size_t cublas_workspace_bytes = size_t{32} << 20;
  // Attention split-context partials; fewer splits are used when a batch would not fit.
  size_t attention_scratch_bytes = size_t{32} << 20;
};

// A backend on device options.device_ordinal with one non-blocking stream and one cuBLAS handle.
// Codes: Unavailable "no CUDA device visible ..." without a usable device (names the CUDA error),
// or for an ordinal outside [0, VisibleDeviceCount()); ResourceExhausted when the scratch buffers
// do not fit; Internal for any other CUDA or cuBLAS failure during setup.
// Threads: as every Backend (one engine thread); each method makes the device current first.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options,
                                                           const CudaTuning& tuning = {});

}  // namespace modserve::backend::cuda

#endif  // MODSERVE_ENGINE_BACKEND_CUDA_CUDA_BACKEND_H_
