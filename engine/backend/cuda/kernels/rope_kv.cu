// RoPE on q and k plus the write of k and v into the paged KV pool, one CTA per token.
// Bit-compatible with the reference: cos/sin from fp64 angles rounded to f32, and the rotation with
// explicitly rounded multiplies and adds (no FMA contraction), so the stored bf16/f16 entries do not
// flip at rounding boundaries.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "engine/backend/cuda/kernels/device_utils.cuh"
#include "engine/backend/cuda/kernels/kernels.h"

namespace modserve::backend::cuda::kernels {
namespace {

// Enough threads that a token's 32 x 64 query pairs take two rounds: each round waits on its
// loads, and at 128 threads the sixteen rounds made one decode token cost ~13 us on an H200.
constexpr int kThreads = 1024;

__device__ __forceinline__ void Rotate(float* v, int j, int half, float c, float s) {
  const float a = v[j], b = v[j + half];
  v[j] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  v[j + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

// Pool layout [num_pages, 2 * n_kv_heads, block_size, head_dim]: K of kv head h at plane h, V at
// plane n_kv_heads + h. Dynamic shared memory: cos[half] then sin[half].
template <typename T>
__global__ void __launch_bounds__(kThreads) RopeKvKernel(RopeKvArgs a) {
  extern __shared__ float cs[];
  const int64_t i = blockIdx.x;
  // An uncounted token: its position and slot are not read and no KV entry is written. The whole
  // CTA leaves before the barrier.
  if (i >= EffectiveRows(a.rows, a.n)) return;
  const int hd = a.head_dim, half = hd / 2, kv = a.n_kv_heads;
  const int32_t pos = a.positions[i];
  TrapUnless(pos >= 0);
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    // Same expressions as the reference: 1 / theta^(2j / hd) and pos * inv_freq in fp64.
    const double inv_freq = 1.0 / pow(a.rope_theta, static_cast<double>(2 * j) / hd);
    const double angle = static_cast<double>(pos) * inv_freq;
    cs[j] = static_cast<float>(cos(angle));
    cs[half + j] = static_cast<float>(sin(angle));
  }
  __syncthreads();

  const int32_t slot = a.slots[i];
  TrapUnless(slot >= 0 && slot < a.num_pages * a.block_size);
  const int64_t page = slot / a.block_size, offset = slot % a.block_size;
  T* pool = static_cast<T*>(a.kv_pool);
  auto entry = [&](int plane) {  // start of this token's head_dim vector in `plane`
    return pool + ((page * 2 * kv + plane) * a.block_size + offset) * hd;
  };

  float* q = a.q + i * a.n_heads * hd;
  for (int p = threadIdx.x; p < a.n_heads * half; p += blockDim.x) {
    const int h = p / half, j = p % half;
    Rotate(q + h * hd, j, half, cs[j], cs[half + j]);
  }
  float* k = a.k + i * kv * hd;
  for (int p = threadIdx.x; p < kv * half; p += blockDim.x) {
    const int h = p / half, j = p % half;
    float* kh = k + h * hd;
    Rotate(kh, j, half, cs[j], cs[half + j]);
    T* dst = entry(h);
    dst[j] = FromF32<T>(kh[j]);
    dst[j + half] = FromF32<T>(kh[j + half]);
  }
  const float* v = a.v + i * kv * hd;
  for (int p = threadIdx.x; p < kv * hd; p += blockDim.x) {
    const int h = p / hd, d = p % hd;
    entry(kv + h)[d] = FromF32<T>(v[h * hd + d]);
  }
}

template <typename T>
cudaError_t Launch(cudaStream_t stream, const RopeKvArgs& args) {
  const size_t smem = sizeof(float) * static_cast<size_t>(args.head_dim);
  RopeKvKernel<T><<<static_cast<unsigned int>(args.n), kThreads, smem, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace

cudaError_t RopeAndAppendKv(cudaStream_t stream, const RopeKvArgs& args) {
  if (args.n == 0) return cudaSuccess;
  switch (args.pool_dtype) {
    case DType::kF32:
      return Launch<float>(stream, args);
    case DType::kF16:
      return Launch<__half>(stream, args);
    case DType::kBF16:
      return Launch<__nv_bfloat16>(stream, args);
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
