// GGUF encoding: header, key/values, tensor infos, padding to the alignment, then each tensor's
// bytes (padded). Tensor bytes are produced and written one tensor at a time.
#include "engine/model/gguf_writer.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/model/gguf.h"

namespace modserve::engine {
namespace {

static_assert(std::endian::native == std::endian::little, "GGUF is written little-endian");

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}
void PutString(std::string* out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out->append(s);
}
void PutKey(std::string* out, const std::string& key, GgufType type) {
  PutString(out, key);
  Put<uint32_t>(out, static_cast<uint32_t>(type));
}

// A FILE* closed on scope exit.
struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

GgufWriter::GgufWriter(uint32_t alignment) : alignment_(alignment) {
  if (alignment_ != 32) AddU32("general.alignment", alignment_);
}

void GgufWriter::AddString(std::string key, std::string value) {
  PutKey(&kv_bytes_, key, GgufType::kString);
  PutString(&kv_bytes_, value);
  keys_.push_back(std::move(key));
}
void GgufWriter::AddBool(std::string key, bool value) {
  PutKey(&kv_bytes_, key, GgufType::kBool);
  Put<uint8_t>(&kv_bytes_, value ? 1 : 0);
  keys_.push_back(std::move(key));
}
void GgufWriter::AddU32(std::string key, uint32_t value) {
  PutKey(&kv_bytes_, key, GgufType::kU32);
  Put(&kv_bytes_, value);
  keys_.push_back(std::move(key));
}
void GgufWriter::AddI32(std::string key, int32_t value) {
  PutKey(&kv_bytes_, key, GgufType::kI32);
  Put(&kv_bytes_, value);
  keys_.push_back(std::move(key));
}
void GgufWriter::AddU64(std::string key, uint64_t value) {
  PutKey(&kv_bytes_, key, GgufType::kU64);
  Put(&kv_bytes_, value);
  keys_.push_back(std::move(key));
}
void GgufWriter::AddF32(std::string key, float value) {
  PutKey(&kv_bytes_, key, GgufType::kF32);
  Put(&kv_bytes_, value);
  keys_.push_back(std::move(key));
}
void GgufWriter::AddF64(std::string key, double value) {
  PutKey(&kv_bytes_, key, GgufType::kF64);
  Put(&kv_bytes_, value);
  keys_.push_back(std::move(key));
}
void GgufWriter::AddStringArray(std::string key, const std::vector<std::string>& values) {
  PutKey(&kv_bytes_, key, GgufType::kArray);
  Put<uint32_t>(&kv_bytes_, static_cast<uint32_t>(GgufType::kString));
  Put<uint64_t>(&kv_bytes_, values.size());
  for (const std::string& v : values) PutString(&kv_bytes_, v);
  keys_.push_back(std::move(key));
}
void GgufWriter::AddF32Array(std::string key, const std::vector<float>& values) {
  PutKey(&kv_bytes_, key, GgufType::kArray);
  Put<uint32_t>(&kv_bytes_, static_cast<uint32_t>(GgufType::kF32));
  Put<uint64_t>(&kv_bytes_, values.size());
  for (float v : values) Put(&kv_bytes_, v);
  keys_.push_back(std::move(key));
}
void GgufWriter::AddF64Array(std::string key, const std::vector<double>& values) {
  PutKey(&kv_bytes_, key, GgufType::kArray);
  Put<uint32_t>(&kv_bytes_, static_cast<uint32_t>(GgufType::kF64));
  Put<uint64_t>(&kv_bytes_, values.size());
  for (double v : values) Put(&kv_bytes_, v);
  keys_.push_back(std::move(key));
}
void GgufWriter::AddI32Array(std::string key, const std::vector<int32_t>& values) {
  PutKey(&kv_bytes_, key, GgufType::kArray);
  Put<uint32_t>(&kv_bytes_, static_cast<uint32_t>(GgufType::kI32));
  Put<uint64_t>(&kv_bytes_, values.size());
  for (int32_t v : values) Put(&kv_bytes_, v);
  keys_.push_back(std::move(key));
}

void GgufWriter::AddTensor(std::string name, uint32_t ggml_type, std::vector<int64_t> ne,
                           Fill fill) {
  tensors_.push_back({std::move(name), ggml_type, std::move(ne), std::move(fill)});
}

uint64_t GgufWriter::TensorBytes(uint32_t ggml_type, const std::vector<int64_t>& ne) {
  const GgmlTypeInfo* t = FindGgmlType(ggml_type);
  if (t == nullptr || ne.empty() || ne.size() > 4) return 0;
  uint64_t numel = 1;
  for (int64_t d : ne) {
    if (d < 0 || __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) return 0;
  }
  if (ne[0] % t->block_elems != 0) return 0;
  return numel / static_cast<uint64_t>(t->block_elems) * t->block_bytes;
}

absl::Status GgufWriter::Write(const std::string& path) const {
  std::set<std::string> seen;
  for (const std::string& k : keys_) {
    if (!seen.insert(k).second) {
      return absl::InvalidArgumentError(absl::StrCat("GGUF metadata key '", k, "' added twice"));
    }
  }
  if (alignment_ == 0 || !std::has_single_bit(alignment_)) {
    return absl::InvalidArgumentError(absl::StrCat("alignment ", alignment_,
                                                   " is not a power of two"));
  }
  std::string head;
  Put<uint32_t>(&head, 0x46554747);  // "GGUF"
  Put<uint32_t>(&head, 3);
  Put<uint64_t>(&head, tensors_.size());
  Put<uint64_t>(&head, keys_.size());
  head += kv_bytes_;
  seen.clear();
  std::vector<uint64_t> bytes;
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    if (!seen.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("GGUF tensor '", t.name, "' added twice"));
    }
    const uint64_t n = TensorBytes(t.ggml_type, t.ne);
    const GgmlTypeInfo* type = FindGgmlType(t.ggml_type);
    if (type == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("GGUF tensor '", t.name, "': unknown ggml type ", t.ggml_type));
    }
    if (n == 0 && !(t.ne.size() >= 1 && t.ne.size() <= 4 && t.ne[0] % type->block_elems == 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GGUF tensor '", t.name, "': bad dims for ", std::string(type->name), " (",
          t.ne.size(), " dims, rows of ", t.ne.empty() ? 0 : t.ne[0], ")"));
    }
    PutString(&head, t.name);
    Put<uint32_t>(&head, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) Put<uint64_t>(&head, static_cast<uint64_t>(d));
    Put<uint32_t>(&head, t.ggml_type);
    Put<uint64_t>(&head, offset);
    bytes.push_back(n);
    offset += (n + alignment_ - 1) / alignment_ * alignment_;
  }
  head.resize((head.size() + alignment_ - 1) / alignment_ * alignment_, '\0');

  const std::string tmp = path + ".tmp";
  std::unique_ptr<std::FILE, FileCloser> out(std::fopen(tmp.c_str(), "wb"));
  auto io_error = [&](absl::string_view what) {
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat(path, ": ", what, ": ", std::strerror(errno)));
  };
  if (out == nullptr) return io_error("cannot create");
  if (std::fwrite(head.data(), 1, head.size(), out.get()) != head.size()) {
    return io_error("write failed");
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const uint64_t padded = (bytes[i] + alignment_ - 1) / alignment_ * alignment_;
    std::vector<uint8_t> buf(padded, 0);
    if (absl::Status s = tensors_[i].fill(buf.data()); !s.ok()) {
      out.reset();
      std::remove(tmp.c_str());
      return s;
    }
    if (std::fwrite(buf.data(), 1, buf.size(), out.get()) != buf.size()) {
      return io_error("write failed");
    }
  }
  if (std::fflush(out.get()) != 0) return io_error("write failed");
  out.reset();
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return io_error("cannot rename the .tmp file");
  return absl::OkStatus();
}

}  // namespace modserve::engine
