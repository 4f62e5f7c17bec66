// The compute-backend interface: device memory, synchronisation and the coarse ops of one forward
// pass (STYLE.md section 2). It declares no implementation and mentions no device API.
#ifndef MODSERVE_ENGINE_BACKEND_BACKEND_H_
#define MODSERVE_ENGINE_BACKEND_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "engine/common/dtype.h"
#include "engine/common/logging.h"
#include "engine/common/tensor_view.h"

namespace modserve::backend {

// How a Gemm with BF16 weights may round its f32 activations where the hardware multiplies bf16
// by bf16 (the CPU backend's AMX tile Gemm, and at kMedium its vdpbf16ps Gemm on CPUs with
// AVX512_BF16 and no AMX; every other kernel multiplies f32 x exactly and is not affected). The
// names and meanings are PyTorch's float32 matmul precision:
//   kHighest: x kept to f32 precision (three bf16 terms per x, one tile product per term);
//   kHigh:    x as the sum of two bf16 terms (16 significant bits, within 2^-16 relative);
//   kMedium:  x rounded to bf16 (8 significant bits, within 2^-8 relative), one tile product.
// Lower precision changes the results beyond the f32 tolerance of docs/DESIGN.md (goldens hold
// at kHighest only). It changes the row-invariant range only where kMedium moves BF16 Gemms onto
// vdpbf16ps (8 rows there; CpuBackend::SmallNMax).
enum class MatmulPrecision : uint8_t { kHighest, kHigh, kMedium };

inline std::string_view MatmulPrecisionName(MatmulPrecision p) {
  switch (p) {
    case MatmulPrecision::kHigh:
      return "high";
    case MatmulPrecision::kMedium:
      return "medium";
    default:
      return "highest";
  }
}

// The bf16 terms of each x that a bf16 x bf16 unit multiplies at precision p: 3, 2 or 1.
inline int Bf16TermsOf(MatmulPrecision p) {
  return p == MatmulPrecision::kMedium ? 1 : p == MatmulPrecision::kHigh ? 2 : 3;
}

// "highest", "high" or "medium"; InvalidArgument naming the value otherwise.
inline absl::StatusOr<MatmulPrecision> ParseMatmulPrecision(std::string_view name) {
  for (MatmulPrecision p :
       {MatmulPrecision::kHighest, MatmulPrecision::kHigh, MatmulPrecision::kMedium}) {
    if (name == MatmulPrecisionName(p)) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat("matmul precision \"", std::string(name),
                                                 "\" is not one of highest, high, medium"));
}

// One value per op of Backend, for capability queries.
// `Logits` is not an op of its own: it is Gemm with the LM head as w; GemmGroup runs wherever
// Gemm does (Supports(kGemm, dtype) of each member's weight dtype).
enum class OpKind : uint8_t {
  kEmbed,
  kRmsNorm,
  kGemm,
  kRopeAndAppendKv,
  kAttention,
  kSwiGlu,
  kActivation,
  kAdd,
  kGatherRows,
  kScatterCombine,
  kCopyKvPages,
  kRouteSelect,
  kRouteRows,
};

constexpr std::string_view OpKindName(OpKind op) {
  switch (op) {
    case OpKind::kEmbed:
      return "Embed";
    case OpKind::kRmsNorm:
      return "RmsNorm";
    case OpKind::kGemm:
      return "Gemm";
    case OpKind::kRopeAndAppendKv:
      return "RopeAndAppendKv";
    case OpKind::kAttention:
      return "Attention";
    case OpKind::kSwiGlu:
      return "SwiGlu";
    case OpKind::kActivation:
      return "Activation";
    case OpKind::kAdd:
      return "Add";
    case OpKind::kGatherRows:
      return "GatherRows";
    case OpKind::kScatterCombine:
      return "ScatterCombine";
    case OpKind::kCopyKvPages:
      return "CopyKvPages";
    case OpKind::kRouteSelect:
      return "RouteSelect";
    case OpKind::kRouteRows:
      return "RouteRows";
  }
  return "?";
}

// Owns one allocation on some device; move-only. The free function runs exactly once, in the
// destructor or on reassignment. A default-constructed buffer owns nothing.
class DeviceBuffer {
 public:
  // Releases `data`; `ctx` is whatever the allocating backend needs (may be null).
  using FreeFn = void (*)(void* data, void* ctx);

  DeviceBuffer() = default;
  DeviceBuffer(void* data, size_t bytes, Device device, FreeFn free_fn, void* ctx)
      : data_(data), bytes_(bytes), device_(device), free_fn_(free_fn), ctx_(ctx) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
      device_ = other.device_;
      free_fn_ = std::exchange(other.free_fn_, nullptr);
      ctx_ = std::exchange(other.ctx_, nullptr);
    }
    return *this;
  }
  ~DeviceBuffer() { Reset(); }

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

  // A view of `dims` elements of `dtype` starting `offset_bytes` into the buffer. CHECKs that the
  // view fits (a caller bug otherwise). The view must not outlive the buffer.
  TensorView View(DType dtype, std::initializer_list<int64_t> dims, size_t offset_bytes = 0) const {
    TensorView v(static_cast<char*>(data_) + offset_bytes, dtype, dims, device_);
    MODSERVE_CHECK(offset_bytes + v.bytes() <= bytes_)
        << "view " << v.ShapeString() << " at offset " << offset_bytes << " exceeds buffer of "
        << bytes_ << " bytes";
    return v;
  }

 private:
  void Reset() {
    if (free_fn_ != nullptr && data_ != nullptr) free_fn_(data_, ctx_);
    data_ = nullptr;
    bytes_ = 0;
    free_fn_ = nullptr;
    ctx_ = nullptr;
  }

  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_ = Device::kCpu;
  FreeFn free_fn_ = nullptr;
  void* ctx_ = nullptr;
};

struct RmsNormParams {
  float eps = 1e-5f;
};

// Rotary embedding plus the KV-cache write of the same tokens.
struct RopeParams {
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;  // even
  double rope_theta = 10000.0;
  int block_size = 0;  // tokens per KV page
};

struct AttentionParams {
  int n_heads = 0;
  int n_kv_heads = 0;  // divides n_heads (GQA); head h reads kv head h / (n_heads / n_kv_heads)
  int head_dim = 0;
  int block_size = 0;  // tokens per KV page
  float scale = 0.0f;  // multiplies q . k; usually 1 / sqrt(head_dim)
  // Every row of the call is a token of its request's prompt (prefill). A backend may run such
  // rows with other kernels than the rest (the CPU backend's tiles, docs/DESIGN.md 5), as long
  // as a prompt row gets the same bits in every prompt call: the engine never mixes the kinds in
  // one call, so a row's bits do not depend on what shares its step.
  bool prompt = false;
};

enum class ActivationKind : uint8_t {
  kSilu,  // x * sigmoid(x)
  kGelu,  // exact erf form: 0.5 x (1 + erf(x / sqrt(2))), torch.nn.GELU() default
  kRelu,
};
struct ActivationParams {
  ActivationKind kind = ActivationKind::kSilu;
};

// MoD combine of a routed block's output into the residual stream (DESIGN.md section 2).
// kOne: g = 1, and the row becomes y exactly (whichever the scale target), not x + (y - x).
enum class WeightFn : uint8_t { kIdentity, kSigmoid, kOne };  // g = s, sigmoid(s) or 1
enum class ScaleTarget : uint8_t { kUpdate, kBlockOutput };   // x + g (y - x) or g y
struct ScatterCombineParams {
  WeightFn weight_fn = WeightFn::kIdentity;
  ScaleTarget scale_target = ScaleTarget::kUpdate;
};

// One member of a GemmGroup: out = x @ w^T (+ bias), with Gemm's shapes and dtypes.
struct GemmOperand {
  TensorView w;
  TensorView bias;  // empty: none
  TensorView out;
};

// A compute device. Contracts shared by every implementation:
// - Threads: one engine thread drives a backend; no method may be called concurrently with
//   another on the same object (implementations keep per-op scratch space).
// - Ops are enqueued in call order and return void. Bad shapes, dtypes or devices are caller bugs
//   and CHECK-fail. Device errors surface at the next Synchronize() (or CopyToHost).
// - Tensor arguments are non-owning views into memory from this backend's Allocate() (or, for the
//   CPU backend, any host memory). They must stay alive until Synchronize() returns.
// - Activations are F32; weights may be F32, F16 or BF16, and the Embed table and Gemm weight
//   also block-quantized (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K in the GGML layouts of common/quant.h,
//   rows of whole blocks); query Supports(). Index tensors are I32.
// - Index values (token ids, slots, page ids, kv lens, row indices) were validated by the caller;
//   out-of-range values are caller bugs and CHECK-fail on the CPU backend.
class Backend {
 public:
  virtual ~Backend() = default;

  // Stable lower-case name, e.g. "cpu"; the key used by the registry.
  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;

  // Whether `op` runs with `dtype` as its weight dtype (Embed/RmsNorm/Gemm) or KV-pool dtype
  // (RopeAndAppendKv/Attention). Activation-only ops support F32 only.
  virtual bool Supports(OpKind op, DType dtype) const = 0;

  // Most x rows for which Gemm with a weight of `weight_dtype` and `weight_rows` rows (and every
  // other op of a step) gives each row the bits it gets in a one-row call: a row's result then
  // does not depend on how many rows share the pass. Self-speculative decoding verifies drafts
  // in one multi-row pass and is exact only within this bound, and the prefix cache gives a
  // request the bits it gets without it only within it (docs/DESIGN.md, 4.1 and 4.2). The
  // default, 1, claims nothing.
  virtual int64_t MaxRowInvariantRows(DType weight_dtype, int64_t weight_rows) const {
    (void)weight_dtype;
    (void)weight_rows;
    return 1;
  }

  // Host work between ops, e.g. sampling the rows of a step: calls task(i) once for every i in
  // [0, count) and returns when all have run, spread over the host threads the backend keeps
  // (the CPU backend's pool, idle between ops) or, by default, in the calling thread in index
  // order. Tasks must be independent of each other and must not call the backend.
  virtual void HostParallelFor(int64_t count, absl::FunctionRef<void(int64_t)> task) {
    for (int64_t i = 0; i < count; ++i) task(i);
  }

  // Row counts that live on the device (DESIGN.md section 5.2): a routed layer's block runs on
  // the rows RouteSelect chose without the host learning how many there are. While a count is
  // set, every op below takes its row dimension (n of ids, x, q, gate, a and z; m of the idx of
  // GatherRows, ScatterCombine and RouteRows) as a capacity and processes rows
  // [0, min(n, count[0])) only, reading count[0] when it runs, not when it is enqueued. With a
  // count of 0 there is no row to compute, and backends skip the work where they can (the CPU
  // backend, and the CUDA decode GEMV, which then reads no weight). Index and metadata entries of
  // later rows are not read. Output rows past the count are unspecified (a backend may compute
  // them from whatever the inputs hold there, e.g. a library GEMM that takes its row count from
  // the host), except that ops which write through an index write for counted rows only:
  // RopeAndAppendKv's slots, ScatterCombine's x[idx[j]]. A counted row gets what a call of exactly
  // count[0] rows gives it, within the op's conformance tolerance (the CPU backend: the same
  // bits; a library GEMM run on all n rows may sum in another order).
  // count: [1] i32 in this backend's memory, alive while set; an empty view clears it.
  // CopyKvPages ignores it. CHECK-fails unless SupportsDeviceRowCount().
  virtual bool SupportsDeviceRowCount() const { return false; }
  virtual void SetDeviceRowCount(const TensorView& count) {
    MODSERVE_CHECK(count.empty()) << "backend '" << name() << "' has no device row counts";
  }

  // Graphs (DESIGN.md section 5.2): the ops enqueued between BeginCapture() and EndCapture() are
  // recorded instead of run, and Replay(graph) runs them again, in order, as enqueued: same
  // tensors, same shapes, every tensor's contents (device row counts included) read when the
  // replay runs. The host fills the inputs with CopyToDevice before a replay. Only ops may be
  // captured: CopyToDevice, CopyToHost, Synchronize, Allocate and CopyKvPages during a capture are
  // caller bugs (CHECK). A graph stays valid while every buffer it names lives; ReleaseGraphs()
  // drops them all. Errors: Unimplemented unless SupportsGraphs(); Internal when the device
  // refuses (the capture is then abandoned, nothing stays recorded).
  virtual bool SupportsGraphs() const { return false; }
  virtual absl::Status BeginCapture() {
    return absl::UnimplementedError(
        absl::StrCat("backend '", std::string(name()), "' has no graphs"));
  }
  // The new graph's id (>= 0).
  virtual absl::StatusOr<int> EndCapture() {
    return absl::UnimplementedError(
        absl::StrCat("backend '", std::string(name()), "' has no graphs"));
  }
  virtual absl::Status Replay(int graph) {
    return absl::UnimplementedError(
        absl::StrCat("backend '", std::string(name()), "' has no graph ", graph));
  }
  virtual void ReleaseGraphs() {}

  // Device memory of at least `bytes` bytes, aligned to 64 bytes. ResourceExhausted when the
  // device has no room (the message names the request size).
  virtual absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) = 0;

  // A Gemm weight in the layout this backend's kernels read fastest, made once when a model is
  // loaded: either `w` itself, or a copy of it (same dtype, shape and bytes) in a layout private
  // to the backend, in memory the backend owns until it is destroyed. A copy may be passed only
  // as a Gemm/GemmGroup weight, whole or as a slice of whole row groups (the backend CHECKs);
  // every other reader (Embed of a tied table, say) keeps the original. The result is the same
  // Gemm within the op's conformance tolerance, and a row's bits still do not depend on the
  // rows beside it (MaxRowInvariantRows). The CPU backend copies Q4_K, Q5_K, Q6_K and Q8_0
  // weights whose rows come in groups of 16 into its interleaved layouts when its kernels read
  // one, and on a CPU with AVX512_BF16 and no AMX BF16 weights of whole 32-row groups into
  // bf16 pair panels (cpu/kernels.h); ResourceExhausted when there is no memory for the copy.
  virtual absl::StatusOr<TensorView> PrepareGemmWeight(const TensorView& w) { return w; }

  // Copies host_src (Device::kCpu) into dst (this backend's device); same byte size.
  // Ordered with ops. InvalidArgument when sizes or devices do not match.
  virtual absl::Status CopyToDevice(const TensorView& host_src, const TensorView& dst) = 0;
  // Copies src (this device) into host_dst; returns once the bytes are in host memory, after all
  // previously enqueued ops. InvalidArgument on size or device mismatch; Internal on device error.
  virtual absl::Status CopyToHost(const TensorView& src, const TensorView& host_dst) = 0;
  // Waits for every enqueued op. Internal when a device error happened since the last call.
  virtual absl::Status Synchronize() = 0;

  // out[i, :] = table[ids[i], :] as F32 (dequantized exactly as quant::DequantizeRow does).
  // ids [n] i32; table [vocab_size, d_model] F32/F16/BF16 or quantized; out [n, d_model] f32.
  virtual void Embed(const TensorView& ids, const TensorView& table, const TensorView& out) = 0;

  // out = x / sqrt(mean(x^2) + eps) * weight, per row. out may alias x.
  // x [n, d] f32; weight [d] F32/F16/BF16; out [n, d] f32.
  virtual void RmsNorm(const RmsNormParams& params, const TensorView& x, const TensorView& weight,
                       const TensorView& out) = 0;

  // out = x @ w^T (+ bias). The LM-head "Logits" step is this op with w = lm_head.
  // x [n, k] f32; w [m, k] F32/F16/BF16 (row-major, as nn.Linear stores it) or quantized (each
  // row k / block elements blocks); bias empty or [m] in w's dtype or F32 (always F32 for a
  // quantized w); out [n, m] f32, must not alias x. With a quantized w a backend may round x to
  // 8 bits per 32-element block for integer dot products (the CPU backend does; its conformance
  // tolerance says how far that moves the result from the dequantize-then-f32 reference).
  virtual void Gemm(const TensorView& x, const TensorView& w, const TensorView& bias,
                    const TensorView& out) = 0;

  // Gemm of one x with several weight matrices (the q/k/v projections, gate and up): for each
  // member g, g.out = x @ g.w^T (+ g.bias), every member following Gemm's contract; the weights
  // may differ in dtype and row count. Each g.out gets exactly the bits Gemm(x, g.w, g.bias,
  // g.out) gives, so a backend may only share work that does not change them (the CPU backend
  // rounds x once per activation layout and runs one parallel pass over all members' weight
  // rows). Outputs must not alias x or each other. The default calls Gemm per member.
  virtual void GemmGroup(const TensorView& x, absl::Span<const GemmOperand> group) {
    for (const GemmOperand& g : group) Gemm(x, g.w, g.bias, g.out);
  }

  // Rotates q and k (HF rotate-half RoPE at positions[i]; angles position * theta^(-2j/head_dim)
  // are formed in fp64, cos/sin rounded to f32, the rotation in f32) and writes token i's rotated k
  // and its v to slot slots[i] = page * block_size + offset of kv_pool.
  // q [n, n_heads, head_dim] f32 (rotated in place); k, v [n, n_kv_heads, head_dim] f32 (k is
  // rotated in place too); positions [n] i32; slots [n] i32;
  // kv_pool [num_pages, 2 * n_kv_heads, block_size, head_dim] F32/F16/BF16: page p holds K as
  // [n_kv_heads, block_size, head_dim] then V likewise. Slots of one call must be distinct.
  virtual void RopeAndAppendKv(const RopeParams& params, const TensorView& q, const TensorView& k,
                               const TensorView& v, const TensorView& positions,
                               const TensorView& slots, const TensorView& kv_pool) = 0;

  // Paged attention for prefill and decode rows alike. Row i belongs to sequence s = row_seq[i]
  // and attends over entries 0 .. row_kv_len[i] - 1 of that sequence's page list, where entry j
  // lives in page page_table[s, j / block_size] at offset j % block_size. Causality is the
  // caller's: it writes the row's own k/v first and sets row_kv_len so that the row sees exactly
  // what it may. Softmax in f32 with max subtraction.
  // q [n, n_heads, head_dim] f32; kv_pool as in RopeAndAppendKv;
  // page_table [num_seqs, max_pages] i32; row_seq [n] i32; row_kv_len [n] i32 (>= 1);
  // out [n, n_heads * head_dim] f32.
  virtual void Attention(const AttentionParams& params, const TensorView& q,
                         const TensorView& kv_pool, const TensorView& page_table,
                         const TensorView& row_seq, const TensorView& row_kv_len,
                         const TensorView& out) = 0;

  // out = silu(gate) * up. gate, up, out [n, f] f32; out may alias gate or up.
  virtual void SwiGlu(const TensorView& gate, const TensorView& up, const TensorView& out) = 0;

  // x = act(x) in place. x [n, f] f32.
  virtual void Activation(const ActivationParams& params, const TensorView& x) = 0;

  // out = a + b. a, b, out [n, d] f32; out may alias a or b.
  virtual void Add(const TensorView& a, const TensorView& b, const TensorView& out) = 0;

  // out[j, :] = x[idx[j], :]. x [n, d] f32; idx [m] i32 in [0, n); out [m, d] f32 (no alias).
  virtual void GatherRows(const TensorView& x, const TensorView& idx, const TensorView& out) = 0;

  // For each j, with g = s[j] or sigmoid(s[j]):
  //   kUpdate:      x[idx[j]] += g * (y[j] - x[idx[j]])
  //   kBlockOutput: x[idx[j]]  = g * y[j]
  // x [n, d] f32 (in/out); y [m, d] f32; idx [m] i32, distinct, in [0, n); s [m] f32 router
  // scores.
  virtual void ScatterCombine(const ScatterCombineParams& params, const TensorView& x,
                              const TensorView& y, const TensorView& idx, const TensorView& s) = 0;

  // For each (src, dst) pair, page dst of kv_pool becomes a copy of page src (K and V of every
  // KV head, all block_size entries): the copy-on-write of a shared page before it is appended
  // to. kv_pool as in RopeAndAppendKv; page ids in [0, num_pages), src != dst, each dst once.
  virtual void CopyKvPages(const TensorView& kv_pool,
                           absl::Span<const std::pair<int32_t, int32_t>> copies) = 0;

  // The MoD routing decision of one routed layer, made where z lives (DESIGN.md section 5.1).
  // For each row i: row i is routed in when z[i] > z_cut[i] (f32; the row's own cut, so one call
  // serves sequences of different request tau; the host derives it from tau so that this is the
  // reference's f64 comparison sigmoid(z) > tau, bit for bit: RouterZCut in model/config.h), and
  // probs[i] = f32(1 / (1 + exp(-z[i]))) evaluated in f64. The routed rows' indices, ascending,
  // go to idx[0 .. count) and their router scores s[idx[j]] to s_sel[j]; count[0] = how many.
  // Entries of idx and s_sel from count on are unspecified.
  // z, z_cut, s, probs, s_sel [n] f32; idx [n] i32; count [1] i32; n >= 1. probs, idx, s_sel and
  // count must not alias each other or the inputs. Under a device row count c (above) only rows
  // [0, c) are candidates, and count[0] is written even when c is 0.
  virtual void RouteSelect(const TensorView& z, const TensorView& z_cut, const TensorView& s,
                           const TensorView& probs, const TensorView& idx,
                           const TensorView& s_sel, const TensorView& count) = 0;

  // The KV metadata of a routed layer's selected rows, computed where RouteSelect left them
  // (DESIGN.md section 5.2), so that no routed layer needs the host. For each j, with r = idx[j]
  // the step row and s = row_seq[r] its sequence:
  //   rank          = j - #{j' < j : idx[j'] < seq_first_row[s]}  (r's place among s's routed rows)
  //   out_pos[j]    = row_pos[r]
  //   out_slots[j]  = cand_slots[seq_first_row[s] + rank]  (s's reserved slots at this layer)
  //   out_seq[j]    = s
  //   out_kv_len[j] = seq_kv_base[s] + rank + 1
  // idx [m] i32 ascending (RouteSelect's); row_seq, row_pos, cand_slots [N] i32 over the step's
  // rows, rows of a sequence contiguous from seq_first_row[s]; seq_first_row, seq_kv_base [S] i32;
  // out_pos, out_slots, out_seq, out_kv_len [m] i32, aliasing nothing. The row dimension is m.
  virtual void RouteRows(const TensorView& idx, const TensorView& row_seq,
                         const TensorView& row_pos, const TensorView& cand_slots,
                         const TensorView& seq_first_row, const TensorView& seq_kv_base,
                         const TensorView& out_pos, const TensorView& out_slots,
                         const TensorView& out_seq, const TensorView& out_kv_len) = 0;
};

}  // namespace modserve::backend

#endif  // MODSERVE_ENGINE_BACKEND_BACKEND_H_
