// GGUF parsing: magic, version, counts, key/values, tensor infos, then the aligned data section.
// Every length and count read from the file is compared with the bytes left before anything is
// sized from it, in 64-bit arithmetic that cannot overflow.
#include "engine/model/gguf.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/common/status_macros.h"

namespace modserve::engine {

static_assert(std::endian::native == std::endian::little, "GGUF data is read in place");

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint64_t kHeaderBytes = 4 + 4 + 8 + 8;  // magic, version, tensor count, kv count
// The smallest encodings, which bound how many entries a file of a given size can hold.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;          // empty key, type, a one-byte value
constexpr uint64_t kMinTensorBytes = 8 + 4 + 4 + 8;  // empty name, ndim 0, type, offset
constexpr int kMaxDims = 4;

// Ids as ggml numbers them; the gaps (4, 5, 31-33, 36-38) are types ggml has retired.
constexpr GgmlTypeInfo kGgmlTypes[] = {
    {0, "F32", 1, 4},          {1, "F16", 1, 2},          {2, "Q4_0", 32, 18},
    {3, "Q4_1", 32, 20},       {6, "Q5_0", 32, 22},       {7, "Q5_1", 32, 24},
    {8, "Q8_0", 32, 34},       {9, "Q8_1", 32, 36},       {10, "Q2_K", 256, 84},
    {11, "Q3_K", 256, 110},    {12, "Q4_K", 256, 144},    {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},    {15, "Q8_K", 256, 292},    {16, "IQ2_XXS", 256, 66},
    {17, "IQ2_XS", 256, 74},   {18, "IQ3_XXS", 256, 98},  {19, "IQ1_S", 256, 50},
    {20, "IQ4_NL", 32, 18},    {21, "IQ3_S", 256, 110},   {22, "IQ2_S", 256, 82},
    {23, "IQ4_XS", 256, 136},  {24, "I8", 1, 1},          {25, "I16", 1, 2},
    {26, "I32", 1, 4},         {27, "I64", 1, 8},         {28, "F64", 1, 8},
    {29, "IQ1_M", 256, 56},    {30, "BF16", 1, 2},        {34, "TQ1_0", 256, 54},
    {35, "TQ2_0", 256, 66},    {39, "MXFP4", 32, 17},
};

// Bytes of one scalar of a fixed-size type; 0 for kString and kArray.
uint64_t ScalarBytes(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    case GgufType::kString:
    case GgufType::kArray:
      return 0;
  }
  return 0;
}

bool IsIntegerType(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kU16:
    case GgufType::kI16:
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kU64:
    case GgufType::kI64:
      return true;
    case GgufType::kF32:
    case GgufType::kBool:
    case GgufType::kString:
    case GgufType::kArray:
    case GgufType::kF64:
      return false;
  }
  return false;
}

// Debian's Abseil has its own string_view, which StrCat wants.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// An integer of any GGUF integer type, widened: `is_negative` tells the two halves apart.
struct WideInt {
  bool negative = false;
  uint64_t magnitude = 0;  // the value when !negative; -value when negative
};

WideInt LoadInt(GgufType t, const uint8_t* p) {
  auto signed_value = [](int64_t v) {
    return v < 0 ? WideInt{true, static_cast<uint64_t>(-(v + 1)) + 1}
                 : WideInt{false, static_cast<uint64_t>(v)};
  };
  switch (t) {
    case GgufType::kU8:
      return {false, Load<uint8_t>(p)};
    case GgufType::kI8:
      return signed_value(Load<int8_t>(p));
    case GgufType::kU16:
      return {false, Load<uint16_t>(p)};
    case GgufType::kI16:
      return signed_value(Load<int16_t>(p));
    case GgufType::kU32:
      return {false, Load<uint32_t>(p)};
    case GgufType::kI32:
      return signed_value(Load<int32_t>(p));
    case GgufType::kU64:
      return {false, Load<uint64_t>(p)};
    case GgufType::kI64:
      return signed_value(Load<int64_t>(p));
    case GgufType::kF32:
    case GgufType::kBool:
    case GgufType::kString:
    case GgufType::kArray:
    case GgufType::kF64:
      break;
  }
  return {};
}

std::string IntString(WideInt v) {
  return v.negative ? absl::StrCat("-", v.magnitude) : absl::StrCat(v.magnitude);
}

// True when `v` lies in [lo, hi].
bool Fits(WideInt v, int64_t lo, uint64_t hi) {
  if (v.negative) return lo < 0 && v.magnitude <= static_cast<uint64_t>(-(lo + 1)) + 1;
  return v.magnitude <= hi;
}

template <typename T>
absl::StatusOr<T> IntAs(WideInt v, const std::string& where) {
  const int64_t lo = static_cast<int64_t>(std::numeric_limits<T>::min());
  const uint64_t hi = static_cast<uint64_t>(std::numeric_limits<T>::max());
  if (!Fits(v, lo, hi)) {
    return absl::InvalidArgumentError(absl::StrCat(where, " = ", IntString(v), " is outside [",
                                                   lo, ", ", hi, "]"));
  }
  return v.negative ? static_cast<T>(-static_cast<int64_t>(v.magnitude - 1) - 1)
                    : static_cast<T>(v.magnitude);
}

}  // namespace

std::string_view GgufTypeName(GgufType t) {
  switch (t) {
    case GgufType::kU8:
      return "UINT8";
    case GgufType::kI8:
      return "INT8";
    case GgufType::kU16:
      return "UINT16";
    case GgufType::kI16:
      return "INT16";
    case GgufType::kU32:
      return "UINT32";
    case GgufType::kI32:
      return "INT32";
    case GgufType::kF32:
      return "FLOAT32";
    case GgufType::kBool:
      return "BOOL";
    case GgufType::kString:
      return "STRING";
    case GgufType::kArray:
      return "ARRAY";
    case GgufType::kU64:
      return "UINT64";
    case GgufType::kI64:
      return "INT64";
    case GgufType::kF64:
      return "FLOAT64";
  }
  return "?";
}

const GgmlTypeInfo* FindGgmlType(uint32_t id) {
  for (const GgmlTypeInfo& t : kGgmlTypes) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

std::optional<DType> DTypeFromGgmlType(uint32_t id) {
  switch (id) {
    case 0:
      return DType::kF32;
    case 1:
      return DType::kF16;
    case 2:
      return DType::kQ4_0;
    case 3:
      return DType::kQ4_1;
    case 6:
      return DType::kQ5_0;
    case 7:
      return DType::kQ5_1;
    case 8:
      return DType::kQ8_0;
    case 12:
      return DType::kQ4_K;
    case 13:
      return DType::kQ5_K;
    case 14:
      return DType::kQ6_K;
    case 30:
      return DType::kBF16;
    default:
      return std::nullopt;
  }
}

std::optional<uint32_t> GgmlTypeFromDType(DType t) {
  switch (t) {
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1;
    case DType::kBF16:
      return 30;
    case DType::kQ8_0:
      return 8;
    case DType::kQ4_0:
      return 2;
    case DType::kQ4_1:
      return 3;
    case DType::kQ5_0:
      return 6;
    case DType::kQ5_1:
      return 7;
    case DType::kQ4_K:
      return 12;
    case DType::kQ5_K:
      return 13;
    case DType::kQ6_K:
      return 14;
    case DType::kI32:
      return std::nullopt;
  }
  return std::nullopt;
}

std::string GgufPrintable(std::string_view s) {
  constexpr size_t kMaxChars = 80;
  const bool cut = s.size() > kMaxChars;
  std::string out = absl::CHexEscape(absl::string_view(s.data(), std::min(s.size(), kMaxChars)));
  if (cut) out += "...";
  return out;
}

std::vector<int64_t> GgufTensor::shape() const {
  std::vector<int64_t> s;
  for (int i = ndim - 1; i >= 0; --i) s.push_back(ne[static_cast<size_t>(i)]);
  return s;
}

bool IsGgufFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return false;
  uint8_t magic[4];
  const bool ok = ::read(fd, magic, 4) == 4 && Load<uint32_t>(magic) == kMagic;
  ::close(fd);
  return ok;
}

// ---- parsing ----

// Reads the header of one mapped file into a GgufFile; the one place that touches its privates.
class GgufParser {
 public:
  explicit GgufParser(GgufFile* out)
      : out_(*out), base_(out->file_.data()), size_(out->file_.size()) {}

  absl::Status Parse() {
    if (size_ < kHeaderBytes) {
      return Error(absl::StrCat("file is ", size_, " bytes, too short for the ", kHeaderBytes,
                                "-byte GGUF header"));
    }
    const uint32_t magic = Load<uint32_t>(base_);
    if (magic != kMagic) {
      return Error(absl::StrCat("not a GGUF file: it starts with ",
                                GgufPrintable(std::string_view(
                                    reinterpret_cast<const char*>(base_), 4)),
                                ", not \"GGUF\""));
    }
    const uint32_t version = Load<uint32_t>(base_ + 4);
    if (version != 2 && version != 3) {
      if (version == 1) return Error("GGUF version 1 is not supported (only 2 and 3 are)");
      const uint32_t swapped = __builtin_bswap32(version);
      if (swapped == 2 || swapped == 3) {
        return Error(absl::StrCat("GGUF version ", swapped,
                                  " is stored big-endian; only little-endian files are supported"));
      }
      return Error(absl::StrCat("unknown GGUF version ", version, " (2 and 3 are supported)"));
    }
    out_.version_ = version;
    const uint64_t num_tensors = Load<uint64_t>(base_ + 8);
    const uint64_t num_kvs = Load<uint64_t>(base_ + 16);
    pos_ = kHeaderBytes;
    // Counts are judged against the bytes left before any entry is read or any container sized.
    const uint64_t left = size_ - pos_;
    if (num_kvs > left / kMinKvBytes) {
      return Error(absl::StrCat("metadata count ", num_kvs, " cannot fit in the ", left,
                                " bytes after the header (each key/value takes at least ",
                                kMinKvBytes, ")"));
    }
    if (num_tensors > (left - num_kvs * kMinKvBytes) / kMinTensorBytes) {
      return Error(absl::StrCat("tensor count ", num_tensors, " cannot fit in the ", left,
                                " bytes after the header (each tensor info takes at least ",
                                kMinTensorBytes, ")"));
    }
    for (uint64_t i = 0; i < num_kvs; ++i) MODSERVE_RETURN_IF_ERROR(ParseKv(i));
    MODSERVE_RETURN_IF_ERROR(ParseAlignment());
    for (uint64_t i = 0; i < num_tensors; ++i) MODSERVE_RETURN_IF_ERROR(ParseTensorInfo(i));
    // The data section starts at the next multiple of the alignment (pos_ <= size_ < 2^63).
    const uint64_t a = out_.alignment_;
    out_.data_offset_ = (pos_ + a - 1) / a * a;
    return CheckTensorData();
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat(out_.path(), ": ", what));
  }

  uint64_t Left() const { return size_ - pos_; }

  // `what` names the field for the message ("the key of metadata entry 3", ...).
  absl::StatusOr<uint64_t> ReadU64(absl::string_view what) {
    if (Left() < 8) return Error(absl::StrCat(what, " runs past the end of the file"));
    const uint64_t v = Load<uint64_t>(base_ + pos_);
    pos_ += 8;
    return v;
  }
  absl::StatusOr<uint32_t> ReadU32(absl::string_view what) {
    if (Left() < 4) return Error(absl::StrCat(what, " runs past the end of the file"));
    const uint32_t v = Load<uint32_t>(base_ + pos_);
    pos_ += 4;
    return v;
  }
  absl::StatusOr<std::string_view> ReadString(absl::string_view what) {
    MODSERVE_ASSIGN_OR_RETURN(const uint64_t len, ReadU64(what));
    if (len > Left()) {
      return Error(absl::StrCat(what, " has length ", len, ", past the end of the file (",
                                Left(), " bytes left)"));
    }
    std::string_view s(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return s;
  }
  absl::StatusOr<GgufType> ReadType(absl::string_view what) {
    MODSERVE_ASSIGN_OR_RETURN(const uint32_t t, ReadU32(what));
    if (t > static_cast<uint32_t>(GgufType::kF64)) {
      return Error(absl::StrCat(what, " is ", t, ", not a GGUF value type (0 to 12)"));
    }
    return static_cast<GgufType>(t);
  }

  absl::Status ParseKv(uint64_t idx) {
    MODSERVE_ASSIGN_OR_RETURN(const std::string_view key,
                              ReadString(absl::StrCat("the key of metadata entry ", idx)));
    const std::string where = absl::StrCat("metadata key '", GgufPrintable(key), "'");
    GgufValue v;
    MODSERVE_ASSIGN_OR_RETURN(v.type, ReadType(absl::StrCat(where, ": the value type")));
    if (v.type == GgufType::kArray) {
      MODSERVE_ASSIGN_OR_RETURN(v.array_type,
                                ReadType(absl::StrCat(where, ": the array element type")));
      if (v.array_type == GgufType::kArray) {
        return Error(absl::StrCat(where, " is an array of arrays, which is not supported"));
      }
      MODSERVE_ASSIGN_OR_RETURN(v.array_size, ReadU64(absl::StrCat(where, ": the array length")));
      if (v.array_type == GgufType::kString) {
        if (v.array_size > Left() / 8) {  // each string takes at least its 8-byte length
          return Error(absl::StrCat(where, " has ", v.array_size, " strings, more than the ",
                                    Left(), " bytes left can hold"));
        }
        v.strings.reserve(v.array_size);
        for (uint64_t i = 0; i < v.array_size; ++i) {
          MODSERVE_ASSIGN_OR_RETURN(std::string_view s,
                                    ReadString(absl::StrCat(where, ": string ", i)));
          v.strings.push_back(s);
        }
      } else {
        const uint64_t elem = ScalarBytes(v.array_type);
        if (v.array_size > Left() / elem) {
          return Error(absl::StrCat(where, " has ", v.array_size, " elements of ",
                                    Sv(GgufTypeName(v.array_type)), ", more than the ", Left(),
                                    " bytes left can hold"));
        }
        v.data = base_ + pos_;
        if (v.array_type == GgufType::kBool) {
          for (uint64_t i = 0; i < v.array_size; ++i) {
            if (v.data[i] > 1) {
              return Error(absl::StrCat(where, ": bool element ", i, " is ",
                                        static_cast<int>(v.data[i]), ", neither 0 nor 1"));
            }
          }
        }
        pos_ += v.array_size * elem;
      }
    } else if (v.type == GgufType::kString) {
      MODSERVE_ASSIGN_OR_RETURN(v.string, ReadString(where));
    } else {
      const uint64_t bytes = ScalarBytes(v.type);
      if (Left() < bytes) return Error(absl::StrCat(where, ": the value runs past the end of the file"));
      v.data = base_ + pos_;
      if (v.type == GgufType::kBool && v.data[0] > 1) {
        return Error(absl::StrCat(where, " is a bool of value ", static_cast<int>(v.data[0]),
                                  ", neither 0 nor 1"));
      }
      pos_ += bytes;
    }
    if (!out_.kv_index_.emplace(key, out_.kvs_.size()).second) {
      return Error(absl::StrCat(where, " appears twice"));
    }
    out_.kvs_.emplace_back(key, std::move(v));
    return absl::OkStatus();
  }

  absl::Status ParseAlignment() {
    const GgufValue* v = out_.Find("general.alignment");
    if (v == nullptr) return absl::OkStatus();
    if (v->type != GgufType::kU32) {
      return Error(absl::StrCat("metadata key 'general.alignment' has type ",
                                Sv(GgufTypeName(v->type)), ", expected UINT32"));
    }
    const uint32_t a = Load<uint32_t>(v->data);
    if (a == 0 || !std::has_single_bit(a)) {
      return Error(absl::StrCat("metadata key 'general.alignment' = ", a,
                                " is not a power of two"));
    }
    out_.alignment_ = a;
    return absl::OkStatus();
  }

  absl::Status ParseTensorInfo(uint64_t idx) {
    MODSERVE_ASSIGN_OR_RETURN(const std::string_view name,
                              ReadString(absl::StrCat("the name of tensor info ", idx)));
    const std::string where = absl::StrCat("tensor '", GgufPrintable(name), "'");
    GgufTensor t;
    t.name = name;
    MODSERVE_ASSIGN_OR_RETURN(const uint32_t ndim,
                              ReadU32(absl::StrCat(where, ": the dimension count")));
    if (ndim > kMaxDims) {
      return Error(absl::StrCat(where, " has ", ndim, " dimensions, at most ", kMaxDims,
                                " are supported"));
    }
    t.ndim = static_cast<int>(ndim);
    uint64_t numel = 1;
    bool overflow = false;
    for (uint32_t i = 0; i < ndim; ++i) {
      MODSERVE_ASSIGN_OR_RETURN(const uint64_t d,
                                ReadU64(absl::StrCat(where, ": dimension ", i)));
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Error(absl::StrCat(where, " has dimension ", i, " = ", d, ", over 2^63 - 1"));
      }
      t.ne[i] = static_cast<int64_t>(d);
      overflow = overflow || __builtin_mul_overflow(numel, d, &numel);
    }
    if (overflow || numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Error(absl::StrCat(where, " has more elements than fit in 64 bits"));
    }
    MODSERVE_ASSIGN_OR_RETURN(t.ggml_type, ReadU32(absl::StrCat(where, ": the type")));
    const GgmlTypeInfo* type = FindGgmlType(t.ggml_type);
    if (type == nullptr) {
      return Error(absl::StrCat(where, " has unknown ggml type id ", t.ggml_type));
    }
    t.dtype = DTypeFromGgmlType(t.ggml_type);
    if (t.ne[0] % type->block_elems != 0) {
      return Error(absl::StrCat(where, " of type ", Sv(type->name), " has rows of ", t.ne[0],
                                " elements, not a multiple of its block of ", type->block_elems));
    }
    // numel / block_elems blocks: numel is a multiple, and the product may still overflow.
    if (__builtin_mul_overflow(numel / static_cast<uint64_t>(type->block_elems), type->block_bytes,
                               &t.bytes)) {
      return Error(absl::StrCat(where, " holds more bytes than fit in 64 bits"));
    }
    MODSERVE_ASSIGN_OR_RETURN(t.offset, ReadU64(absl::StrCat(where, ": the data offset")));
    if (t.offset % out_.alignment_ != 0) {
      return Error(absl::StrCat(where, " has data offset ", t.offset,
                                ", not a multiple of the alignment ", out_.alignment_));
    }
    if (!out_.tensor_index_.emplace(name, out_.tensors_.size()).second) {
      return Error(absl::StrCat(where, " appears twice"));
    }
    out_.tensors_.push_back(t);
    return absl::OkStatus();
  }

  absl::Status CheckTensorData() {
    const uint64_t start = out_.data_offset_;
    const uint64_t data_bytes = start < size_ ? size_ - start : 0;
    for (GgufTensor& t : out_.tensors_) {
      if (t.offset > data_bytes || t.bytes > data_bytes - t.offset) {
        return Error(absl::StrCat("tensor '", GgufPrintable(t.name), "' [", t.offset, ", +",
                                  t.bytes, ") runs past the end of the data section (",
                                  data_bytes, " bytes; is the file truncated?)"));
      }
      t.data = t.bytes == 0 ? base_ : base_ + start + t.offset;
    }
    // Overlap: sorted by offset, each non-empty span must begin at or after the furthest end.
    std::vector<const GgufTensor*> spans;
    for (const GgufTensor& t : out_.tensors_) {
      if (t.bytes > 0) spans.push_back(&t);
    }
    std::sort(spans.begin(), spans.end(),
              [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
    const GgufTensor* furthest = nullptr;
    for (const GgufTensor* t : spans) {
      if (furthest != nullptr && t->offset < furthest->offset + furthest->bytes) {
        auto span = [](const GgufTensor* x) {
          return absl::StrCat("[", x->offset, ", ", x->offset + x->bytes, ")");
        };
        return Error(absl::StrCat("tensors '", GgufPrintable(furthest->name), "' ",
                                  span(furthest), " and '", GgufPrintable(t->name), "' ", span(t),
                                  " overlap"));
      }
      if (furthest == nullptr || t->offset + t->bytes > furthest->offset + furthest->bytes) {
        furthest = t;
      }
    }
    return absl::OkStatus();
  }

  GgufFile& out_;
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

absl::StatusOr<GgufFile> GgufFile::Open(const std::string& path) {
  MODSERVE_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path));
  GgufFile file(std::move(mapped));
  GgufParser parser(&file);
  MODSERVE_RETURN_IF_ERROR(parser.Parse());
  return file;
}

GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

MappedFile GgufFile::ReleaseMapping() && {
  kvs_.clear();
  kv_index_.clear();
  tensors_.clear();
  tensor_index_.clear();
  return std::move(file_);
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].second;
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

// ---- typed getters ----

namespace {

std::string Where(const std::string& path, std::string_view key) {
  return absl::StrCat(path, ": metadata key '", GgufPrintable(key), "'");
}

absl::Status TypeError(const std::string& path, std::string_view key, const GgufValue& v,
                       absl::string_view expected) {
  const std::string found =
      v.type == GgufType::kArray
          ? absl::StrCat("ARRAY of ", Sv(GgufTypeName(v.array_type)))
          : std::string(GgufTypeName(v.type));
  return absl::InvalidArgumentError(
      absl::StrCat(Where(path, key), " has type ", found, ", expected ", expected));
}

template <typename T>
absl::StatusOr<T> IntValue(const GgufFile& f, std::string_view key) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(Where(f.path(), key), " is missing"));
  if (!IsIntegerType(v->type)) return TypeError(f.path(), key, *v, "an integer");
  return IntAs<T>(LoadInt(v->type, v->data), Where(f.path(), key));
}

template <typename T>
absl::StatusOr<std::vector<T>> IntArray(const GgufFile& f, std::string_view key) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(Where(f.path(), key), " is missing"));
  if (v->type != GgufType::kArray || !IsIntegerType(v->array_type)) {
    return TypeError(f.path(), key, *v, "an ARRAY of integers");
  }
  const uint64_t elem = ScalarBytes(v->array_type);
  std::vector<T> out;
  out.reserve(v->array_size);  // the parser checked that the file holds every element
  for (uint64_t i = 0; i < v->array_size; ++i) {
    MODSERVE_ASSIGN_OR_RETURN(
        T x, IntAs<T>(LoadInt(v->array_type, v->data + i * elem),
                      absl::StrCat(Where(f.path(), key), " element ", i)));
    out.push_back(x);
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string_view> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(Where(path(), key), " is missing"));
  if (v->type != GgufType::kString) return TypeError(path(), key, *v, "STRING");
  return v->string;
}

absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(Where(path(), key), " is missing"));
  if (v->type != GgufType::kBool) return TypeError(path(), key, *v, "BOOL");
  return v->data[0] != 0;
}

absl::StatusOr<uint32_t> GgufFile::GetU32(std::string_view key) const {
  return IntValue<uint32_t>(*this, key);
}
absl::StatusOr<int32_t> GgufFile::GetI32(std::string_view key) const {
  return IntValue<int32_t>(*this, key);
}
absl::StatusOr<uint64_t> GgufFile::GetU64(std::string_view key) const {
  return IntValue<uint64_t>(*this, key);
}
absl::StatusOr<int64_t> GgufFile::GetI64(std::string_view key) const {
  return IntValue<int64_t>(*this, key);
}

absl::StatusOr<double> GgufFile::GetF64(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(Where(path(), key), " is missing"));
  if (v->type == GgufType::kF32) return static_cast<double>(Load<float>(v->data));
  if (v->type == GgufType::kF64) return Load<double>(v->data);
  return TypeError(path(), key, *v, "FLOAT32 or FLOAT64");
}

absl::StatusOr<float> GgufFile::GetF32(std::string_view key) const {
  MODSERVE_ASSIGN_OR_RETURN(const double d, GetF64(key));
  return static_cast<float>(d);
}

absl::StatusOr<absl::Span<const std::string_view>> GgufFile::GetStringArray(
    std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(Where(path(), key), " is missing"));
  if (v->type != GgufType::kArray || v->array_type != GgufType::kString) {
    return TypeError(path(), key, *v, "an ARRAY of STRING");
  }
  return absl::Span<const std::string_view>(v->strings);
}

absl::StatusOr<std::vector<double>> GgufFile::GetF64Array(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat(Where(path(), key), " is missing"));
  if (v->type != GgufType::kArray ||
      (v->array_type != GgufType::kF32 && v->array_type != GgufType::kF64)) {
    return TypeError(path(), key, *v, "an ARRAY of FLOAT32 or FLOAT64");
  }
  std::vector<double> out(v->array_size);
  for (uint64_t i = 0; i < v->array_size; ++i) {
    out[i] = v->array_type == GgufType::kF32 ? static_cast<double>(Load<float>(v->data + 4 * i))
                                             : Load<double>(v->data + 8 * i);
  }
  return out;
}

absl::StatusOr<std::vector<float>> GgufFile::GetF32Array(std::string_view key) const {
  MODSERVE_ASSIGN_OR_RETURN(const std::vector<double> d, GetF64Array(key));
  return std::vector<float>(d.begin(), d.end());
}

absl::StatusOr<std::vector<int32_t>> GgufFile::GetI32Array(std::string_view key) const {
  return IntArray<int32_t>(*this, key);
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetI64Array(std::string_view key) const {
  return IntArray<int64_t>(*this, key);
}

}  // namespace modserve::engine
