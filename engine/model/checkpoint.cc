// Safetensors parsing: an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets}}, then the data section. Every number that comes from the
// file is checked in 64-bit arithmetic before it is used as a size or an offset.
#include "engine/model/checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "engine/common/status_macros.h"
#include "nlohmann/json.hpp"

namespace modserve::engine {

// Tensor data is read in place, so the file's little-endian bytes must be the host's order.
static_assert(std::endian::native == std::endian::little, "safetensors is little-endian");

namespace {

using Json = nlohmann::json;

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";

// The value as JSON text, cut short so that a hostile header cannot flood a log line.
std::string Render(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  constexpr size_t kMaxChars = 80;
  if (s.size() > kMaxChars) s = s.substr(0, kMaxChars) + "...";
  return s;
}

std::optional<int64_t> AsInt(const Json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return std::nullopt;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string JoinPath(absl::string_view dir, absl::string_view file) {
  return absl::StrCat(dir, "/", file);
}

// One validated header entry, with offsets relative to the start of the file.
struct ParsedTensor {
  std::string name;
  TensorInfo info;
};

// Checks one header entry; `path` and `name` only feed the messages. `data_bytes` is the size of
// the data section, which starts at file offset `data_start`.
absl::StatusOr<ParsedTensor> ParseEntry(const std::string& path, const std::string& name,
                                        const Json& entry, uint64_t data_start,
                                        uint64_t data_bytes) {
  const std::string where = absl::StrCat(path, ": tensor '", name, "'");
  auto error = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(where, " ", what));
  };
  if (!entry.is_object())
    return error(absl::StrCat("entry must be an object, got ", Render(entry)));
  ParsedTensor out;
  out.name = name;

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end()) return error("has no 'dtype'");
  if (!dtype_it->is_string()) {
    return error(absl::StrCat("'dtype' must be a string, got ", Render(*dtype_it)));
  }
  const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
  if (!ParseSafetensorsDType(dtype_name, &out.info.dtype)) {
    return error(
        absl::StrCat("has unsupported dtype ", Render(*dtype_it), " (supported: F32, F16, BF16)"));
  }
  const uint64_t elem_bytes = DTypeBytes(out.info.dtype);

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end()) return error("has no 'shape'");
  if (!shape_it->is_array()) {
    return error(absl::StrCat("'shape' must be a list of integers, got ", Render(*shape_it)));
  }
  if (shape_it->size() > static_cast<size_t>(TensorView::kMaxDims)) {
    return error(absl::StrCat("has ", shape_it->size(), " dimensions ", Render(*shape_it),
                              ", at most ", TensorView::kMaxDims, " are supported"));
  }
  uint64_t numel = 1;
  bool overflow = false;
  for (const Json& d : *shape_it) {
    const std::optional<int64_t> dim = AsInt(d);
    if (!dim.has_value()) {
      return error(absl::StrCat("'shape' must be a list of integers, got ", Render(*shape_it)));
    }
    if (*dim < 0) {
      return error(absl::StrCat("'shape' ", Render(*shape_it), " has negative dimension ", *dim));
    }
    out.info.shape.push_back(*dim);
    overflow = overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(*dim), &numel);
  }
  uint64_t bytes = 0;
  // numel must also fit int64 (TensorView::numel()), and the byte count uint64.
  if (overflow || numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
      __builtin_mul_overflow(numel, elem_bytes, &bytes)) {
    return error(absl::StrCat("'shape' ", ShapeString(out.info.shape),
                              " has more elements than fit in 64 bits"));
  }

  auto off_it = entry.find("data_offsets");
  if (off_it == entry.end()) return error("has no 'data_offsets'");
  std::optional<int64_t> begin, end;
  if (off_it->is_array() && off_it->size() == 2) {
    begin = AsInt((*off_it)[0]);
    end = AsInt((*off_it)[1]);
  }
  if (!begin || !end || *begin < 0 || *end < 0) {
    return error(
        absl::StrCat("'data_offsets' must be [begin, end] with non-negative integers, "
                     "got ",
                     Render(*off_it)));
  }
  const uint64_t b = static_cast<uint64_t>(*begin), e = static_cast<uint64_t>(*end);
  if (e < b) {
    return error(absl::StrCat("'data_offsets' [", b, ", ", e, "] end before they begin"));
  }
  if (e > data_bytes) {
    return error(absl::StrCat("'data_offsets' [", b, ", ", e, "] run past the end of the data ",
                              "section (", data_bytes, " bytes)"));
  }
  if (e - b != bytes) {
    return error(absl::StrCat("'data_offsets' [", b, ", ", e, "] hold ", e - b,
                              " bytes, but shape ", ShapeString(out.info.shape), " of ", dtype_name,
                              " needs ", bytes));
  }
  out.info.bytes = bytes;
  out.info.file_offset = data_start + b;  // cannot overflow: both are below the file size
  return out;
}

// Parses and checks the header of one mapped file. `file_name` is recorded in each TensorInfo.
absl::StatusOr<std::vector<ParsedTensor>> ParseHeader(const MappedFile& file,
                                                      const std::string& file_name) {
  const std::string& path = file.path();
  if (file.size() < 8) {
    return absl::DataLossError(absl::StrCat(path, ": file is ", file.size(),
                                            " bytes, too short for the 8-byte header length"));
  }
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data(), 8);
  // Compared against what is there before anything is sized from it (it may be 2^60).
  if (header_len > file.size() - 8) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", header_len,
                                            " runs past the end of the file (", file.size(),
                                            " bytes)"));
  }
  const char* text = reinterpret_cast<const char*>(file.data() + 8);
  Json header;
  try {
    header = Json::parse(text, text + header_len);
  } catch (const Json::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) {
    return absl::DataLossError(
        absl::StrCat(path, ": header is not a JSON object, got ", Render(header)));
  }
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_bytes = file.size() - data_start;

  std::vector<ParsedTensor> tensors;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    MODSERVE_ASSIGN_OR_RETURN(ParsedTensor t,
                              ParseEntry(path, name, entry, data_start, data_bytes));
    t.info.file = file_name;
    tensors.push_back(std::move(t));
  }

  // Overlap: sorted by start, each non-empty span must begin at or after the furthest end so far.
  std::vector<const ParsedTensor*> spans;
  for (const ParsedTensor& t : tensors) {
    if (t.info.bytes > 0) spans.push_back(&t);
  }
  std::sort(spans.begin(), spans.end(), [](const ParsedTensor* a, const ParsedTensor* b) {
    return a->info.file_offset < b->info.file_offset;
  });
  const ParsedTensor* furthest = nullptr;
  for (const ParsedTensor* t : spans) {
    if (furthest != nullptr &&
        t->info.file_offset < furthest->info.file_offset + furthest->info.bytes) {
      const auto rel = [&](const ParsedTensor* x) {
        return absl::StrCat("[", x->info.file_offset - data_start, ", ",
                            x->info.file_offset - data_start + x->info.bytes, ")");
      };
      return absl::DataLossError(absl::StrCat(path, ": tensors '", furthest->name, "' ",
                                              rel(furthest), " and '", t->name, "' ", rel(t),
                                              " overlap"));
    }
    if (furthest == nullptr ||
        t->info.file_offset + t->info.bytes > furthest->info.file_offset + furthest->info.bytes) {
      furthest = t;
    }
  }
  return tensors;
}

absl::StatusOr<Json> ReadJsonFile(const std::string& path) {
  MODSERVE_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  const char* text = reinterpret_cast<const char*>(file.data());
  try {
    return Json::parse(text, text + file.size());
  } catch (const Json::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": not valid JSON: ", e.what()));
  }
}

// A shard name must stay inside the model directory.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace

bool ParseSafetensorsDType(std::string_view name, DType* dtype) {
  if (name == "F32") {
    *dtype = DType::kF32;
  } else if (name == "F16") {
    *dtype = DType::kF16;
  } else if (name == "BF16") {
    *dtype = DType::kBF16;
  } else {
    return false;
  }
  return true;
}

// ---- MappedFile ----

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO planted as a model file must not wait for a writer forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrCat(path, ": cannot open: ", std::strerror(err)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const uint8_t* data = nullptr;
  if (size > 0) {  // mmap rejects length 0
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::DataLossError(
          absl::StrCat(path, ": mmap of ", size, " bytes failed: ", std::strerror(err)));
    }
    data = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
  return MappedFile(path, data, size);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() { Unmap(); }

void MappedFile::Unmap() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

// ---- Checkpoint ----

// Assembles a Checkpoint from opened files; it is the one place that may touch its privates.
class CheckpointBuilder {
 public:
  // Takes ownership of `file` and adds its already-validated tensors.
  absl::Status AddFile(MappedFile file, std::vector<ParsedTensor> tensors) {
    const uint8_t* base = file.data();
    ckpt_.files_.push_back(std::move(file));
    for (ParsedTensor& t : tensors) {
      Checkpoint::Entry entry;
      entry.info = std::move(t.info);
      const uint8_t* src = base + entry.info.file_offset;
      const uint64_t elem_bytes = DTypeBytes(entry.info.dtype);
      // mmap returns a page-aligned base, so only the in-file offset can misalign a tensor.
      if (entry.info.file_offset % elem_bytes != 0) {
        // new[] storage is aligned for any fundamental type, so for every element size here.
        auto copy = std::make_unique<uint8_t[]>(std::max<uint64_t>(entry.info.bytes, 1));
        std::memcpy(copy.get(), src, entry.info.bytes);
        src = copy.get();
        ckpt_.copies_.push_back(std::move(copy));
        ckpt_.aligned_copy_bytes_ += entry.info.bytes;
        entry.info.copied = true;
      }
      entry.data = src;
      ckpt_.total_bytes_ += entry.info.bytes;
      auto [it, inserted] = ckpt_.tensors_.emplace(std::move(t.name), std::move(entry));
      if (!inserted) {  // callers reject duplicates first; this keeps the invariant local
        return absl::DataLossError(absl::StrCat("tensor '", it->first, "' appears twice"));
      }
    }
    return absl::OkStatus();
  }

  // Takes ownership of `file` and `owned`, and adds tensors that point into them.
  absl::Status Adopt(MappedFile file, std::vector<Checkpoint::AdoptedTensor> tensors,
                     std::vector<std::unique_ptr<uint8_t[]>> owned) {
    ckpt_.files_.push_back(std::move(file));
    for (auto& buffer : owned) ckpt_.copies_.push_back(std::move(buffer));
    for (Checkpoint::AdoptedTensor& t : tensors) {
      Checkpoint::Entry entry;
      entry.info = std::move(t.info);
      const uint8_t* src = static_cast<const uint8_t*>(t.data);
      const uint64_t align = DTypeIsQuantized(entry.info.dtype) ? 4 : DTypeBytes(entry.info.dtype);
      if (reinterpret_cast<uintptr_t>(src) % align != 0) {
        auto copy = std::make_unique<uint8_t[]>(std::max<uint64_t>(entry.info.bytes, 1));
        std::memcpy(copy.get(), src, entry.info.bytes);
        src = copy.get();
        ckpt_.copies_.push_back(std::move(copy));
        ckpt_.aligned_copy_bytes_ += entry.info.bytes;
        entry.info.copied = true;
      }
      entry.data = src;
      ckpt_.total_bytes_ += entry.info.bytes;
      auto [it, inserted] = ckpt_.tensors_.emplace(std::move(t.name), std::move(entry));
      if (!inserted) {
        return absl::DataLossError(absl::StrCat("tensor '", it->first, "' appears twice"));
      }
    }
    return absl::OkStatus();
  }

  Checkpoint Finish() { return std::move(ckpt_); }

 private:
  Checkpoint ckpt_;
};

absl::StatusOr<Checkpoint> Checkpoint::OpenFile(const std::string& path) {
  MODSERVE_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  const std::string file_name = std::filesystem::path(path).filename().string();
  MODSERVE_ASSIGN_OR_RETURN(std::vector<ParsedTensor> tensors, ParseHeader(file, file_name));
  CheckpointBuilder builder;
  MODSERVE_RETURN_IF_ERROR(builder.AddFile(std::move(file), std::move(tensors)));
  return builder.Finish();
}

absl::StatusOr<Checkpoint> Checkpoint::Adopt(MappedFile file, std::vector<AdoptedTensor> tensors,
                                             std::vector<std::unique_ptr<uint8_t[]>> owned) {
  CheckpointBuilder builder;
  MODSERVE_RETURN_IF_ERROR(builder.Adopt(std::move(file), std::move(tensors), std::move(owned)));
  return builder.Finish();
}

absl::StatusOr<Checkpoint> Checkpoint::Open(const std::string& model_dir) {
  const std::string single = JoinPath(model_dir, kSingleFile);
  const std::string index_path = JoinPath(model_dir, kIndexFile);
  std::error_code ec;
  if (std::filesystem::exists(single, ec)) return OpenFile(single);
  if (!std::filesystem::exists(index_path, ec)) {
    return absl::NotFoundError(
        absl::StrCat(model_dir, ": neither ", kSingleFile, " nor ", kIndexFile, " exists"));
  }

  MODSERVE_ASSIGN_OR_RETURN(const Json index, ReadJsonFile(index_path));
  if (!index.is_object()) {
    return absl::DataLossError(
        absl::StrCat(index_path, ": top level must be an object, got ", Render(index)));
  }
  auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) {
    return absl::DataLossError(absl::StrCat(
        index_path, ": 'weight_map' must be an object of tensor name -> shard file, got ",
        map_it == index.end() ? std::string("nothing") : Render(*map_it)));
  }
  std::map<std::string, std::string, std::less<>> wanted;  // tensor -> shard file name
  std::set<std::string> shard_names;
  for (const auto& [name, shard] : map_it->items()) {
    if (!shard.is_string() || !IsPlainFileName(shard.get<std::string>())) {
      return absl::DataLossError(absl::StrCat(index_path, ": tensor '", name, "' maps to ",
                                              Render(shard),
                                              ", not a file name inside the model directory"));
    }
    wanted.emplace(name, shard.get<std::string>());
    shard_names.insert(shard.get<std::string>());
  }

  // Read every shard's header before judging names, so that a tensor stored in two shards is
  // reported as such rather than as "not listed" for one of them.
  std::vector<std::pair<MappedFile, std::vector<ParsedTensor>>> shards;
  std::map<std::string, std::string, std::less<>> found;  // tensor -> shard that holds it
  for (const std::string& shard : shard_names) {
    const std::string path = JoinPath(model_dir, shard);
    absl::StatusOr<MappedFile> file = MappedFile::Open(path);
    if (!file.ok()) {
      return absl::Status(file.status().code(), absl::StrCat(index_path, " lists shard '", shard,
                                                             "': ", file.status().message()));
    }
    MODSERVE_ASSIGN_OR_RETURN(std::vector<ParsedTensor> tensors, ParseHeader(*file, shard));
    for (const ParsedTensor& t : tensors) {
      auto [it, inserted] = found.emplace(t.name, shard);
      if (!inserted) {
        return absl::DataLossError(absl::StrCat(model_dir, ": tensor '", t.name,
                                                "' appears in both shard '", it->second,
                                                "' and shard '", shard, "'"));
      }
    }
    shards.emplace_back(std::move(*file), std::move(tensors));
  }
  for (const auto& [name, shard] : found) {
    auto it = wanted.find(name);
    if (it == wanted.end() || it->second != shard) {
      return absl::DataLossError(absl::StrCat(
          JoinPath(model_dir, shard), ": tensor '", name, "' is not listed for this shard in ",
          kIndexFile,
          it == wanted.end() ? std::string(" (the index does not list it)")
                             : absl::StrCat(" (the index puts it in '", it->second, "')")));
    }
  }
  for (const auto& [name, shard] : wanted) {
    if (found.find(name) == found.end()) {
      return absl::DataLossError(absl::StrCat(index_path, ": tensor '", name,
                                              "' is listed in shard '", shard,
                                              "', but that shard has no such tensor"));
    }
  }

  CheckpointBuilder builder;
  for (auto& [file, tensors] : shards) {
    MODSERVE_RETURN_IF_ERROR(builder.AddFile(std::move(file), std::move(tensors)));
  }
  return builder.Finish();
}

Checkpoint::Checkpoint(Checkpoint&&) noexcept = default;
Checkpoint& Checkpoint::operator=(Checkpoint&&) noexcept = default;
Checkpoint::~Checkpoint() = default;

const TensorInfo* Checkpoint::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second.info;
}

absl::StatusOr<TensorView> Checkpoint::Get(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat("checkpoint has no tensor '",
                                            absl::string_view(name.data(), name.size()), "'"));
  }
  const Entry& e = it->second;
  TensorView v;
  v.dtype = e.info.dtype;
  v.device = Device::kCpu;
  v.ndim = static_cast<int>(e.info.shape.size());
  for (int i = 0; i < v.ndim; ++i) v.shape[i] = e.info.shape[i];
  // TensorView has no const flavour; the bytes stay PROT_READ (see the class comment).
  v.data = const_cast<void*>(e.data);
  return v;
}

std::vector<std::string> Checkpoint::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, entry] : tensors_) names.push_back(name);
  return names;
}

std::vector<std::string> Checkpoint::file_paths() const {
  std::vector<std::string> paths;
  for (const MappedFile& f : files_) paths.push_back(f.path());
  return paths;
}

uint64_t Checkpoint::ReleasePages(const void* data, uint64_t bytes) const {
  const auto begin = reinterpret_cast<uintptr_t>(data);
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  for (const MappedFile& f : files_) {
    const auto base = reinterpret_cast<uintptr_t>(f.data());
    if (f.data() == nullptr || begin < base || begin - base > f.size() ||
        bytes > f.size() - (begin - base)) {
      continue;
    }
    const uintptr_t first = (begin + page - 1) / page * page, last = (begin + bytes) / page * page;
    if (first >= last) return 0;
    // madvise takes a non-const pointer; the pages are only dropped, never written.
    if (::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0) return 0;
    return last - first;
  }
  return 0;
}

}  // namespace modserve::engine
