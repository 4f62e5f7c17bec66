// Scheduler: FIFO admission by expected pages, decode-first token budgeting, LIFO preemption.
#include "engine/scheduler/scheduler.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/logging.h"

namespace modserve::engine {
namespace {

int32_t CeilDiv(int64_t a, int64_t b) { return static_cast<int32_t>((a + b - 1) / b); }

}  // namespace

KvPageEstimator::KvPageEstimator(int32_t n_layers, std::vector<int32_t> routed_layers,
                                 double prior_fraction, int32_t block_size)
    : n_layers_(n_layers),
      routed_layers_(std::move(routed_layers)),
      prior_fraction_(prior_fraction),
      block_size_(block_size),
      routed_rows_total_(routed_layers_.size(), 0) {}

KvPageEstimator KvPageEstimator::ForModel(const ModelConfig& config, int32_t block_size) {
  std::vector<int32_t> routed;
  double prior = 1.0;
  if (config.mod) {
    routed.assign(config.mod->routed_layers.begin(), config.mod->routed_layers.end());
    prior = config.mod->capacity;
  }
  return KvPageEstimator(static_cast<int32_t>(config.n_layers), std::move(routed), prior,
                         block_size);
}

void KvPageEstimator::Observe(absl::Span<const int32_t> routed_rows, int32_t num_tokens) {
  if (routed_rows.size() != routed_rows_total_.size() || num_tokens <= 0) return;
  for (size_t k = 0; k < routed_rows.size(); ++k) routed_rows_total_[k] += routed_rows[k];
  tokens_total_ += num_tokens;
}

double KvPageEstimator::RoutedFraction(size_t k) const {
  return (prior_fraction_ * kPriorTokens + static_cast<double>(routed_rows_total_[k])) /
         static_cast<double>(kPriorTokens + tokens_total_);
}

int32_t KvPageEstimator::ExpectedPages(int32_t num_tokens) const {
  const int32_t dense_pages = CeilDiv(num_tokens, block_size_);
  int64_t pages = int64_t{dense_pages} * (n_layers_ - static_cast<int32_t>(routed_layers_.size()));
  for (size_t k = 0; k < routed_layers_.size(); ++k) {
    const double f = std::min(1.0, RoutedFraction(k) + kFractionMargin);
    pages += CeilDiv(static_cast<int64_t>(std::ceil(f * num_tokens)), block_size_);
  }
  return static_cast<int32_t>(pages);
}

int32_t KvPageEstimator::WorstCasePages(int32_t num_tokens) const {
  return CeilDiv(num_tokens, block_size_) * n_layers_;
}

std::string_view StepPlan::Phase() const {
  if (num_decode_entries == 0) return "prefill";
  if (num_decode_entries == static_cast<int32_t>(entries.size())) return "decode";
  return "mixed";
}

Scheduler::Scheduler(const SchedulerOptions& options, KvPageEstimator estimator)
    : options_(options), estimator_(std::move(estimator)), waiting_(options.max_queue) {}

absl::Status Scheduler::Enqueue(const WaitingSequence& seq) {
  if (seq.num_tokens <= 0 || seq.max_new_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", seq.seq_id, " has ", seq.num_tokens,
                                                   " tokens and max_new_tokens ",
                                                   seq.max_new_tokens, "; both must be > 0"));
  }
  const int32_t final_tokens = seq.num_tokens + seq.max_new_tokens - seq.num_generated;
  const int32_t worst = estimator_.WorstCasePages(final_tokens);
  if (worst > options_.num_pages) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a request of ", final_tokens, " tokens may need ", worst,
                     " KV pages; the cache has ", options_.num_pages, " (raise --kv_cache_bytes)"));
  }
  return waiting_.PushBack(seq);
}

int32_t Scheduler::PromisedPages() const {
  int64_t pages = 0;
  for (const Running& r : running_) pages += estimator_.ExpectedPages(r.FinalTokens());
  return static_cast<int32_t>(pages);
}

StepPlan Scheduler::Plan() {
  StepPlan plan;
  if (!admissions_held_) {
    int64_t promised = PromisedPages();
    while (!waiting_.empty() && num_running() < options_.max_num_seqs) {
      const WaitingSequence& w = waiting_.front();
      const int32_t need =
          estimator_.ExpectedPages(w.num_tokens + w.max_new_tokens - w.num_generated);
      // With nothing running, the head is admitted whatever the estimate: Enqueue checked that
      // its worst case fits the cache alone.
      if (!running_.empty() && promised + need > options_.num_pages) break;
      promised += need;
      running_.push_back({w.seq_id, w.num_tokens, 0, w.max_new_tokens, w.num_generated, false});
      plan.admitted.push_back(w.seq_id);
      waiting_.PopFront();
    }
  }
  int32_t budget = options_.max_batch_tokens;
  for (const Running& r : running_) {
    if (budget == 0) break;
    if (r.finished || r.num_tokens - r.num_computed != 1) continue;
    plan.entries.push_back({r.seq_id, 1});
    if (r.num_computed > 0) ++plan.num_decode_entries;
    --budget;
  }
  for (const Running& r : running_) {
    if (budget == 0) break;
    const int32_t pending = r.num_tokens - r.num_computed;
    if (r.finished || pending <= 1) continue;
    const int32_t n = std::min(pending, budget);
    plan.entries.push_back({r.seq_id, n});
    budget -= n;
  }
  plan.num_tokens = options_.max_batch_tokens - budget;
  return plan;
}

std::vector<SequenceId> Scheduler::Commit(const StepResult& result) {
  admissions_held_ = false;
  estimator_.Observe(result.routed_rows, result.num_tokens);
  std::vector<SequenceId> finished;
  for (const SequenceStepResult& s : result.sequences) {
    auto it = std::find_if(running_.begin(), running_.end(),
                           [&](const Running& r) { return r.seq_id == s.seq_id; });
    MODSERVE_CHECK(it != running_.end());
    it->num_computed += s.num_fed;
    MODSERVE_CHECK(it->num_computed <= it->num_tokens);
    if (s.event.has_value()) {
      ++it->num_tokens;
      ++it->num_generated;
      if (s.event->finish_reason.has_value()) {
        it->finished = true;
        finished.push_back(s.seq_id);
      }
    }
  }
  return finished;
}

std::optional<SequenceId> Scheduler::PreemptOne() {
  if (running_.size() < 2) return std::nullopt;
  const Running victim = running_.back();
  running_.pop_back();
  waiting_.PushFront(
      {victim.seq_id, victim.num_tokens, victim.max_new_tokens, victim.num_generated});
  admissions_held_ = true;
  ++num_preemptions_;
  return victim.seq_id;
}

std::vector<SequenceId> Scheduler::RunningIds() const {
  std::vector<SequenceId> ids;
  for (const Running& r : running_) ids.push_back(r.seq_id);
  return ids;
}

bool Scheduler::Remove(SequenceId seq_id) {
  auto it = std::find_if(running_.begin(), running_.end(),
                         [&](const Running& r) { return r.seq_id == seq_id; });
  if (it != running_.end()) {
    running_.erase(it);
    return true;
  }
  return waiting_.Remove(seq_id);
}

}  // namespace modserve::engine
