// THE forward pass of a (Mixture-of-Depths) Llama, written once against backend::Backend.
// It runs one step over many sequences at once (prefill chunks and decode tokens mixed), makes
// the causal routing decision of every token at every routed layer, and writes KV entries only
// for routed-in tokens. It does not sample, schedule or own sequences: see executor/ and sampler/.
#ifndef MODSERVE_ENGINE_MODEL_TRANSFORMER_H_
#define MODSERVE_ENGINE_MODEL_TRANSFORMER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/backend/backend.h"
#include "engine/kv_cache/kv_cache_manager.h"
#include "engine/model/config.h"
#include "engine/model/weights.h"

namespace modserve::engine {

// Where a step decides which rows enter a routed layer and which KV slots they take (DESIGN.md
// section 5.2).
enum class DeviceRouting : uint8_t {
  kAuto,  // on the device for a backend that is not the CPU (the CPU's downloads are memcpys)
  kOn,    // on the device whenever the backend can (tests run the CPU backend this way)
  kOff,   // on the host, one download per routed layer
};

struct TransformerOptions {
  int32_t max_batch_tokens = 2048;  // most rows (tokens) one step may carry
  int32_t max_seqs = 64;            // most sequences one step may carry
  int32_t block_size = 16;          // tokens per KV page
  int32_t num_pages = 0;            // pages in the KV pool (all layers share it)
  DType kv_dtype = DType::kF32;     // storage of K and V in the pool
  DeviceRouting device_routing = DeviceRouting::kAuto;
  // Whether a device step of one token per sequence is captured once per shape (a bucket of 1,
  // 2, 4, ... 64 sequences and a page-table stride) and replayed (DESIGN.md section 5.2); kAuto:
  // on a backend with graphs that is not the CPU.
  DeviceRouting graphs = DeviceRouting::kAuto;
  // Called with a Gemm weight's view as the transformer held it (on a host backend, the file's)
  // right after Backend::PrepareGemmWeight returned a copy of it: the engine drops the view's file
  // pages there, one weight at a time, so that loading never holds the file's pages and the
  // copies of the whole model at once. Null: nothing is called.
  std::function<void(const TensorView&)> on_weight_copied;
};

// One sequence's share of a step. The sequence must already be added to the KV manager.
struct StepSequence {
  SequenceId seq_id = 0;
  absl::Span<const int32_t> tokens;  // new tokens, at positions start_pos, start_pos + 1, ...
  int32_t start_pos = 0;             // tokens the sequence has fed so far
  double threshold = 0.5;            // request tau r in (0, 1] (the compute knob; 1 selects
                                     // nothing); routed layer k selects
                                     // sigmoid(z) > LayerThreshold(mod, k, r) (config.h)
  bool all_logits = false;           // logits for every new token, else for the last one only
  int32_t prompt_len = 0;            // tokens at positions below it are the request's prompt:
                                     // their attention runs as prompt rows
                                     // (AttentionParams::prompt)
};

// What a step produced, on the host.
struct StepOutput {
  // [num_logit_rows, vocab_size] f32, row-major; sequence i owns rows
  // [logit_offsets[i], logit_offsets[i + 1]).
  std::vector<float> logits;
  std::vector<int32_t> logit_offsets;  // [num_seqs + 1]
  // Per routed layer (in the order of ModConfig::routed_layers), per step row (sequences in
  // order, their tokens in order): whether the token was routed in, and sigmoid(z).
  std::vector<std::vector<uint8_t>> selected;
  std::vector<std::vector<float>> probs;
  std::vector<int32_t> row_offsets;  // [num_seqs + 1] first step row of each sequence
  // Routed layers that no row of this step entered (their weights were not read).
  int32_t num_layer_skips = 0;
};

// Thread contract: engine thread only. The config, weights, backend and KV manager must outlive
// the Transformer; the KV pool and the work buffers are allocated once in Create(), except the
// logits buffer, which grows when a step asks for more rows than it holds (prompt logprobs).
class Transformer {
 public:
  // InvalidArgument for options that cannot work (non-positive sizes, a KV dtype the backend
  // does not support); ResourceExhausted when the backend cannot allocate the pool or buffers.
  static absl::StatusOr<std::unique_ptr<Transformer>> Create(const ModelConfig& config,
                                                             const ModelWeights& weights,
                                                             backend::Backend* backend,
                                                             KvCacheManager* kv,
                                                             const TransformerOptions& options);

  // Runs one forward pass over `seqs`. Before any compute it reserves KV capacity for every new
  // token at every dense layer; a routed layer's capacity is reserved after its routing, for the
  // tokens routed in only. Everything is committed at the end, or returned on error.
  // Errors: InvalidArgument (too many rows or sequences, empty token list, token id outside the
  // vocabulary, position past max_seq_len), NotFound (unknown sequence), ResourceExhausted (not
  // enough free KV pages, or no device memory to grow the logits to the rows asked for: nothing
  // was written, the caller may preempt and retry), Internal
  // (device failure). On error no KV entry was committed.
  absl::StatusOr<StepOutput> Step(absl::Span<const StepSequence> seqs);

  const ModelConfig& config() const { return config_; }
  const TransformerOptions& options() const { return options_; }
  // Steps that ran as DeviceStep (section 5.2), graphs captured and replayed, since creation.
  int64_t num_device_steps() const { return num_device_steps_; }
  int64_t num_graph_captures() const { return num_graph_captures_; }
  int64_t num_graph_replays() const { return num_graph_replays_; }
  // Device steps of a graph shape run eagerly because the shape was new (each shape's first).
  int64_t num_graph_warmups() const { return num_graph_warmups_; }

  // The weights it runs: the model's views, with each Gemm weight as the backend prepared it
  // (a view into the backend's own copy where it made one).
  const ModelWeights& weights() const { return weights_; }

  // Drops the graphs it captured (they name its buffers).
  ~Transformer();

 private:
  Transformer(const ModelConfig& config, const ModelWeights& weights, backend::Backend* backend,
              KvCacheManager* kv, const TransformerOptions& options)
      : config_(config), weights_(weights), backend_(backend), kv_(kv), options_(options) {}

  absl::Status AllocateBuffers();
  // Router and predictor biases as the Gemm op takes them: the file's view when its dtype is
  // the weight's or F32, else an F32 copy owned here.
  absl::Status PrepareBiases();
  // Every Gemm weight through Backend::PrepareGemmWeight (the backend may keep a copy in its
  // own layout); the Embed table stays the file's, even when lm_head is tied to it.
  absl::Status PrepareGemmWeights();
  absl::StatusOr<TensorView> PrepareBias(const TensorView& w, const TensorView& b);
  // A copy of host view `host` in a backend buffer owned here (owned_buffers_), same shape/dtype.
  absl::StatusOr<TensorView> CopyToOwnedBuffer(const TensorView& host);
  // On a backend whose memory is not the host's: every weight and bias still on the host (the
  // file's mapped views) copied into device memory owned here, each file tensor once (a tied
  // lm_head shares the Embed table's copy). Runs after PrepareBiases, which reads biases on the
  // host. A no-op on the CPU backend.
  absl::Status UploadWeights();
  // Rows [begin, end) of a block's attention: prompt rows or not (AttentionParams::prompt).
  struct AttnSegment {
    int64_t begin, end;
    bool prompt;
  };
  // Where a block's rows find their positions, KV slots, sequences and visible-key counts ([m]
  // i32 each) and the layer's page table ([num_seqs, stride] i32), filled on the device.
  struct BlockIndex {
    TensorView pos, slots, row_seq, row_kv_len, page_table;
    // Attention's calls, in row order; empty: one call, no prompt rows.
    absl::Span<const AttnSegment> segments = {};
  };
  // The dense block on `m` rows held in `rows` ([m, d_model] f32, updated in place to y).
  void RunBlock(int layer, const TensorView& rows, int64_t m, const BlockIndex& ix);
  // Enqueues z and s for `n` rows of x_, left in z_ (or s_ when z is s) and s_.
  void RouteScores(int layer, int64_t n);
  // RouterZCut of the k-th routed layer's tau_l for a request threshold, remembered.
  float ZCut(int k, double request_threshold);
  // Whether an option of that kind is on for this backend (kAuto: unless it is the CPU).
  bool Enabled(DeviceRouting mode) const;
  // Whether steps run as DeviceStep: the options and the backend allow it.
  bool UseDeviceStep() const;
  // KV capacity for every new token of `seqs` at every dense layer, and with `routed_layers` at
  // the routed ones too; base[i][l] = the entries sequence i held at layer l before the step.
  // Copy-on-write page copies are enqueued as reservations come. On error nothing stays
  // reserved.
  absl::Status ReserveStep(absl::Span<const StepSequence> seqs, bool routed_layers,
                           std::vector<ReservedSlots>* reserved,
                           std::vector<std::vector<int32_t>>* base);
  // Gives back what the first `upto` sequences reserved in this step (nothing committed).
  void ReleaseReservations(absl::Span<const StepSequence> seqs, int64_t upto);
  // A reservation that appends to a page shared through the prefix cache came with a private
  // copy of it to make first; the backend runs ops in order, so the copy lands before the step
  // writes the page or reads it through the sequence's page table.
  void CopyPagesOnWrite(const ReservedSlots& r);
  // The step rows whose logits are asked for (every row of a sequence with all_logits, else its
  // last), filling out.logit_offsets.
  std::vector<int32_t> LogitRows(absl::Span<const StepSequence> seqs, StepOutput& out) const;
  // A step with no host round trip inside the forward pass: every new token's KV slot reserved
  // at every layer up front, the routed rows and their slots found on the device (RouteSelect,
  // RouteRows), the routed block run under a device row count, and the decisions downloaded once,
  // with the logits; the pages of candidates that were not routed in go back at Commit. One
  // upload, two downloads. nullopt when the up-front reservation does not fit (nothing is kept):
  // the host step, which reserves only what is routed in, may still fit. `out` comes with
  // row_offsets filled.
  absl::StatusOr<std::optional<StepOutput>> DeviceStep(absl::Span<const StepSequence> seqs,
                                                       StepOutput out);
  // Word offsets of DeviceStep's upload (step_in_) for capacities of n rows, `seqs` sequences,
  // page tables of `stride` pages and `logit_rows` logit rows; the download (step_out_) is
  // [count, idx [n]] per routed layer, then probs [n] per routed layer.
  struct DeviceLayout {
    int64_t n = 0, seqs = 0, stride = 0, logit_rows = 0;
    int64_t ids = 0, row_seq = 0, row_pos = 0, first_row = 0, logit_idx = 0, step_rows = 0;
    int64_t layers = 0, zcut = 0, pages = 0, words = 0, out_words = 0;
  };
  DeviceLayout MakeDeviceLayout(int64_t n, int64_t seqs, int64_t stride, int64_t logit_rows) const;
  // Every op of DeviceStep's forward pass, logits included, on the uploaded step_in_; with
  // `counted`, under the step's row count from the upload (the ops of a graph bucket).
  void EnqueueDeviceForward(const DeviceLayout& layout, bool counted);
  // Whether this device step runs as a graph (options, backend, one token per sequence, a bucket
  // that fits the options).
  bool UseGraph(absl::Span<const StepSequence> seqs) const;
  // Sequences a graph of a step of n sequences holds: the power of two >= n, at most
  // max_seqs.
  int64_t GraphBucket(int64_t n) const;
  static constexpr int64_t kMaxGraphBucket = 64;
  void DropGraphs();
  // logits_ rows [0, R) = lm_head(RMSNorm_final(x_[rows_idx])), R = rows_idx's length (logits_
  // holds them: EnsureLogitRows); DownloadLogits copies the first `rows` into out.logits.
  void EnqueueLogits(const TensorView& rows_idx);
  absl::Status DownloadLogits(int64_t rows, StepOutput& out);
  // Grows `buf` to at least `bytes` (doubling), keeping nothing of its contents.
  absl::Status EnsureBytes(backend::DeviceBuffer& buf, size_t bytes);
  // Grows logits_ to hold `rows` rows (ResourceExhausted naming them when the backend has no
  // room; the step then fails whole, as when KV pages run out).
  absl::Status EnsureLogitRows(int64_t rows);

  const ModelConfig& config_;
  // The model's views, with each Gemm weight as the backend prepared it (PrepareGemmWeights).
  ModelWeights weights_;
  backend::Backend* backend_;
  KvCacheManager* kv_;
  TransformerOptions options_;
  int64_t max_pages_per_seq_ = 0;
  int64_t num_device_steps_ = 0;
  std::map<std::pair<int, double>, float> zcuts_;  // ZCut's table: (k, request tau) -> cut
  int64_t num_graph_captures_ = 0;
  int64_t num_graph_replays_ = 0;
  // Graph of each (bucket, page-table stride) seen: the backend's id, kGraphWarmup after the
  // shape's first (eager) step, kGraphRefused where capture failed (the shape then runs eagerly).
  static constexpr int kGraphWarmup = -1, kGraphRefused = -2;
  std::map<std::pair<int64_t, int64_t>, int> graphs_;
  int64_t num_graph_warmups_ = 0;

  struct Biases {
    TensorView router;            // [1]
    TensorView predictor_hidden;  // [p]
    TensorView predictor_out;     // [1]
  };
  std::vector<Biases> biases_;  // [n_layers]; empty views when absent
  // CopyToOwnedBuffer's copies: PrepareBias's F32 biases and UploadWeights' weights.
  std::vector<backend::DeviceBuffer> owned_buffers_;

  // Device buffers, allocated once. Shapes are capacities: [max_batch_tokens, ...].
  backend::DeviceBuffer kv_pool_;  // [num_pages, 2 * n_kv_heads, block_size, head_dim] kv_dtype
  backend::DeviceBuffer x_;        // [T, d_model] f32 residual stream
  backend::DeviceBuffer xs_;       // [T, d_model] f32 gathered rows of a routed layer, then y
  backend::DeviceBuffer a_;        // [T, d_model] f32 normed input
  backend::DeviceBuffer q_;        // [T, n_heads * head_dim] f32
  backend::DeviceBuffer k_;        // [T, n_kv_heads * head_dim] f32
  backend::DeviceBuffer v_;        // [T, n_kv_heads * head_dim] f32
  backend::DeviceBuffer att_;      // [T, n_heads * head_dim] f32
  backend::DeviceBuffer o_;        // [T, d_model] f32 projection outputs
  backend::DeviceBuffer gate_;     // [T, d_ff] f32
  backend::DeviceBuffer up_;       // [T, d_ff] f32
  backend::DeviceBuffer s_;        // [T, 1] f32 router scores
  backend::DeviceBuffer z_;        // [T, 1] f32 decision logits
  backend::DeviceBuffer ph_;       // [T, max(p, 1)] f32 predictor hidden
  backend::DeviceBuffer s_sel_;    // [T] f32 router scores of the selected rows
  backend::DeviceBuffer logits_;   // [logit_rows_, vocab_size] f32
  int64_t logit_rows_ = 0;         // min(T, max_seqs) at first; grown to the most a step asked
  // I32 index buffers: [T] each, and the page table (capacity [max_seqs, max_pages_per_seq]; a
  // layer uses [num_seqs, its longest page list of the step]).
  backend::DeviceBuffer ids_, idx_, pos_, slots_, row_seq_, row_kv_len_, page_table_;

  // Routing on the device (Backend::RouteSelect): per-row z cuts zcut_ [T] f32; route_
  // [1 + T] i32 = the routed count, then the routed rows' indices (one download gives both);
  // probs_ [num_routed, T] f32, every routed layer's sigmoid(z), downloaded once per step.
  backend::DeviceBuffer zcut_, route_, probs_;

  // Host staging (same shapes), reused every step.
  std::vector<int32_t> h_ids_, h_idx_, h_pos_, h_slots_, h_row_seq_, h_row_kv_len_, h_page_table_;
  std::vector<uint8_t> h_prompt_row_;    // per step row: a prompt token (StepSequence::prompt_len)
  std::vector<AttnSegment> h_segments_;  // the current block's attention calls
  std::vector<float> h_zcut_, h_probs_;
  std::vector<absl::Span<const PageId>> h_pages_;  // [max_seqs] one layer's page lists
  std::vector<int32_t> h_route_;
  std::vector<std::pair<int32_t, int32_t>> page_copies_;  // CopyPagesOnWrite's scratch

  // DeviceStep: everything the host knows before the step, in one upload (layout in DeviceStep),
  // and every routed layer's [count, idx...] then its probs, in one download.
  backend::DeviceBuffer step_in_, step_out_;
  std::vector<int32_t> h_step_in_, h_step_out_;
};

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_MODEL_TRANSFORMER_H_
