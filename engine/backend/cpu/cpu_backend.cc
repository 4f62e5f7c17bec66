// CPU backend ops: dtype dispatch, threading and the memory-bound glue around the per-ISA kernels.
// Numerics follow reference_ops.cc; only the summation order (SIMD lanes, split-K) differs.
#include "engine/backend/cpu/cpu_backend.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/backend/cpu/op_checks.h"
#include "engine/backend/cpu/reference_ops.h"
#include "engine/backend/cpu/scalar_convert.h"
#include "engine/common/logging.h"
#include "engine/common/quant.h"

namespace modserve::backend::cpu {
namespace {

constexpr Device kHost = Device::kCpu;
constexpr size_t kAlignment = 64;  // a cache line, and one zmm register
constexpr size_t kHugePage = size_t{2} << 20;
// PrepareGemmWeight's copies are placed in chunks of at least this (virtual) size.
constexpr size_t kPreparedChunkBytes = size_t{256} << 20;

// Below ~16K elements an elementwise op is faster on one thread than waking the pool.
constexpr int64_t kElementwiseGrain = 1 << 14;
// Small-n Gemm: weight rows split in units of 16 (4 micro-tiles of 4, or one row group of a
// prepared Q4_K weight), so that tiny m (router, k/v projections) does not fan out into chunks
// cheaper than a wake-up.
constexpr int64_t kGemmRowGrain = 16;
// Large-n Gemm tiles: 128 weight rows (4 AVX-512 panels) by 256 x rows. One tile is ~30 MFLOP at
// TinyLlama sizes (k = 2048), enough to amortise packing its w block once per x row block.
constexpr int64_t kGemmColBlock = 128;
// The AMX Gemm's tiles are one chunk of its kernel: 512 weight rows (amx_gemm_impl.h says why).
constexpr int64_t kAmxColBlock = 512;
constexpr int64_t kGemmRowBlock = 256;
// The AMX Gemm wants x row ranges that start at a multiple of 32.
static_assert(kGemmRowBlock % 32 == 0);
// Attention: keys per tile (one kv head's scores and K/V rows of a tile stay in L1 at head_dim
// <= 128), and keys per split of a row's context: enough that the combine costs little beside
// them, few enough that batch-1 decode at a few hundred keys keeps both threads busy.
constexpr int64_t kKeyTile = 64;
constexpr int64_t kKeysPerSplit = 256;
static_assert(kKeysPerSplit == kAmxAttnKeys);
// Attention on the matrix unit (bf16 K/V, CPUs with AMX): the rows of a block share the K/V
// tiles of each split, so a prefill chunk's rows go in blocks of this many.
constexpr int64_t kAttnTileBlockRows = 32;

void FreeAligned(void* data, void* /*ctx*/) { std::free(data); }

float Sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }

// Per-thread scratch for attention tiles; grows to the largest size seen, never shrinks.
// 64-byte aligned: the AMX Gemm's tile loads and stores run at half speed when their rows split
// cache lines.
float* ThreadScratch(size_t floats) {
  thread_local std::vector<float> scratch;
  if (scratch.size() < floats + 15) scratch.resize(floats + 15);
  const uintptr_t p = reinterpret_cast<uintptr_t>(scratch.data());
  return reinterpret_cast<float*>((p + 63) & ~uintptr_t{63});
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(const CpuBackendOptions& options) {
  if (options.num_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu backend num_threads must be >= 0, got ", options.num_threads));
  }
  if (options.kernels != nullptr) {
    return std::unique_ptr<CpuBackend>(
        new CpuBackend(*options.kernels, options.num_threads, options.matmul_precision));
  }
  Isa isa = options.isa.value_or(BestIsa());
  if (const char* env = std::getenv("MODSERVE_CPU_ISA");
      !options.isa.has_value() && env != nullptr && env[0] != '\0') {
    const std::optional<Isa> named = IsaFromName(env);
    if (!named.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("MODSERVE_CPU_ISA=", env,
                       " names no kernel table (scalar, avx2, avx512, avx512vnni, amx)"));
    }
    if (!CpuHasIsa(*named)) {
      return absl::UnavailableError(absl::StrCat(
          "MODSERVE_CPU_ISA=", env, ": this CPU/OS cannot run those kernels",
          *named == Isa::kAmx ? absl::StrCat(" (", std::string(AmxUnavailableReason()), ")") : ""));
    }
    isa = *named;
  }
  if (!CpuHasIsa(isa)) {
    return absl::UnavailableError(absl::StrCat("cpu backend: kernels for isa '",
                                               std::string(IsaName(isa)),
                                               "' requested but this CPU/OS does not support it"));
  }
  return std::unique_ptr<CpuBackend>(
      new CpuBackend(KernelsFor(isa), options.num_threads, options.matmul_precision));
}

CpuBackend::CpuBackend(const KernelTable& kernels, int num_threads, MatmulPrecision precision)
    : kernels_(kernels), amx_terms_(Bf16TermsOf(precision)), pool_(num_threads) {}

bool CpuBackend::Supports(OpKind op, DType dtype) const {
  const bool float_storage = dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
  switch (op) {
    case OpKind::kEmbed:
    case OpKind::kGemm:
      return float_storage || DTypeIsQuantized(dtype);
    case OpKind::kRmsNorm:
    case OpKind::kRopeAndAppendKv:
    case OpKind::kAttention:
      return float_storage;
    case OpKind::kSwiGlu:
    case OpKind::kActivation:
    case OpKind::kAdd:
    case OpKind::kGatherRows:
    case OpKind::kScatterCombine:
    case OpKind::kRouteSelect:
      return dtype == DType::kF32;
    case OpKind::kCopyKvPages:
      return float_storage;
    case OpKind::kRouteRows:
      return dtype == DType::kI32;
  }
  return false;
}

void CpuBackend::SetDeviceRowCount(const TensorView& count) {
  CheckRowCountArg(kHost, count);
  row_count_ = count.empty() ? nullptr : count.as<int32_t>();
}

absl::StatusOr<DeviceBuffer> CpuBackend::Allocate(size_t bytes) {
  MODSERVE_CHECK(!capturing_) << "Allocate during a graph capture";
  // Buffers of 2 MiB and more (the KV pool above all) go on 2 MiB pages where the kernel allows
  // them: attention reads KV pages scattered over the pool, and with 4 KiB pages every 16 KiB KV
  // page costs four TLB entries. madvise before the first touch; a refusal changes nothing.
  const size_t align = bytes >= kHugePage ? kHugePage : kAlignment;
  // aligned_alloc wants a multiple of the alignment; a zero-byte request still gets a real pointer.
  // A size within one granule of SIZE_MAX would wrap when rounded up: it fails like any other.
  const size_t rounded = bytes > std::numeric_limits<size_t>::max() - align
                             ? 0
                             : std::max<size_t>(align, (bytes + align - 1) / align * align);
  void* data = rounded == 0 ? nullptr : std::aligned_alloc(align, rounded);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cpu backend: cannot allocate ", bytes, " bytes of host memory"));
  }
  if (align == kHugePage) ::madvise(data, rounded, MADV_HUGEPAGE);
  return DeviceBuffer(data, bytes, Device::kCpu, &FreeAligned, nullptr);
}

absl::StatusOr<TensorView> CpuBackend::PrepareGemmWeight(const TensorView& w) {
  MODSERVE_CHECK(!capturing_) << "PrepareGemmWeight during a graph capture";
  if (w.ndim != 2 || w.device != Device::kCpu || w.empty() || w.dim(0) == 0 ||
      w.dim(0) % kQ4KX16Rows != 0 || PreparedGroupRows(w) != 0) {
    return w;
  }
  const int64_t m = w.dim(0), k = w.dim(1);
  // The copy's repack function, rows per group and the bytes of one row group, where the table
  // has a kernel for it and the shape fits: the quantized types' interleaved layouts, and BF16's
  // panels where every BF16 Gemm of the weight can run on them (UsesBf16Panels).
  std::function<void(int64_t, int64_t, void*)> repack;
  int64_t group_bytes = 0, group_rows = kQ4KX16Rows;
  const char* layout = "interleaved";
  if (w.dtype == DType::kBF16) {
    if (!UsesBf16Panels(m)) return w;
    repack = [&](int64_t b, int64_t e, void* dst) {
      kernels_.repack_dpbf16(w.as<bf16_t>(), k, b, e, dst);
    };
    group_bytes = DpBf16PanelGroupBytes(k);
    group_rows = kDpBf16PanelRows;
    layout = "bf16 panel";
  } else {
    if (InterleavedKernel(w.dtype) == nullptr) return w;
    void (*fn)(const void*, int64_t, int64_t, int64_t, void*) = nullptr;
    if (w.dtype == DType::kQ4_K) {
      fn = &RepackQ4_KX16;
      group_bytes = k / 256 * kQ4KX16UnitBytes;
    } else if (w.dtype == DType::kQ5_K) {
      fn = &RepackQ5_KX16;
      group_bytes = k / 256 * kQ5KX16UnitBytes;
    } else if (w.dtype == DType::kQ6_K) {
      fn = &RepackQ6_KX16;
      group_bytes = k / 256 * kQ6KX16UnitBytes;
    } else if (w.dtype == DType::kQ8_0 && k % kQ8_0X16UnitElems == 0) {
      fn = &RepackQ8_0X16;
      group_bytes = k / kQ8_0X16UnitElems * kQ8_0X16UnitBytes;
    } else if ((w.dtype == DType::kQ4_0 || w.dtype == DType::kQ4_1 || w.dtype == DType::kQ5_0 ||
                w.dtype == DType::kQ5_1) &&
               k % kQ4X16UnitElems == 0) {
      repack = [&](int64_t b, int64_t e, void* dst) { RepackQ4X16(w.dtype, w.data, k, b, e, dst); };
      group_bytes = k / kQ4X16UnitElems * Q4X16UnitBytes(w.dtype);
    }
    if (fn == nullptr && !repack) return w;
    if (fn != nullptr) {
      repack = [&, fn](int64_t b, int64_t e, void* dst) { fn(w.data, k, b, e, dst); };
    }
  }
  const int64_t groups = m / group_rows;
  // Every layout keeps a row group in its rows' bytes, so views of whole groups start where
  // TensorView::rows puts them.
  MODSERVE_CHECK(static_cast<size_t>(groups) * static_cast<size_t>(group_bytes) == w.bytes())
      << layout << " copy of " << w.ShapeString() << " is not the tensor's size";
  const size_t bytes = (w.bytes() + kAlignment - 1) / kAlignment * kAlignment;
  if (prepared_chunks_.empty() || prepared_used_ + bytes > prepared_chunks_.back().bytes()) {
    absl::StatusOr<DeviceBuffer> chunk = Allocate(std::max(kPreparedChunkBytes, bytes));
    if (!chunk.ok()) {
      return absl::Status(chunk.status().code(),
                          absl::StrCat(std::string(DTypeName(w.dtype)), " weight ", w.ShapeString(),
                                       " in the ", layout, " layout: ", chunk.status().message()));
    }
    prepared_chunks_.push_back(*std::move(chunk));
    prepared_used_ = 0;
  }
  char* dst = static_cast<char*>(prepared_chunks_.back().data()) + prepared_used_;
  prepared_used_ += bytes;
  pool_.ParallelFor(0, groups, 1, [&](int64_t begin, int64_t end) { repack(begin, end, dst); });
  prepared_.emplace(dst, PreparedWeight{w.bytes(), group_bytes, group_rows, w.dtype});
  return TensorView(dst, w.dtype, {m, k}, Device::kCpu);
}

int64_t CpuBackend::PreparedGroupRows(const TensorView& w) const {
  const char* p = static_cast<const char*>(w.data);
  auto it = prepared_.upper_bound(p);
  if (it == prepared_.begin()) return 0;
  --it;
  if (p >= it->first + it->second.bytes) return 0;
  const int64_t offset = p - it->first;
  MODSERVE_CHECK(w.dtype == it->second.dtype && w.ndim == 2 &&
                 offset % it->second.group_bytes == 0 && w.dim(0) % it->second.group_rows == 0 &&
                 static_cast<size_t>(offset) + w.bytes() <= it->second.bytes)
      << "a view " << w.ShapeString() << " " << DTypeName(w.dtype) << " at byte " << offset
      << " of a prepared " << DTypeName(it->second.dtype)
      << " weight is not whole row groups of it";
  return it->second.group_rows;
}

absl::Status CpuBackend::CopyToDevice(const TensorView& host_src, const TensorView& dst) {
  MODSERVE_CHECK(!capturing_) << "CopyToDevice during a graph capture";
  if (host_src.device != Device::kCpu || dst.device != Device::kCpu) {
    return absl::InvalidArgumentError(
        "cpu backend CopyToDevice: both tensors must be host tensors");
  }
  if (host_src.bytes() != dst.bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("cpu backend CopyToDevice: source has ",
                                                   host_src.bytes(), " bytes, destination ",
                                                   dst.bytes()));
  }
  if (dst.bytes() > 0) std::memmove(dst.data, host_src.data, dst.bytes());
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyToHost(const TensorView& src, const TensorView& host_dst) {
  MODSERVE_CHECK(!capturing_) << "CopyToHost during a graph capture";
  if (src.device != Device::kCpu || host_dst.device != Device::kCpu) {
    return absl::InvalidArgumentError("cpu backend CopyToHost: both tensors must be host tensors");
  }
  if (src.bytes() != host_dst.bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("cpu backend CopyToHost: source has ",
                                                   src.bytes(), " bytes, destination ",
                                                   host_dst.bytes()));
  }
  if (src.bytes() > 0) std::memmove(host_dst.data, src.data, src.bytes());
  return absl::OkStatus();
}

// Every op runs to completion before returning, so there is never anything to wait for.
absl::Status CpuBackend::Synchronize() {
  MODSERVE_CHECK(!capturing_) << "Synchronize during a graph capture";
  return absl::OkStatus();
}

void CpuBackend::Record(std::function<void()> op) {
  recording_.push_back([this, op = std::move(op), count = row_count_] {
    row_count_ = count;
    op();
  });
}

absl::Status CpuBackend::BeginCapture() {
  if (capturing_) return absl::FailedPreconditionError("cpu backend: a capture is already open");
  capturing_ = true;
  recording_.clear();
  return absl::OkStatus();
}

absl::StatusOr<int> CpuBackend::EndCapture() {
  if (!capturing_) return absl::FailedPreconditionError("cpu backend: no capture is open");
  capturing_ = false;
  const int id = next_graph_++;
  graphs_[id] = std::exchange(recording_, {});
  return id;
}

absl::Status CpuBackend::Replay(int graph) {
  if (capturing_) return absl::FailedPreconditionError("cpu backend: Replay during a capture");
  auto it = graphs_.find(graph);
  if (it == graphs_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("cpu backend: no graph ", graph));
  }
  // The host's row count is its own: a replay sets each op's, then gives the host's back.
  const int32_t* host_count = row_count_;
  for (const std::function<void()>& op : it->second) op();
  row_count_ = host_count;
  return absl::OkStatus();
}

template <typename W>
void CpuBackend::WeightToF32(const W* src, int64_t count, float* dst) const {
  if constexpr (std::is_same_v<W, float>) {
    std::memcpy(dst, src, count * sizeof(float));
  } else if constexpr (std::is_same_v<W, f16_t>) {
    kernels_.to_f32_f16(src, count, dst);
  } else {
    kernels_.to_f32_bf16(src, count, dst);
  }
}

// ---- Embed -----------------------------------------------------------------------------------
template <typename W>
void CpuBackend::EmbedT(const TensorView& ids, const TensorView& table, const TensorView& out) {
  const int64_t n = ids.dim(0), vocab = table.dim(0), d = table.dim(1);
  const int32_t* id = ids.as<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    MODSERVE_CHECK(id[i] >= 0 && id[i] < vocab) << "token id " << id[i] << " vocab " << vocab;
  }
  const W* t = table.as<W>();
  float* o = out.as<float>();
  pool_.ParallelFor(0, n, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(d, 1)),
                    [&](int64_t b, int64_t e) {
                      for (int64_t i = b; i < e; ++i) WeightToF32(t + id[i] * d, d, o + i * d);
                    });
}

// Block-quantized tables: the looked-up rows are dequantized with the reference dequantizer, so
// the result is exact (and identical to reference::Embed); a row is a few KiB, not worth SIMD.
void CpuBackend::EmbedQuantized(const TensorView& ids, const TensorView& table,
                                const TensorView& out) {
  const int64_t n = ids.dim(0), vocab = table.dim(0), d = table.dim(1);
  const int32_t* id = ids.as<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    MODSERVE_CHECK(id[i] >= 0 && id[i] < vocab) << "token id " << id[i] << " vocab " << vocab;
  }
  const char* t = static_cast<const char*>(table.data);
  const size_t row_bytes = DTypeRowBytes(table.dtype, d);
  float* o = out.as<float>();
  pool_.ParallelFor(0, n, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(d, 1)),
                    [&](int64_t b, int64_t e) {
                      for (int64_t i = b; i < e; ++i) {
                        quant::DequantizeRow(table.dtype, t + id[i] * row_bytes, d, o + i * d);
                      }
                    });
}

void CpuBackend::Embed(const TensorView& ids, const TensorView& table, const TensorView& out) {
  if (capturing_) return Record([=, this] { Embed(ids, table, out); });
  CheckEmbedArgs(kHost, ids, table, out);
  MODSERVE_CHECK(PreparedGroupRows(table) == 0) << "Embed of a PrepareGemmWeight copy";
  if (const int64_t n = CountedRows(ids.dim(0)); n < ids.dim(0)) {
    if (n > 0) Embed(ids.rows(0, n), table, out.rows(0, n));
    return;
  }
  switch (table.dtype) {
    case DType::kF32:
      return EmbedT<float>(ids, table, out);
    case DType::kF16:
      return EmbedT<f16_t>(ids, table, out);
    case DType::kBF16:
      return EmbedT<bf16_t>(ids, table, out);
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ4_K:
    case DType::kQ6_K:
    case DType::kQ5_K:
    case DType::kQ5_0:
    case DType::kQ5_1:
      return EmbedQuantized(ids, table, out);
    case DType::kI32:
      break;
  }
  MODSERVE_CHECK(false) << "Embed table dtype " << DTypeName(table.dtype);
}

// ---- RmsNorm ---------------------------------------------------------------------------------
template <typename W>
void CpuBackend::RmsNormT(float eps, const TensorView& x, const TensorView& weight,
                          const TensorView& out) {
  const int64_t n = x.dim(0), d = x.dim(1);
  norm_weight_.resize(d);
  WeightToF32(weight.as<W>(), d, norm_weight_.data());
  const float* w = norm_weight_.data();
  const float* xp = x.as<float>();
  float* o = out.as<float>();
  pool_.ParallelFor(0, n, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(d, 1)),
                    [&](int64_t b, int64_t e) {
                      for (int64_t i = b; i < e; ++i) {
                        const float* xi = xp + i * d;
                        // Eight partial sums: a vectorisable reduction without -ffast-math.
                        float part[8] = {};
                        int64_t c = 0;
                        for (; c + 8 <= d; c += 8) {
                          for (int u = 0; u < 8; ++u) part[u] += xi[c + u] * xi[c + u];
                        }
                        float sum_sq = 0.0f;
                        for (; c < d; ++c) sum_sq += xi[c] * xi[c];
                        for (int u = 0; u < 8; ++u) sum_sq += part[u];
                        const float inv_rms =
                            1.0f / std::sqrt(sum_sq / static_cast<float>(d) + eps);
                        float* oi = o + i * d;
                        for (c = 0; c < d; ++c) oi[c] = xi[c] * inv_rms * w[c];
                      }
                    });
}

void CpuBackend::RmsNorm(const RmsNormParams& params, const TensorView& x, const TensorView& weight,
                         const TensorView& out) {
  if (capturing_) return Record([=, this] { RmsNorm(params, x, weight, out); });
  CheckRmsNormArgs(kHost, x, weight, out);
  if (const int64_t n = CountedRows(x.dim(0)); n < x.dim(0)) {
    if (n > 0) RmsNorm(params, x.rows(0, n), weight, out.rows(0, n));
    return;
  }
  switch (weight.dtype) {
    case DType::kF32:
      return RmsNormT<float>(params.eps, x, weight, out);
    case DType::kF16:
      return RmsNormT<f16_t>(params.eps, x, weight, out);
    case DType::kBF16:
      return RmsNormT<bf16_t>(params.eps, x, weight, out);
    case DType::kI32:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ4_K:
    case DType::kQ6_K:
    case DType::kQ5_K:
    case DType::kQ5_0:
    case DType::kQ5_1:
      break;
  }
  MODSERVE_CHECK(false) << "RmsNorm weight dtype " << DTypeName(weight.dtype);
}

// ---- Gemm and GemmGroup ------------------------------------------------------------------------
// Gemm is a group of one. A group runs every member's kernels on the same tiles as its own Gemm
// would (the kernels compute each output element independently of the row range they are given),
// so sharing one parallel pass and one quantization of x changes no bit.
void CpuBackend::Gemm(const TensorView& x, const TensorView& w, const TensorView& bias,
                      const TensorView& out) {
  if (capturing_) return Record([=, this] { Gemm(x, w, bias, out); });
  const GemmOperand member{w, bias, out};
  GemmGroup(x, absl::MakeConstSpan(&member, 1));
}

uint16_t* CpuBackend::PackedX(size_t bytes) {
  bytes = (bytes + kAlignment - 1) / kAlignment * kAlignment;  // aligned_alloc wants a multiple
  if (amx_x_bytes_ < bytes) {
    amx_x_.reset(static_cast<uint16_t*>(std::aligned_alloc(kAlignment, bytes)));
    MODSERVE_CHECK(amx_x_ != nullptr) << "cannot allocate " << bytes << " bytes";
    amx_x_bytes_ = bytes;
  }
  return amx_x_.get();
}

void CpuBackend::GemmRange(const GemmMember& g, const float* x, int64_t n, int64_t k,
                           int64_t x_begin, int64_t x_end, int64_t row_begin,
                           int64_t row_end) const {
  if (g.acts != nullptr) {
    return g.quant(*g.acts, x_begin, x_end, g.w, g.bias, g.out, g.m, row_begin, row_end);
  }
  if (g.amx) {
    return kernels_.gemm_amx_bf16(amx_x_.get(), n, k, x_begin, x_end,
                                  static_cast<const bf16_t*>(g.w), g.bias, g.out, g.m, row_begin,
                                  row_end, ThreadScratch(kAmxScratchFloats), amx_terms_);
  }
  if (g.panels && UsesDpBf16()) {
    return kernels_.gemm_dpbf16_panels(amx_x_.get(), k, x_begin, x_end, g.w, g.bias, g.out, g.m,
                                       row_begin, row_end, amx_terms_);
  }
  if (g.panels) {
    return kernels_.gemm_bf16_panels(x, k, x_begin, x_end, g.w, g.bias, g.out, g.m, row_begin,
                                     row_end);
  }
  if (g.dpbf16) {
    return kernels_.gemm_dpbf16(amx_x_.get(), k, x_begin, x_end, static_cast<const bf16_t*>(g.w),
                                g.bias, g.out, g.m, row_begin, row_end, amx_terms_);
  }
  // Float weights: the decode kernel always takes all n rows of x.
  switch (g.dtype) {
    case DType::kF32:
      return g.large ? kernels_.gemm_large_f32(x, x_begin, x_end, k, static_cast<const float*>(g.w),
                                               g.bias, g.out, g.m, row_begin, row_end)
                     : kernels_.gemm_small_f32(x, n, k, static_cast<const float*>(g.w), g.bias,
                                               g.out, g.m, row_begin, row_end);
    case DType::kF16:
      return g.large ? kernels_.gemm_large_f16(x, x_begin, x_end, k, static_cast<const f16_t*>(g.w),
                                               g.bias, g.out, g.m, row_begin, row_end)
                     : kernels_.gemm_small_f16(x, n, k, static_cast<const f16_t*>(g.w), g.bias,
                                               g.out, g.m, row_begin, row_end);
    case DType::kBF16:
      return g.large
                 ? kernels_.gemm_large_bf16(x, x_begin, x_end, k, static_cast<const bf16_t*>(g.w),
                                            g.bias, g.out, g.m, row_begin, row_end)
                 : kernels_.gemm_small_bf16(
                       kernels_.prepare_x_bf16 != nullptr ? small_bf16_x_.data() : x, n, k,
                       static_cast<const bf16_t*>(g.w), g.bias, g.out, g.m, row_begin, row_end);
    default:
      break;
  }
  MODSERVE_CHECK(false) << "Gemm w dtype " << DTypeName(g.dtype);
}

QuantGemmFn CpuBackend::QuantKernel(DType dtype) const {
  switch (dtype) {
    case DType::kQ8_0:
      return kernels_.gemm_q8_0;
    case DType::kQ4_0:
      return kernels_.gemm_q4_0;
    case DType::kQ4_1:
      return kernels_.gemm_q4_1;
    case DType::kQ4_K:
      return kernels_.gemm_q4_k;
    case DType::kQ6_K:
      return kernels_.gemm_q6_k;
    case DType::kQ5_K:
      return kernels_.gemm_q5_k;
    case DType::kQ5_0:
      return kernels_.gemm_q5_0;
    case DType::kQ5_1:
      return kernels_.gemm_q5_1;
    default:
      break;
  }
  return nullptr;
}

QuantGemmFn CpuBackend::InterleavedKernel(DType dtype) const {
  switch (dtype) {
    case DType::kQ4_K:
      return kernels_.gemm_q4_k_x16;
    case DType::kQ5_K:
      return kernels_.gemm_q5_k_x16;
    case DType::kQ6_K:
      return kernels_.gemm_q6_k_x16;
    case DType::kQ8_0:
      return kernels_.gemm_q8_0_x16;
    case DType::kQ4_0:
      return kernels_.gemm_q4_0_x16;
    case DType::kQ4_1:
      return kernels_.gemm_q4_1_x16;
    case DType::kQ5_0:
      return kernels_.gemm_q5_0_x16;
    case DType::kQ5_1:
      return kernels_.gemm_q5_1_x16;
    default:
      break;
  }
  return nullptr;
}

// Decode (n up to the kernels' small-n bound): bound by reading w, so the threads split the union
// of all members' weight rows and each streams its share. Prefill: 2-D tiles over (weight-row
// block, x-row block) of every member, each tile packing its w block once. With a quantized w,
// x is rounded to 8 bits per 32-element block (QuantizedActs) once per activation layout the
// group's kernels want, then every weight block is an integer dot product (kernels.h).
void CpuBackend::GemmGroup(const TensorView& x, absl::Span<const GemmOperand> group) {
  if (capturing_) {
    return Record([=, this, members = std::vector<GemmOperand>(group.begin(), group.end())] {
      GemmGroup(x, members);
    });
  }
  if (const int64_t n = CountedRows(x.dim(0)); n < x.dim(0)) {
    if (n == 0) return;
    absl::InlinedVector<GemmOperand, 4> counted(group.begin(), group.end());
    for (GemmOperand& g : counted) g.out = g.out.rows(0, n);
    GemmGroup(x.rows(0, n), counted);
    return;
  }
  for (size_t i = 0; i < group.size(); ++i) {
    const GemmOperand& g = group[i];
    CheckGemmArgs(kHost, x, g.w, g.bias, g.out);
    MODSERVE_CHECK(DTypeIsQuantized(g.w.dtype) || g.w.dtype == DType::kF32 ||
                   g.w.dtype == DType::kF16 || g.w.dtype == DType::kBF16)
        << "Gemm w dtype " << DTypeName(g.w.dtype);
    const char* lo = static_cast<const char*>(g.out.data);
    for (size_t j = 0; j < i; ++j) {
      const char* other = static_cast<const char*>(group[j].out.data);
      MODSERVE_CHECK(g.out.bytes() == 0 || group[j].out.bytes() == 0 ||
                     lo + g.out.bytes() <= other || other + group[j].out.bytes() <= lo)
          << "GemmGroup outputs " << j << " and " << i << " overlap";
    }
  }
  const int64_t n = x.dim(0), k = x.dim(1);
  if (n == 0) return;

  // Float biases in w's 16-bit dtype, widened once into one buffer for the whole group.
  int64_t bias_elems = 0;
  bool layouts[2] = {false, false};  // ActLayout::kNatural, kPairInterleaved
  for (const GemmOperand& g : group) {
    if (!g.bias.empty() && g.bias.dtype != DType::kF32) bias_elems += g.w.dim(0);
    if (DTypeIsQuantized(g.w.dtype)) {
      layouts[static_cast<int>(ActLayoutFor(g.w.dtype, n, PreparedGroupRows(g.w) != 0))] = true;
    }
  }
  if (static_cast<int64_t>(bias_f32_.size()) < bias_elems) bias_f32_.resize(bias_elems);

  // x as the quantized kernels read it, once per layout needed.
  QuantizedActs acts[2];
  const int num_layouts = int{layouts[0]} + int{layouts[1]};
  if (num_layouts > 0) {
    const size_t one = (QuantizedActs::Bytes(n, k) + kAlignment - 1) / kAlignment * kAlignment;
    const size_t scratch_bytes = one * static_cast<size_t>(num_layouts);
    if (act_scratch_bytes_ < scratch_bytes) {
      act_scratch_.reset(static_cast<char*>(std::aligned_alloc(kAlignment, scratch_bytes)));
      MODSERVE_CHECK(act_scratch_ != nullptr) << "cannot allocate " << scratch_bytes << " bytes";
      act_scratch_bytes_ = scratch_bytes;
    }
    size_t offset = 0;
    for (int l = 0; l < 2; ++l) {
      if (!layouts[l]) continue;
      acts[l] = QuantizedActs::In(act_scratch_.get() + offset, n, k, static_cast<ActLayout>(l));
      offset += one;
    }
    const float* xp = x.as<float>();
    // Rows of every layout in one pass: [0, n) the first layout's, [n, 2n) the second's.
    const int first = layouts[0] ? 0 : 1;
    pool_.ParallelFor(0, n * num_layouts, std::max<int64_t>(1, kElementwiseGrain / k),
                      [&](int64_t b, int64_t e) {
                        for (int64_t lo = b; lo < e;) {
                          const int64_t part = lo / n;
                          const int64_t hi = std::min(e, (part + 1) * n);
                          kernels_.quantize_acts(xp, lo - part * n, hi - part * n,
                                                 acts[first + static_cast<int>(part)]);
                          lo = hi;
                        }
                      });
  }

  gemm_members_.clear();
  bool any_amx = false, any_dpbf16 = false, any_small_bf16 = false;
  int64_t small_rows = 0, large_tiles = 0, bias_used = 0;
  // Rows of the decode pass's units: whole groups of every prepared copy in it.
  int64_t unit_rows = kGemmRowGrain;
  const int64_t row_blocks = (n + kGemmRowBlock - 1) / kGemmRowBlock;
  for (const GemmOperand& g : group) {
    GemmMember mem;
    mem.dtype = g.w.dtype;
    mem.w = g.w.data;
    mem.out = g.out.as<float>();
    mem.m = g.w.dim(0);
    if (mem.m == 0) continue;
    if (!g.bias.empty() && g.bias.dtype == DType::kF32) {
      mem.bias = g.bias.as<float>();
    } else if (!g.bias.empty()) {
      float* dst = bias_f32_.data() + bias_used;
      if (g.bias.dtype == DType::kF16) {
        WeightToF32(g.bias.as<f16_t>(), mem.m, dst);
      } else {
        WeightToF32(g.bias.as<bf16_t>(), mem.m, dst);
      }
      mem.bias = dst;
      bias_used += mem.m;
    }
    const int64_t group_rows = PreparedGroupRows(g.w);
    const bool prepared = group_rows != 0;
    if (DTypeIsQuantized(mem.dtype)) {
      mem.quant = prepared ? InterleavedKernel(mem.dtype) : QuantKernel(mem.dtype);
      mem.acts = &acts[static_cast<int>(ActLayoutFor(mem.dtype, n, prepared))];
      mem.large = n > kQuantSmallNMax;
    } else {
      mem.large = n > SmallNMax(mem.dtype) && mem.m > kGemmSkinnyRows;
      // A BF16 panel copy (PrepareGemmWeight, UsesBf16Panels) takes its kernel at every row
      // count.
      mem.panels = prepared && mem.dtype == DType::kBF16;
      mem.amx = mem.large && mem.dtype == DType::kBF16 && kernels_.gemm_amx_bf16 != nullptr;
      // KernelTable::gemm_dpbf16 says why only at kMedium.
      mem.dpbf16 = mem.large && mem.dtype == DType::kBF16 && UsesDpBf16() && !mem.panels;
      any_amx = any_amx || mem.amx;
      any_dpbf16 = any_dpbf16 || mem.dpbf16 || (mem.panels && UsesDpBf16());
    }
    any_small_bf16 = any_small_bf16 || (!mem.large && mem.dtype == DType::kBF16 && !mem.panels);
    if (mem.large) {
      mem.first = large_tiles;
      mem.col_block = mem.amx ? kAmxColBlock : kGemmColBlock;
      large_tiles += (mem.m + mem.col_block - 1) / mem.col_block * row_blocks;
    } else {
      // A prepared weight's rows are split in whole groups: it starts on a group boundary of
      // the pass, which is split at multiples of unit_rows below.
      mem.first = prepared ? (small_rows + group_rows - 1) / group_rows * group_rows : small_rows;
      small_rows = mem.first + mem.m;
      unit_rows = std::max(unit_rows, group_rows);
    }
    gemm_members_.push_back(mem);
  }
  const float* xp = x.as<float>();
  if (any_small_bf16 && kernels_.prepare_x_bf16 != nullptr) {
    // x in the BF16 decode kernel's layout, once for every member (not once per chunk).
    if (static_cast<int64_t>(small_bf16_x_.size()) < n * k) small_bf16_x_.resize(n * k);
    pool_.ParallelFor(0, n, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(1, k)),
                      [&](int64_t b, int64_t e) {
                        kernels_.prepare_x_bf16(xp + b * k, e - b, k, small_bf16_x_.data() + b * k);
                      });
  }
  if (any_amx) {
    // x split into its amx_terms_ bf16 terms once for every AMX member (rows padded to 32).
    // 64-byte aligned, as the tile loads want it (see ThreadScratch).
    uint16_t* packed = PackedX(AmxPackedXBytes(n, k));
    // Whole 16-row tiles per task (the packer transposes them for decode-sized n).
    constexpr int64_t kTile = 16;
    pool_.ParallelFor(0, AmxPackedRows(n) / kTile,
                      std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(1, k * kTile)),
                      [&](int64_t b, int64_t e) {
                        kernels_.pack_x_bf16(xp, n, k, b * kTile, e * kTile, packed, amx_terms_);
                      });
  }
  if (any_dpbf16) {
    // x as amx_terms_ bf16 terms per row in the DpBf16 layout, once for every such member.
    // (Never beside AMX members: a table with the tiles takes every large BF16 Gemm there.)
    uint16_t* packed = PackedX(DpBf16PackedXBytes(n, k, amx_terms_));
    pool_.ParallelFor(
        0, n, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(1, k)),
        [&](int64_t b, int64_t e) { kernels_.pack_x_dpbf16(xp, k, b, e, packed, amx_terms_); });
  }
  if (small_rows > 0) {
    static_assert(kGemmRowGrain % kQ4KX16Rows == 0 && kDpBf16PanelRows % kGemmRowGrain == 0);
    pool_.ParallelForSpans(
        0, (small_rows + unit_rows - 1) / unit_rows, 1, [&](int64_t ub, int64_t ue) {
          const int64_t b = ub * unit_rows, e = std::min(small_rows, ue * unit_rows);
          for (const GemmMember& g : gemm_members_) {
            if (g.large) continue;
            const int64_t lo = std::max(b, g.first), hi = std::min(e, g.first + g.m);
            if (lo < hi) GemmRange(g, xp, n, k, 0, n, lo - g.first, hi - g.first);
          }
        });
  }
  if (large_tiles > 0) {
    // One tile per chunk: a tile is 0.1-1 ms of work, and a thread left with one more tile than
    // the other costs a whole one.
    pool_.ParallelForEach(0, large_tiles, [&](int64_t b, int64_t e) {
      for (const GemmMember& g : gemm_members_) {
        if (!g.large) continue;
        const int64_t tiles = (g.m + g.col_block - 1) / g.col_block * row_blocks;
        for (int64_t t = std::max(b, g.first); t < std::min(e, g.first + tiles); ++t) {
          const int64_t cb = (t - g.first) / row_blocks, rb = (t - g.first) % row_blocks;
          GemmRange(g, xp, n, k, rb * kGemmRowBlock, std::min(n, (rb + 1) * kGemmRowBlock),
                    cb * g.col_block, std::min(g.m, (cb + 1) * g.col_block));
        }
      }
    });
  }
}

// ---- RopeAndAppendKv -------------------------------------------------------------------------
template <typename T>
void CpuBackend::RopeAndAppendKvT(const RopeParams& p, const TensorView& q, const TensorView& k,
                                  const TensorView& v, const TensorView& positions,
                                  const TensorView& slots, const TensorView& kv_pool) {
  const int64_t n = q.dim(0), hd = p.head_dim, half = hd / 2, kv = p.n_kv_heads;
  const int64_t bs = p.block_size, num_slots = kv_pool.dim(0) * bs;
  const int32_t* pos = positions.as<int32_t>();
  const int32_t* slot = slots.as<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    MODSERVE_CHECK(pos[i] >= 0) << "position " << pos[i];
    MODSERVE_CHECK(slot[i] >= 0 && slot[i] < num_slots)
        << "slot " << slot[i] << " of " << num_slots;
  }
  // inv_freq in fp64 once per call; the angle position * inv_freq is fp64 too, so positions in
  // the 100k range keep their phase (an f32 angle would be off by ~1e-2 rad there).
  std::vector<double> inv_freq(half);
  for (int64_t j = 0; j < half; ++j) {
    inv_freq[j] = 1.0 / std::pow(p.rope_theta, static_cast<double>(2 * j) / hd);
  }
  float* qp = q.as<float>();
  float* kp = k.as<float>();
  const float* vp = v.as<float>();
  T* pool = kv_pool.as<T>();
  const int64_t work_per_token = (p.n_heads + 2 * kv) * hd;
  pool_.ParallelFor(
      0, n, std::max<int64_t>(1, kElementwiseGrain / work_per_token), [&](int64_t b, int64_t e) {
        float* cs = ThreadScratch(2 * half);  // [cos | sin], f32 as the reference rounds them
        for (int64_t i = b; i < e; ++i) {
          for (int64_t j = 0; j < half; ++j) {
            const double angle = static_cast<double>(pos[i]) * inv_freq[j];
            cs[j] = static_cast<float>(std::cos(angle));
            cs[half + j] = static_cast<float>(std::sin(angle));
          }
          auto rotate = [&](float* vec) {
            for (int64_t j = 0; j < half; ++j) {
              const float a = vec[j], c = vec[j + half];
              vec[j] = a * cs[j] - c * cs[half + j];
              vec[j + half] = c * cs[j] + a * cs[half + j];
            }
          };
          for (int64_t h = 0; h < p.n_heads; ++h) rotate(qp + (i * p.n_heads + h) * hd);
          const int64_t page = slot[i] / bs, offset = slot[i] % bs;
          for (int64_t h = 0; h < kv; ++h) {
            float* kh = kp + (i * kv + h) * hd;
            const float* vh = vp + (i * kv + h) * hd;
            rotate(kh);
            T* k_dst = pool + ((page * 2 * kv + h) * bs + offset) * hd;
            T* v_dst = pool + ((page * 2 * kv + kv + h) * bs + offset) * hd;
            for (int64_t d = 0; d < hd; ++d) {
              k_dst[d] = FromF32<T>(kh[d]);
              v_dst[d] = FromF32<T>(vh[d]);
            }
          }
        }
      });
}

void CpuBackend::RopeAndAppendKv(const RopeParams& params, const TensorView& q, const TensorView& k,
                                 const TensorView& v, const TensorView& positions,
                                 const TensorView& slots, const TensorView& kv_pool) {
  if (capturing_) {
    return Record([=, this] { RopeAndAppendKv(params, q, k, v, positions, slots, kv_pool); });
  }
  CheckRopeAndAppendKvArgs(kHost, params, q, k, v, positions, slots, kv_pool);
  if (const int64_t n = CountedRows(q.dim(0)); n < q.dim(0)) {
    if (n > 0) {
      RopeAndAppendKv(params, q.rows(0, n), k.rows(0, n), v.rows(0, n), positions.rows(0, n),
                      slots.rows(0, n), kv_pool);
    }
    return;
  }
  switch (kv_pool.dtype) {
    case DType::kF32:
      return RopeAndAppendKvT<float>(params, q, k, v, positions, slots, kv_pool);
    case DType::kF16:
      return RopeAndAppendKvT<f16_t>(params, q, k, v, positions, slots, kv_pool);
    case DType::kBF16:
      return RopeAndAppendKvT<bf16_t>(params, q, k, v, positions, slots, kv_pool);
    case DType::kI32:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ4_K:
    case DType::kQ6_K:
    case DType::kQ5_K:
    case DType::kQ5_0:
    case DType::kQ5_1:
      break;
  }
  MODSERVE_CHECK(false) << "kv_pool dtype " << DTypeName(kv_pool.dtype);
}

// ---- Attention -------------------------------------------------------------------------------

void CpuBackend::RunAttentionBlocks(const AttentionParams& p, const float* q, const bf16_t* pool,
                                    const int32_t* page_table, int64_t max_pages,
                                    const int32_t* seq_of, const int32_t* kv_len, int64_t n,
                                    const int64_t* first, float* partial, int64_t partial_stride,
                                    float* out) {
  const int64_t hd = p.head_dim, kv = p.n_kv_heads, bs = p.block_size, nh = p.n_heads;
  const int64_t group = nh / kv;
  // Runs of rows of one sequence whose kv lengths count up by one (a prefill chunk, or a routed
  // layer's rows of one) in blocks of kAttnTileBlockRows, any other row as a block of its own; a
  // task is one block and one split of its last row's keys.
  std::vector<std::pair<int64_t, int64_t>>& blocks = attn_blocks_;
  std::vector<int64_t>& block_first = attn_block_first_task_;
  blocks.clear();
  block_first.assign(1, 0);
  for (int64_t i = 0; i < n;) {
    int64_t e = i + 1;
    while (e < n && e - i < kAttnTileBlockRows && seq_of[e] == seq_of[i] &&
           kv_len[e] == kv_len[e - 1] + 1) {
      ++e;
    }
    blocks.emplace_back(i, e);
    block_first.push_back(block_first.back() + first[e] - first[e - 1]);
    i = e;
  }
  // One task per chunk: tasks differ in cost (a split of fewer keys, a block of one row), and a
  // prompt has only a few dozen of them.
  pool_.ParallelForEach(0, block_first.back(), [&](int64_t tb, int64_t te) {
    // Scratch: the kernel's tiles, then its outputs m, l, acc for a block's q-rows, then the
    // K and V row pointers of a split.
    const int64_t kernel_floats = static_cast<int64_t>(AmxAttnScratchBytes(hd) / sizeof(float));
    const int64_t f_max = kAttnTileBlockRows * group;
    const int64_t ptr_at = (kernel_floats + f_max * (hd + 2) + 15) / 16 * 16;
    float* scratch = ThreadScratch(ptr_at + 2 * kAmxAttnKeys * sizeof(void*) / sizeof(float));
    float* m = scratch + kernel_floats;
    float* l = m + f_max;
    float* acc = l + f_max;
    const bf16_t** keys = reinterpret_cast<const bf16_t**>(scratch + ptr_at);
    const bf16_t** values = keys + kAmxAttnKeys;
    int64_t bi =
        std::upper_bound(block_first.begin(), block_first.end(), tb) - block_first.begin() - 1;
    for (int64_t task = tb; task < te; ++task) {
      while (task >= block_first[bi + 1]) ++bi;
      const auto [b, e] = blocks[bi];
      const int64_t s = task - block_first[bi], key_begin = s * kKeysPerSplit;
      const int64_t num_keys = std::min(kKeysPerSplit, kv_len[e - 1] - key_begin);
      const int32_t* pages = page_table + seq_of[b] * max_pages;
      for (int64_t g = 0; g < kv; ++g) {
        for (int64_t j = 0; j < num_keys; ++j) {
          const int64_t key = key_begin + j;
          const bf16_t* page = pool + pages[key / bs] * 2 * kv * bs * hd;
          keys[j] = page + (g * bs + key % bs) * hd;
          values[j] = page + ((kv + g) * bs + key % bs) * hd;
        }
        const AmxAttnBlock block = {.q = q + (b * nh + g * group) * hd,
                                    .ldq = nh * hd,
                                    .rows = e - b,
                                    .group = group,
                                    .head_dim = hd,
                                    .kv_len0 = kv_len[b],
                                    .key_begin = key_begin,
                                    .num_keys = num_keys,
                                    .keys = keys,
                                    .values = values,
                                    .scale = p.scale,
                                    .terms = amx_terms_,
                                    .m = m,
                                    .l = l,
                                    .acc = acc,
                                    .scratch = scratch};
        kernels_.attn_block_bf16(block);
        for (int64_t i = b; i < e; ++i) {
          if (kv_len[i] <= key_begin) continue;  // no key of this split
          const bool split = first[i + 1] - first[i] > 1;
          for (int64_t h = 0; h < group; ++h) {
            const int64_t f = (i - b) * group + h;
            if (!split) {
              float* dst = out + (i * nh + g * group + h) * hd;
              const float inv_l = 1.0f / l[f];
              for (int64_t d = 0; d < hd; ++d) dst[d] = acc[f * hd + d] * inv_l;
            } else {
              float* part = partial + ((first[i] + s) * kv + g) * partial_stride;
              part[h] = m[f];
              part[group + h] = l[f];
              std::copy(acc + f * hd, acc + (f + 1) * hd, part + 2 * group + h * hd);
            }
          }
        }
      }
    }
  });
}

// Flash-style: one task per (row, split) covers every kv head, so it reads whole pages (K of
// every head, then V of every head: 2 * n_kv_heads * block_size rows in a row) rather than one
// head's slice of each. Keys are visited in tiles of kKeyTile; a tile's scores (every kv head's,
// so each page's K rows are read in one pass), then its softmax, then its values (the V rows in
// one pass) update a running max m, denominator l and unnormalised output acc for every q head,
// so memory is O(tile) whatever the context. K/V are read in place from the pages in their
// storage type, each key and value vector once for all the group's q heads.
//
// A row's context is split at fixed multiples of kKeysPerSplit: the splits, and so the bits of
// the row's output, depend on its kv_len alone, never on how many rows share the call or on the
// thread count (MaxRowInvariantRows covers attention). Each split of a row with several leaves
// (m, l, acc) of every kv head in attn_partial_, and a second pass merges them in split order
// (log-sum-exp combine).
template <typename T>
void CpuBackend::AttentionT(const AttentionParams& p, const TensorView& q,
                            const TensorView& kv_pool, const TensorView& page_table,
                            const TensorView& row_seq, const TensorView& row_kv_len,
                            const TensorView& out) {
  const int64_t n = q.dim(0), hd = p.head_dim, kv = p.n_kv_heads, bs = p.block_size;
  const int64_t nh = p.n_heads, group = nh / kv;
  const int64_t num_seqs = page_table.dim(0), max_pages = page_table.dim(1);
  const int64_t num_pages = kv_pool.dim(0);
  const int32_t* pt = page_table.as<int32_t>();
  const int32_t* seq_of = row_seq.as<int32_t>();
  const int32_t* kv_len = row_kv_len.as<int32_t>();
  // Row i's tasks are [first[i], first[i + 1]), one per kKeysPerSplit keys.
  std::vector<int64_t>& first = attn_first_task_;
  first.resize(n + 1);
  first[0] = 0;
  for (int64_t i = 0; i < n; ++i) {
    MODSERVE_CHECK(seq_of[i] >= 0 && seq_of[i] < num_seqs)
        << "row_seq " << seq_of[i] << " of " << num_seqs;
    MODSERVE_CHECK(kv_len[i] >= 1 && kv_len[i] <= max_pages * bs) << "row_kv_len " << kv_len[i];
    const int32_t* pages = pt + seq_of[i] * max_pages;
    for (int64_t e = 0; e < (kv_len[i] + bs - 1) / bs; ++e) {
      MODSERVE_CHECK(pages[e] >= 0 && pages[e] < num_pages)
          << "page " << pages[e] << " of " << num_pages;
    }
    first[i + 1] = first[i] + (kv_len[i] + kKeysPerSplit - 1) / kKeysPerSplit;
  }
  if (n == 0) return;
  const int64_t num_tasks = first[n];
  // Task t of a split row leaves its (m[group], l[group], acc[group][hd]) for kv head g at
  // partial + (t * kv + g) * partial_stride.
  const int64_t partial_stride = group * (hd + 2);
  if (num_tasks > n) attn_partial_.resize(num_tasks * kv * partial_stride);

  const float* qp = q.as<float>();
  const T* pool = kv_pool.as<T>();
  float* o = out.as<float>();
  const float scale = p.scale;
  const KernelTable& kern = kernels_;
  float* partial = attn_partial_.data();

  const int64_t row_bytes = hd * static_cast<int64_t>(sizeof(T));

  // Entry j of row i's sequence: page pages[j / bs], offset j % bs; K then V halves of a page.
  // The entries of one head in one page are contiguous rows, which the kernels read in place:
  // f(run, rows) for each run of row i's entries within one page, in order from entry `from` on
  // for `count` entries, rows pointing at that run's entries of the page (add g * bs * hd for
  // head g's K, (kv + g) * bs * hd for its V).
  auto for_each_run = [&](int64_t i, int64_t from, int64_t count, auto&& f) {
    const int32_t* pages = pt + seq_of[i] * max_pages;
    for (int64_t t = 0, page = from / bs, offset = from - page * bs; t < count;
         ++page, offset = 0) {
      const int64_t run = std::min(bs - offset, count - t);
      f(run, pool + (pages[page] * 2 * kv * bs + offset) * hd);
      t += run;
    }
  };
  // The page runs of row i's keys [from, from + count) as byte ranges, for AttnPrefetch: run r's
  // page rows from base[r] (add `half * bs * row_bytes` for half `half`: K heads, then V heads),
  // bytes[r] bytes of each half. Returns the number of runs (at most kKeyTile for a tile).
  auto tile_ranges = [&](int64_t i, int64_t from, int64_t count, const char** base,
                         int64_t* bytes) {
    int64_t n = 0;
    for_each_run(i, from, count, [&](int64_t run, const T* rows) {
      base[n] = reinterpret_cast<const char*>(rows);
      bytes[n++] = run * row_bytes;
    });
    return n;
  };
  // The ranges of the first tile of row i's task `task`.
  auto first_tile_ranges = [&](int64_t i, int64_t task, const char** base, int64_t* bytes) {
    const int64_t from = (task - first[i]) * kKeysPerSplit;
    return tile_ranges(i, from, std::min(kKeyTile, kv_len[i] - from), base, bytes);
  };
  // Whether row i's tasks prefetch their tiles: not when the row before it is of the same
  // sequence (the rows of a prompt chunk, a draft's verification rows). Such rows read the keys
  // of the rows before them, which are then in the cache, and prefetching lines that are already
  // there costs the kernels time (a third more at 3 q heads per kv head: kernel_bench
  // attention-hot).
  auto prefetches = [&](int64_t i) { return i == 0 || seq_of[i - 1] != seq_of[i]; };
  // Prefetches the first tile of row i's task `task` into L2, every head's rows in one burst: for
  // a thread's first task, which no tile before it prefetched.
  // Only kv heads [g0, g1): those the task computes.
  auto prefetch_first_tile = [&](int64_t i, int64_t task, int64_t g0, int64_t g1) {
    const char* base[kKeyTile];
    int64_t bytes[kKeyTile];
    const int64_t n = first_tile_ranges(i, task, base, bytes);
    for (int64_t half = 0; half < 2 * kv; ++half) {
      if (half % kv < g0 || half % kv >= g1) continue;
      AttnPrefetch{.base = base, .bytes = bytes, .num_ranges = n, .offset = half * bs * row_bytes}
          .IssueRest();
    }
  };
  // Row i's task `task` (its split task - first[i]) for kv heads [g0, g1) and their q heads;
  // next_i >= 0 when this thread runs task + 1 (of row next_i, the same heads) next, whose first
  // tile it then prefetches during this task's last one.
  auto run_task = [&](int64_t i, int64_t task, int64_t next_i, int64_t g0, int64_t g1) {
    const int64_t s = task - first[i], len = kv_len[i];
    const bool split = first[i + 1] - first[i] > 1;
    const int64_t j_begin = s * kKeysPerSplit, j_end = std::min(len, j_begin + kKeysPerSplit);

    // Head h of the row (kv head h / group) owns scores[h], acc[h], m[h], l[h], rescale[h].
    float* scratch = ThreadScratch(nh * (kKeyTile + hd + 3));
    float* scores = scratch;              // [nh, kKeyTile]
    float* acc = scores + nh * kKeyTile;  // [nh, hd]
    float* m = acc + nh * hd;             // [nh]
    float* l = m + nh;                    // [nh]
    float* rescale = l + nh;              // [nh]
    const int64_t h0 = g0 * group, h1 = g1 * group;
    std::fill(acc + h0 * hd, acc + h1 * hd, 0.0f);
    std::fill(m + h0, m + h1, -INFINITY);
    std::fill(l + h0, l + h1, 0.0f);
    const float* qi = qp + i * nh * hd;

    // A tile's runs, found once for every head's scores and values: run r holds run_len[r]
    // keys (the tile's keys in order) and its page's rows start at run_rows[r].
    int64_t run_len[kKeyTile];
    const T* run_rows[kKeyTile];
    // The runs of the tile after the current one (tile_ranges): the kernels prefetch head g's K
    // rows of it while they compute head g's scores, and its V rows while they accumulate head
    // g's values, a few lines a step. Only for the first row of a sequence (prefetches, above).
    const char* next_base[kKeyTile];
    int64_t next_bytes[kKeyTile];
    for (int64_t t0 = j_begin; t0 < j_end; t0 += kKeyTile) {
      const int64_t nt = std::min(kKeyTile, j_end - t0);
      int64_t runs = 0;
      for_each_run(i, t0, nt, [&](int64_t run, const T* rows) {
        run_len[runs] = run;
        run_rows[runs++] = rows;
      });
      int64_t next_runs = 0;
      if (t0 + kKeyTile < j_end) {
        if (prefetches(i)) {
          next_runs = tile_ranges(i, t0 + kKeyTile, std::min(kKeyTile, j_end - t0 - kKeyTile),
                                  next_base, next_bytes);
        }
      } else if (next_i >= 0 && prefetches(next_i)) {
        next_runs = first_tile_ranges(next_i, task + 1, next_base, next_bytes);
      }
      // Scores of every kv head (one call over the tile's pages, q kept in registers across
      // them), the softmax of every head, then the values of every kv head (one call over the
      // tile's pages, acc rescaled once and kept in registers across them). The calls of head g
      // prefetch the next tile's K rows (scores) and V rows (values) of head g.
      for (int64_t g = g0; g < g1; ++g) {
        AttnPrefetch pf{.base = next_base,
                        .bytes = next_bytes,
                        .num_ranges = next_runs,
                        .offset = g * bs * row_bytes};
        AttnScoresFor<T>(kern)(qi + g * group * hd, group, run_rows, run_len, runs, g * bs * hd, hd,
                               scale, scores + g * group * kKeyTile, kKeyTile, &pf);
      }
      kern.attn_softmax(scores + h0 * kKeyTile, kKeyTile, h1 - h0, nt, m + h0, l + h0,
                        rescale + h0);
      for (int64_t g = g0; g < g1; ++g) {
        AttnPrefetch pf{.base = next_base,
                        .bytes = next_bytes,
                        .num_ranges = next_runs,
                        .offset = (kv + g) * bs * row_bytes};
        AttnAccumulateFor<T>(kern)(scores + g * group * kKeyTile, kKeyTile, group, run_rows,
                                   run_len, runs, (kv + g) * bs * hd, hd, rescale + g * group,
                                   acc + g * group * hd, &pf);
      }
    }

    if (!split) {
      for (int64_t h = h0; h < h1; ++h) {
        float* dst = o + (i * nh + h) * hd;
        const float inv_l = 1.0f / l[h];
        for (int64_t d = 0; d < hd; ++d) dst[d] = acc[h * hd + d] * inv_l;
      }
    } else {
      for (int64_t g = g0; g < g1; ++g) {
        float* dst = partial + (task * kv + g) * partial_stride;
        std::copy(m + g * group, m + (g + 1) * group, dst);
        std::copy(l + g * group, l + (g + 1) * group, dst + group);
        std::copy(acc + g * group * hd, acc + (g + 1) * group * hd, dst + 2 * group);
      }
    }
  };
  // Prompt rows (AttentionParams::prompt) with bf16 K/V on a CPU with AMX take the tile kernel
  // (RunAttentionBlocks). A row's bits do not depend on its block, so a prompt row gets the same
  // bits in every prompt call. Every other row (decode, drafts, verification) takes the row
  // kernels, a task per row and split, in row order (a chunk's first task finds its row by
  // binary search, later ones step), each task cut by kv heads when the tasks are too few to
  // share evenly (below).
  bool tiles = false;
  if constexpr (std::is_same_v<T, bf16_t>) {
    tiles =
        p.prompt && kernels_.attn_block_bf16 != nullptr && hd % 32 == 0 && hd <= kAmxAttnMaxHeadDim;
    if (tiles) {
      RunAttentionBlocks(p, qp, pool, pt, max_pages, seq_of, kv_len, n, first.data(), partial,
                         partial_stride, o);
    }
  }
  if (!tiles) {
    // A few tasks that do not share evenly among the threads (one row at a context of one or
    // three 256-key splits, with two threads): each task is cut further into `parts` ranges of
    // kv heads, the fewest that make a whole number of pieces per thread (or else about four
    // pieces per thread, at most one kv head a piece). A head's operations are the same
    // whichever heads share its task, so its bits do not change. A piece prefetches its own
    // first tile (the next piece's heads are not the ones whose kernel calls would prefetch
    // it), which costs more than it gains where the tasks already share evenly: one row at 512
    // keys, two tasks on two threads, took 9.6 us a layer whole and 10.7-14.0 cut in four (12 q
    // heads over 4, `kernel_bench 2 best attention`).
    const int64_t threads = pool_.num_threads();
    int64_t parts = 1;
    if (num_tasks < 4 * threads && num_tasks % threads != 0) {
      parts = std::min(kv, (4 * threads + num_tasks - 1) / num_tasks);
      for (int64_t cut = 2; cut <= kv; ++cut) {
        if (num_tasks * cut % threads == 0) {
          parts = cut;
          break;
        }
      }
    }
    // Whole tasks (parts 1) prefetch the next task's first tile during their last one, so only a
    // thread's first task prefetches its own.
    pool_.ParallelFor(0, num_tasks * parts, 1, [&](int64_t b, int64_t e) {
      int64_t i = std::upper_bound(first.begin(), first.end(), b / parts) - first.begin() - 1;
      for (int64_t piece = b; piece < e; ++piece) {
        const int64_t task = piece / parts, part = piece % parts;
        while (task >= first[i + 1]) ++i;
        const int64_t g0 = part * kv / parts, g1 = (part + 1) * kv / parts;
        if ((parts > 1 || piece == b) && prefetches(i)) prefetch_first_tile(i, task, g0, g1);
        const int64_t next_i = parts > 1 || task + 1 >= e ? -1
                               : task + 1 < first[i + 1]  ? i
                                                          : i + 1;
        run_task(i, task, next_i, g0, g1);
      }
    });
  }
  if (num_tasks == n) return;

  // Merge the splits of each (row, kv head) that has several, in split order.
  pool_.ParallelFor(0, n * kv, 1, [&](int64_t b, int64_t e) {
    for (int64_t pair = b; pair < e; ++pair) {
      const int64_t i = pair / kv, g = pair % kv;
      if (first[i + 1] - first[i] == 1) continue;
      for (int64_t h = 0; h < group; ++h) {
        float m_all = -INFINITY;
        for (int64_t t = first[i]; t < first[i + 1]; ++t) {
          m_all = std::max(m_all, partial[(t * kv + g) * partial_stride + h]);
        }
        float* dst = o + (i * nh + g * group + h) * hd;
        std::fill(dst, dst + hd, 0.0f);
        float l_all = 0.0f;
        for (int64_t t = first[i]; t < first[i + 1]; ++t) {
          const float* part = partial + (t * kv + g) * partial_stride;
          const float l_s = part[group + h];
          if (l_s == 0.0f) continue;
          const float wgt = std::exp(part[h] - m_all);
          l_all += wgt * l_s;
          const float* acc_s = part + 2 * group + h * hd;
          for (int64_t d = 0; d < hd; ++d) dst[d] += wgt * acc_s[d];
        }
        const float inv_l = 1.0f / l_all;
        for (int64_t d = 0; d < hd; ++d) dst[d] *= inv_l;
      }
    }
  });
}

void CpuBackend::Attention(const AttentionParams& params, const TensorView& q,
                           const TensorView& kv_pool, const TensorView& page_table,
                           const TensorView& row_seq, const TensorView& row_kv_len,
                           const TensorView& out) {
  if (capturing_) {
    return Record(
        [=, this] { Attention(params, q, kv_pool, page_table, row_seq, row_kv_len, out); });
  }
  CheckAttentionArgs(kHost, params, q, kv_pool, page_table, row_seq, row_kv_len, out);
  if (const int64_t n = CountedRows(q.dim(0)); n < q.dim(0)) {
    if (n > 0) {
      Attention(params, q.rows(0, n), kv_pool, page_table, row_seq.rows(0, n),
                row_kv_len.rows(0, n), out.rows(0, n));
    }
    return;
  }
  switch (kv_pool.dtype) {
    case DType::kF32:
      return AttentionT<float>(params, q, kv_pool, page_table, row_seq, row_kv_len, out);
    case DType::kF16:
      return AttentionT<f16_t>(params, q, kv_pool, page_table, row_seq, row_kv_len, out);
    case DType::kBF16:
      return AttentionT<bf16_t>(params, q, kv_pool, page_table, row_seq, row_kv_len, out);
    case DType::kI32:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ4_K:
    case DType::kQ6_K:
    case DType::kQ5_K:
    case DType::kQ5_0:
    case DType::kQ5_1:
      break;
  }
  MODSERVE_CHECK(false) << "kv_pool dtype " << DTypeName(kv_pool.dtype);
}

// ---- elementwise and MoD ops -----------------------------------------------------------------
void CpuBackend::SwiGlu(const TensorView& gate, const TensorView& up, const TensorView& out) {
  if (capturing_) return Record([=, this] { SwiGlu(gate, up, out); });
  CheckSameShapeF32Args(kHost, gate, up, out);
  if (const int64_t n = CountedRows(gate.dim(0)); n < gate.dim(0)) {
    if (n > 0) SwiGlu(gate.rows(0, n), up.rows(0, n), out.rows(0, n));
    return;
  }
  const float* g = gate.as<float>();
  const float* u = up.as<float>();
  float* o = out.as<float>();
  const KernelTable& kern = kernels_;
  pool_.ParallelFor(0, gate.numel(), kElementwiseGrain,
                    [&](int64_t b, int64_t e) { kern.swiglu(g + b, u + b, o + b, e - b); });
}

void CpuBackend::Activation(const ActivationParams& params, const TensorView& x) {
  if (capturing_) return Record([=, this] { Activation(params, x); });
  CheckActivationArgs(kHost, x);
  if (const int64_t n = CountedRows(x.dim(0)); n < x.dim(0)) {
    if (n > 0) Activation(params, x.rows(0, n));
    return;
  }
  float* v = x.as<float>();
  const ActivationKind kind = params.kind;
  pool_.ParallelFor(0, x.numel(), kElementwiseGrain, [&](int64_t b, int64_t e) {
    switch (kind) {
      case ActivationKind::kSilu:
        kernels_.silu(v + b, e - b);
        return;
      case ActivationKind::kGelu:
        for (int64_t i = b; i < e; ++i) {
          v[i] = 0.5f * v[i] * (1.0f + std::erf(v[i] * static_cast<float>(M_SQRT1_2)));
        }
        return;
      case ActivationKind::kRelu:
        for (int64_t i = b; i < e; ++i) v[i] = v[i] > 0.0f ? v[i] : 0.0f;
        return;
    }
  });
}

void CpuBackend::Add(const TensorView& a, const TensorView& b, const TensorView& out) {
  if (capturing_) return Record([=, this] { Add(a, b, out); });
  CheckSameShapeF32Args(kHost, a, b, out);
  if (const int64_t n = CountedRows(a.dim(0)); n < a.dim(0)) {
    if (n > 0) Add(a.rows(0, n), b.rows(0, n), out.rows(0, n));
    return;
  }
  const float* ap = a.as<float>();
  const float* bp = b.as<float>();
  float* o = out.as<float>();
  pool_.ParallelFor(0, a.numel(), kElementwiseGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) o[i] = ap[i] + bp[i];
  });
}

void CpuBackend::GatherRows(const TensorView& x, const TensorView& idx, const TensorView& out) {
  if (capturing_) return Record([=, this] { GatherRows(x, idx, out); });
  CheckGatherRowsArgs(kHost, x, idx, out);
  if (const int64_t m = CountedRows(idx.dim(0)); m < idx.dim(0)) {
    if (m > 0) GatherRows(x, idx.rows(0, m), out.rows(0, m));
    return;
  }
  const int64_t n = x.dim(0), d = x.dim(1), m = idx.dim(0);
  const int32_t* rows = idx.as<int32_t>();
  for (int64_t j = 0; j < m; ++j) {
    MODSERVE_CHECK(rows[j] >= 0 && rows[j] < n) << "row index " << rows[j] << " of " << n;
  }
  const float* xp = x.as<float>();
  float* o = out.as<float>();
  for (int64_t j = 0; j < m; ++j) std::memcpy(o + j * d, xp + rows[j] * d, d * sizeof(float));
}

void CpuBackend::ScatterCombine(const ScatterCombineParams& params, const TensorView& x,
                                const TensorView& y, const TensorView& idx, const TensorView& s) {
  if (capturing_) return Record([=, this] { ScatterCombine(params, x, y, idx, s); });
  CheckScatterCombineArgs(kHost, x, y, idx, s);
  if (const int64_t m = CountedRows(idx.dim(0)); m < idx.dim(0)) {
    if (m > 0) ScatterCombine(params, x, y.rows(0, m), idx.rows(0, m), s.rows(0, m));
    return;
  }
  const int64_t n = x.dim(0), d = x.dim(1), m = idx.dim(0);
  const int32_t* rows = idx.as<int32_t>();
  for (int64_t j = 0; j < m; ++j) {
    MODSERVE_CHECK(rows[j] >= 0 && rows[j] < n) << "row index " << rows[j] << " of " << n;
  }
  float* xp = x.as<float>();
  const float* yp = y.as<float>();
  const float* sp = s.as<float>();
  // Rows are distinct (contract), so chunks of j never touch the same x row.
  pool_.ParallelFor(0, m, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(d, 1)),
                    [&](int64_t b, int64_t e) {
                      for (int64_t j = b; j < e; ++j) {
                        float g = 0.0f;
                        float* xr = xp + rows[j] * d;
                        const float* yr = yp + j * d;
                        switch (params.weight_fn) {
                          case WeightFn::kIdentity:
                            g = sp[j];
                            break;
                          case WeightFn::kSigmoid:
                            g = Sigmoid(sp[j]);
                            break;
                          case WeightFn::kOne:
                            std::memcpy(xr, yr, static_cast<size_t>(d) * sizeof(float));
                            continue;
                        }
                        switch (params.scale_target) {
                          case ScaleTarget::kUpdate:
                            for (int64_t c = 0; c < d; ++c) xr[c] = xr[c] + g * (yr[c] - xr[c]);
                            break;
                          case ScaleTarget::kBlockOutput:
                            for (int64_t c = 0; c < d; ++c) xr[c] = g * yr[c];
                            break;
                        }
                      }
                    });
}

void CpuBackend::CopyKvPages(const TensorView& kv_pool,
                             absl::Span<const std::pair<int32_t, int32_t>> copies) {
  MODSERVE_CHECK(!capturing_) << "CopyKvPages during a graph capture";
  CheckCopyKvPagesArgs(kHost, kv_pool, copies);
  const size_t page_bytes = kv_pool.bytes() / static_cast<size_t>(std::max<int64_t>(1, kv_pool.dim(0)));
  char* base = static_cast<char*>(kv_pool.data);
  for (const auto& [src, dst] : copies) {
    std::memcpy(base + static_cast<size_t>(dst) * page_bytes,
                base + static_cast<size_t>(src) * page_bytes, page_bytes);
  }
}

// One pass over n rows (n is at most a step's tokens): the reference's loop itself, so the
// decisions are those the host made before this op existed, bit for bit.
void CpuBackend::RouteSelect(const TensorView& z, const TensorView& z_cut, const TensorView& s,
                             const TensorView& probs, const TensorView& idx,
                             const TensorView& s_sel, const TensorView& count) {
  if (capturing_) {
    return Record([=, this] { RouteSelect(z, z_cut, s, probs, idx, s_sel, count); });
  }
  if (const int64_t n = CountedRows(z.dim(0)); n < z.dim(0)) {
    CheckRouteSelectArgs(kHost, z, z_cut, s, probs, idx, s_sel, count);
    if (n == 0) {
      count.as<int32_t>()[0] = 0;
      return;
    }
    reference::RouteSelect(z.rows(0, n), z_cut.rows(0, n), s.rows(0, n), probs.rows(0, n),
                           idx.rows(0, n), s_sel.rows(0, n), count);
    return;
  }
  reference::RouteSelect(z, z_cut, s, probs, idx, s_sel, count);
}

// The reference's formula, with each row's rank carried along: the routed rows of a sequence
// are consecutive in idx, so a rank is the previous row's plus one within the same sequence.
void CpuBackend::RouteRows(const TensorView& idx, const TensorView& row_seq,
                           const TensorView& row_pos, const TensorView& cand_slots,
                           const TensorView& seq_first_row, const TensorView& seq_kv_base,
                           const TensorView& out_pos, const TensorView& out_slots,
                           const TensorView& out_seq, const TensorView& out_kv_len) {
  if (capturing_) {
    return Record([=, this] {
      RouteRows(idx, row_seq, row_pos, cand_slots, seq_first_row, seq_kv_base, out_pos, out_slots,
                out_seq, out_kv_len);
    });
  }
  CheckRouteRowsArgs(kHost, idx, row_seq, row_pos, cand_slots, seq_first_row, seq_kv_base,
                     out_pos, out_slots, out_seq, out_kv_len);
  const int64_t m = CountedRows(idx.dim(0)), n = row_seq.dim(0);
  const int64_t num_seqs = seq_first_row.dim(0);
  const int32_t* rows = idx.as<int32_t>();
  int32_t prev_seq = -1, rank = 0;
  for (int64_t j = 0; j < m; ++j) {
    const int32_t r = rows[j];
    MODSERVE_CHECK(r >= 0 && r < n && (j == 0 || rows[j - 1] < r))
        << "routed row " << r << " of " << n << " at " << j << " (rows must ascend)";
    const int32_t s = row_seq.as<int32_t>()[r];
    MODSERVE_CHECK(s >= 0 && s < num_seqs && s >= prev_seq) << "row " << r << " of sequence " << s;
    rank = s == prev_seq ? rank + 1 : 0;
    prev_seq = s;
    const int64_t cand = int64_t{seq_first_row.as<int32_t>()[s]} + rank;
    MODSERVE_CHECK(cand >= 0 && cand < n) << "candidate slot " << cand << " of " << n;
    out_pos.as<int32_t>()[j] = row_pos.as<int32_t>()[r];
    out_slots.as<int32_t>()[j] = cand_slots.as<int32_t>()[cand];
    out_seq.as<int32_t>()[j] = s;
    out_kv_len.as<int32_t>()[j] = seq_kv_base.as<int32_t>()[s] + rank + 1;
  }
}

}  // namespace modserve::backend::cpu
