// The engine facade: loads a checkpoint onto a backend, owns the KV cache, and runs sequences
// step by step (the server's scheduler drives Step) or to completion (Generate, for the CLI,
// tests and benchmarks). It knows nothing of gRPC, protobuf, prometheus or flags.
#ifndef MODSERVE_ENGINE_ENGINE_H_
#define MODSERVE_ENGINE_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/backend/backend.h"
#include "engine/kv_cache/kv_cache_manager.h"
#include "engine/model/transformer.h"
#include "engine/model/weights.h"
#include "engine/sampler/sampler.h"
#include "engine/sampler/stop_checker.h"
#include "engine/tokenizer/incremental_detokenizer.h"
#include "engine/tokenizer/tokenizer.h"

namespace modserve::engine {

// Faults injected on purpose, for the fault-injection tests (all off by default). A per-request
// fault ends only the request it hits (INTERNAL for it alone); the backend fault fails the step
// as a device error would, which fails the engine.
struct FaultInjection {
  double sampler_rate = 0.0;      // probability that sampling a token fails
  double detokenizer_rate = 0.0;  // probability that detokenizing a token fails
  int64_t backend_fault_step = 0;  // > 0: the forward pass of the step with this number fails
                                   // (and every later one: a sticky device error)
  uint64_t seed = 0;               // draws are a function of (seed, sequence id, token index)
  // Test hook: runs on the engine thread each time the injected backend fault fires, before the
  // step returns it (a test can act "during" the failing step).
  std::function<void()> on_backend_fault;
};

// "sampler=P,detokenizer=P,backend_step=N,seed=S" (any subset, any order) as a FaultInjection;
// InvalidArgument naming the part that does not parse or is out of range.
absl::StatusOr<FaultInjection> ParseFaultInjection(absl::string_view spec);

// "auto" (unset), "f32", "f16" or "bf16", as EngineOptions::kv_dtype takes it; InvalidArgument
// for anything else.
absl::StatusOr<std::optional<DType>> ParseKvDtype(absl::string_view name);

// Most tokens one speculative decode step drafts (EngineOptions and Request).
inline constexpr int32_t kMaxSpeculativeTokens = 16;

struct EngineOptions {
  std::string model_dir;  // a checkpoint directory
  std::string backend = "cpu";
  int num_threads = 0;             // CPU backend threads; 0 = every core
  // How the CPU backend's AMX BF16 Gemm may round activations (backend.h, docs/DESIGN.md 4.2):
  // kHighest (f32 precision, the default) unless a user trades accuracy for speed.
  backend::MatmulPrecision matmul_precision = backend::MatmulPrecision::kHighest;
  int32_t max_batch_tokens = 512;  // rows of one forward pass (prefill chunks + decode tokens)
  int32_t max_seqs = 16;           // sequences in one forward pass
  int64_t kv_cache_bytes = int64_t{256} << 20;
  int32_t block_size = 16;         // tokens per KV page
  // Storage of K and V: F32, F16 or BF16; unset = auto (the 16-bit type of the layer weights,
  // or F32 when they are F32 or quantized).
  std::optional<DType> kv_dtype = DType::kF32;
  uint64_t seed = 0;               // seeds the generator of per-request seeds
  // Keep the KV entries of full prompt blocks after their sequences end and start later
  // sequences with the same prefix (and routing threshold) from them (docs/DESIGN.md, prefix
  // caching). Outputs are the same with and without it.
  bool prefix_caching = false;
  // Self-speculative decoding (docs/DESIGN.md, section 4.2): each decode step drafts up to
  // speculative_tokens tokens with the same model at routing threshold speculative_threshold
  // (1 skips every routed layer), then verifies them in one pass at the request's own
  // threshold. 0 = off. Outputs are those of decoding without it (greedy: the same tokens and
  // routing decisions; sampling: the same distribution). Requests may override both.
  int32_t speculative_tokens = 0;
  double speculative_threshold = 1.0;
  // Where routing, routed rows and KV slots are decided, and whether decode steps replay
  // graphs (docs/DESIGN.md, section 5.2). kAuto: on the device, with graphs, for every backend
  // but the CPU. Outputs are the same either way (up to a GEMM's summation order on a device).
  DeviceRouting device_routing = DeviceRouting::kAuto;
  DeviceRouting graphs = DeviceRouting::kAuto;
  FaultInjection faults;
};

// One generation request, already tokenized.
struct Request {
  std::vector<TokenId> prompt;        // non-empty; BOS included when the model wants one
  SamplingParams sampling;            // temperature 0 = greedy
  std::optional<double> threshold;    // overrides mod.threshold for this request (in (0, 1))
  // -1: none. 0..kMaxTopLogprobs: report, for every prompt token but the first, its logprob
  // under the model (log_softmax of the raw logits: no penalties, no temperature) and this many
  // top alternatives.
  int32_t prompt_logprobs = -1;
  // Override EngineOptions::speculative_tokens ([0, kMaxSpeculativeTokens]) and
  // ::speculative_threshold ((0, 1]) for this request.
  std::optional<int32_t> speculative_tokens;
  std::optional<double> speculative_threshold;
};

// One prompt token and how likely the model found it given the tokens before it.
struct PromptLogprob {
  TokenId token = 0;
  std::optional<float> logprob;    // unset for the first prompt token (nothing predicts it)
  std::vector<TokenLogprob> top;   // the most likely tokens at this position, logprob
                                   // descending, ties to the lower id; empty for the first
};

// One sequence's share of a step: feed up to num_tokens of its pending input (prompt chunk, or
// the last sampled token when decoding).
struct StepEntry {
  SequenceId seq_id = 0;
  int32_t num_tokens = 1;
  // Speculative decoding: a decoding sequence (one pending token) drafts up to this many tokens
  // and verifies them in this step. Capped by the sequence's own setting, its remaining
  // max_new_tokens and the rows left in the step; ignored for other entries.
  int32_t num_draft = 0;
};

// A sampled token and what it adds to the output.
struct TokenEvent {
  TokenId token = 0;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top_logprobs;
  std::string text;  // text safe to stream with this token (UTF-8 complete, stop strings held)
  std::optional<FinishReason> finish_reason;  // set on the last token of the request
  // Set on the first token of a request that asked for prompt logprobs (one per prompt token),
  // so that a stream can send them before the first generated token; empty otherwise.
  std::vector<PromptLogprob> prompt_logprobs;
};

struct SequenceStepResult {
  SequenceId seq_id = 0;
  int32_t num_fed = 0;  // tokens fed this step (their KV entries are committed)
  // Set when this step fed the sequence's last pending token and a new token was sampled.
  std::optional<TokenEvent> event;
  // Not OK when this sequence failed on its own in this step (sampling or detokenizing its next
  // token: Internal, or InvalidArgument); it is then finished and its other fields are as far
  // as it got. Other sequences of the step are unaffected.
  absl::Status status;
  // Per routed layer: how many of this sequence's num_fed rows were routed in.
  std::vector<int32_t> routed_rows;
  // Tokens before them whose KV entries this step took from the prefix cache instead (the
  // sequence's first step after admission, when a cached prefix matched); the sequence has
  // num_cached + num_fed more tokens in the cache.
  int32_t num_cached = 0;
  // Speculative decoding: the tokens after `event` that this step also produced (accepted
  // drafts and the token after them), in order; only the last may finish the request.
  std::vector<TokenEvent> more_events;
  int32_t num_drafted = 0;   // tokens drafted for this sequence in this step
  int32_t num_accepted = 0;  // of those, accepted
};

struct StepResult {
  std::vector<SequenceStepResult> sequences;  // in the order of the entries
  int32_t num_tokens = 0;                     // rows of the forward pass
  int32_t num_layer_skips = 0;                // routed layers no row entered
  // Per routed layer: rows routed in, of num_tokens.
  std::vector<int32_t> routed_rows;
  // Prefix cache lookups of this step (sequences starting from nothing): tokens looked up and
  // tokens found (vLLM's query and hit counters count the same).
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  // Speculative decoding in this step: sequences that drafted, tokens drafted and accepted, and
  // per draft position i (0-based) how many of those sequences had their i-th draft accepted.
  int32_t num_drafts = 0;
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  std::vector<int64_t> accepted_per_position;
};

// Prefix cache counters since the engine started, in tokens.
struct PrefixCacheStats {
  bool enabled = false;
  int64_t queries = 0;
  int64_t hits = 0;
  int32_t num_blocks = 0;  // cached blocks now
  int32_t num_pages = 0;   // pages they reference
};

// A finished (or stopped) request.
struct GenerationResult {
  std::vector<TokenId> token_ids;   // generated tokens, the stopping one included
  std::vector<float> logprobs;      // of each generated token
  std::vector<std::vector<TokenLogprob>> top_logprobs;
  std::string text;                 // empty when the checkpoint has no tokenizer
  FinishReason finish_reason = FinishReason::kLength;
  int32_t prompt_tokens = 0;
  // Per routed layer index (config order), the decision for every token fed to the model:
  // the prompt, then each generated token but the last (which is never fed).
  std::vector<std::vector<uint8_t>> routing;
  std::vector<int32_t> routed_layers;  // the layer index of each entry of `routing`
  int64_t kv_bytes = 0;         // KV entries held at the end, in bytes (exact, not pages)
  int64_t kv_bytes_dense = 0;   // what a dense model of the same shape would hold
  int64_t kv_pages = 0;         // pages held at the end
  // One per prompt token when the request asked for prompt logprobs (Request::prompt_logprobs).
  std::vector<PromptLogprob> prompt_logprobs;
};

// Threads: one thread (the engine thread) calls everything but the const accessors.
class Engine {
 public:
  // NotFound / InvalidArgument / DataLoss from loading (each names the file or key);
  // NotFound or Unavailable for an unknown or absent backend; ResourceExhausted when the KV cache
  // or work buffers cannot be allocated; InvalidArgument for options that cannot work.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  ~Engine();

  const ModelConfig& config() const { return model_.config(); }
  const EngineOptions& options() const { return options_; }
  // Null when the checkpoint directory has no tokenizer file.
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  backend::Backend& backend() { return *backend_; }
  KvCacheStats kv_stats() const { return kv_->GetStats(); }
  // Bytes one token's K and V take at one layer.
  int64_t kv_bytes_per_token_layer() const;
  // The KV storage type in use (EngineOptions::kv_dtype, resolved).
  DType kv_dtype() const { return kv_dtype_; }
  PrefixCacheStats prefix_cache_stats() const;

  // Registers a request and returns its sequence id. InvalidArgument for bad sampling
  // parameters, threshold or token ids (prompt and stop ids must lie in the model's vocabulary
  // and, when the checkpoint has a tokenizer, name one of its tokens); OutOfRange when prompt +
  // max_new_tokens exceeds the model's max_seq_len.
  absl::StatusOr<SequenceId> Add(const Request& request);
  // Tokens a request drafts per decode step: its override, else EngineOptions'.
  int32_t SpeculativeTokens(const Request& request) const {
    return request.speculative_tokens.value_or(options_.speculative_tokens);
  }
  // Most rows of a step in which the backend gives every row the bits of a one-row step, for
  // this model's weights (Backend::MaxRowInvariantRows). A step speculates only within it:
  // one whose plain rows already exceed it verifies no drafts.
  int32_t max_row_invariant_rows() const { return max_row_invariant_rows_; }
  // One forward pass over the entries, then the next token of every sequence whose input is all
  // in the cache. Atomic per sequence: a sequence whose sampling or detokenization fails ends
  // alone (SequenceStepResult::status) and the others advance. A returned error means nothing
  // was committed for any sequence: ResourceExhausted (not enough free KV pages: the caller may
  // preempt and retry), Internal (a backend fault: the engine is unusable), InvalidArgument /
  // NotFound / FailedPrecondition (entries that are a caller bug: unknown, finished or idle
  // sequences, too many rows).
  absl::StatusOr<StepResult> Step(absl::Span<const StepEntry> entries);
  // Frees the sequence's KV pages and forgets it (finish, cancel, preemption).
  absl::Status Release(SequenceId seq_id);
  // Drops a sequence's KV pages but keeps its tokens, so a later step recomputes them
  // (preemption by recompute).
  absl::Status Preempt(SequenceId seq_id);

  int32_t PendingTokens(SequenceId seq_id) const;
  bool Finished(SequenceId seq_id) const;
  // KV pages the sequence holds now (0 for an unknown id).
  int32_t HeldPages(SequenceId seq_id) const;
  // The result so far (complete once Finished()).
  absl::StatusOr<GenerationResult> Result(SequenceId seq_id) const;

  // Runs `requests` to completion together through the same scheduler and step runner as the
  // server (executor/step_runner.h): continuous batching with chunked prefill inside
  // max_batch_tokens, MoD-aware admission by expected KV pages, preemption by recompute.
  // Results are in request order. Any request's error ends the call with that error (every
  // sequence is released first); ResourceExhausted when one request can never fit the cache.
  absl::StatusOr<std::vector<GenerationResult>> Generate(absl::Span<const Request> requests);

 private:
  struct Sequence;
  Engine(EngineOptions options, LoadedModel model);

  EngineOptions options_;
  LoadedModel model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<KvCacheManager> kv_;
  std::unique_ptr<Transformer> transformer_;
  std::unique_ptr<Sampler> sampler_;
  // Samples, detokenizes and stop-checks the next token of `s` from its logits row (which it
  // may modify: ids that name no token are masked). Changes nothing in `s` on error.
  absl::StatusOr<TokenEvent> NextToken(SequenceId seq_id, Sequence& s, absl::Span<float> logits);
  // NextToken in three parts, so that a step's rows are sampled in parallel between them: masks
  // the row's unnamed ids and makes the injected sampler fault (token `index`) ...
  absl::Status PrepareSample(SequenceId seq_id, absl::Span<float> logits, int64_t index);
  // ... (then Sampler::Sample) ... and detokenizes and stop-checks the sample, or names the
  // token in the error.
  absl::StatusOr<TokenEvent> FinishSample(SequenceId seq_id, Sequence& s,
                                          absl::StatusOr<SampleResult> sample, int64_t index);
  // Speculative decoding: the next token of `s` from the verification row `logits` given the
  // drafted token and the draft's distribution q (empty for greedy); *accepted says whether the
  // draft was kept. Like NextToken otherwise.
  absl::StatusOr<TokenEvent> VerifyToken(SequenceId seq_id, Sequence& s, absl::Span<float> logits,
                                         TokenId draft, absl::Span<const TokenLogprob> q,
                                         bool* accepted);
  // Detokenizes and stop-checks a chosen token (the second half of NextToken).
  absl::StatusOr<TokenEvent> EmitToken(SequenceId seq_id, Sequence& s, SampleResult sample,
                                       int64_t index);
  // Drafts num_draft[i] tokens for each entry (1-row passes at the draft threshold), then rolls
  // their KV entries back. A sequence whose draft cannot be sampled drafts fewer (num_draft
  // shrinks). Errors of a pass come back after the rollback (nothing is left committed).
  absl::Status Draft(absl::Span<const StepEntry> entries, absl::Span<Sequence* const> seqs,
                     std::vector<int32_t>& num_draft, std::vector<std::vector<TokenId>>* drafts,
                     std::vector<std::vector<std::vector<TokenLogprob>>>* dists);
  // Appends prompt logprobs from `num_rows` logits rows whose first row is at position `pos`
  // (masking ids that name no token). Internal for a non-finite logit.
  absl::Status AddPromptLogprobs(Sequence& s, int32_t pos, float* logits, int32_t num_rows);
  // Whether the injected fault of kind `salt` hits token `index` of `seq_id`.
  bool InjectFault(double rate, SequenceId seq_id, int64_t index, uint64_t salt) const;
  absl::Status CheckTokenId(absl::string_view what, TokenId id) const;
  // Prefix caching: the key salt of a sequence (its routing threshold; 0 for a dense model),
  // attaching the cached prefix of a sequence that holds nothing (returns tokens attached),
  // undoing that, and caching the sequence's newly fed full prompt blocks.
  uint64_t PrefixSalt(const Sequence& s) const;
  int32_t AttachPrefix(SequenceId seq_id, Sequence& s);
  void DetachPrefix(SequenceId seq_id, Sequence& s);
  void CachePrefixBlocks(SequenceId seq_id, Sequence& s);

  DType kv_dtype_ = DType::kF32;
  absl::flat_hash_map<SequenceId, std::unique_ptr<Sequence>> sequences_;
  SequenceId next_id_ = 1;
  int32_t max_row_invariant_rows_ = 1;
  int64_t num_steps_ = 0;  // forward passes attempted (the backend fault counts them)
  int64_t prefix_queries_ = 0;
  int64_t prefix_hits_ = 0;
  // Ids in [0, vocab_size) that name no token of the tokenizer (an embedding padded past it):
  // never sampled, refused in prompts.
  std::vector<TokenId> unnamed_ids_;
};

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_ENGINE_H_
