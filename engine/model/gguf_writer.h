// GgufWriter: writes a GGUF v3 file (little-endian, llama.cpp's layout) from metadata key/values
// and tensors whose bytes are produced one at a time, so a model larger than memory can be
// written. It validates nothing about models; what a model file must hold is gguf_model.h's.
// Not part of the serving engine (tools/ and tests link it).
#ifndef MODSERVE_ENGINE_MODEL_GGUF_WRITER_H_
#define MODSERVE_ENGINE_MODEL_GGUF_WRITER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace modserve::engine {

class GgufWriter {
 public:
  // Writes the bytes of one tensor into `dst` (exactly the tensor's byte count).
  using Fill = std::function<absl::Status(uint8_t* dst)>;

  // Tensor data offsets are multiples of `alignment` (a power of two); a value other than 32 is
  // written as general.alignment.
  explicit GgufWriter(uint32_t alignment = 32);

  // Metadata, written in the order added. A key added twice makes Write() fail.
  void AddString(std::string key, std::string value);
  void AddBool(std::string key, bool value);
  void AddU32(std::string key, uint32_t value);
  void AddI32(std::string key, int32_t value);
  void AddU64(std::string key, uint64_t value);
  void AddF32(std::string key, float value);
  void AddF64(std::string key, double value);
  void AddStringArray(std::string key, const std::vector<std::string>& values);
  void AddF32Array(std::string key, const std::vector<float>& values);
  void AddF64Array(std::string key, const std::vector<double>& values);
  void AddI32Array(std::string key, const std::vector<int32_t>& values);

  // A tensor of ggml type `ggml_type` with dims `ne` (innermost first, 1..4 of them); `fill` is
  // called once, during Write(), with a buffer of the tensor's bytes. Tensors are stored in the
  // order added.
  void AddTensor(std::string name, uint32_t ggml_type, std::vector<int64_t> ne, Fill fill);

  // Writes everything to `path` (through `path`.tmp, renamed at the end, so a failed write leaves
  // no half file under the final name). InvalidArgument for a duplicate key or tensor name, an
  // unknown ggml type, bad dims or a row length that is not a multiple of the type's block;
  // whatever a Fill returns; Internal for I/O errors (naming the path).
  absl::Status Write(const std::string& path) const;

  // Bytes of a tensor of `ggml_type` with dims `ne`; 0 for an unknown type or bad dims.
  static uint64_t TensorBytes(uint32_t ggml_type, const std::vector<int64_t>& ne);

 private:
  struct Tensor {
    std::string name;
    uint32_t ggml_type;
    std::vector<int64_t> ne;
    Fill fill;
  };
  uint32_t alignment_;
  std::vector<std::string> keys_;
  std::string kv_bytes_;  // every key/value, encoded
  std::vector<Tensor> tensors_;
};

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_MODEL_GGUF_WRITER_H_
