// Plans each engine step: continuous batching under a token budget, decodes before prefill
// chunks, and admission by expected KV pages with MoD-aware estimates. It only plans and keeps
// counts; it never calls the engine (executor/step_loop.h does), so tests drive it with a fake.
#ifndef MODSERVE_ENGINE_SCHEDULER_SCHEDULER_H_
#define MODSERVE_ENGINE_SCHEDULER_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/engine.h"
#include "engine/model/config.h"
#include "engine/scheduler/request_queue.h"

namespace modserve::engine {

// Expected KV pages of a sequence from the routed fraction measured per routed layer and per
// routing threshold. A routed layer stores only the tokens routed into it, so a MoD sequence of
// n tokens holds about sum_l ceil(f_l * n / block_size) pages, not n_layers * ceil(n /
// block_size). The fraction depends on the request's threshold tau (a lower tau routes more
// tokens in), so it is measured per tau. An unmeasured tau borrows the estimate of the nearest
// measured tau below it (the fraction never grows with tau, so that is an upper bound); with
// none below, a tau at or above the checkpoint's default starts from the training capacity and
// a lower one from 1 (dense). Each estimate weighs its prior as kPriorTokens observed tokens.
class KvPageEstimator {
 public:
  // Weight of the prior, in tokens: enough that one odd first step does not swing admission.
  static constexpr int64_t kPriorTokens = 256;
  // Margin added to a fraction: three standard errors of the estimate, at least kMinMargin.
  // Underestimating costs a preemption (a recompute); overestimating admits fewer sequences.
  static constexpr double kMinMargin = 0.01;
  // Distinct thresholds tracked (clients choose them): the least observed one is dropped.
  static constexpr size_t kMaxThresholds = 64;

  // routed_layers: ascending layer indices in [0, n_layers); prior_fraction in (0, 1];
  // default_threshold: the checkpoint's tau.
  KvPageEstimator(int32_t n_layers, std::vector<int32_t> routed_layers, double prior_fraction,
                  int32_t block_size, double default_threshold = 0.5);
  // From a checkpoint config: routed layers, capacity and threshold of `mod`, or dense.
  static KvPageEstimator ForModel(const ModelConfig& config, int32_t block_size);

  // One sequence's share of a step at threshold tau: routed_rows[k] of num_tokens rows entered
  // routed layer k.
  void Observe(double threshold, absl::Span<const int32_t> routed_rows, int32_t num_tokens);
  // Fraction of tokens stored at routed layer k for requests at `threshold` (without the margin).
  double RoutedFraction(size_t k, double threshold) const;
  double RoutedFraction(size_t k) const { return RoutedFraction(k, default_threshold_); }
  // Pages a sequence of num_tokens tokens at `threshold` is expected to hold (margin included).
  int32_t ExpectedPages(int32_t num_tokens, double threshold) const;
  int32_t ExpectedPages(int32_t num_tokens) const {
    return ExpectedPages(num_tokens, default_threshold_);
  }
  // Pages it holds if every token enters every layer: the bound that must fit the cache alone.
  int32_t WorstCasePages(int32_t num_tokens) const;

  int32_t n_layers() const { return n_layers_; }
  absl::Span<const int32_t> routed_layers() const { return routed_layers_; }
  double default_threshold() const { return default_threshold_; }

 private:
  struct Stats {
    std::vector<int64_t> routed_rows;  // [routed layers] rows routed in so far
    int64_t tokens = 0;                // rows seen so far
  };
  // Estimate and its number of observed tokens at routed layer k for `threshold`.
  std::pair<double, int64_t> Estimate(size_t k, double threshold) const;

  int32_t n_layers_;
  std::vector<int32_t> routed_layers_;
  double prior_fraction_;
  int32_t block_size_;
  double default_threshold_;
  std::map<double, Stats> stats_;  // by threshold, ascending
};

struct SchedulerOptions {
  int32_t max_num_seqs = 16;       // sequences running at once (and entries of one step)
  int32_t max_batch_tokens = 512;  // rows of one step: decode tokens plus prefill chunks
  int32_t max_queue = 256;         // sequences waiting for admission; more are refused
  int32_t num_pages = 0;           // KV pages of the cache
  // Rows a step with drafts may have: the backend's row-invariant range
  // (Engine::max_row_invariant_rows), within which speculation is exact. 0 = max_batch_tokens.
  int32_t max_speculative_step_rows = 0;
};

// One step's work, decodes first then prefill chunks, plus what the plan changed.
struct StepPlan {
  std::vector<StepEntry> entries;
  std::vector<SequenceId> admitted;  // moved from waiting to running by this plan
  int32_t num_tokens = 0;            // sum of entries' num_tokens and num_draft
  int32_t num_decode_entries = 0;    // entries feeding one token after the first sample

  bool empty() const { return entries.empty(); }
  // "prefill", "decode" or "mixed" (a bounded metrics label).
  std::string_view Phase() const;
};

// Thread contract: engine thread only. The scheduler mirrors each sequence's token counts from
// the StepResults it is given; it must see every step of the sequences it runs.
class Scheduler {
 public:
  Scheduler(const SchedulerOptions& options, KvPageEstimator estimator);

  // Queues a new sequence. ResourceExhausted naming the limit when max_queue sequences wait or
  // when the sequence could not fit the cache even alone (worst case, every token in every
  // layer); InvalidArgument for non-positive counts.
  absl::Status Enqueue(const WaitingSequence& seq);

  // Admits waiting sequences in FIFO order while the expected final pages of everything running
  // fit the cache (the first one always, when nothing runs), then fills the token budget: one
  // token per decoding sequence, then prefill chunks in admission order, then the drafts of
  // speculative decoding sequences (each draft is one more row of the step's verification pass,
  // at most what the sequence may still generate) while the step stays within
  // max_speculative_step_rows. A long prompt thus delays running decodes by at most one chunk
  // of max_batch_tokens, and a step with a long prompt chunk drafts nothing. Admissions held by a
  // preemption resume at the next Commit, or at once when nothing runs.
  StepPlan Plan();

  // Applies a step that succeeded. Returns the sequences that ended in it (finished, or failed
  // on their own: SequenceStepResult::status); they stay "running" until Remove() but are never
  // planned again.
  std::vector<SequenceId> Commit(const StepResult& result);

  // The step could not get KV pages: moves the most recently admitted running sequence (never
  // the oldest one, which must be left to make progress) back to the front of the queue and
  // holds admissions until the next Commit. A sequence that has computed nothing yet holds no
  // pages and is only deferred (held_pages false, not counted as a preemption); otherwise the
  // caller must Engine::Preempt it (recompute later). nullopt when only the oldest runs.
  struct Eviction {
    SequenceId seq_id;
    bool held_pages;
  };
  std::optional<Eviction> PreemptOne();

  // Forgets a sequence (finished, cancelled, past its deadline, failed); false if unknown.
  bool Remove(SequenceId seq_id);

  // Running sequences in admission order.
  std::vector<SequenceId> RunningIds() const;
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t num_waiting() const { return waiting_.size(); }
  int64_t num_preemptions() const { return num_preemptions_; }
  const KvPageEstimator& estimator() const { return estimator_; }
  // Sum of the running sequences' expected final pages.
  int32_t PromisedPages() const;

 private:
  struct Running {
    SequenceId seq_id;
    int32_t num_tokens;    // known tokens: prompt + sampled output
    int32_t num_computed;  // tokens whose KV entries are in the cache
    int32_t max_new_tokens;
    int32_t num_generated;
    std::optional<double> threshold;  // unset: the checkpoint's default
    int32_t speculative_tokens = 0;   // drafted per decode step
    bool finished = false;  // set by Commit; never planned again
    int32_t FinalTokens() const { return num_tokens + (max_new_tokens - num_generated); }
  };

  SchedulerOptions options_;
  KvPageEstimator estimator_;
  RequestQueue waiting_;
  std::vector<Running> running_;  // in admission order
  bool admissions_held_ = false;
  int64_t num_preemptions_ = 0;
};

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_SCHEDULER_SCHEDULER_H_
