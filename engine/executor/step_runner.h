// One engine iteration as every driver runs it: plan (scheduler.h), one forward pass, eviction
// when KV pages run out, commit. The StepLoop (engine thread, sinks) and Engine::Generate
// (synchronous) both run it, so there is one admission and preemption policy, and the scheduler
// tests drive this same code against a fake executor. No threads, sinks or timing in here.
#ifndef MODSERVE_ENGINE_EXECUTOR_STEP_RUNNER_H_
#define MODSERVE_ENGINE_EXECUTOR_STEP_RUNNER_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/engine.h"
#include "engine/scheduler/scheduler.h"

namespace modserve::engine {

// What the runner needs from whatever runs the forward pass: the Engine, or a fake in tests.
class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  // Engine::Step's contract: per-sequence failures in SequenceStepResult::status; an error
  // means nothing was committed (ResourceExhausted: out of KV pages; anything else: a fault).
  virtual absl::StatusOr<StepResult> Step(absl::Span<const StepEntry> entries) = 0;
  // Drops the sequence's KV pages and keeps its tokens (preemption by recompute).
  virtual absl::Status Preempt(SequenceId seq_id) = 0;
};

class EngineExecutor final : public StepExecutor {
 public:
  explicit EngineExecutor(Engine* engine) : engine_(engine) {}
  absl::StatusOr<StepResult> Step(absl::Span<const StepEntry> entries) override {
    return engine_->Step(entries);
  }
  absl::Status Preempt(SequenceId seq_id) override { return engine_->Preempt(seq_id); }

 private:
  Engine* engine_;
};

// What one iteration did.
struct IterationResult {
  StepPlan plan;  // the plan that ran (after evictions); empty when there was nothing to run
  // Sequences running for the first time since they were queued (or re-queued) that are still
  // running at the end of the iteration.
  std::vector<SequenceId> admitted;
  std::vector<Scheduler::Eviction> evicted;  // in order; held_pages = a preemption
  std::optional<StepResult> step;            // set when the forward pass succeeded
  std::vector<SequenceId> finished;          // ended normally in this step
  // Ended on their own with this error (sampling or detokenizing failed; or out of pages with
  // nothing left to evict). The caller ends them and Removes them from the scheduler.
  std::vector<std::pair<SequenceId, absl::Status>> failed;
  // A step error other than out-of-pages: a backend fault, after which the executor is
  // unusable. Nothing was committed.
  absl::Status engine_error;

  int32_t num_preemptions() const;
};

// Thread contract: the thread that owns the executor and the scheduler.
class StepRunner {
 public:
  // Evictions after each failed attempt: one at a time for the first attempts (evicting
  // little keeps the batch large), then doubling, because an attempt that runs out of pages at
  // a routed layer has already computed the layers before it.
  static constexpr int32_t kSingleEvictionAttempts = 8;

  StepRunner(StepExecutor* executor, Scheduler* scheduler)
      : executor_(executor), scheduler_(scheduler) {}

  // Plans and runs one step, evicting and retrying while KV pages run out. The scheduler has
  // committed the step when `step` is set; finished and failed sequences stay in the scheduler
  // until the caller Removes them.
  IterationResult RunOnce();

 private:
  StepExecutor* executor_;
  Scheduler* scheduler_;
};

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_EXECUTOR_STEP_RUNNER_H_
