// A non-owning view of a dense, row-major tensor: dtype, up to 4 dims, data pointer, device.
// It never allocates or frees; whoever made the buffer keeps it alive while views exist.
#ifndef MODSERVE_ENGINE_COMMON_TENSOR_VIEW_H_
#define MODSERVE_ENGINE_COMMON_TENSOR_VIEW_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "engine/common/dtype.h"
#include "engine/common/logging.h"

namespace modserve {

enum class Device : uint8_t { kCpu, kCuda };

struct TensorView {
  static constexpr int kMaxDims = 4;

  DType dtype = DType::kF32;
  Device device = Device::kCpu;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};  // outer to inner, row-major, contiguous
  void* data = nullptr;

  TensorView() = default;
  TensorView(void* ptr, DType t, std::initializer_list<int64_t> dims, Device dev = Device::kCpu)
      : dtype(t), device(dev), data(ptr) {
    MODSERVE_CHECK_LE(static_cast<int>(dims.size()), kMaxDims);
    for (int64_t d : dims) shape[ndim++] = d;
  }

  int64_t dim(int i) const {
    MODSERVE_DCHECK(i >= 0 && i < ndim);
    return shape[i];
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  // Quantized views: the innermost dim is a multiple of the block (checked where they are made).
  size_t bytes() const { return DTypeRowBytes(dtype, numel()); }
  bool empty() const { return data == nullptr; }

  // Typed access; CHECKs that T matches the dtype (a caller bug otherwise).
  template <typename T>
  T* as() const;

  // Rows [begin, begin + count) of the outermost dimension.
  TensorView rows(int64_t begin, int64_t count) const {
    MODSERVE_CHECK(ndim >= 1 && begin >= 0 && count >= 0 && begin + count <= shape[0]);
    TensorView v = *this;
    v.shape[0] = count;
    v.data = static_cast<char*>(data) + static_cast<size_t>(begin) * (bytes() / (shape[0] ? shape[0] : 1));
    return v;
  }

  std::string ShapeString() const {
    std::string s = "[";
    for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }
};

template <>
inline float* TensorView::as<float>() const {
  MODSERVE_CHECK(dtype == DType::kF32) << DTypeName(dtype);
  return static_cast<float*>(data);
}
template <>
inline bf16_t* TensorView::as<bf16_t>() const {
  MODSERVE_CHECK(dtype == DType::kBF16) << DTypeName(dtype);
  return static_cast<bf16_t*>(data);
}
template <>
inline f16_t* TensorView::as<f16_t>() const {
  MODSERVE_CHECK(dtype == DType::kF16) << DTypeName(dtype);
  return static_cast<f16_t*>(data);
}

template <>
inline int32_t* TensorView::as<int32_t>() const {
  MODSERVE_CHECK(dtype == DType::kI32) << DTypeName(dtype);
  return static_cast<int32_t*>(data);
}

}  // namespace modserve

#endif  // MODSERVE_ENGINE_COMMON_TENSOR_VIEW_H_
