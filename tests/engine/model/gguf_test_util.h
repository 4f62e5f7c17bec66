// Test-only GGUF writer at the byte level, written from the GGUF specification independently of
// the reader under test and of engine/model/gguf_writer.h. Every field can be overridden, so tests
// can emit malformed files (lying counts, offsets, types).
#ifndef MODSERVE_TESTS_ENGINE_MODEL_GGUF_TEST_UTIL_H_
#define MODSERVE_TESTS_ENGINE_MODEL_GGUF_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace modserve::engine::testing {

// GGUF value type numbers, spelled out here rather than taken from gguf.h.
namespace gguf_type {
constexpr uint32_t kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
                   kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12;
}  // namespace gguf_type
// ggml tensor type numbers.
namespace ggml_type {
constexpr uint32_t kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8,
                   kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kIQ4_NL = 20, kF64 = 28, kBF16 = 30;
}  // namespace ggml_type

inline void PutU32(std::string* out, uint32_t v) {
  out->append(reinterpret_cast<const char*>(&v), 4);
}
inline void PutU64(std::string* out, uint64_t v) {
  out->append(reinterpret_cast<const char*>(&v), 8);
}
inline void PutString(std::string* out, const std::string& s) {
  PutU64(out, s.size());
  out->append(s);
}
template <typename T>
std::string Bytes(const std::vector<T>& values) {
  std::string s(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(s.data(), values.data(), s.size());
  return s;
}

class GgufBuilder {
 public:
  uint32_t magic = 0x46554747;  // "GGUF"
  uint32_t version = 3;
  std::optional<uint64_t> tensor_count;  // overrides the true count
  std::optional<uint64_t> kv_count;
  uint32_t alignment = 32;  // layout only; write general.alignment with KvU32 to declare it

  // One key/value whose value bytes (after the type) are given raw.
  GgufBuilder& KvRaw(const std::string& key, uint32_t type, const std::string& value) {
    std::string kv;
    PutString(&kv, key);
    PutU32(&kv, type);
    kv += value;
    kvs_.push_back(std::move(kv));
    return *this;
  }
  GgufBuilder& KvU32(const std::string& key, uint32_t v) {
    return KvRaw(key, gguf_type::kU32, Bytes(std::vector<uint32_t>{v}));
  }
  GgufBuilder& KvI32(const std::string& key, int32_t v) {
    return KvRaw(key, gguf_type::kI32, Bytes(std::vector<int32_t>{v}));
  }
  GgufBuilder& KvU64(const std::string& key, uint64_t v) {
    return KvRaw(key, gguf_type::kU64, Bytes(std::vector<uint64_t>{v}));
  }
  GgufBuilder& KvI64(const std::string& key, int64_t v) {
    return KvRaw(key, gguf_type::kI64, Bytes(std::vector<int64_t>{v}));
  }
  GgufBuilder& KvF32(const std::string& key, float v) {
    return KvRaw(key, gguf_type::kF32, Bytes(std::vector<float>{v}));
  }
  GgufBuilder& KvF64(const std::string& key, double v) {
    return KvRaw(key, gguf_type::kF64, Bytes(std::vector<double>{v}));
  }
  GgufBuilder& KvBool(const std::string& key, bool v) {
    return KvRaw(key, gguf_type::kBool, std::string(1, v ? '\1' : '\0'));
  }
  GgufBuilder& KvString(const std::string& key, const std::string& v) {
    std::string s;
    PutString(&s, v);
    return KvRaw(key, gguf_type::kString, s);
  }
  GgufBuilder& KvArray(const std::string& key, uint32_t elem_type, uint64_t count,
                       const std::string& elems) {
    std::string s;
    PutU32(&s, elem_type);
    PutU64(&s, count);
    return KvRaw(key, gguf_type::kArray, s + elems);
  }
  GgufBuilder& KvStringArray(const std::string& key, const std::vector<std::string>& v) {
    std::string elems;
    for (const std::string& e : v) PutString(&elems, e);
    return KvArray(key, gguf_type::kString, v.size(), elems);
  }
  GgufBuilder& KvF32Array(const std::string& key, const std::vector<float>& v) {
    return KvArray(key, gguf_type::kF32, v.size(), Bytes(v));
  }
  GgufBuilder& KvI32Array(const std::string& key, const std::vector<int32_t>& v) {
    return KvArray(key, gguf_type::kI32, v.size(), Bytes(v));
  }

  // A tensor; `ne` innermost first. Its data is placed after the previous tensor's, padded to
  // the alignment, unless `offset` says otherwise.
  GgufBuilder& Tensor(const std::string& name, uint32_t type, std::vector<uint64_t> ne,
                      std::string data, std::optional<uint64_t> offset = std::nullopt) {
    tensors_.push_back({name, type, std::move(ne), std::move(data), offset});
    return *this;
  }

  std::string Build() const {
    std::string out;
    PutU32(&out, magic);
    PutU32(&out, version);
    PutU64(&out, tensor_count.value_or(tensors_.size()));
    PutU64(&out, kv_count.value_or(kvs_.size()));
    for (const std::string& kv : kvs_) out += kv;
    std::string data;
    for (const TestGgufTensor& t : tensors_) {
      while (data.size() % alignment != 0) data.push_back('\0');
      PutString(&out, t.name);
      PutU32(&out, static_cast<uint32_t>(t.ne.size()));
      for (uint64_t d : t.ne) PutU64(&out, d);
      PutU32(&out, t.type);
      PutU64(&out, t.offset.value_or(data.size()));
      data += t.data;
    }
    while (out.size() % alignment != 0) out.push_back('\0');
    return out + data;
  }

 private:
  struct TestGgufTensor {
    std::string name;
    uint32_t type;
    std::vector<uint64_t> ne;
    std::string data;
    std::optional<uint64_t> offset;
  };
  std::vector<std::string> kvs_;
  std::vector<TestGgufTensor> tensors_;
};

}  // namespace modserve::engine::testing

#endif  // MODSERVE_TESTS_ENGINE_MODEL_GGUF_TEST_UTIL_H_
