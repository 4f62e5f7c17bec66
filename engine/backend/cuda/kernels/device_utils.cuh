// Device helpers shared by the kernels: dtype conversions that match engine/common/dtype.h bit for
// bit (round-to-nearest-even), warp/block sums, 128-bit weight loads, the device row count and the
// launch-size helper. Nothing here launches work.
#ifndef MODSERVE_ENGINE_BACKEND_CUDA_KERNELS_DEVICE_UTILS_CUH_
#define MODSERVE_ENGINE_BACKEND_CUDA_KERNELS_DEVICE_UTILS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace modserve::backend::cuda::kernels {

__device__ __forceinline__ float ToF32(float v) { return v; }
__device__ __forceinline__ float ToF32(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToF32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromF32(float v);
template <>
__device__ __forceinline__ float FromF32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromF32<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromF32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Unpacks 16 bytes of weights into 16 / sizeof(W) floats (exact widening).
__device__ __forceinline__ void Unpack16(const uint4& raw, float* f, const float*) {
  f[0] = __uint_as_float(raw.x);
  f[1] = __uint_as_float(raw.y);
  f[2] = __uint_as_float(raw.z);
  f[3] = __uint_as_float(raw.w);
}
__device__ __forceinline__ void Unpack16(const uint4& raw, float* f, const __nv_bfloat16*) {
  // A bf16 is the top half of an f32: shifting the bits into place is the exact conversion.
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(words[i] << 16);
    f[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ void Unpack16(const uint4& raw, float* f, const __half*) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __half2 h2;
    memcpy(&h2, &words[i], 4);
    const float2 f2 = __half22float2(h2);
    f[2 * i] = f2.x;
    f[2 * i + 1] = f2.y;
  }
}

// A 16-byte load of data read once per op (weights): read-only path, no L1 allocation, so the
// activations that every row reuses stay in L1.
__device__ __forceinline__ uint4 LoadStreaming16(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Sum over the block, returned to every thread. `red` holds one float per warp (<= 32); blockDim.x
// is a multiple of 32. Contains __syncthreads(): every thread of the block must call it.
__device__ __forceinline__ float BlockSum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // `red` may still be read by a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += red[w];
  return total;
}

// Caller bugs that the CPU backend CHECKs (out-of-range indices) stop the kernel here; the error
// surfaces at the next Synchronize().
__device__ __forceinline__ void TrapUnless(bool ok) {
  if (!ok) __trap();
}

// Rows an op processes (Backend::SetDeviceRowCount): all n without a count, else count[0] clamped
// to [0, n]. Read when the kernel runs, so every replay of a captured graph sees the current count;
// n stays the capacity the grid was sized for on the host.
__device__ __forceinline__ int64_t EffectiveRows(const int32_t* rows, int64_t n) {
  if (rows == nullptr) return n;
  const int64_t count = *rows;
  return count < 0 ? 0 : (count < n ? count : n);
}

// Grid size for a grid-stride loop over `count` items with `threads` per block.
inline unsigned int GridFor(int64_t count, int threads) {
  const int64_t blocks = (count + threads - 1) / threads;
  constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride loops cover the rest
  return static_cast<unsigned int>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

}  // namespace modserve::backend::cuda::kernels

#endif  // MODSERVE_ENGINE_BACKEND_CUDA_KERNELS_DEVICE_UTILS_CUH_
