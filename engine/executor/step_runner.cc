// StepRunner: plan, step, evict-and-retry while out of pages, commit.
#include "engine/executor/step_runner.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "engine/common/logging.h"

namespace modserve::engine {

int32_t IterationResult::num_preemptions() const {
  return static_cast<int32_t>(std::count_if(evicted.begin(), evicted.end(),
                                            [](const Scheduler::Eviction& e) {
                                              return e.held_pages;
                                            }));
}

IterationResult StepRunner::RunOnce() {
  IterationResult r;
  std::vector<SequenceId> admitted;
  for (int32_t attempt = 0;; ++attempt) {
    r.plan = scheduler_->Plan();
    admitted.insert(admitted.end(), r.plan.admitted.begin(), r.plan.admitted.end());
    if (r.plan.empty()) break;
    absl::StatusOr<StepResult> step = executor_->Step(r.plan.entries);
    if (step.ok()) {
      for (SequenceId id : scheduler_->Commit(*step)) {
        auto it = std::find_if(step->sequences.begin(), step->sequences.end(),
                               [id](const SequenceStepResult& s) { return s.seq_id == id; });
        if (it->status.ok()) {
          r.finished.push_back(id);
        } else {
          r.failed.emplace_back(id, it->status);
        }
      }
      r.step = *std::move(step);
      break;
    }
    if (!absl::IsResourceExhausted(step.status())) {
      r.engine_error = step.status();
      break;
    }
    const int32_t count =
        attempt < kSingleEvictionAttempts
            ? 1
            : int32_t{1} << std::min<int32_t>(attempt - kSingleEvictionAttempts + 1, 20);
    bool evicted = false;
    for (int32_t i = 0; i < count; ++i) {
      std::optional<Scheduler::Eviction> e = scheduler_->PreemptOne();
      if (!e.has_value()) break;
      evicted = true;
      r.evicted.push_back(*e);
      if (e->held_pages) {
        const absl::Status preempted = executor_->Preempt(e->seq_id);
        MODSERVE_CHECK(preempted.ok()) << preempted;
      }
    }
    if (!evicted) {
      // Only the oldest sequence is left and it still does not fit. Admission checks that every
      // sequence fits the cache alone, so this means pages are held outside the scheduler.
      for (const StepEntry& e : r.plan.entries) r.failed.emplace_back(e.seq_id, step.status());
      break;
    }
  }
  const std::vector<SequenceId> running = scheduler_->RunningIds();
  const absl::flat_hash_set<SequenceId> running_set(running.begin(), running.end());
  for (SequenceId id : admitted) {
    if (running_set.contains(id) &&
        std::find(r.admitted.begin(), r.admitted.end(), id) == r.admitted.end()) {
      r.admitted.push_back(id);
    }
  }
  return r;
}

}  // namespace modserve::engine
