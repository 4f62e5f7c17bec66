// Status helpers for CUDA runtime and cuBLAS calls inside the CUDA backend: error-code names and
// absl::Status conversion. Host-only; it decides nothing about when errors are reported.
#ifndef MODSERVE_ENGINE_BACKEND_CUDA_CUDA_CHECK_H_
#define MODSERVE_ENGINE_BACKEND_CUDA_CUDA_CHECK_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace modserve::backend::cuda {

// Internal("CUDA error cudaErrorX (text) in <where>"), or OK for cudaSuccess.
inline absl::Status CudaStatus(cudaError_t err, absl::string_view where) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA error ", cudaGetErrorName(err), " (",
                                          cudaGetErrorString(err), ") in ", where));
}

inline absl::Status CublasStatus(cublasStatus_t st, absl::string_view where) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuBLAS error ", cublasGetStatusName(st), " (",
                                          cublasGetStatusString(st), ") in ", where));
}

}  // namespace modserve::backend::cuda

// Returns an Internal status from the enclosing function when a CUDA runtime call fails; the
// message names the call.
#define MODSERVE_CUDA_RETURN_IF_ERROR(expr)                                              \
  do {                                                                                   \
    const cudaError_t modserve_cuda_err_ = (expr);                                       \
    if (modserve_cuda_err_ != cudaSuccess)                                               \
      return ::modserve::backend::cuda::CudaStatus(modserve_cuda_err_, #expr);           \
  } while (0)

#define MODSERVE_CUBLAS_RETURN_IF_ERROR(expr)                                            \
  do {                                                                                   \
    const cublasStatus_t modserve_cublas_st_ = (expr);                                   \
    if (modserve_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                    \
      return ::modserve::backend::cuda::CublasStatus(modserve_cublas_st_, #expr);        \
  } while (0)

#endif  // MODSERVE_ENGINE_BACKEND_CUDA_CUDA_CHECK_H_
