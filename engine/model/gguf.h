// GgufFile: a GGUF (v2 or v3, little-endian) file memory-mapped read-only, with every header field
// bounds-checked on open: metadata key/values of every GGUF type, tensor infos and the data
// section. It knows nothing of models: which keys and tensors a Llama needs is gguf_model.h's.
#ifndef MODSERVE_ENGINE_MODEL_GGUF_H_
#define MODSERVE_ENGINE_MODEL_GGUF_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/common/dtype.h"
#include "engine/model/checkpoint.h"

namespace modserve::engine {

// Metadata value types, numbered as GGUF stores them.
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// "UINT8", "INT32", "STRING", ... as the GGUF specification names them.
std::string_view GgufTypeName(GgufType t);

// One ggml tensor type: its name and block layout (block_elems elements in block_bytes bytes;
// 1 element for the plain types).
struct GgmlTypeInfo {
  uint32_t id = 0;          // the ggml_type number stored in the file
  std::string_view name;    // "F32", "Q4_K", ...
  int64_t block_elems = 1;  // elements per block
  uint64_t block_bytes = 0;
};

// The ggml type with this id, or nullptr for an id ggml never assigned (or has retired).
const GgmlTypeInfo* FindGgmlType(uint32_t id);
// The DType the engine holds a ggml type in, when it has one (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
// Q4_K, Q5_K, Q6_K); nullopt for every other type.
std::optional<DType> DTypeFromGgmlType(uint32_t id);
// The ggml type id of a weight DType (every DType but kI32, which is not a weight type).
std::optional<uint32_t> GgmlTypeFromDType(DType t);

// One metadata value. Views point into the mapping and live as long as the GgufFile.
struct GgufValue {
  GgufType type = GgufType::kU8;
  // kArray only: the element type (never kArray: nested arrays are rejected) and count.
  GgufType array_type = GgufType::kU8;
  uint64_t array_size = 0;
  // Scalars: the value's bytes (little-endian, unaligned). Arrays of numbers or bools: the first
  // element, array_size elements back to back. nullptr for strings and arrays of strings.
  const uint8_t* data = nullptr;
  std::string_view string;                // kString
  std::vector<std::string_view> strings;  // kArray of kString, array_size entries
};

// One tensor info, checked against the file: its bytes lie inside the data section and overlap
// no other tensor's.
struct GgufTensor {
  std::string_view name;                 // into the mapping
  uint32_t ggml_type = 0;                // always a known id (FindGgmlType != nullptr)
  std::optional<DType> dtype;            // DTypeFromGgmlType(ggml_type)
  int ndim = 0;                          // 0..4
  std::array<int64_t, 4> ne{1, 1, 1, 1};  // ggml order: ne[0] is the innermost (row) length
  uint64_t offset = 0;                   // from the start of the data section
  uint64_t bytes = 0;                    // numel / block_elems * block_bytes
  const uint8_t* data = nullptr;         // into the mapping; non-null even when bytes == 0

  int64_t numel() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  // Outer to inner (the engine's and safetensors' order): ne reversed, ndim entries.
  std::vector<int64_t> shape() const;
};

// A parsed GGUF file.
//
// Ownership: the GgufFile owns the mapping; every string_view, value and tensor pointer it hands
// out points into it and stays valid until the GgufFile is destroyed. Moving a GgufFile keeps them
// valid (the mapped bytes do not move). The tensor bytes are PROT_READ.
// Threads: after Open(), every method is const and safe to call from any number of threads.
class GgufFile {
 public:
  // Opens and checks `path`. Status codes:
  //   NotFound   no such file
  //   DataLoss   anything malformed: short file, bad magic, a version other than 2 or 3, counts
  //              that the file's size cannot hold, strings or arrays running past the end, an
  //              unknown value type, nested arrays, a bool byte other than 0/1, a duplicate key or
  //              tensor name, a bad general.alignment (not a UINT32 power of two), a tensor with
  //              more than 4 dims, a dim over 2^63 - 1 or an element count overflowing 64 bits,
  //              an unknown ggml type id, a row length that is not a multiple of the type's block,
  //              an offset not a multiple of the alignment, a tensor past the end of the data
  //              section (a truncated file) or overlapping another.
  // Every message starts with the path and names the key or tensor at fault. Nothing is sized
  // from a count before the file has been shown to hold that many entries.
  static absl::StatusOr<GgufFile> Open(const std::string& path);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  const std::string& path() const { return file_.path(); }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }    // general.alignment, default 32
  uint64_t data_offset() const { return data_offset_; }  // file offset of the data section
  uint64_t file_size() const { return file_.size(); }

  // ---- metadata ----
  // Every key/value, in file order.
  const std::vector<std::pair<std::string_view, GgufValue>>& metadata() const { return kvs_; }
  // nullptr when the file has no key `key`.
  const GgufValue* Find(std::string_view key) const;
  bool Contains(std::string_view key) const { return Find(key) != nullptr; }

  // Typed getters. NotFound when the key is absent ("PATH: metadata key 'K' is missing");
  // InvalidArgument when its type does not fit ("... has type STRING, expected an integer") or
  // its value is out of the requested type's range. Integer getters accept any integer type
  // (never a bool) whose value fits; float getters accept FLOAT32 and FLOAT64.
  absl::StatusOr<std::string_view> GetString(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<uint32_t> GetU32(std::string_view key) const;
  absl::StatusOr<int32_t> GetI32(std::string_view key) const;
  absl::StatusOr<uint64_t> GetU64(std::string_view key) const;
  absl::StatusOr<int64_t> GetI64(std::string_view key) const;
  absl::StatusOr<float> GetF32(std::string_view key) const;
  absl::StatusOr<double> GetF64(std::string_view key) const;
  // Arrays, with the same codes; the element type must fit as for the scalar getters (an array
  // of strings for GetStringArray). The span lives as long as the GgufFile.
  absl::StatusOr<absl::Span<const std::string_view>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<float>> GetF32Array(std::string_view key) const;
  absl::StatusOr<std::vector<double>> GetF64Array(std::string_view key) const;
  absl::StatusOr<std::vector<int32_t>> GetI32Array(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetI64Array(std::string_view key) const;

  // ---- tensors ----
  // Every tensor info, in file order.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  // nullptr when the file has no tensor `name`.
  const GgufTensor* FindTensor(std::string_view name) const;

  // Hands the mapping over (to a Checkpoint that serves these tensors); this GgufFile is then
  // empty and must not be used again. The tensors' data pointers stay valid in the mapping.
  MappedFile ReleaseMapping() &&;

 private:
  explicit GgufFile(MappedFile file) : file_(std::move(file)) {}
  friend class GgufParser;

  MappedFile file_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string_view, GgufValue>> kvs_;
  absl::flat_hash_map<std::string_view, size_t> kv_index_;
  std::vector<GgufTensor> tensors_;
  absl::flat_hash_map<std::string_view, size_t> tensor_index_;
};

// A key, tensor name or string value from a file as it is safe to print: non-printable bytes
// escaped, cut to 80 characters.
std::string GgufPrintable(std::string_view s);

// True when the file at `path` starts with the GGUF magic (false for a directory or a short or
// unreadable file).
bool IsGgufFile(const std::string& path);

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_MODEL_GGUF_H_
