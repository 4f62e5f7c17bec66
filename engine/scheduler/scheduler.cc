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
                                 double prior_fraction, int32_t block_size,
                                 double default_threshold)
    : n_layers_(n_layers),
      routed_layers_(std::move(routed_layers)),
      prior_fraction_(prior_fraction),
      block_size_(block_size),
      default_threshold_(default_threshold) {}

KvPageEstimator KvPageEstimator::ForModel(const ModelConfig& config, int32_t block_size) {
  std::vector<int32_t> routed;
  double prior = 1.0;
  double tau = 0.5;
  if (config.mod) {
    routed.assign(config.mod->routed_layers.begin(), config.mod->routed_layers.end());
    prior = config.mod->capacity;
    tau = config.mod->threshold;
  }
  return KvPageEstimator(static_cast<int32_t>(config.n_layers), std::move(routed), prior,
                         block_size, tau);
}

void KvPageEstimator::Observe(double threshold, absl::Span<const int32_t> routed_rows,
                              int32_t num_tokens) {
  if (routed_rows.size() != routed_layers_.size() || routed_layers_.empty() || num_tokens <= 0) {
    return;
  }
  auto it = stats_.find(threshold);
  if (it == stats_.end()) {
    if (stats_.size() >= kMaxThresholds) {
      // Drop the least observed threshold (never the default one) to bound client-chosen keys.
      auto victim = stats_.end();
      for (auto jt = stats_.begin(); jt != stats_.end(); ++jt) {
        if (jt->first == default_threshold_) continue;
        if (victim == stats_.end() || jt->second.tokens < victim->second.tokens) victim = jt;
      }
      if (victim != stats_.end()) stats_.erase(victim);
    }
    it = stats_.emplace(threshold, Stats{std::vector<int64_t>(routed_layers_.size(), 0), 0}).first;
  }
  for (size_t k = 0; k < routed_rows.size(); ++k) it->second.routed_rows[k] += routed_rows[k];
  it->second.tokens += num_tokens;
}

std::pair<double, int64_t> KvPageEstimator::Estimate(size_t k, double threshold) const {
  // E(tau) = blend(E(tau'), measured at tau) where tau' is the nearest measured threshold below
  // tau (an upper bound, since the fraction never grows with tau). At and above the default the
  // chain starts from the training capacity and never borrows from lower thresholds (a burst at
  // a low tau says nothing useful about the default); below it, it starts from 1 (dense).
  const bool at_or_above_default = threshold >= default_threshold_;
  double estimate = at_or_above_default ? prior_fraction_ : 1.0;
  int64_t tokens = 0;
  for (auto it = at_or_above_default ? stats_.lower_bound(default_threshold_) : stats_.begin();
       it != stats_.end() && it->first <= threshold; ++it) {
    estimate = (estimate * kPriorTokens + static_cast<double>(it->second.routed_rows[k])) /
               static_cast<double>(kPriorTokens + it->second.tokens);
    tokens = it->second.tokens;
  }
  return {estimate, tokens};
}

double KvPageEstimator::RoutedFraction(size_t k, double threshold) const {
  return Estimate(k, threshold).first;
}

int32_t KvPageEstimator::ExpectedPages(int32_t num_tokens, double threshold) const {
  const int32_t dense_pages = CeilDiv(num_tokens, block_size_);
  int64_t pages = int64_t{dense_pages} * (n_layers_ - static_cast<int32_t>(routed_layers_.size()));
  for (size_t k = 0; k < routed_layers_.size(); ++k) {
    const auto [f, tokens] = Estimate(k, threshold);
    const double margin = std::max(
        kMinMargin, 3.0 * std::sqrt(f * (1.0 - f) / static_cast<double>(kPriorTokens + tokens)));
    const double fm = std::min(1.0, f + margin);
    pages += CeilDiv(static_cast<int64_t>(std::ceil(fm * num_tokens)), block_size_);
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
  for (const Running& r : running_) {
    if (!r.finished) pages += estimator_.ExpectedPages(
          r.FinalTokens(), r.threshold.value_or(estimator_.default_threshold()));
  }
  return static_cast<int32_t>(pages);
}

StepPlan Scheduler::Plan() {
  StepPlan plan;
  // A hold waits for running sequences to make room; with none running nothing would lift it.
  if (running_.empty()) admissions_held_ = false;
  if (!admissions_held_) {
    int64_t promised = PromisedPages();
    while (!waiting_.empty() && num_running() < options_.max_num_seqs) {
      const WaitingSequence& w = waiting_.front();
      const int32_t need =
          estimator_.ExpectedPages(w.num_tokens + w.max_new_tokens - w.num_generated,
                                   w.threshold.value_or(estimator_.default_threshold()));
      // With nothing running, the head is admitted whatever the estimate: Enqueue checked that
      // its worst case fits the cache alone.
      if (!running_.empty() && promised + need > options_.num_pages) break;
      promised += need;
      running_.push_back({w.seq_id, w.num_tokens, 0, w.max_new_tokens, w.num_generated,
                          w.threshold, w.speculative_tokens, false});
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
  const size_t num_single = plan.entries.size();
  for (const Running& r : running_) {
    if (budget == 0) break;
    const int32_t pending = r.num_tokens - r.num_computed;
    if (r.finished || pending <= 1) continue;
    const int32_t n = std::min(pending, budget);
    plan.entries.push_back({r.seq_id, n});
    budget -= n;
  }
  // Drafts only while the whole step stays in the backend's row-invariant range (the engine
  // enforces the same bound; planning it here leaves the rows to prefill instead).
  const int32_t spec_rows = options_.max_speculative_step_rows > 0
                                ? std::min(options_.max_speculative_step_rows,
                                           options_.max_batch_tokens)
                                : options_.max_batch_tokens;
  int32_t draft_budget = std::max(0, spec_rows - (options_.max_batch_tokens - budget));
  for (size_t i = 0; i < num_single && draft_budget > 0; ++i) {
    StepEntry& e = plan.entries[i];
    const Running& r = *std::find_if(running_.begin(), running_.end(),
                                     [&](const Running& x) { return x.seq_id == e.seq_id; });
    if (r.num_computed == 0) continue;  // a one-token prompt: its first step samples no draft
    const int32_t left = r.max_new_tokens - r.num_generated - 1;
    e.num_draft = std::max(0, std::min({r.speculative_tokens, left, draft_budget}));
    draft_budget -= e.num_draft;
    budget -= e.num_draft;
  }
  plan.num_tokens = options_.max_batch_tokens - budget;
  return plan;
}

std::vector<SequenceId> Scheduler::Commit(const StepResult& result) {
  admissions_held_ = false;
  std::vector<SequenceId> finished;
  for (const SequenceStepResult& s : result.sequences) {
    auto it = std::find_if(running_.begin(), running_.end(),
                           [&](const Running& r) { return r.seq_id == s.seq_id; });
    MODSERVE_CHECK(it != running_.end());
    it->num_computed += s.num_cached + s.num_fed;
    // A speculative step feeds and samples several tokens at once.
    const int32_t num_new =
        s.event.has_value() ? 1 + static_cast<int32_t>(s.more_events.size()) : 0;
    it->num_tokens += num_new;
    it->num_generated += num_new;
    MODSERVE_CHECK(it->num_computed <= it->num_tokens);
    estimator_.Observe(it->threshold.value_or(estimator_.default_threshold()), s.routed_rows,
                       s.num_fed);
    if (!s.status.ok()) {
      it->finished = true;
      finished.push_back(s.seq_id);
      continue;
    }
    if (s.event.has_value()) {
      const TokenEvent& last = s.more_events.empty() ? *s.event : s.more_events.back();
      if (last.finish_reason.has_value()) {
        it->finished = true;
        finished.push_back(s.seq_id);
      }
    }
  }
  return finished;
}

std::optional<Scheduler::Eviction> Scheduler::PreemptOne() {
  // Finished sequences are about to be removed; they are never planned, so never evicted.
  auto victim_it = running_.end();
  for (size_t i = running_.size(); i-- > 1;) {
    if (!running_[i].finished) {
      victim_it = running_.begin() + static_cast<ptrdiff_t>(i);
      break;
    }
  }
  if (victim_it == running_.end()) return std::nullopt;
  const Running victim = *victim_it;
  running_.erase(victim_it);
  waiting_.PushFront({victim.seq_id, victim.num_tokens, victim.max_new_tokens,
                      victim.num_generated, victim.threshold, victim.speculative_tokens});
  admissions_held_ = true;
  const bool held_pages = victim.num_computed > 0;
  if (held_pages) ++num_preemptions_;
  return Eviction{victim.seq_id, held_pages};
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
