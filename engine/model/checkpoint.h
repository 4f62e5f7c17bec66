// Checkpoint: the tensors of a model directory's safetensors file(s), memory-mapped read-only and
// bounds-checked on open. It knows nothing of the model: which names and shapes must exist is
// weights.h's business; config.json is config.h's.
#ifndef MODSERVE_ENGINE_MODEL_CHECKPOINT_H_
#define MODSERVE_ENGINE_MODEL_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/common/dtype.h"
#include "engine/common/tensor_view.h"

namespace modserve::engine {

// Where one tensor lives and what it is. The shape has at most TensorView::kMaxDims dims.
struct TensorInfo {
  DType dtype = DType::kF32;   // kF32, kF16 or kBF16; a GGUF file also the quantized types
  std::vector<int64_t> shape;  // outer to inner, row-major; empty for a scalar
  std::string file;            // file name inside the model directory (no directory)
  uint64_t file_offset = 0;    // absolute byte offset of the tensor's data in `file`
  uint64_t bytes = 0;          // DTypeRowBytes(dtype, numel)
  bool copied = false;         // served from a copy: misaligned in the file, or its rows
                               // reordered at load (a GGUF's Q/K rows, gguf_model.h)
};

// A read-only memory mapping of one whole file, unmapped on destruction. Move-only; moving it
// does not move the mapped bytes, so pointers into it stay valid.
class MappedFile {
 public:
  // NotFound when `path` does not exist; DataLoss when it cannot be opened, sized or mapped.
  static absl::StatusOr<MappedFile> Open(const std::string& path);

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }  // nullptr for an empty file
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, uint64_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  void Unmap();

  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// All tensors of one checkpoint. Open() validates every header entry up front, so Get() on a
// listed name never fails later, and nothing is read from disk until a view's bytes are touched.
//
// Ownership: the Checkpoint owns the mappings (and the aligned copies of misaligned tensors); the
// TensorViews it returns borrow them and stay valid until the Checkpoint is destroyed. Moving a
// Checkpoint keeps them valid (the mapped and copied bytes do not move). The views' `data` is a
// non-const pointer only because TensorView has no const flavour: the memory is mapped
// PROT_READ, and writing through it crashes.
// Threads: after Open(), every method is const and safe to call from any number of threads.
//
// Alignment: every tensor's data is aligned to its element size in the returned view. A tensor
// misaligned in the file (old writers did not pad the header) is copied once, at Open(), into an
// aligned heap buffer rather than rejected; aligned_copy_bytes() says how much that cost.
class Checkpoint {
 public:
  // Opens `model_dir`/model.safetensors, or when that file does not exist every shard listed by
  // `model_dir`/model.safetensors.index.json (the single file wins when both exist, as in the
  // reference). Status codes:
  //   NotFound   neither file exists, or a shard named by the index does not exist
  //   DataLoss   any malformed content: short file, header length past the end, header not a
  //              JSON object, bad tensor entry, unsupported dtype (only F32, F16, BF16), more
  //              than 4 dims, negative or overflowing shape, bad or overlapping data_offsets,
  //              malformed index, a tensor missing from / not listed for its shard, a tensor in
  //              two shards. Every message names the file and the tensor or key at fault.
  static absl::StatusOr<Checkpoint> Open(const std::string& model_dir);

  // Opens one safetensors file (no index), with the same checks and codes as Open().
  static absl::StatusOr<Checkpoint> OpenFile(const std::string& path);

  // A tensor that another format's parser has already validated (gguf_model.cc): `data` holds
  // info.bytes bytes inside the adopted mapping or one of the adopted buffers.
  struct AdoptedTensor {
    std::string name;
    TensorInfo info;
    const void* data = nullptr;
  };
  // A checkpoint serving `tensors`; it takes ownership of the mapping and of `owned` (buffers
  // the tensors may point into). A tensor whose data is not aligned to its element size (4 for
  // the quantized types) is copied, as Open() does. DataLoss when a name appears twice.
  static absl::StatusOr<Checkpoint> Adopt(MappedFile file, std::vector<AdoptedTensor> tensors,
                                          std::vector<std::unique_ptr<uint8_t[]>> owned);

  Checkpoint(Checkpoint&&) noexcept;
  Checkpoint& operator=(Checkpoint&&) noexcept;
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;
  ~Checkpoint();

  // A view of tensor `name` (dtype and shape as in the file, Device::kCpu). NotFound when the
  // checkpoint has no such tensor. A zero-element tensor gets a non-null data pointer.
  absl::StatusOr<TensorView> Get(std::string_view name) const;

  // nullptr when the checkpoint has no tensor `name`.
  const TensorInfo* Find(std::string_view name) const;
  bool Contains(std::string_view name) const { return Find(name) != nullptr; }

  // Every tensor name, sorted. `__metadata__` is not a tensor and is never listed.
  std::vector<std::string> Names() const;
  int64_t num_tensors() const { return static_cast<int64_t>(tensors_.size()); }

  // Sum of the data bytes of all tensors (headers and padding excluded).
  uint64_t total_bytes() const { return total_bytes_; }
  // Bytes held in aligned copies because the file stored them misaligned (usually 0).
  uint64_t aligned_copy_bytes() const { return aligned_copy_bytes_; }
  // The files backing this checkpoint, in the order they were opened.
  std::vector<std::string> file_paths() const;

  // Drops this process's pages of the whole pages inside [data, data + bytes) when that range
  // lies in one of the file mappings (anything else: nothing happens). The mappings are private
  // and read-only, so nothing is lost: a later read maps the file's bytes again. For tensors
  // the engine no longer reads (a backend holds its own copy), so they stop counting as
  // resident memory. Returns the bytes released.
  uint64_t ReleasePages(const void* data, uint64_t bytes) const;

 private:
  struct Entry {
    TensorInfo info;
    const void* data = nullptr;  // into a mapping or an aligned copy
  };

  Checkpoint() = default;

  std::vector<MappedFile> files_;
  std::vector<std::unique_ptr<uint8_t[]>> copies_;  // aligned copies of misaligned tensors
  std::map<std::string, Entry, std::less<>> tensors_;
  uint64_t total_bytes_ = 0;
  uint64_t aligned_copy_bytes_ = 0;

  friend class CheckpointBuilder;
};

// Parses a dtype name as safetensors spells it ("F32", "F16", "BF16"); false for any other.
bool ParseSafetensorsDType(std::string_view name, DType* dtype);

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_MODEL_CHECKPOINT_H_
