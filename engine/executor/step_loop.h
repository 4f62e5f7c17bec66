// The one engine thread: takes submitted requests, plans each step (scheduler.h), runs
// Engine::Step, emits sampled tokens to per-request sinks and releases finished, cancelled and
// expired sequences in the same iteration. It knows nothing of gRPC, protobuf or prometheus.
#ifndef MODSERVE_ENGINE_EXECUTOR_STEP_LOOP_H_
#define MODSERVE_ENGINE_EXECUTOR_STEP_LOOP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "engine/executor/step_runner.h"
#include "engine/scheduler/scheduler.h"

namespace modserve::engine {

// When a request passed each stage (absl::InfinitePast() = not reached).
struct RequestTimings {
  absl::Time accepted = absl::InfinitePast();     // Submit returned OK
  absl::Time scheduled = absl::InfinitePast();    // first admitted to the running set
  absl::Time first_token = absl::InfinitePast();  // first token sampled
  absl::Time finished = absl::InfinitePast();
};

struct FinishedRequest {
  GenerationResult result;  // complete: tokens, text, routing, KV bytes at the end
  RequestTimings timings;
  double threshold = 0.0;  // routing tau the request ran with (0 for a dense model)
};

// Receives one request's events, on the engine thread. Implementations must not block (queue
// and return). OnToken comes once per sampled token, in order; OnDone exactly once, last.
class GenerationSink {
 public:
  virtual ~GenerationSink() = default;
  virtual void OnToken(const TokenEvent& event) = 0;
  // The result, or why the request ended early: Cancelled, DeadlineExceeded, Unavailable (the
  // drain timeout passed, the server stopped, or the engine had already failed), Internal (this
  // request's own sampling/detokenization failed, or the engine failed under it),
  // InvalidArgument/OutOfRange (Engine::Add refused it), ResourceExhausted (the KV cache could
  // not hold it even alone).
  virtual void OnDone(absl::StatusOr<FinishedRequest> result) = 0;
};

// One step, as metrics see it.
struct StepStats {
  std::string_view phase;  // "prefill", "decode" or "mixed"
  absl::Duration duration;
  int32_t num_tokens = 0;
  int32_t num_sampled = 0;        // tokens sampled (generation tokens)
  int32_t num_prompt_tokens = 0;  // prompt tokens of the sequences admitted for the first time
  // Per layer (all n_layers): rows that entered the layer / that skipped it this step.
  std::vector<int32_t> layer_computed;
  std::vector<int32_t> layer_skipped;
  std::vector<double> inter_token_seconds;  // one per sampled token that had a predecessor
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  double kv_usage_ratio = 0.0;
  double kv_bytes_per_token = 0.0;        // measured: dense layers plus routed fractions
  double kv_bytes_per_token_dense = 0.0;  // every layer stores every token
  int64_t prefix_cache_queries = 0;       // prompt tokens looked up in the prefix cache
  int64_t prefix_cache_hits = 0;          // of those, found there
  // Speculative decoding: sequences that drafted, tokens drafted and accepted, and accepted
  // drafts per draft position (StepResult's counters).
  int32_t spec_num_drafts = 0;
  int64_t spec_num_draft_tokens = 0;
  int64_t spec_num_accepted_tokens = 0;
  std::vector<int64_t> spec_accepted_per_position;
};

// Metrics hook: called on the engine thread; must not block.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void OnStep(const StepStats& stats) = 0;
  virtual void OnPreemption() = 0;
  virtual void OnRequestFinished(const FinishedRequest& request) = 0;
  virtual void OnRequestFailed(absl::StatusCode code) = 0;
};

// A submitted request; any thread may cancel it. The loop frees its pages at its next
// iteration (before the next step) and reports Cancelled to the sink.
class RequestHandle {
 public:
  virtual ~RequestHandle() = default;
  virtual void Cancel() = 0;
};

struct LoopRequest {
  std::string request_id;  // for logs only
  Request request;
  absl::Time deadline = absl::InfiniteFuture();
};

struct StepLoopOptions {
  SchedulerOptions scheduler;  // num_pages is taken from the engine
  // Longest idle wait between iterations: the heartbeat health checks read.
  absl::Duration idle_wait = absl::Milliseconds(50);
  // Test hook: runs on the engine thread at the top of every iteration, before cancellations
  // are reaped and the step is planned; a test may block in it to hold the engine still.
  std::function<void()> before_iteration;
};

// Thread contract: Submit, Cancel (via the handle), StartDrain, WaitIdle and the accessors are
// safe from any thread and never wait for a step (they take a mutex held only to move requests
// in and out of the inbox). The engine is used only by the loop thread between Create and Stop.
class StepLoop {
 public:
  // `engine` must outlive the loop; `observer` may be null. InvalidArgument when the scheduler
  // options disagree with the engine's (max_num_seqs > engine max_seqs, max_batch_tokens >
  // engine max_batch_tokens) or are not positive.
  static absl::StatusOr<std::unique_ptr<StepLoop>> Create(Engine* engine,
                                                          const StepLoopOptions& options,
                                                          StepObserver* observer);
  ~StepLoop();  // Stop()

  // Unavailable while draining, stopped or after an engine failure; ResourceExhausted naming
  // the limit when max_queue requests wait or the request could never fit the KV cache.
  absl::StatusOr<std::shared_ptr<RequestHandle>> Submit(LoopRequest request,
                                                        std::shared_ptr<GenerationSink> sink);

  // No new submissions; requests already accepted run on. Those still running after `timeout`
  // end with Unavailable.
  void StartDrain(absl::Duration timeout);
  // True once no request is in flight; false if `timeout` passed first.
  bool WaitIdle(absl::Duration timeout);
  // Ends every request still in flight with Unavailable and joins the engine thread.
  void Stop();

  bool draining() const { return draining_.load(); }
  // False after a step failed with anything but ResourceExhausted (the engine is unusable).
  bool healthy() const { return healthy_.load(); }
  // Last time the engine thread went round its loop (idle loops included).
  absl::Time last_heartbeat() const { return absl::FromUnixNanos(heartbeat_ns_.load()); }
  int32_t num_in_flight() const { return num_in_flight_.load(); }
  // Published by the engine thread after every change (for gauges and tests): sequences running
  // and waiting in the scheduler, and KV pages in use (updated before a sink hears OnDone, so a
  // client that saw its request end reads the pages it freed as free).
  int32_t num_running() const { return num_running_.load(); }
  int32_t num_waiting() const { return num_waiting_.load(); }
  int32_t kv_used_pages() const { return kv_used_pages_.load(); }
  int32_t kv_num_pages() const { return num_pages_; }
  int64_t num_preemptions() const { return num_preemptions_.load(); }
  // Prefix cache: prompt tokens looked up and found since start, and blocks cached now.
  int64_t prefix_cache_queries() const { return prefix_cache_queries_.load(); }
  int64_t prefix_cache_hits() const { return prefix_cache_hits_.load(); }
  int32_t prefix_cache_blocks() const { return prefix_cache_blocks_.load(); }

 private:
  struct State;
  class Handle;
  StepLoop(Engine* engine, const StepLoopOptions& options, StepObserver* observer);

  void Run();
  // Moves the inbox into *incoming. Waits first (up to idle_wait) unless something is new or
  // the last iteration made progress.
  void TakeInbox(bool made_progress, std::vector<std::shared_ptr<State>>* incoming);
  void AddIncoming(std::vector<std::shared_ptr<State>>& incoming);
  // Ends requests that never reached the engine (arrived once it had failed or stopped).
  void Refuse(std::vector<std::shared_ptr<State>>& incoming, const absl::Status& status);
  void ReapCancelledAndExpired(absl::Time now);
  // One iteration of the step runner; returns whether it ran a step.
  bool RunStep(absl::Time now);
  // Bookkeeping for a request that ends without ever being added to the engine.
  void EndUnadmitted();
  // Releases the sequence (if added) and tells the sink.
  void Finish(SequenceId seq_id, absl::StatusOr<FinishedRequest> result);
  void FailAll(const absl::Status& status);
  void Publish();

  Engine* engine_;
  StepLoopOptions options_;
  StepObserver* observer_;
  Scheduler scheduler_;  // engine thread only
  EngineExecutor executor_;
  StepRunner runner_;
  int32_t num_pages_;
  int32_t block_size_;
  int32_t n_layers_;
  double default_threshold_;
  double kv_bytes_per_token_layer_;
  std::vector<int32_t> routed_layers_;

  // Engine thread only: requests added to the engine, by sequence id.
  absl::flat_hash_map<SequenceId, std::shared_ptr<State>> active_;

  absl::Mutex mu_;
  absl::CondVar wake_;  // inbox, a cancellation, drain or stop
  absl::CondVar idle_;  // num_in_flight_ reached 0
  std::vector<std::shared_ptr<State>> inbox_ ABSL_GUARDED_BY(mu_);
  bool kicked_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time drain_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();

  std::atomic<bool> draining_{false};
  std::atomic<bool> healthy_{true};
  std::atomic<int64_t> heartbeat_ns_{0};
  std::atomic<int32_t> num_in_flight_{0};   // accepted and not done
  std::atomic<int32_t> num_unadmitted_{0};  // accepted and never admitted (queue bound)
  std::atomic<int32_t> num_running_{0};
  std::atomic<int32_t> num_waiting_{0};
  std::atomic<int32_t> kv_used_pages_{0};
  std::atomic<int64_t> num_preemptions_{0};
  std::atomic<int64_t> prefix_cache_queries_{0};
  std::atomic<int64_t> prefix_cache_hits_{0};
  std::atomic<int32_t> prefix_cache_blocks_{0};
  std::thread thread_;
};

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_EXECUTOR_STEP_LOOP_H_
