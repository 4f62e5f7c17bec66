// Helpers around the cuBLAS GEMMs of CudaBackend::Gemm: the exact 3-plane bf16 split of f32
// activations, the plane combine (+ bias), weight widening and bias add. Elementwise, memory-bound.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "engine/backend/cuda/kernels/device_utils.cuh"
#include "engine/backend/cuda/kernels/kernels.h"

namespace modserve::backend::cuda::kernels {
namespace {

constexpr int kThreads = 256;

// x = hi + mid + lo exactly: hi = bf16(x); x - hi is exact in f32 (hi is x's nearest bf16), and
// so on; three 8-bit significands cover f32's 24. (Exact unless a remainder is below the smallest
// normal f32, ~1e-38, i.e. never for activations of a sane model.)
__global__ void SplitKernel(const float* __restrict__ x, int64_t count,
                            __nv_bfloat16* __restrict__ planes) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[i];
    const __nv_bfloat16 hi = __float2bfloat16_rn(v);
    const float r1 = __fsub_rn(v, __bfloat162float(hi));
    const __nv_bfloat16 mid = __float2bfloat16_rn(r1);
    const float r2 = __fsub_rn(r1, __bfloat162float(mid));
    planes[i] = hi;
    planes[count + i] = mid;
    planes[2 * count + i] = __float2bfloat16_rn(r2);
  }
}

// The two small planes are added first: they carry the low bits of the same products.
template <typename B>
__global__ void CombineKernel(const float* __restrict__ p, const B* __restrict__ bias, int64_t n,
                              int64_t m, float* __restrict__ out) {
  const int64_t count = n * m;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    float v = p[i] + (p[count + i] + p[2 * count + i]);
    if (bias != nullptr) v += ToF32(bias[i % m]);
    out[i] = v;
  }
}

template <typename W>
__global__ void WidenKernel(const W* __restrict__ src, int64_t count, float* __restrict__ dst) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = ToF32(src[i]);
  }
}

template <typename B>
__global__ void AddBiasKernel(const B* __restrict__ bias, int64_t n, int64_t m,
                              float* __restrict__ out) {
  const int64_t count = n * m;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] += ToF32(bias[i % m]);
  }
}

template <typename B>
cudaError_t LaunchCombine(cudaStream_t stream, const float* p, const void* bias, int64_t n,
                          int64_t m, float* out) {
  CombineKernel<B><<<GridFor(n * m, kThreads), kThreads, 0, stream>>>(
      p, static_cast<const B*>(bias), n, m, out);
  return cudaGetLastError();
}

template <typename W>
cudaError_t LaunchWiden(cudaStream_t stream, const void* src, int64_t count, float* dst) {
  WidenKernel<W>
      <<<GridFor(count, kThreads), kThreads, 0, stream>>>(static_cast<const W*>(src), count, dst);
  return cudaGetLastError();
}

template <typename B>
cudaError_t LaunchAddBias(cudaStream_t stream, const void* bias, int64_t n, int64_t m,
                          float* out) {
  AddBiasKernel<B><<<GridFor(n * m, kThreads), kThreads, 0, stream>>>(
      static_cast<const B*>(bias), n, m, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t SplitToBf16Planes(cudaStream_t stream, const float* x, int64_t n, int64_t k,
                              void* planes) {
  if (n * k == 0) return cudaSuccess;
  SplitKernel<<<GridFor(n * k, kThreads), kThreads, 0, stream>>>(
      x, n * k, static_cast<__nv_bfloat16*>(planes));
  return cudaGetLastError();
}

cudaError_t CombinePlanes(cudaStream_t stream, const float* p, const void* bias, DType bias_dt,
                          int64_t n, int64_t m, float* out) {
  if (n * m == 0) return cudaSuccess;
  switch (bias_dt) {
    case DType::kF32:
      return LaunchCombine<float>(stream, p, bias, n, m, out);
    case DType::kF16:
      return LaunchCombine<__half>(stream, p, bias, n, m, out);
    case DType::kBF16:
      return LaunchCombine<__nv_bfloat16>(stream, p, bias, n, m, out);
    case DType::kI32:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ4_K:
    case DType::kQ6_K:
    case DType::kQ5_K:
    case DType::kQ5_0:
    case DType::kQ5_1:
      break;
  }
  return cudaErrorInvalidValue;
}

cudaError_t WidenToF32(cudaStream_t stream, const void* src, DType dt, int64_t count, float* dst) {
  if (count == 0) return cudaSuccess;
  switch (dt) {
    case DType::kF32:
      return LaunchWiden<float>(stream, src, count, dst);
    case DType::kF16:
      return LaunchWiden<__half>(stream, src, count, dst);
    case DType::kBF16:
      return LaunchWiden<__nv_bfloat16>(stream, src, count, dst);
    case DType::kI32:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ4_K:
    case DType::kQ6_K:
    case DType::kQ5_K:
    case DType::kQ5_0:
    case DType::kQ5_1:
      break;
  }
  return cudaErrorInvalidValue;
}

cudaError_t AddBias(cudaStream_t stream, const void* bias, DType dt, int64_t n, int64_t m,
                    float* out) {
  if (n * m == 0) return cudaSuccess;
  switch (dt) {
    case DType::kF32:
      return LaunchAddBias<float>(stream, bias, n, m, out);
    case DType::kF16:
      return LaunchAddBias<__half>(stream, bias, n, m, out);
    case DType::kBF16:
      return LaunchAddBias<__nv_bfloat16>(stream, bias, n, m, out);
    case DType::kI32:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ4_K:
    case DType::kQ6_K:
    case DType::kQ5_K:
    case DType::kQ5_0:
    case DType::kQ5_1:
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace modserve::backend::cuda::kernels
