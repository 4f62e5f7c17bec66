// Host-side tensors for the backend tests: owned bytes of any dtype, seeded random fills rounded
// to the dtype, and a whole-tensor closeness check. Shared by the conformance and CUDA tests.
#ifndef MODSERVE_TESTS_ENGINE_BACKEND_HOST_TENSOR_H_
#define MODSERVE_TESTS_ENGINE_BACKEND_HOST_TENSOR_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/common/dtype.h"
#include "engine/common/tensor_view.h"
#include "gtest/gtest.h"

namespace modserve::backend::test_util {

struct HostTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> dims;
  std::vector<uint8_t> storage;
  int64_t numel_ = 0;

  HostTensor() = default;
  HostTensor(DType t, std::vector<int64_t> d) : dtype(t), dims(std::move(d)) {
    int64_t numel = 1;
    for (int64_t x : dims) numel *= x;
    numel_ = numel;
    storage.assign(DTypeRowBytes(dtype, numel), 0);
  }
  int64_t numel() const { return numel_; }
  TensorView view() { return MakeView(storage.data(), Device::kCpu); }
  TensorView MakeView(void* data, Device device) const {
    TensorView v;
    v.dtype = dtype;
    v.device = device;
    v.data = data;
    v.ndim = static_cast<int>(dims.size());
    for (int i = 0; i < v.ndim; ++i) v.shape[i] = dims[i];
    return v;
  }
  float* f32() { return reinterpret_cast<float*>(storage.data()); }
  const float* f32() const { return reinterpret_cast<const float*>(storage.data()); }
  int32_t* i32() { return reinterpret_cast<int32_t*>(storage.data()); }
  // Element i as f32, whatever the dtype.
  float At(int64_t i) const {
    switch (dtype) {
      case DType::kF32: {
        float f;
        std::memcpy(&f, storage.data() + 4 * i, 4);
        return f;
      }
      case DType::kF16: {
        f16_t h;
        std::memcpy(&h, storage.data() + 2 * i, 2);
        return F16ToF32(h);
      }
      case DType::kBF16: {
        bf16_t h;
        std::memcpy(&h, storage.data() + 2 * i, 2);
        return Bf16ToF32(h);
      }
      case DType::kI32: {
        int32_t v;
        std::memcpy(&v, storage.data() + 4 * i, 4);
        return static_cast<float>(v);
      }
      case DType::kQ8_0:
      case DType::kQ4_0:
      case DType::kQ4_1:
      case DType::kQ4_K:
      case DType::kQ6_K:
      case DType::kQ5_K:
      case DType::kQ5_0:
      case DType::kQ5_1:
        break;  // block-quantized: no per-element access here
    }
    return 0.0f;
  }
};

// Normal(0, scale) values, rounded to the tensor's dtype so both sides see exact inputs.
inline HostTensor Random(std::mt19937& rng, DType dtype, std::vector<int64_t> dims, float scale = 1.0f) {
  HostTensor t(dtype, std::move(dims));
  std::normal_distribution<float> dist(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = dist(rng);
    switch (dtype) {
      case DType::kF32:
        std::memcpy(t.storage.data() + 4 * i, &v, 4);
        break;
      case DType::kF16: {
        const f16_t h = F32ToF16(v);
        std::memcpy(t.storage.data() + 2 * i, &h, 2);
        break;
      }
      case DType::kBF16: {
        const bf16_t h = F32ToBf16(v);
        std::memcpy(t.storage.data() + 2 * i, &h, 2);
        break;
      }
      case DType::kI32:
      case DType::kQ8_0:
      case DType::kQ4_0:
      case DType::kQ4_1:
      case DType::kQ4_K:
      case DType::kQ6_K:
      case DType::kQ5_K:
      case DType::kQ5_0:
      case DType::kQ5_1:
        ADD_FAILURE() << "Random() is for plain float tensors";
        break;
    }
  }
  return t;
}

inline HostTensor Ints(const std::vector<int32_t>& values) {
  HostTensor t(DType::kI32, {static_cast<int64_t>(values.size())});
  std::memcpy(t.storage.data(), values.data(), values.size() * 4);
  return t;
}

// max |got - want| <= rel_tol * max(1, max |want|), element by element over the whole tensor.
inline void ExpectClose(const HostTensor& got, const HostTensor& want, double rel_tol,
                 const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  double max_want = 1.0, max_err = 0.0;
  int64_t worst = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    max_want = std::max(max_want, std::fabs(static_cast<double>(want.At(i))));
    const double err = std::fabs(static_cast<double>(got.At(i)) - want.At(i));
    if (!(err <= max_err)) {  // also catches NaN
      max_err = err;
      worst = i;
    }
  }
  EXPECT_LE(max_err, rel_tol * max_want)
      << what << ": worst element " << worst << " got " << got.At(worst) << " want "
      << want.At(worst) << " (max |want| " << max_want << ")";
}

}  // namespace modserve::backend::test_util

#endif  // MODSERVE_TESTS_ENGINE_BACKEND_HOST_TENSOR_H_
