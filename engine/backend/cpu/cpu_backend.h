// The CPU backend: multi-threaded, SIMD (AVX2 / AVX-512, chosen at run time) versions of the
// backend ops on host memory. It is what users without a GPU run, so it is built for speed; its
// oracle is reference_ops.h. No asynchrony: every op has finished when it returns.
#ifndef MODSERVE_ENGINE_BACKEND_CPU_CPU_BACKEND_H_
#define MODSERVE_ENGINE_BACKEND_CPU_CPU_BACKEND_H_

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend/backend.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/cpu/thread_pool.h"

namespace modserve::backend::cpu {

struct CpuBackendOptions {
  // Threads that run an op, the calling thread included; 0 = std::thread::hardware_concurrency().
  int num_threads = 0;
  // Forces the kernels of one ISA (dispatch tests, benchmarks); unset = the one named by the
  // environment variable MODSERVE_CPU_ISA (IsaName: scalar, avx2, avx512, avx512vnni, amx) when
  // it is set, else the best this CPU runs.
  std::optional<Isa> isa;
  // A kernel table to run instead of KernelsFor(isa), e.g. one with a software model of a unit
  // this CPU lacks (tests). It must outlive the backend; isa is then ignored.
  const KernelTable* kernels = nullptr;
  // Terms of x in the AMX BF16 Gemm (backend.h): 3, 2 or 1 for kHighest, kHigh, kMedium. Tables
  // without that Gemm compute every Gemm at f32 whatever this says.
  MatmulPrecision matmul_precision = MatmulPrecision::kHighest;
};

// Threads: engine thread only (see Backend). Owns a ThreadPool whose workers sleep between ops.
class CpuBackend final : public Backend {
 public:
  // InvalidArgument when num_threads < 0 or MODSERVE_CPU_ISA names no ISA; Unavailable when `isa`
  // (or MODSERVE_CPU_ISA) names kernels this CPU (or OS) cannot run, e.g. AVX-512 on a CPU
  // without avx512f/bw/vl.
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(const CpuBackendOptions& options);

  Isa isa() const { return kernels_.isa; }
  int num_threads() const { return pool_.num_threads(); }

  std::string_view name() const override { return "cpu"; }
  // Float weights: the decode kernels' range, up to the ISA's measured crossover for the dtype
  // (KernelTable::SmallNMax; the prefill kernels beyond it sum in another order), except weights
  // of at most kGemmSkinnyRows rows, which take the decode kernels at every row count, and BF16
  // weights that PrepareGemmWeight keeps as bf16 panels (UsesBf16Panels: one kernel for
  // every row count; for such a weight as PrepareGemmWeight returned it, as the engine runs it).
  // Quantized weights: every row count, since their prefill kernels make each block's f32 update
  // in the decode kernels' order (quant_kernels_avx2_impl.h; the scalar table has one kernel).
  // Elementwise ops, attention and the activation quantizer work row by row.
  int64_t MaxRowInvariantRows(DType weight_dtype, int64_t weight_rows) const override {
    return DTypeIsQuantized(weight_dtype) || weight_rows <= kGemmSkinnyRows ||
                   (weight_dtype == DType::kBF16 && UsesBf16Panels(weight_rows))
               ? std::numeric_limits<int64_t>::max()
               : SmallNMax(weight_dtype);
  }
  Device device() const override { return Device::kCpu; }
  // On the pool, one task per chunk at least: a task (sampling one row) is worth a wake-up.
  void HostParallelFor(int64_t count, absl::FunctionRef<void(int64_t)> task) override {
    pool_.ParallelFor(0, count, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) task(i);
    });
  }
  bool Supports(OpKind op, DType dtype) const override;
  bool SupportsDeviceRowCount() const override { return true; }
  // Graphs record the ops (with the device row count each was enqueued under) as calls to run
  // again. They save nothing on the CPU, where ops run when called; they exist so that what a
  // device backend captures runs the same way here, in tests.
  bool SupportsGraphs() const override { return true; }
  absl::Status BeginCapture() override;
  absl::StatusOr<int> EndCapture() override;
  absl::Status Replay(int graph) override;
  void ReleaseGraphs() override { graphs_.clear(); }
  // Ops run when called, so the count is read when the op is called.
  void SetDeviceRowCount(const TensorView& count) override;
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override;
  // Q4_K (Q5_K, Q6_K) weights of a multiple of kQ4KX16Rows rows, when the table has
  // gemm_q4_k_x16 (gemm_q5_k_x16, gemm_q6_k_x16), and Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 weights of
  // such rows and k a multiple of 64, when it has that type's gemm_*_x16: a copy in the
  // interleaved layout (kernels.h); BF16 weights where UsesBf16Panels: a copy in the panel
  // layout. Copies are kept until the backend is destroyed. Anything else: `w`.
  absl::StatusOr<TensorView> PrepareGemmWeight(const TensorView& w) override;
  absl::Status CopyToDevice(const TensorView& host_src, const TensorView& dst) override;
  absl::Status CopyToHost(const TensorView& src, const TensorView& host_dst) override;
  absl::Status Synchronize() override;

  void Embed(const TensorView& ids, const TensorView& table, const TensorView& out) override;
  void RmsNorm(const RmsNormParams& params, const TensorView& x, const TensorView& weight,
               const TensorView& out) override;
  void Gemm(const TensorView& x, const TensorView& w, const TensorView& bias,
            const TensorView& out) override;
  void GemmGroup(const TensorView& x, absl::Span<const GemmOperand> group) override;
  void RopeAndAppendKv(const RopeParams& params, const TensorView& q, const TensorView& k,
                       const TensorView& v, const TensorView& positions, const TensorView& slots,
                       const TensorView& kv_pool) override;
  void Attention(const AttentionParams& params, const TensorView& q, const TensorView& kv_pool,
                 const TensorView& page_table, const TensorView& row_seq,
                 const TensorView& row_kv_len, const TensorView& out) override;
  void SwiGlu(const TensorView& gate, const TensorView& up, const TensorView& out) override;
  void Activation(const ActivationParams& params, const TensorView& x) override;
  void Add(const TensorView& a, const TensorView& b, const TensorView& out) override;
  void GatherRows(const TensorView& x, const TensorView& idx, const TensorView& out) override;
  void ScatterCombine(const ScatterCombineParams& params, const TensorView& x, const TensorView& y,
                      const TensorView& idx, const TensorView& s) override;
  void CopyKvPages(const TensorView& kv_pool,
                   absl::Span<const std::pair<int32_t, int32_t>> copies) override;
  void RouteSelect(const TensorView& z, const TensorView& z_cut, const TensorView& s,
                   const TensorView& probs, const TensorView& idx, const TensorView& s_sel,
                   const TensorView& count) override;
  void RouteRows(const TensorView& idx, const TensorView& row_seq, const TensorView& row_pos,
                 const TensorView& cand_slots, const TensorView& seq_first_row,
                 const TensorView& seq_kv_base, const TensorView& out_pos,
                 const TensorView& out_slots, const TensorView& out_seq,
                 const TensorView& out_kv_len) override;

 private:
  CpuBackend(const KernelTable& kernels, int num_threads, MatmulPrecision precision);

  template <typename W>
  void EmbedT(const TensorView& ids, const TensorView& table, const TensorView& out);
  void EmbedQuantized(const TensorView& ids, const TensorView& table, const TensorView& out);
  template <typename W>
  void RmsNormT(float eps, const TensorView& x, const TensorView& weight, const TensorView& out);
  // Whether large BF16 Gemms run on gemm_dpbf16: at kMedium, in a table that has it and no tiles.
  bool UsesDpBf16() const {
    return kernels_.gemm_amx_bf16 == nullptr && kernels_.gemm_dpbf16 != nullptr && amx_terms_ == 1;
  }
  // Whether PrepareGemmWeight keeps a BF16 weight of m rows in the DpBf16 panel layout, so that
  // its Gemms of every row count run on one kernel: m a multiple of kDpBf16PanelRows, a table
  // without the tiles, and gemm_dpbf16_panels at kMedium (UsesDpBf16()) or gemm_bf16_panels (f32
  // FMA) at kHigh and kHighest.
  bool UsesBf16Panels(int64_t m) const {
    return kernels_.gemm_amx_bf16 == nullptr && kernels_.repack_dpbf16 != nullptr &&
           m % kDpBf16PanelRows == 0 &&
           (UsesDpBf16() ? kernels_.gemm_dpbf16_panels != nullptr
                         : kernels_.gemm_bf16_panels != nullptr);
  }
  // The decode kernels' range for float weights of `dtype`: the table's (KernelTable::SmallNMax),
  // or kDpBf16SmallNMax for BF16 on gemm_dpbf16.
  int64_t SmallNMax(DType dtype) const {
    return dtype == DType::kBF16 && UsesDpBf16() ? kDpBf16SmallNMax : kernels_.SmallNMax(dtype);
  }
  // One GemmGroup member as the threads see it.
  struct GemmMember {
    DType dtype = DType::kF32;
    const void* w = nullptr;
    const float* bias = nullptr;  // f32 or null
    float* out = nullptr;
    int64_t m = 0;                      // weight rows (out's row stride)
    QuantGemmFn quant = nullptr;        // quantized w: its kernel (rows in groups of 16 when
                                        // w is a PrepareGemmWeight copy),
    const QuantizedActs* acts = nullptr;  // and x as that kernel reads it
    bool large = false;                 // the prefill kernels (tiles) rather than the decode ones
    bool amx = false;                   // large BF16 on the matrix unit (x from amx_x_)
    bool dpbf16 = false;                // large BF16 on vdpbf16ps (x from amx_x_, DpBf16 layout)
    bool panels = false;  // BF16 in a PrepareGemmWeight copy, every n: gemm_dpbf16_panels (x as
                          // for dpbf16) at kMedium, else gemm_bf16_panels (f32 x); rows in
                          // groups of kDpBf16PanelRows
    int64_t first = 0;  // its first weight row (decode) or tile (prefill) in the group's pass
    int64_t col_block = 0;  // weight rows per prefill tile
  };
  // Weight rows [row_begin, row_end) of one member for the x rows [x_begin, x_end) (all n rows
  // for the decode kernels).
  void GemmRange(const GemmMember& g, const float* x, int64_t n, int64_t k, int64_t x_begin,
                 int64_t x_end, int64_t row_begin, int64_t row_end) const;
  QuantGemmFn QuantKernel(DType dtype) const;
  // The kernel of dtype's interleaved layout (PrepareGemmWeight's copies); null where the table
  // has none.
  QuantGemmFn InterleavedKernel(DType dtype) const;
  // The rows per group of the PrepareGemmWeight copy w lies in (kQ4KX16Rows for the interleaved
  // layouts, kDpBf16PanelRows for the BF16 panels), or 0 where w is no copy; CHECKs that w is
  // then a whole number of the copy's row groups from a group boundary.
  int64_t PreparedGroupRows(const TensorView& w) const;
  template <typename T>
  void RopeAndAppendKvT(const RopeParams& params, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& positions, const TensorView& slots,
                        const TensorView& kv_pool);
  template <typename T>
  void AttentionT(const AttentionParams& params, const TensorView& q, const TensorView& kv_pool,
                  const TensorView& page_table, const TensorView& row_seq,
                  const TensorView& row_kv_len, const TensorView& out);
  // AttentionT for the n rows of a prompt call (bf16 K/V, the matrix unit): cuts them into
  // blocks (attn_blocks_) and leaves each row's output in out, or its splits' parts in partial
  // (row i's tasks start at first[i]).
  void RunAttentionBlocks(const AttentionParams& p, const float* q, const bf16_t* pool,
                          const int32_t* page_table, int64_t max_pages, const int32_t* seq_of,
                          const int32_t* kv_len, int64_t n, const int64_t* first, float* partial,
                          int64_t partial_stride, float* out);
  template <typename W>
  void WeightToF32(const W* src, int64_t count, float* dst) const;

  // Rows an op with capacity n runs: n, or min(n, count) under a device row count.
  int64_t CountedRows(int64_t n) const {
    return row_count_ == nullptr ? n : std::clamp<int64_t>(*row_count_, 0, n);
  }

  // During a capture: appends `op` to the recording, to run under the row count set now.
  void Record(std::function<void()> op);

  const KernelTable& kernels_;
  // bf16 terms of x in gemm_amx_bf16 and gemm_dpbf16 (CpuBackendOptions::matmul_precision).
  const int amx_terms_;
  // PrepareGemmWeight's copies by first byte: their size and the bytes of one row group.
  struct PreparedWeight {
    size_t bytes = 0;
    int64_t group_bytes = 0;
    int64_t group_rows = kQ4KX16Rows;
    DType dtype = DType::kQ4_K;
  };
  std::map<const char*, PreparedWeight> prepared_;
  // Where the copies live: back to back in chunks of at least kPreparedChunkBytes on 2 MiB
  // pages (a buffer per weight would round each up to whole 2 MiB pages), the last one filled
  // up to prepared_used_ bytes. Space a chunk has left when a copy does not fit is never touched,
  // so it takes no memory.
  std::vector<DeviceBuffer> prepared_chunks_;
  size_t prepared_used_ = 0;
  const int32_t* row_count_ = nullptr;  // SetDeviceRowCount's count, or null
  bool capturing_ = false;
  std::vector<std::function<void()>> recording_;
  std::map<int, std::vector<std::function<void()>>> graphs_;
  int next_graph_ = 0;
  ThreadPool pool_;
  // Scratch reused across calls so a decode step does not allocate once sizes have been seen.
  std::vector<float> bias_f32_;      // f32 Gemm biases of a group, converted once per call
  std::vector<GemmMember> gemm_members_;
  std::vector<float> norm_weight_;   // [d] f32: the RmsNorm weight converted once per call
  std::vector<float> attn_partial_;        // [tasks, n_kv_heads, group, head_dim + 2] f32
  std::vector<int64_t> attn_first_task_;  // [n + 1]: row i's attention tasks start here
  // Attention's blocks of rows on the matrix unit: [begin, end) rows.
  std::vector<std::pair<int64_t, int64_t>> attn_blocks_;
  std::vector<int64_t> attn_block_first_task_;  // [blocks + 1]: block b's tasks start here
  // QuantizedActs of the quantized-weight Gemm's x, one per activation layout a group needs
  // (64-byte aligned), grown to the largest seen.
  struct FreeDeleter {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<char, FreeDeleter> act_scratch_;
  size_t act_scratch_bytes_ = 0;
  // x as the BF16 decode kernel reads it (KernelTable::prepare_x_bf16), once per group.
  std::vector<float> small_bf16_x_;
  // x split into bf16 terms for the AMX Gemm (KernelTable::pack_x_bf16) or the vdpbf16ps one
  // (pack_x_dpbf16), once per group.
  std::unique_ptr<uint16_t, FreeDeleter> amx_x_;  // 64-byte aligned
  size_t amx_x_bytes_ = 0;
  // amx_x_, grown to at least `bytes` (its contents are not kept).
  uint16_t* PackedX(size_t bytes);
};

}  // namespace modserve::backend::cpu

#endif  // MODSERVE_ENGINE_BACKEND_CPU_CPU_BACKEND_H_
