// Fuzz targets for the model loader: safetensors files (Checkpoint::OpenFile), config.json
// (ParseConfig) and GGUF files (GgufFile::Open, then LoadModel on the same bytes). They check each parser's result against the rules its header states, computed
// here from the raw bytes, not only that it returns; they do not build weights or run a model.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/common/dtype.h"
#include "engine/model/checkpoint.h"
#include "engine/model/config.h"
#include "engine/model/gguf.h"
#include "engine/model/weights.h"
#include "engine/tokenizer/gguf_tokenizer.h"
#include "tests/fuzz/fuzz_targets.h"
#include "tests/fuzz/fuzz_util.h"

namespace modserve::fuzz {
namespace {

using engine::Checkpoint;
using engine::TensorInfo;

// One in-memory file reused for every input, so the checkpoint target does no disk I/O. Checkpoint
// only takes a path, and /proc/self/fd/N of a memfd is one that open() and mmap() accept.
class MemFile {
 public:
  explicit MemFile(const char* name = "model.safetensors")
      : fd_(::memfd_create(name, MFD_CLOEXEC)) {
    FUZZ_CHECK(fd_ >= 0, "memfd_create failed");
    path_ = absl::StrCat("/proc/self/fd/", fd_);
  }
  const std::string& Write(const uint8_t* data, size_t size) {
    FUZZ_CHECK(::ftruncate(fd_, 0) == 0, "ftruncate failed");
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      FUZZ_CHECK(n > 0, "pwrite to the memfd failed");
      done += static_cast<size_t>(n);
    }
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

}  // namespace

int FuzzCheckpoint(const uint8_t* data, size_t size) {
  static MemFile* file = new MemFile();  // never freed: lives for the fuzzing process
  const std::string& path = file->Write(data, size);
  absl::StatusOr<Checkpoint> ckpt = Checkpoint::OpenFile(path);
  if (!ckpt.ok()) {
    FUZZ_CHECK(ckpt.status().code() == absl::StatusCode::kDataLoss,
               absl::StrCat("malformed file must give DataLoss: ", ckpt.status().ToString()));
    FUZZ_CHECK(absl::StrContains(ckpt.status().message(), path),
               absl::StrCat("message must name the file: ", ckpt.status().ToString()));
    return 0;
  }
  // Accepted: recompute the layout from the raw bytes and hold every tensor to it.
  FUZZ_CHECK(size >= 8, "a file under 8 bytes was accepted");
  uint64_t header_len = 0;
  std::memcpy(&header_len, data, 8);
  FUZZ_CHECK(header_len <= size - 8, "header length past the end was accepted");
  const uint64_t data_start = 8 + header_len;

  struct Span {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Span> spans;
  uint64_t total = 0;
  for (const std::string& name : ckpt->Names()) {
    FUZZ_CHECK(name != "__metadata__", "__metadata__ listed as a tensor");
    const TensorInfo* info = ckpt->Find(name);
    FUZZ_CHECK(info != nullptr, absl::StrCat("Names() lists '", name, "' but Find() misses it"));
    FUZZ_CHECK(info->shape.size() <= static_cast<size_t>(TensorView::kMaxDims),
               absl::StrCat(name, ": too many dims accepted"));
    uint64_t numel = 1;
    for (int64_t d : info->shape) {
      FUZZ_CHECK(d >= 0, absl::StrCat(name, ": negative dim accepted"));
      FUZZ_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel),
                 absl::StrCat(name, ": overflowing shape accepted"));
    }
    uint64_t bytes = 0;
    FUZZ_CHECK(!__builtin_mul_overflow(numel, DTypeBytes(info->dtype), &bytes),
               absl::StrCat(name, ": overflowing byte count accepted"));
    FUZZ_CHECK(bytes == info->bytes, absl::StrCat(name, ": bytes ", info->bytes, " != numel * ",
                                                  "element size ", bytes));
    FUZZ_CHECK(info->file_offset >= data_start && info->file_offset <= size &&
                   info->bytes <= size - info->file_offset,
               absl::StrCat(name, ": [", info->file_offset, ", +", info->bytes,
                            ") is outside the data section [", data_start, ", ", size, ")"));
    absl::StatusOr<TensorView> view = ckpt->Get(name);
    FUZZ_CHECK(view.ok(), absl::StrCat(name, ": Get failed: ", view.status().ToString()));
    FUZZ_CHECK(view->data != nullptr, absl::StrCat(name, ": null data"));
    FUZZ_CHECK(static_cast<uint64_t>(view->numel()) == numel, absl::StrCat(name, ": numel"));
    FUZZ_CHECK(reinterpret_cast<uintptr_t>(view->data) % DTypeBytes(info->dtype) == 0,
               absl::StrCat(name, ": misaligned view"));
    // Reads every byte of the view: the sanitizers see a view that points outside its storage.
    FUZZ_CHECK(std::memcmp(view->data, data + info->file_offset, info->bytes) == 0,
               absl::StrCat(name, ": view bytes differ from the file"));
    if (info->bytes > 0) spans.push_back({info->file_offset, info->file_offset + info->bytes, name});
    total += info->bytes;
  }
  FUZZ_CHECK(total == ckpt->total_bytes(), "total_bytes() != sum of tensor bytes");
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < spans.size(); ++i) {
    FUZZ_CHECK(spans[i].begin >= spans[i - 1].end,
               absl::StrCat("overlapping tensors accepted: '", spans[i - 1].name, "' and '",
                            spans[i].name, "'"));
  }
  return 0;
}

namespace {

template <typename T>
T LoadLe(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Every typed getter on every key: each must either succeed or fail with NotFound (never here)
// or InvalidArgument naming the key, and a successful string read must be the parsed value.
void CheckGetters(const engine::GgufFile& f) {
  for (const auto& [key, value] : f.metadata()) {
    FUZZ_CHECK(f.Find(key) == &value, "Find() does not return the listed value");
    auto check = [&](const absl::Status& s) {
      if (s.ok()) return;
      FUZZ_CHECK(s.code() == absl::StatusCode::kInvalidArgument,
                 absl::StrCat("getter on a present key: ", s.ToString()));
      FUZZ_CHECK(absl::StrContains(s.message(), "metadata key '"),
                 absl::StrCat("getter error must name the key: ", s.ToString()));
    };
    check(f.GetU32(key).status());
    check(f.GetI32(key).status());
    check(f.GetU64(key).status());
    check(f.GetI64(key).status());
    check(f.GetF32(key).status());
    check(f.GetF64(key).status());
    check(f.GetBool(key).status());
    check(f.GetI32Array(key).status());
    check(f.GetI64Array(key).status());
    check(f.GetF32Array(key).status());
    absl::StatusOr<std::string_view> str = f.GetString(key);
    check(str.status());
    if (str.ok()) FUZZ_CHECK(*str == value.string, "GetString differs from the parsed value");
    auto strs = f.GetStringArray(key);
    check(strs.status());
    if (strs.ok()) {
      FUZZ_CHECK(strs->size() == value.array_size, "string array size");
      for (std::string_view s : *strs) {
        // Every string view lies in the file: the sanitizers see a bad one here.
        volatile size_t sum = 0;
        for (char c : s) sum = sum + static_cast<unsigned char>(c);
      }
    }
  }
}

}  // namespace

int FuzzGguf(const uint8_t* data, size_t size) {
  static MemFile* file = new MemFile("model.gguf");  // never freed: lives for the process
  const std::string& path = file->Write(data, size);
  absl::StatusOr<engine::GgufFile> f = engine::GgufFile::Open(path);
  if (!f.ok()) {
    FUZZ_CHECK(f.status().code() == absl::StatusCode::kDataLoss,
               absl::StrCat("malformed GGUF must give DataLoss: ", f.status().ToString()));
    FUZZ_CHECK(absl::StrContains(f.status().message(), path),
               absl::StrCat("message must name the file: ", f.status().ToString()));
    return 0;
  }
  // Accepted: the header as the specification reads it, from the raw bytes.
  FUZZ_CHECK(size >= 24 && std::memcmp(data, "GGUF", 4) == 0, "bad magic accepted");
  const uint32_t version = LoadLe<uint32_t>(data + 4);
  FUZZ_CHECK(version == 2 || version == 3, absl::StrCat("version ", version, " accepted"));
  FUZZ_CHECK(f->tensors().size() == LoadLe<uint64_t>(data + 8), "tensor count differs");
  FUZZ_CHECK(f->metadata().size() == LoadLe<uint64_t>(data + 16), "metadata count differs");
  const uint64_t align = f->alignment();
  FUZZ_CHECK(align != 0 && (align & (align - 1)) == 0, "alignment not a power of two");
  FUZZ_CHECK(f->data_offset() % align == 0, "data section misaligned");
  CheckGetters(*f);

  struct Span {
    uint64_t begin, end;
  };
  std::vector<Span> spans;
  for (const engine::GgufTensor& t : f->tensors()) {
    const std::string name(t.name);
    FUZZ_CHECK(f->FindTensor(t.name) == &t, absl::StrCat(name, ": FindTensor"));
    FUZZ_CHECK(t.ndim >= 0 && t.ndim <= 4, absl::StrCat(name, ": ndim"));
    const engine::GgmlTypeInfo* type = engine::FindGgmlType(t.ggml_type);
    FUZZ_CHECK(type != nullptr, absl::StrCat(name, ": unknown type accepted"));
    uint64_t numel = 1;
    for (int i = 0; i < 4; ++i) {
      FUZZ_CHECK(t.ne[i] >= 0, absl::StrCat(name, ": negative dim"));
      FUZZ_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(t.ne[i]), &numel),
                 absl::StrCat(name, ": overflowing dims accepted"));
    }
    FUZZ_CHECK(t.ne[0] % type->block_elems == 0, absl::StrCat(name, ": partial block accepted"));
    FUZZ_CHECK(t.bytes == numel / static_cast<uint64_t>(type->block_elems) * type->block_bytes,
               absl::StrCat(name, ": byte count"));
    FUZZ_CHECK(t.offset % align == 0, absl::StrCat(name, ": misaligned offset accepted"));
    if (t.bytes == 0) continue;
    const uint64_t begin = f->data_offset() + t.offset;
    FUZZ_CHECK(begin <= size && t.bytes <= size - begin,
               absl::StrCat(name, ": data outside the file accepted"));
    // Reads every byte of the tensor through its pointer: the sanitizers see one outside the map.
    FUZZ_CHECK(std::memcmp(t.data, data + begin, t.bytes) == 0,
               absl::StrCat(name, ": data differs from the file"));
    spans.push_back({begin, begin + t.bytes});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin < b.begin;
  });
  for (size_t i = 1; i < spans.size(); ++i) {
    FUZZ_CHECK(spans[i].begin >= spans[i - 1].end, "overlapping tensors accepted");
  }

  // The tokenizer on top: none (NotFound), an InvalidArgument naming the file, or a tokenizer
  // whose ids for a sample name tokens and decode to valid UTF-8.
  absl::StatusOr<std::unique_ptr<engine::Tokenizer>> tok = engine::LoadTokenizerFromGguf(*f);
  if (!tok.ok()) {
    const absl::StatusCode code = tok.status().code();
    FUZZ_CHECK(code == absl::StatusCode::kNotFound || code == absl::StatusCode::kInvalidArgument,
               absl::StrCat("tokenizer error must be NotFound or InvalidArgument: ",
                            tok.status().ToString()));
    FUZZ_CHECK(absl::StrContains(tok.status().message(), path),
               absl::StrCat("tokenizer error must name the file: ", tok.status().ToString()));
  } else {
    static constexpr std::string_view kSample = "Hello world, 123 \xc3\xbcn\xc3\xaf <s> \n\t";
    for (bool special : {false, true}) {
      absl::StatusOr<std::vector<int32_t>> ids = (*tok)->Encode(kSample, special);
      FUZZ_CHECK(ids.ok(), absl::StrCat("Encode failed: ", ids.status().ToString()));
      for (int32_t id : *ids) {
        FUZZ_CHECK(id >= 0 && id < (*tok)->vocab_size(), absl::StrCat("Encode gave id ", id));
      }
      absl::StatusOr<std::string> text = (*tok)->Decode(*ids, !special);
      FUZZ_CHECK(text.ok() && IsStrictUtf8(*text),
                 absl::StrCat("Decode of Encode's ids failed: ", text.status().ToString()));
    }
  }

  // The model on top: either a model whose config keeps config.json's rules, or a clear error.
  absl::StatusOr<engine::LoadedModel> m = engine::LoadModel(path);
  if (!m.ok()) {
    const absl::StatusCode code = m.status().code();
    FUZZ_CHECK(code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kDataLoss,
               absl::StrCat("model error must be InvalidArgument or DataLoss: ",
                            m.status().ToString()));
    FUZZ_CHECK(absl::StrContains(m.status().message(), path),
               absl::StrCat("model error must name the file: ", m.status().ToString()));
    return 0;
  }
  const engine::ModelConfig& c = m->config();
  FUZZ_CHECK(c.n_heads % c.n_kv_heads == 0 && c.head_dim % 2 == 0, "bad head layout accepted");
  FUZZ_CHECK(static_cast<int64_t>(m->weights().layers.size()) == c.n_layers, "layer count");
  FUZZ_CHECK(c.tie_word_embeddings == (f->FindTensor("output.weight") == nullptr), "tie flag");
  return 0;
}

int FuzzConfig(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<engine::ModelConfig> cfg = engine::ParseConfig(text);
  if (!cfg.ok()) {
    FUZZ_CHECK(cfg.status().code() == absl::StatusCode::kInvalidArgument,
               absl::StrCat("rejection must be InvalidArgument: ", cfg.status().ToString()));
    FUZZ_CHECK(absl::StartsWith(cfg.status().message(), "config.json: "),
               absl::StrCat("message must start with 'config.json: ': ", cfg.status().ToString()));
    return 0;
  }
  const engine::ModelConfig& c = *cfg;
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  for (int64_t v : {c.d_model, c.d_ff, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size,
                    c.max_seq_len}) {
    FUZZ_CHECK(v >= 1 && v <= kMax, absl::StrCat("size ", v, " outside [1, 2^31 - 1] accepted"));
  }
  FUZZ_CHECK(c.n_heads % c.n_kv_heads == 0, "n_kv_heads does not divide n_heads");
  FUZZ_CHECK(c.head_dim >= 2 && c.head_dim <= kMax && c.head_dim % 2 == 0, "odd head_dim");
  FUZZ_CHECK(c.rms_norm_eps > 0 && c.rope_theta > 0, "non-positive eps or theta");
  if (c.bos_token_id) FUZZ_CHECK(*c.bos_token_id >= 0 && *c.bos_token_id < c.vocab_size, "bos");
  for (int32_t e : c.eos_token_ids) FUZZ_CHECK(e >= 0 && e < c.vocab_size, "eos out of range");
  if (c.mod) {
    const engine::ModConfig& m = *c.mod;
    FUZZ_CHECK(m.format_version == 1, "format_version");
    for (size_t i = 0; i < m.routed_layers.size(); ++i) {
      FUZZ_CHECK(m.routed_layers[i] >= 0 && m.routed_layers[i] < c.n_layers, "routed layer range");
      FUZZ_CHECK(i == 0 || m.routed_layers[i - 1] < m.routed_layers[i], "routed not ascending");
      FUZZ_CHECK(c.IsRouted(m.routed_layers[i]), "IsRouted disagrees with routed_layers");
    }
    FUZZ_CHECK(m.capacity > 0 && m.capacity <= 1, "capacity outside (0, 1]");
    FUZZ_CHECK(m.threshold > 0 && m.threshold < 1, "threshold outside (0, 1)");
    if (m.inference_routing == engine::InferenceRouting::kPredictorThreshold) {
      FUZZ_CHECK(m.predictor.has_value(), "predictor_threshold without a predictor");
    }
    if (m.predictor && m.predictor->type == engine::PredictorType::kMlp) {
      FUZZ_CHECK(m.predictor->hidden_size >= 1 && m.predictor->hidden_size <= kMax, "hidden_size");
    }
  } else {
    FUZZ_CHECK(!c.IsRouted(0), "dense config reports a routed layer");
  }
  return 0;
}

}  // namespace modserve::fuzz
