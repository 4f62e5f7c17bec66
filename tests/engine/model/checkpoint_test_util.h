// Test-only helpers for the model unit: a StatusIs matcher (the pinned Abseil has none), a
// scratch directory, and a tiny safetensors writer laid out like tools/modref/safetensors_io.py.
// The writer is deliberately separate from the reader under test and can emit malformed files.
#ifndef MODSERVE_TESTS_ENGINE_MODEL_CHECKPOINT_TEST_UTIL_H_
#define MODSERVE_TESTS_ENGINE_MODEL_CHECKPOINT_TEST_UTIL_H_

#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/common/dtype.h"
#include "engine/common/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace modserve::engine::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

// Matches a Status or StatusOr whose code is `code` and whose message contains `substr`.
MATCHER_P2(StatusIs, code, substr,
           absl::StrCat("has code ", absl::StatusCodeToString(code), " and a message containing \"",
                        substr, "\"")) {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code && absl::StrContains(s.message(), substr);
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.ok();
}

// A fresh directory under the test temp dir, removed with everything in it on destruction.
class ScratchDir {
 public:
  ScratchDir() {
    std::string templ =
        (std::filesystem::path(::testing::TempDir()) / "modserve_model_XXXXXX").string();
    MODSERVE_CHECK(mkdtemp(templ.data()) != nullptr) << templ;
    path_ = templ;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  std::string File(absl::string_view name) const { return absl::StrCat(path_, "/", name); }

 private:
  std::string path_;
};

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  MODSERVE_CHECK(out.good()) << path;
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  MODSERVE_CHECK(out.good()) << path;
}

struct TestTensor {
  std::string name;
  std::string dtype;  // as safetensors spells it; any string, so tests can write "I8"
  std::vector<int64_t> shape;
  std::string bytes;  // raw little-endian data
};

inline TestTensor F32Tensor(std::string name, std::vector<int64_t> shape,
                            const std::vector<float>& values) {
  std::string bytes(values.size() * 4, '\0');
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return {std::move(name), "F32", std::move(shape), std::move(bytes)};
}

inline TestTensor Bf16Tensor(std::string name, std::vector<int64_t> shape,
                             const std::vector<float>& values) {
  std::string bytes;
  for (float v : values) {
    const uint16_t b = F32ToBf16(v).bits;
    bytes.append(reinterpret_cast<const char*>(&b), 2);
  }
  return {std::move(name), "BF16", std::move(shape), std::move(bytes)};
}

inline TestTensor F16Tensor(std::string name, std::vector<int64_t> shape,
                            const std::vector<float>& values) {
  std::string bytes;
  for (float v : values) {
    const uint16_t b = F32ToF16(v).bits;
    bytes.append(reinterpret_cast<const char*>(&b), 2);
  }
  return {std::move(name), "F16", std::move(shape), std::move(bytes)};
}

inline int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// `n` seeded values in [-1, 1).
inline std::vector<float> RandomValues(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// The 8-byte length, the header text and the data, with the length field given explicitly.
inline std::string RawSafetensors(uint64_t header_len, const std::string& header,
                                  const std::string& data) {
  std::string out(8, '\0');
  std::memcpy(out.data(), &header_len, 8);
  return out + header + data;
}

struct SafetensorsParts {
  std::string header;  // JSON text, unpadded
  std::string data;    // the data section
};

// Header and data for `tensors` in order, each tensor's data padded to `align` bytes.
inline SafetensorsParts MakeParts(const std::vector<TestTensor>& tensors, size_t align = 8) {
  std::vector<std::string> entries = {R"("__metadata__":{"format":"pt"})"};
  SafetensorsParts parts;
  for (const TestTensor& t : tensors) {
    const size_t begin = parts.data.size();
    parts.data += t.bytes;
    entries.push_back(absl::StrCat("\"", t.name, "\":{\"dtype\":\"", t.dtype, "\",\"shape\":[",
                                   absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", begin, ",",
                                   parts.data.size(), "]}"));
    while (parts.data.size() % align != 0) parts.data.push_back('\0');
  }
  parts.header = absl::StrCat("{", absl::StrJoin(entries, ","), "}");
  return parts;
}

// A well-formed file laid out as the reference writes it: the header padded with spaces so
// that the data section starts on an `align`-byte boundary of the file.
inline std::string SafetensorsBytes(const std::vector<TestTensor>& tensors, size_t align = 8) {
  SafetensorsParts parts = MakeParts(tensors, align);
  while ((8 + parts.header.size()) % align != 0) parts.header.push_back(' ');
  return RawSafetensors(parts.header.size(), parts.header, parts.data);
}

inline void WriteSafetensors(const std::string& path, const std::vector<TestTensor>& tensors,
                             size_t align = 8) {
  WriteBytes(path, SafetensorsBytes(tensors, align));
}

}  // namespace modserve::engine::testing

#endif  // MODSERVE_TESTS_ENGINE_MODEL_CHECKPOINT_TEST_UTIL_H_
