// CudaBackend: argument checks (shared with the CPU backend), dtype dispatch into the kernels of
// kernels/, cuBLAS for GEMMs with more than kGemvMaxRows rows, device row counts, graph capture and
// replay, and error bookkeeping. It allocates only in Create() and Allocate(); no op synchronises
// the host (CopyToHost and Synchronize do), so every op may be captured.
#include "engine/backend/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/backend/cpu/op_checks.h"
#include "engine/backend/cpu/thread_pool.h"
#include "engine/backend/cuda/cuda_check.h"
#include "engine/backend/cuda/kernels/kernels.h"
#include "engine/common/logging.h"
#include "engine/common/status_macros.h"

namespace modserve::backend::cuda {
namespace {

constexpr Device kDev = Device::kCuda;
// Host uploads go through this pinned buffer so that CopyToDevice returns at once and the caller
// may reuse its memory; space is recycled at the next Synchronize()/CopyToHost(). Larger copies
// (and overflow between syncs) go straight from pageable memory, which the driver stages itself.
constexpr size_t kPinnedStagingBytes = size_t{8} << 20;
constexpr size_t kPinnedMaxCopyBytes = kPinnedStagingBytes / 8;

// The ordinal travels in the DeviceBuffer's ctx pointer.
void FreeOnDevice(void* data, void* ctx) {
  const int ordinal = static_cast<int>(reinterpret_cast<intptr_t>(ctx));
  int current = -1;
  const bool switch_device = cudaGetDevice(&current) == cudaSuccess && current != ordinal;
  if (switch_device) cudaSetDevice(ordinal);
  cudaFree(data);  // nowhere to report a failure from a destructor; a dead context frees anyway
  if (switch_device) cudaSetDevice(current);
}

// cuBLAS takes int dimensions.
int CheckedInt(int64_t v, const char* what) {
  MODSERVE_CHECK(v <= std::numeric_limits<int>::max()) << what << " " << v << " exceeds cuBLAS int";
  return static_cast<int>(v);
}

// Op timing, on when MODSERVE_CUDA_OP_TIMES=1: a pair of CUDA events around every op and graph
// replay outside captures, summed per op name and shape at each drain, printed to stderr as one
// table when the backend is destroyed. For profiling on a machine without Nsight Systems; it adds
// two event records per op, so time steps without it.
struct OpTimes {
  struct Open {
    std::string key;
    cudaEvent_t start, end;
  };
  std::vector<Open> open;          // recorded, not yet read
  std::vector<cudaEvent_t> spare;  // read, free for reuse
  struct Total {
    int64_t calls = 0;
    double ms = 0;
  };
  std::map<std::string, Total> totals;
  int depth = 0;  // an op that calls another op (Gemm with an F32 bias) is timed once

  cudaEvent_t Event() {
    if (!spare.empty()) {
      cudaEvent_t e = spare.back();
      spare.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    cudaEventCreate(&e);
    return e;
  }
  // After the stream drained: every open pair is complete.
  void Collect() {
    for (Open& o : open) {
      float ms = 0;
      if (cudaEventElapsedTime(&ms, o.start, o.end) == cudaSuccess) {
        Total& t = totals[o.key];
        ++t.calls;
        t.ms += ms;
      }
      spare.push_back(o.start);
      spare.push_back(o.end);
    }
    open.clear();
  }
  void Print() const {
    std::vector<std::pair<std::string, Total>> rows(totals.begin(), totals.end());
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    double sum = 0;
    for (const auto& r : rows) sum += r.second.ms;
    std::fprintf(stderr, "cuda op times (MODSERVE_CUDA_OP_TIMES): %.3f ms in %zu kinds\n", sum,
                 rows.size());
    std::fprintf(stderr,
                 "| op | calls | total ms | %% | us per call |\n|---|---:|---:|---:|---:|\n");
    for (const auto& [key, t] : rows) {
      std::fprintf(stderr, "| %s | %lld | %.3f | %.1f | %.2f |\n", key.c_str(),
                   static_cast<long long>(t.calls), t.ms, sum > 0 ? 100 * t.ms / sum : 0.0,
                   1000 * t.ms / static_cast<double>(t.calls));
    }
  }
  ~OpTimes() {
    for (Open& o : open) spare.insert(spare.end(), {o.start, o.end});
    for (cudaEvent_t e : spare) cudaEventDestroy(e);
  }
};

class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<Backend>> Create(const BackendOptions& options,
                                                         const CudaTuning& tuning);
  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
  // Not established for the gemv (n <= kGemvMaxRows), cuBLAS and attention kernels across row
  // counts, so nothing is claimed: a speculative step needs at least 2 rows and never runs here.
  int64_t MaxRowInvariantRows(DType, int64_t) const override { return 1; }
  Device device() const override { return kDev; }
  bool Supports(OpKind op, DType dtype) const override;
  // Sampling a step's rows: on the host threads the backend keeps (BackendOptions::num_threads),
  // one row at least per task, as the CPU backend does. At batch 64 with a 128k vocabulary the
  // rows took ~50 ms one after another.
  void HostParallelFor(int64_t count, absl::FunctionRef<void(int64_t)> task) override {
    host_pool_->ParallelFor(0, count, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) task(i);
    });
  }
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override;
  absl::Status CopyToDevice(const TensorView& host_src, const TensorView& dst) override;
  absl::Status CopyToHost(const TensorView& src, const TensorView& host_dst) override;
  absl::Status Synchronize() override;

  bool SupportsDeviceRowCount() const override { return true; }
  void SetDeviceRowCount(const TensorView& count) override;

  bool SupportsGraphs() const override { return true; }
  absl::Status BeginCapture() override;
  absl::StatusOr<int> EndCapture() override;
  absl::Status Replay(int graph) override;
  void ReleaseGraphs() override;

  void Embed(const TensorView& ids, const TensorView& table, const TensorView& out) override;
  void RmsNorm(const RmsNormParams& params, const TensorView& x, const TensorView& weight,
               const TensorView& out) override;
  void Gemm(const TensorView& x, const TensorView& w, const TensorView& bias,
            const TensorView& out) override;
  void RopeAndAppendKv(const RopeParams& params, const TensorView& q, const TensorView& k,
                       const TensorView& v, const TensorView& positions, const TensorView& slots,
                       const TensorView& kv_pool) override;
  void Attention(const AttentionParams& params, const TensorView& q, const TensorView& kv_pool,
                 const TensorView& page_table, const TensorView& row_seq,
                 const TensorView& row_kv_len, const TensorView& out) override;
  void SwiGlu(const TensorView& gate, const TensorView& up, const TensorView& out) override;
  void Activation(const ActivationParams& params, const TensorView& x) override;
  void Add(const TensorView& a, const TensorView& b, const TensorView& out) override;
  void RouteSelect(const TensorView& z, const TensorView& z_cut, const TensorView& s,
                   const TensorView& probs, const TensorView& idx, const TensorView& s_sel,
                   const TensorView& count) override;
  void GatherRows(const TensorView& x, const TensorView& idx, const TensorView& out) override;
  void ScatterCombine(const ScatterCombineParams& params, const TensorView& x, const TensorView& y,
                      const TensorView& idx, const TensorView& s) override;
  void RouteRows(const TensorView& idx, const TensorView& row_seq, const TensorView& row_pos,
                 const TensorView& cand_slots, const TensorView& seq_first_row,
                 const TensorView& seq_kv_base, const TensorView& out_pos,
                 const TensorView& out_slots, const TensorView& out_seq,
                 const TensorView& out_kv_len) override;
  void CopyKvPages(const TensorView& kv_pool,
                   absl::Span<const std::pair<int32_t, int32_t>> copies) override;

 private:
  explicit CudaBackend(int ordinal) : ordinal_(ordinal) {}

  // Every entry point makes the backend's device current for the calling thread (cheap when it
  // already is), so a backend created on one thread works from another.
  void MakeCurrent() const { cudaSetDevice(ordinal_); }
  // Keeps the first failure until Synchronize()/CopyToHost() reports it.
  void Record(cudaError_t err, absl::string_view op) {
    if (err != cudaSuccess && pending_.ok()) pending_ = CudaStatus(err, op);
  }
  void Record(cublasStatus_t st, absl::string_view op) {
    if (st != CUBLAS_STATUS_SUCCESS && pending_.ok()) pending_ = CublasStatus(st, op);
  }
  absl::Status TakePending() { return std::exchange(pending_, absl::OkStatus()); }
  // Host-side calls that a graph cannot record are caller bugs during a capture (backend.h).
  void CheckNotCapturing(absl::string_view call) const {
    MODSERVE_CHECK(!capturing_) << "cuda backend: " << call
                                << " during a graph capture (only ops may be captured)";
  }
  // Ends a capture in progress and drops whatever it recorded (EndCapture's failure path and the
  // destructor).
  void AbandonCapture();
  // Waits for the stream; returns the first recorded or device error; recycles the staging buffer.
  absl::Status Drain(absl::string_view where);
  DeviceBuffer Owned(void* p, size_t bytes) const {
    return DeviceBuffer(p, bytes, kDev, &FreeOnDevice,
                        reinterpret_cast<void*>(static_cast<intptr_t>(ordinal_)));
  }

  // Gemm bodies for n > kGemvMaxRows; out [n, m] = x [n, k] @ w [m, k]^T (+ bias).
  void GemmBf16Planes(const float* x, const void* w, const void* bias, int64_t n, int64_t m,
                      int64_t k, float* out);
  void GemmWidenedF16(const float* x, const void* w, const void* bias, int64_t n, int64_t m,
                      int64_t k, float* out);
  void GemmF32(const float* x, const void* w, const void* bias, int64_t n, int64_t m, int64_t k,
               float* out);

  const int ordinal_;
  int num_sms_ = 1;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer gemm_scratch_;       // bytes per CudaTuning; layouts in the Gemm bodies
  DeviceBuffer cublas_workspace_;   // owned here, lent to cuBLAS
  DeviceBuffer attention_scratch_;  // kernels::AttentionPlan partials
  char* pinned_ = nullptr;          // [kPinnedStagingBytes] host staging for CopyToDevice
  size_t pinned_used_ = 0;          // bytes handed out since the last drain
  absl::Status pending_;
  // SetDeviceRowCount's [1] i32 in device memory, or null. Kernels take the pointer, never the
  // value, so a captured graph reads the count when it replays.
  const int32_t* rows_ = nullptr;
  bool capturing_ = false;
  // An error recorded before BeginCapture, kept aside so that pending_ holds the capture's own
  // errors only; it goes back to pending_ at EndCapture (and surfaces at the next Synchronize).
  absl::Status pending_before_capture_;
  // Replay(id) launches graphs_[id]; ReleaseGraphs() destroys them and leaves null entries, so a
  // stale id is refused instead of naming a later graph.
  std::vector<cudaGraphExec_t> graphs_;
  std::unique_ptr<OpTimes> op_times_;           // MODSERVE_CUDA_OP_TIMES=1 only
  std::unique_ptr<cpu::ThreadPool> host_pool_;  // HostParallelFor
  // kernels::AttentionArgs::scores_per_lane; MODSERVE_CUDA_ATTENTION=warp turns it off.
  bool attention_scores_per_lane_ = true;

  // Times the enclosing op under "name d0xd1x.." (see OpTimes); free when timing is off.
  class OpTimer {
   public:
    OpTimer(CudaBackend* b, const char* name, std::initializer_list<int64_t> dims) {
      OpTimes* t = b->op_times_.get();
      if (t == nullptr || b->capturing_) return;
      times_ = t;
      if (t->depth++ > 0) return;  // inside a timed op
      key_ = name;
      const char* sep = " ";
      for (int64_t d : dims) {
        absl::StrAppend(&key_, sep, d);
        sep = "x";
      }
      stream_ = b->stream_;
      start_ = t->Event();
      cudaEventRecord(start_, stream_);
    }
    ~OpTimer() {
      if (times_ == nullptr || --times_->depth > 0) return;
      cudaEvent_t end = times_->Event();
      cudaEventRecord(end, stream_);
      times_->open.push_back({std::move(key_), start_, end});
    }
    OpTimer(const OpTimer&) = delete;
    OpTimer& operator=(const OpTimer&) = delete;

   private:
    OpTimes* times_ = nullptr;
    std::string key_;
    cudaStream_t stream_ = nullptr;
    cudaEvent_t start_ = nullptr;
  };
};

absl::StatusOr<std::unique_ptr<Backend>> CudaBackend::Create(const BackendOptions& options,
                                                             const CudaTuning& tuning) {
  int count = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&count);
  if (count_err != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the (non-sticky) error for later callers
    return absl::UnavailableError(
        absl::StrCat("backend 'cuda': no CUDA device visible (cudaGetDeviceCount: ",
                     count_err == cudaSuccess ? "0 devices" : cudaGetErrorName(count_err),
                     "); check the driver, the GPU and CUDA_VISIBLE_DEVICES"));
  }
  if (options.device_ordinal < 0 || options.device_ordinal >= count) {
    return absl::UnavailableError(absl::StrCat("backend 'cuda': device ordinal ",
                                               options.device_ordinal, " but ", count,
                                               " device(s) visible"));
  }
  const int ordinal = options.device_ordinal;
  MODSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
  cudaDeviceProp prop;
  MODSERVE_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, ordinal));
  if (prop.major < 8) {
    return absl::UnavailableError(absl::StrCat(
        "backend 'cuda': device ", ordinal, " (", prop.name, ") has compute capability ",
        prop.major, ".", prop.minor, "; the kernels need 8.0 or newer (bf16, sm_80)"));
  }
  std::unique_ptr<CudaBackend> b(new CudaBackend(ordinal));
  b->num_sms_ = prop.multiProcessorCount;
  b->host_pool_ = std::make_unique<cpu::ThreadPool>(options.num_threads);
  if (const char* env = std::getenv("MODSERVE_CUDA_OP_TIMES"); env != nullptr && env[0] == '1') {
    b->op_times_ = std::make_unique<OpTimes>();
  }
  if (const char* env = std::getenv("MODSERVE_CUDA_ATTENTION"); env != nullptr) {
    b->attention_scores_per_lane_ = std::string_view(env) != "warp";
  }
  MODSERVE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking));
  MODSERVE_CUBLAS_RETURN_IF_ERROR(cublasCreate(&b->cublas_));
  MODSERVE_CUBLAS_RETURN_IF_ERROR(cublasSetStream(b->cublas_, b->stream_));
  // Default math: no TF32 for f32 GEMMs (NVIDIA_TF32_OVERRIDE=1 in the environment cannot turn it
  // on either; only CUBLAS_TF32_TENSOR_OP_MATH could), fp32 accumulation for bf16 inputs.
  MODSERVE_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(b->cublas_, CUBLAS_DEFAULT_MATH));
  MODSERVE_ASSIGN_OR_RETURN(b->gemm_scratch_, b->Allocate(tuning.gemm_scratch_bytes));
  MODSERVE_ASSIGN_OR_RETURN(b->cublas_workspace_, b->Allocate(tuning.cublas_workspace_bytes));
  MODSERVE_ASSIGN_OR_RETURN(b->attention_scratch_, b->Allocate(tuning.attention_scratch_bytes));
  MODSERVE_CUBLAS_RETURN_IF_ERROR(
      cublasSetWorkspace(b->cublas_, b->cublas_workspace_.data(), b->cublas_workspace_.bytes()));
  MODSERVE_CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&b->pinned_),
                                              kPinnedStagingBytes, cudaHostAllocDefault));
  return std::unique_ptr<Backend>(std::move(b));
}

CudaBackend::~CudaBackend() {
  MakeCurrent();
  if (capturing_) AbandonCapture();
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (op_times_ != nullptr) {
    op_times_->Collect();
    op_times_->Print();
    op_times_.reset();
  }
  ReleaseGraphs();
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
  // The scratch DeviceBuffers free themselves after this body.
}

// Block-quantized weights (Q8_0 .. Q6_K) are not implemented on the GPU: they are refused here, and
// Transformer::Create names the tensor and its type.
bool CudaBackend::Supports(OpKind op, DType dtype) const {
  const bool storage = dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
  switch (op) {
    case OpKind::kEmbed:
    case OpKind::kRmsNorm:
    case OpKind::kGemm:
    case OpKind::kRopeAndAppendKv:
    case OpKind::kAttention:
      return storage;
    case OpKind::kSwiGlu:
    case OpKind::kActivation:
    case OpKind::kAdd:
    case OpKind::kGatherRows:
    case OpKind::kScatterCombine:
    case OpKind::kRouteSelect:
      return dtype == DType::kF32;
    case OpKind::kCopyKvPages:
      return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
    case OpKind::kRouteRows:
      return dtype == DType::kI32;
  }
  return false;
}

absl::StatusOr<DeviceBuffer> CudaBackend::Allocate(size_t bytes) {
  CheckNotCapturing("Allocate");
  if (bytes == 0) return DeviceBuffer(nullptr, 0, kDev, nullptr, nullptr);
  MakeCurrent();
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);  // 256-byte aligned
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda: cannot allocate ", bytes, " bytes on device ", ordinal_, " (",
                     free_bytes, " of ", total_bytes, " bytes free)"));
  }
  MODSERVE_RETURN_IF_ERROR(CudaStatus(err, absl::StrCat("cudaMalloc(", bytes, " bytes)")));
  return Owned(p, bytes);
}

absl::Status CudaBackend::CopyToDevice(const TensorView& host_src, const TensorView& dst) {
  CheckNotCapturing("CopyToDevice");
  if (host_src.device != Device::kCpu || dst.device != kDev) {
    return absl::InvalidArgumentError(
        "CopyToDevice: host_src must be a host tensor and dst a cuda tensor");
  }
  if (host_src.bytes() != dst.bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyToDevice: host_src has ", host_src.bytes(), " bytes, dst ", dst.bytes()));
  }
  const size_t bytes = dst.bytes();
  if (bytes == 0) return absl::OkStatus();
  MakeCurrent();
  const size_t offset = (pinned_used_ + 255) / 256 * 256;
  if (bytes <= kPinnedMaxCopyBytes && offset + bytes <= kPinnedStagingBytes) {
    std::memcpy(pinned_ + offset, host_src.data, bytes);
    pinned_used_ = offset + bytes;
    return CudaStatus(
        cudaMemcpyAsync(dst.data, pinned_ + offset, bytes, cudaMemcpyHostToDevice, stream_),
        "CopyToDevice (staged)");
  }
  return CudaStatus(
      cudaMemcpyAsync(dst.data, host_src.data, bytes, cudaMemcpyHostToDevice, stream_),
      "CopyToDevice");
}

absl::Status CudaBackend::Drain(absl::string_view where) {
  const cudaError_t err = cudaStreamSynchronize(stream_);
  pinned_used_ = 0;
  if (op_times_ != nullptr) op_times_->Collect();
  MODSERVE_RETURN_IF_ERROR(TakePending());
  return CudaStatus(err, absl::StrCat(where, " (a device error in an earlier op)"));
}

absl::Status CudaBackend::CopyToHost(const TensorView& src, const TensorView& host_dst) {
  CheckNotCapturing("CopyToHost");
  if (src.device != kDev || host_dst.device != Device::kCpu) {
    return absl::InvalidArgumentError(
        "CopyToHost: src must be a cuda tensor and host_dst a host tensor");
  }
  if (src.bytes() != host_dst.bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("CopyToHost: src has ", src.bytes(), " bytes, host_dst ", host_dst.bytes()));
  }
  MakeCurrent();
  if (src.bytes() > 0) {
    OpTimer timer(this, "CopyToHost", {static_cast<int64_t>(src.bytes())});
    Record(cudaMemcpyAsync(host_dst.data, src.data, src.bytes(), cudaMemcpyDeviceToHost, stream_),
           "CopyToHost");
  }
  return Drain("CopyToHost");
}

absl::Status CudaBackend::Synchronize() {
  CheckNotCapturing("Synchronize");
  MakeCurrent();
  return Drain("Synchronize");
}

void CudaBackend::SetDeviceRowCount(const TensorView& count) {
  cpu::CheckRowCountArg(kDev, count);
  rows_ = count.empty() ? nullptr : count.as<int32_t>();
}

// Thread-local mode: only this thread's unsafe calls (a sync, a cudaMalloc) invalidate the capture;
// other threads' work on other streams is unaffected. Every op only enqueues on stream_ (the
// pinned staging of CopyToDevice is host work before the replay, and CopyToDevice itself is refused
// here), cuBLAS has its workspace preset, and launch shapes depend on tensor shapes only, so the
// recorded graph is valid for any contents of the tensors it names.
absl::Status CudaBackend::BeginCapture() {
  if (capturing_) {
    return absl::FailedPreconditionError("cuda backend: BeginCapture while a capture is running");
  }
  MakeCurrent();
  MODSERVE_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
  pending_before_capture_ = TakePending();
  return absl::OkStatus();
}

void CudaBackend::AbandonCapture() {
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream_, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaGetLastError();  // the capture's (non-sticky) errors are reported by the caller, if at all
  capturing_ = false;
}

absl::StatusOr<int> CudaBackend::EndCapture() {
  if (!capturing_) {
    return absl::FailedPreconditionError("cuda backend: EndCapture without BeginCapture");
  }
  MakeCurrent();
  cudaGraph_t graph = nullptr;
  const cudaError_t end_err = cudaStreamEndCapture(stream_, &graph);
  capturing_ = false;
  const absl::Status during = std::exchange(pending_, std::move(pending_before_capture_));
  pending_before_capture_ = absl::OkStatus();
  if (end_err != cudaSuccess || !during.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();
    // An op's own error says more than the invalidated capture it caused.
    if (!during.ok()) {
      return absl::InternalError(
          absl::StrCat("EndCapture: an op failed during the capture: ", during.message()));
    }
    return CudaStatus(end_err, "EndCapture (cudaStreamEndCapture)");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst_err = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);  // the executable graph does not need it
  if (inst_err != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(inst_err, "EndCapture (cudaGraphInstantiate)");
  }
  graphs_.push_back(exec);
  return static_cast<int>(graphs_.size() - 1);
}

absl::Status CudaBackend::Replay(int graph) {
  if (capturing_) {
    return absl::FailedPreconditionError("cuda backend: Replay during a graph capture");
  }
  if (graph < 0 || static_cast<size_t>(graph) >= graphs_.size() || graphs_[graph] == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda backend: no graph ", graph, " (", graphs_.size(),
                     " captured; ids of released graphs stay invalid)"));
  }
  MakeCurrent();
  OpTimer timer(this, "Replay (graph)", {graph});
  const cudaError_t err = cudaGraphLaunch(graphs_[graph], stream_);
  Record(err, "Replay (cudaGraphLaunch)");
  return CudaStatus(err, "Replay (cudaGraphLaunch)");
}

// A graph still running is freed by the driver when it completes, so no sync is needed here.
void CudaBackend::ReleaseGraphs() {
  MakeCurrent();
  for (cudaGraphExec_t& exec : graphs_) {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    exec = nullptr;
  }
}

void CudaBackend::Embed(const TensorView& ids, const TensorView& table, const TensorView& out) {
  cpu::CheckEmbedArgs(kDev, ids, table, out);
  MODSERVE_CHECK(!DTypeIsQuantized(table.dtype))
      << "cuda backend: Embed table dtype " << DTypeName(table.dtype) << " (Supports() is false)";
  MakeCurrent();
  OpTimer timer(this, "Embed", {ids.dim(0), table.dim(1)});
  Record(kernels::Embed(stream_, ids.as<int32_t>(), ids.dim(0), table.data, table.dtype,
                        table.dim(0), table.dim(1), rows_, out.as<float>()),
         "Embed");
}

void CudaBackend::RmsNorm(const RmsNormParams& params, const TensorView& x,
                          const TensorView& weight, const TensorView& out) {
  cpu::CheckRmsNormArgs(kDev, x, weight, out);
  MakeCurrent();
  OpTimer timer(this, "RmsNorm", {x.dim(0), x.dim(1)});
  Record(kernels::RmsNorm(stream_, x.as<float>(), weight.data, weight.dtype, x.dim(0), x.dim(1),
                          params.eps, rows_, out.as<float>()),
         "RmsNorm");
}

// Under a device row count only the GEMV (n <= kGemvMaxRows) reads the count: it computes the
// counted rows and, at a count of 0, reads no weight. cuBLAS takes its row count from the host, so
// the n > kGemvMaxRows paths (bf16 planes, widened f16, f32) and their split/combine/widen/bias
// kernels run on all n rows; rows past the count come out unspecified, as backend.h allows. The
// counted rows then get the bits of an n-row call, not of a call with count rows (which may take
// the GEMV or another cuBLAS algorithm): within the accumulation-order tolerance, not bit-equal.
void CudaBackend::Gemm(const TensorView& x, const TensorView& w, const TensorView& bias,
                       const TensorView& out) {
  cpu::CheckGemmArgs(kDev, x, w, bias, out);
  MODSERVE_CHECK(!DTypeIsQuantized(w.dtype))
      << "cuda backend: Gemm w dtype " << DTypeName(w.dtype) << " (Supports() is false)";
  MakeCurrent();
  OpTimer timer(this, "Gemm", {x.dim(0), w.dim(0), x.dim(1)});
  const int64_t n = x.dim(0), k = x.dim(1), m = w.dim(0);
  if (n == 0 || m == 0) return;
  if (!bias.empty() && bias.dtype != w.dtype) {
    // An F32 bias beside a 16-bit w (backend.h): the product, then the bias on its own.
    Gemm(x, w, TensorView(), out);
    Record(kernels::AddBias(stream_, bias.data, DType::kF32, n, m, out.as<float>()),
           "Gemm (f32 bias)");
    return;
  }
  const void* b = bias.empty() ? nullptr : bias.data;
  if (n <= kernels::kGemvMaxRows) {
    Record(
        kernels::Gemv(stream_, x.as<float>(), w.data, b, w.dtype, n, m, k, rows_, out.as<float>()),
        "Gemm (gemv)");
    return;
  }
  switch (w.dtype) {
    case DType::kBF16:
      return GemmBf16Planes(x.as<float>(), w.data, b, n, m, k, out.as<float>());
    case DType::kF16:
      return GemmWidenedF16(x.as<float>(), w.data, b, n, m, k, out.as<float>());
    case DType::kF32:
      return GemmF32(x.as<float>(), w.data, b, n, m, k, out.as<float>());
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
  MODSERVE_CHECK(false) << "Gemm w dtype " << DTypeName(w.dtype);
}

// x is split exactly into three bf16 planes (kernels.h); one tensor-core GEMM multiplies all three
// by w (bf16 x bf16 products are exact in f32, sums in f32), and a combine adds the plane results
// and the bias. Scratch layout per chunk of `rows` rows of x: planes [3, rows, k] bf16, then
// (256-byte aligned) products [3, rows, m] f32. The chunk is as many rows as fit.
void CudaBackend::GemmBf16Planes(const float* x, const void* w, const void* bias, int64_t n,
                                 int64_t m, int64_t k, float* out) {
  const size_t per_row = 3 * static_cast<size_t>(k) * 2 + 3 * static_cast<size_t>(m) * 4 + 256;
  const int64_t rows = std::min<int64_t>(n, static_cast<int64_t>(gemm_scratch_.bytes() / per_row));
  MODSERVE_CHECK(rows >= 1) << "Gemm m=" << m << " k=" << k << " needs " << per_row
                            << " scratch bytes per row; CudaTuning::gemm_scratch_bytes is "
                            << gemm_scratch_.bytes();
  char* scratch = static_cast<char*>(gemm_scratch_.data());
  const float alpha = 1.0f, beta = 0.0f;
  for (int64_t r0 = 0; r0 < n; r0 += rows) {
    const int64_t rc = std::min(rows, n - r0);
    void* planes = scratch;
    float* prod = reinterpret_cast<float*>(scratch + (3 * rc * k * 2 + 255) / 256 * 256);
    Record(kernels::SplitToBf16Planes(stream_, x + r0 * k, rc, k, planes), "Gemm (split)");
    // Column-major view: prod^T [m, 3 rc] = (w^T [k, m])^T @ planes^T [k, 3 rc].
    Record(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, CheckedInt(m, "m"),
                        CheckedInt(3 * rc, "3n"), CheckedInt(k, "k"), &alpha, w, CUDA_R_16BF,
                        static_cast<int>(k), planes, CUDA_R_16BF, static_cast<int>(k), &beta, prod,
                        CUDA_R_32F, static_cast<int>(m), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
           "Gemm (cublasGemmEx bf16 planes)");
    Record(kernels::CombinePlanes(stream_, prod, bias, DType::kBF16, rc, m, out + r0 * m),
           "Gemm (combine)");
  }
}

// f16 weights cannot share the bf16 trick (f16 planes of x would under/overflow), so chunks of
// w's rows are widened to f32 in scratch ([rows, k] f32) and multiplied with plain f32 SGEMM.
void CudaBackend::GemmWidenedF16(const float* x, const void* w, const void* bias, int64_t n,
                                 int64_t m, int64_t k, float* out) {
  const int64_t rows = std::min<int64_t>(
      m, static_cast<int64_t>(gemm_scratch_.bytes() / (4 * std::max<int64_t>(k, 1))));
  MODSERVE_CHECK(rows >= 1) << "Gemm k=" << k << " does not fit CudaTuning::gemm_scratch_bytes "
                            << gemm_scratch_.bytes();
  float* wf = static_cast<float*>(gemm_scratch_.data());
  const auto* w16 = static_cast<const uint16_t*>(w);
  const float alpha = 1.0f, beta = 0.0f;
  for (int64_t r0 = 0; r0 < m; r0 += rows) {
    const int64_t rc = std::min(rows, m - r0);
    Record(kernels::WidenToF32(stream_, w16 + r0 * k, DType::kF16, rc * k, wf), "Gemm (widen)");
    // out^T rows r0 .. r0 + rc: column-major [rc, n] block at out + r0 with leading dim m.
    Record(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, CheckedInt(rc, "m"), CheckedInt(n, "n"),
                        CheckedInt(k, "k"), &alpha, wf, CUDA_R_32F, static_cast<int>(k), x,
                        CUDA_R_32F, static_cast<int>(k), &beta, out + r0, CUDA_R_32F,
                        CheckedInt(m, "m"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
           "Gemm (cublasGemmEx f32, widened f16)");
  }
  if (bias != nullptr) {
    Record(kernels::AddBias(stream_, bias, DType::kF16, n, m, out), "Gemm (bias)");
  }
}

void CudaBackend::GemmF32(const float* x, const void* w, const void* bias, int64_t n, int64_t m,
                          int64_t k, float* out) {
  const float alpha = 1.0f, beta = 0.0f;
  Record(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, CheckedInt(m, "m"), CheckedInt(n, "n"),
                      CheckedInt(k, "k"), &alpha, w, CUDA_R_32F, static_cast<int>(k), x, CUDA_R_32F,
                      static_cast<int>(k), &beta, out, CUDA_R_32F, static_cast<int>(m),
                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
         "Gemm (cublasGemmEx f32)");
  if (bias != nullptr) {
    Record(kernels::AddBias(stream_, bias, DType::kF32, n, m, out), "Gemm (bias)");
  }
}

void CudaBackend::RopeAndAppendKv(const RopeParams& params, const TensorView& q,
                                  const TensorView& k, const TensorView& v,
                                  const TensorView& positions, const TensorView& slots,
                                  const TensorView& kv_pool) {
  cpu::CheckRopeAndAppendKvArgs(kDev, params, q, k, v, positions, slots, kv_pool);
  MakeCurrent();
  OpTimer timer(this, "RopeAndAppendKv", {q.dim(0)});
  kernels::RopeKvArgs a;
  a.q = q.as<float>();
  a.k = k.as<float>();
  a.v = v.as<float>();
  a.positions = positions.as<int32_t>();
  a.slots = slots.as<int32_t>();
  a.rows = rows_;
  a.kv_pool = kv_pool.data;
  a.pool_dtype = kv_pool.dtype;
  a.n = q.dim(0);
  a.num_pages = kv_pool.dim(0);
  a.n_heads = params.n_heads;
  a.n_kv_heads = params.n_kv_heads;
  a.head_dim = params.head_dim;
  a.block_size = params.block_size;
  a.rope_theta = params.rope_theta;
  Record(kernels::RopeAndAppendKv(stream_, a), "RopeAndAppendKv");
}

void CudaBackend::Attention(const AttentionParams& params, const TensorView& q,
                            const TensorView& kv_pool, const TensorView& page_table,
                            const TensorView& row_seq, const TensorView& row_kv_len,
                            const TensorView& out) {
  cpu::CheckAttentionArgs(kDev, params, q, kv_pool, page_table, row_seq, row_kv_len, out);
  MODSERVE_CHECK_LE(params.head_dim, kernels::kAttentionMaxHeadDim);
  MakeCurrent();
  OpTimer timer(this, "Attention", {q.dim(0), page_table.dim(0), page_table.dim(1)});
  kernels::AttentionArgs a;
  a.q = q.as<float>();
  a.kv_pool = kv_pool.data;
  a.pool_dtype = kv_pool.dtype;
  a.page_table = page_table.as<int32_t>();
  a.row_seq = row_seq.as<int32_t>();
  a.row_kv_len = row_kv_len.as<int32_t>();
  a.rows = rows_;
  a.out = out.as<float>();
  a.n = q.dim(0);
  a.num_pages = kv_pool.dim(0);
  a.num_seqs = page_table.dim(0);
  a.max_pages = page_table.dim(1);
  a.n_heads = params.n_heads;
  a.n_kv_heads = params.n_kv_heads;
  a.head_dim = params.head_dim;
  a.block_size = params.block_size;
  a.scale = params.scale;
  a.scores_per_lane = attention_scores_per_lane_;
  const kernels::AttentionPlan plan =
      kernels::PlanAttention(a, num_sms_, attention_scratch_.bytes());
  Record(kernels::Attention(stream_, a, plan, num_sms_, attention_scratch_.bytes(),
                            attention_scratch_.data()),
         "Attention");
}

void CudaBackend::SwiGlu(const TensorView& gate, const TensorView& up, const TensorView& out) {
  cpu::CheckSameShapeF32Args(kDev, gate, up, out);
  MakeCurrent();
  OpTimer timer(this, "SwiGlu", {gate.dim(0), gate.dim(1)});
  Record(kernels::SwiGlu(stream_, gate.as<float>(), up.as<float>(), gate.dim(0), gate.dim(1), rows_,
                         out.as<float>()),
         "SwiGlu");
}

void CudaBackend::Activation(const ActivationParams& params, const TensorView& x) {
  cpu::CheckActivationArgs(kDev, x);
  MakeCurrent();
  OpTimer timer(this, "Activation", {x.dim(0), x.dim(1)});
  int kind = 0;
  switch (params.kind) {
    case ActivationKind::kSilu:
      kind = 0;
      break;
    case ActivationKind::kGelu:
      kind = 1;
      break;
    case ActivationKind::kRelu:
      kind = 2;
      break;
  }
  Record(kernels::Activation(stream_, kind, x.dim(0), x.dim(1), rows_, x.as<float>()),
         "Activation");
}

void CudaBackend::Add(const TensorView& a, const TensorView& b, const TensorView& out) {
  cpu::CheckSameShapeF32Args(kDev, a, b, out);
  MakeCurrent();
  OpTimer timer(this, "Add", {a.dim(0), a.dim(1)});
  Record(kernels::Add(stream_, a.as<float>(), b.as<float>(), a.dim(0), a.dim(1), rows_,
                      out.as<float>()),
         "Add");
}

void CudaBackend::GatherRows(const TensorView& x, const TensorView& idx, const TensorView& out) {
  cpu::CheckGatherRowsArgs(kDev, x, idx, out);
  MakeCurrent();
  OpTimer timer(this, "GatherRows", {idx.dim(0), x.dim(1)});
  Record(kernels::GatherRows(stream_, x.as<float>(), x.dim(0), x.dim(1), idx.as<int32_t>(),
                             idx.dim(0), rows_, out.as<float>()),
         "GatherRows");
}

void CudaBackend::ScatterCombine(const ScatterCombineParams& params, const TensorView& x,
                                 const TensorView& y, const TensorView& idx, const TensorView& s) {
  cpu::CheckScatterCombineArgs(kDev, x, y, idx, s);
  MakeCurrent();
  OpTimer timer(this, "ScatterCombine", {idx.dim(0), x.dim(1)});
  int weight_fn = 0;
  switch (params.weight_fn) {
    case WeightFn::kIdentity:
      weight_fn = 0;
      break;
    case WeightFn::kSigmoid:
      weight_fn = 1;
      break;
    case WeightFn::kOne:
      weight_fn = 2;
      break;
  }
  const int scale_target = params.scale_target == ScaleTarget::kUpdate ? 0 : 1;
  Record(
      kernels::ScatterCombine(stream_, weight_fn, scale_target, x.as<float>(), x.dim(0), x.dim(1),
                              y.as<float>(), idx.as<int32_t>(), s.as<float>(), idx.dim(0), rows_),
      "ScatterCombine");
}

void CudaBackend::RouteSelect(const TensorView& z, const TensorView& z_cut, const TensorView& s,
                              const TensorView& probs, const TensorView& idx,
                              const TensorView& s_sel, const TensorView& count) {
  cpu::CheckRouteSelectArgs(kDev, z, z_cut, s, probs, idx, s_sel, count);
  MakeCurrent();
  OpTimer timer(this, "RouteSelect", {z.dim(0)});
  Record(kernels::RouteSelect(stream_, z.as<float>(), z_cut.as<float>(), s.as<float>(), z.dim(0),
                              rows_, probs.as<float>(), idx.as<int32_t>(), s_sel.as<float>(),
                              count.as<int32_t>()),
         "RouteSelect");
}

void CudaBackend::RouteRows(const TensorView& idx, const TensorView& row_seq,
                            const TensorView& row_pos, const TensorView& cand_slots,
                            const TensorView& seq_first_row, const TensorView& seq_kv_base,
                            const TensorView& out_pos, const TensorView& out_slots,
                            const TensorView& out_seq, const TensorView& out_kv_len) {
  cpu::CheckRouteRowsArgs(kDev, idx, row_seq, row_pos, cand_slots, seq_first_row, seq_kv_base,
                          out_pos, out_slots, out_seq, out_kv_len);
  MakeCurrent();
  OpTimer timer(this, "RouteRows", {idx.dim(0)});
  kernels::RouteRowsArgs a;
  a.idx = idx.as<int32_t>();
  a.row_seq = row_seq.as<int32_t>();
  a.row_pos = row_pos.as<int32_t>();
  a.cand_slots = cand_slots.as<int32_t>();
  a.seq_first_row = seq_first_row.as<int32_t>();
  a.seq_kv_base = seq_kv_base.as<int32_t>();
  a.out_pos = out_pos.as<int32_t>();
  a.out_slots = out_slots.as<int32_t>();
  a.out_seq = out_seq.as<int32_t>();
  a.out_kv_len = out_kv_len.as<int32_t>();
  a.rows = rows_;
  a.m = idx.dim(0);
  a.num_rows = row_seq.dim(0);
  a.num_seqs = seq_first_row.dim(0);
  Record(kernels::RouteRows(stream_, a), "RouteRows");
}

void CudaBackend::CopyKvPages(const TensorView& kv_pool,
                              absl::Span<const std::pair<int32_t, int32_t>> copies) {
  CheckNotCapturing("CopyKvPages");
  cpu::CheckCopyKvPagesArgs(kDev, kv_pool, copies);
  MakeCurrent();
  OpTimer timer(this, "CopyKvPages", {static_cast<int64_t>(copies.size())});
  const size_t page_bytes =
      kv_pool.bytes() / static_cast<size_t>(std::max<int64_t>(1, kv_pool.dim(0)));
  char* base = static_cast<char*>(kv_pool.data);
  // In stream order: each copy lands before any later op of the step writes the page.
  for (const auto& [src, dst] : copies) {
    Record(cudaMemcpyAsync(base + static_cast<size_t>(dst) * page_bytes,
                           base + static_cast<size_t>(src) * page_bytes, page_bytes,
                           cudaMemcpyDeviceToDevice, stream_),
           "CopyKvPages");
  }
}

}  // namespace

int VisibleDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options,
                                                           const CudaTuning& tuning) {
  return CudaBackend::Create(options, tuning);
}

}  // namespace modserve::backend::cuda
