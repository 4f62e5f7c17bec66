// StepLoop: the engine thread. Cancellation is a flag the loop reads every iteration, so
// cancelling never waits for a step and a cancelled request's pages are free before the next one.
#include "engine/executor/step_loop.h"

#include <pthread.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/logging.h"

namespace modserve::engine {

struct StepLoop::State {
  LoopRequest request;
  std::shared_ptr<GenerationSink> sink;  // null once the request has ended
  std::atomic<bool> cancelled{false};
  RequestTimings timings;
  absl::Time last_token = absl::InfinitePast();
  SequenceId seq_id = 0;  // 0 until added to the engine
  bool admitted_once = false;

  // Hands the request's result to its sink, which leaves the state with it, so nothing that
  // outlives the request (its handle, or a handle the sink itself holds) keeps the sink or what
  // it refers to alive.
  void End(absl::StatusOr<FinishedRequest> result) {
    const std::shared_ptr<GenerationSink> done = std::move(sink);
    done->OnDone(std::move(result));
  }
};

class StepLoop::Handle final : public RequestHandle {
 public:
  explicit Handle(std::shared_ptr<State> state) : state_(std::move(state)) {}
  void Cancel() override { state_->cancelled.store(true); }

 private:
  std::shared_ptr<State> state_;
};

absl::StatusOr<std::unique_ptr<StepLoop>> StepLoop::Create(Engine* engine,
                                                           const StepLoopOptions& options,
                                                           StepObserver* observer) {
  const SchedulerOptions& s = options.scheduler;
  if (s.max_num_seqs <= 0 || s.max_batch_tokens <= 0 || s.max_queue <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_num_seqs (", s.max_num_seqs, "), max_batch_tokens (", s.max_batch_tokens,
                     ") and max_queue (", s.max_queue, ") must be > 0"));
  }
  if (s.max_num_seqs > engine->options().max_seqs) {
    return absl::InvalidArgumentError(absl::StrCat("max_num_seqs ", s.max_num_seqs,
                                                   " exceeds the engine's max_seqs ",
                                                   engine->options().max_seqs));
  }
  if (s.max_batch_tokens > engine->options().max_batch_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("max_batch_tokens ", s.max_batch_tokens,
                                                   " exceeds the engine's max_batch_tokens ",
                                                   engine->options().max_batch_tokens));
  }
  std::unique_ptr<StepLoop> loop(new StepLoop(engine, options, observer));
  loop->heartbeat_ns_.store(absl::ToUnixNanos(absl::Now()));
  loop->thread_ = std::thread([l = loop.get()] { l->Run(); });
  // Named for top -H, perf and gdb (15 characters at most).
  pthread_setname_np(loop->thread_.native_handle(), "modserve-engine");
  return loop;
}

namespace {

SchedulerOptions WithPages(SchedulerOptions s, const Engine& engine) {
  s.num_pages = engine.kv_stats().num_pages;
  s.max_speculative_step_rows = engine.max_row_invariant_rows();
  return s;
}

}  // namespace

StepLoop::StepLoop(Engine* engine, const StepLoopOptions& options, StepObserver* observer)
    : engine_(engine),
      options_(options),
      observer_(observer),
      scheduler_(WithPages(options.scheduler, *engine),
                 KvPageEstimator::ForModel(engine->config(), engine->kv_stats().block_size)),
      executor_(engine),
      runner_(&executor_, &scheduler_),
      num_pages_(engine->kv_stats().num_pages),
      block_size_(engine->kv_stats().block_size),
      n_layers_(static_cast<int32_t>(engine->config().n_layers)),
      default_threshold_(engine->config().mod ? engine->config().mod->threshold : 0.0),
      kv_bytes_per_token_layer_(static_cast<double>(engine->kv_bytes_per_token_layer())) {
  if (engine->config().mod) {
    routed_layers_.assign(engine->config().mod->routed_layers.begin(),
                          engine->config().mod->routed_layers.end());
  }
}

StepLoop::~StepLoop() { Stop(); }

absl::StatusOr<std::shared_ptr<RequestHandle>> StepLoop::Submit(
    LoopRequest request, std::shared_ptr<GenerationSink> sink) {
  if (!healthy_.load())
    return absl::UnavailableError("the engine failed; the server needs a restart");
  if (draining_.load()) return absl::UnavailableError("the server is draining; retry elsewhere");
  const int64_t final_tokens =
      static_cast<int64_t>(request.request.prompt.size()) + request.request.sampling.max_new_tokens;
  const int64_t worst = (final_tokens + block_size_ - 1) / block_size_ * n_layers_;
  if (worst > num_pages_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a request of ", final_tokens, " tokens may need ", worst,
                     " KV pages; the cache has ", num_pages_, " (raise --kv_cache_bytes)"));
  }
  // Reserve a queue place first so that concurrent submitters never overshoot max_queue.
  const int32_t max_queue = options_.scheduler.max_queue;
  int32_t queued = num_unadmitted_.load();
  do {
    if (queued >= max_queue) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the waiting queue is full (max_queue ", max_queue, "); retry later"));
    }
  } while (!num_unadmitted_.compare_exchange_weak(queued, queued + 1));

  auto state = std::make_shared<State>();
  state->request = std::move(request);
  state->sink = std::move(sink);
  state->timings.accepted = absl::Now();
  num_in_flight_.fetch_add(1);
  {
    absl::MutexLock lock(&mu_);
    if (stop_) {
      num_in_flight_.fetch_sub(1);
      num_unadmitted_.fetch_sub(1);
      return absl::UnavailableError("the server is shutting down");
    }
    inbox_.push_back(state);
    kicked_ = true;
    wake_.Signal();
  }
  return std::shared_ptr<RequestHandle>(std::make_shared<Handle>(std::move(state)));
}

void StepLoop::StartDrain(absl::Duration timeout) {
  draining_.store(true);
  absl::MutexLock lock(&mu_);
  drain_deadline_ = absl::Now() + timeout;
  kicked_ = true;
  wake_.Signal();
}

bool StepLoop::WaitIdle(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (num_in_flight_.load() > 0) {
    if (idle_.WaitWithDeadline(&mu_, deadline)) return num_in_flight_.load() == 0;
  }
  return true;
}

void StepLoop::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
    kicked_ = true;
    wake_.Signal();
  }
  if (thread_.joinable()) thread_.join();
}

void StepLoop::TakeInbox(bool made_progress, std::vector<std::shared_ptr<State>>* incoming) {
  absl::MutexLock lock(&mu_);
  // Sleep unless there is something new or the last iteration stepped: a loop that can make no
  // progress (nothing admitted, or the engine failed) must not spin. The timeout keeps the
  // heartbeat fresh and reaps cancellations and deadlines.
  if (inbox_.empty() && !kicked_ && !made_progress) {
    wake_.WaitWithTimeout(&mu_, options_.idle_wait);
  }
  kicked_ = false;
  incoming->swap(inbox_);
}

void StepLoop::Finish(SequenceId seq_id, absl::StatusOr<FinishedRequest> result) {
  auto it = active_.find(seq_id);
  MODSERVE_CHECK(it != active_.end());
  std::shared_ptr<State> state = std::move(it->second);
  active_.erase(it);
  if (!state->admitted_once) num_unadmitted_.fetch_sub(1);
  scheduler_.Remove(seq_id);
  const absl::Status released = engine_->Release(seq_id);
  if (!released.ok()) {
    MODSERVE_LOG(ERROR) << "request " << state->request.request_id << ": " << released;
  }
  Publish();
  if (observer_ != nullptr) {
    if (result.ok()) {
      observer_->OnRequestFinished(*result);
    } else {
      observer_->OnRequestFailed(result.status().code());
    }
  }
  state->End(std::move(result));
  if (num_in_flight_.fetch_sub(1) == 1) {
    absl::MutexLock lock(&mu_);
    idle_.SignalAll();
  }
}

void StepLoop::Publish() {
  num_running_.store(scheduler_.num_running());
  num_waiting_.store(scheduler_.num_waiting());
  kv_used_pages_.store(engine_->kv_stats().num_used_pages);
  num_preemptions_.store(scheduler_.num_preemptions());
  const PrefixCacheStats prefix = engine_->prefix_cache_stats();
  prefix_cache_queries_.store(prefix.queries);
  prefix_cache_hits_.store(prefix.hits);
  prefix_cache_blocks_.store(prefix.num_blocks);
}

void StepLoop::FailAll(const absl::Status& status) {
  std::vector<SequenceId> ids;
  for (const auto& [id, state] : active_) ids.push_back(id);
  for (SequenceId id : ids) Finish(id, status);
}

void StepLoop::AddIncoming(std::vector<std::shared_ptr<State>>& incoming) {
  for (std::shared_ptr<State>& state : incoming) {
    const Request& r = state->request.request;
    absl::StatusOr<SequenceId> id = engine_->Add(r);
    if (!id.ok()) {
      // Never added: there is no sequence to release.
      if (observer_ != nullptr) observer_->OnRequestFailed(id.status().code());
      state->End(id.status());
      EndUnadmitted();
      continue;
    }
    state->seq_id = *id;
    active_.emplace(*id, state);
    const absl::Status queued =
        scheduler_.Enqueue({*id, static_cast<int32_t>(r.prompt.size()),
                            r.sampling.max_new_tokens, 0, r.threshold,
                            engine_->SpeculativeTokens(r)});
    if (!queued.ok()) Finish(*id, queued);
  }
  incoming.clear();
}

void StepLoop::EndUnadmitted() {
  num_unadmitted_.fetch_sub(1);
  if (num_in_flight_.fetch_sub(1) == 1) {
    absl::MutexLock lock(&mu_);
    idle_.SignalAll();
  }
}

void StepLoop::Refuse(std::vector<std::shared_ptr<State>>& incoming, const absl::Status& status) {
  for (std::shared_ptr<State>& state : incoming) {
    if (observer_ != nullptr) observer_->OnRequestFailed(status.code());
    state->End(status);
    EndUnadmitted();
  }
  incoming.clear();
}

void StepLoop::ReapCancelledAndExpired(absl::Time now) {
  std::vector<std::pair<SequenceId, absl::Status>> done;
  for (const auto& [id, state] : active_) {
    // The deadline first: when it passes, gRPC also cancels the call, and the request should be
    // counted as expired, not as cancelled by its client.
    if (now >= state->request.deadline) {
      done.emplace_back(id, absl::DeadlineExceededError(
                                absl::StrCat("the request's deadline passed after ",
                                             absl::FormatDuration(now - state->timings.accepted))));
    } else if (state->cancelled.load()) {
      done.emplace_back(id, absl::CancelledError("the client cancelled the request"));
    }
  }
  for (auto& [id, status] : done) Finish(id, status);
}

void StepLoop::Run() {
  std::vector<std::shared_ptr<State>> incoming;
  bool made_progress = false;
  while (true) {
    if (options_.before_iteration) options_.before_iteration();
    TakeInbox(made_progress, &incoming);
    made_progress = false;
    const absl::Time now = absl::Now();
    heartbeat_ns_.store(absl::ToUnixNanos(now));
    bool stop;
    absl::Time drain_deadline;
    {
      absl::MutexLock lock(&mu_);
      stop = stop_;
      drain_deadline = drain_deadline_;
      if (stop) {
        // Submit checks stop_ under this lock, so nothing can arrive after this swap.
        incoming.insert(incoming.end(), inbox_.begin(), inbox_.end());
        inbox_.clear();
      }
    }
    if (stop) {
      const absl::Status stopped =
          absl::UnavailableError("the server stopped before the request finished");
      Refuse(incoming, stopped);
      FailAll(stopped);
      return;
    }
    if (!healthy_.load()) {
      // Requests that raced the failure (accepted just before it) end at once, like the rest.
      Refuse(incoming, absl::UnavailableError("the engine failed; the server needs a restart"));
      FailAll(absl::UnavailableError("the engine failed; the server needs a restart"));
      Publish();
      continue;
    }
    AddIncoming(incoming);
    if (now >= drain_deadline) {
      FailAll(absl::UnavailableError("the server's drain timeout passed"));
    }
    ReapCancelledAndExpired(now);
    made_progress = RunStep(now);
    Publish();
  }
}

bool StepLoop::RunStep(absl::Time now) {
  const absl::Time start = absl::Now();
  IterationResult it = runner_.RunOnce();
  int32_t num_prompt_tokens = 0;
  for (SequenceId id : it.admitted) {
    State& s = *active_.at(id);
    if (s.admitted_once) continue;
    s.admitted_once = true;
    s.timings.scheduled = now;
    num_unadmitted_.fetch_sub(1);
    num_prompt_tokens += static_cast<int32_t>(s.request.request.prompt.size());
  }
  if (observer_ != nullptr) {
    for (int32_t i = 0; i < it.num_preemptions(); ++i) observer_->OnPreemption();
  }
  if (it.plan.empty()) return false;
  if (!it.engine_error.ok()) {
    std::string ids;
    for (const auto& [id, state] : active_) {
      absl::StrAppend(&ids, ids.empty() ? "" : ", ", "'", state->request.request_id, "'");
    }
    MODSERVE_LOG(ERROR) << "engine step failed: " << it.engine_error << "; failing "
                        << active_.size() << " request(s) in flight: " << ids
                        << "; the engine accepts no more requests";
    healthy_.store(false);
    FailAll(absl::InternalError(absl::StrCat("the engine failed (", it.engine_error.message(),
                                             "); the server needs a restart")));
    return true;
  }
  for (auto& [id, status] : it.failed) {
    MODSERVE_LOG(ERROR) << "request '" << active_.at(id)->request.request_id
                        << "' failed on its own: " << status;
    Finish(id, status);
  }
  if (!it.step.has_value()) return true;
  const StepResult& result = *it.step;
  const StepPlan& plan = it.plan;
  const absl::Time end = absl::Now();
  StepStats stats;
  stats.phase = plan.Phase();
  stats.duration = end - start;
  stats.num_tokens = result.num_tokens;
  stats.num_prompt_tokens = num_prompt_tokens;
  stats.prefix_cache_queries = result.prefix_cache_queries;
  stats.prefix_cache_hits = result.prefix_cache_hits;
  stats.layer_computed.assign(n_layers_, result.num_tokens);
  stats.layer_skipped.assign(n_layers_, 0);
  for (size_t k = 0; k < routed_layers_.size() && k < result.routed_rows.size(); ++k) {
    stats.layer_computed[routed_layers_[k]] = result.routed_rows[k];
    stats.layer_skipped[routed_layers_[k]] = result.num_tokens - result.routed_rows[k];
  }

  for (const SequenceStepResult& s : result.sequences) {
    if (!s.event.has_value() || !s.status.ok()) continue;
    State& state = *active_.at(s.seq_id);
    ++stats.num_sampled;
    if (state.timings.first_token == absl::InfinitePast()) {
      state.timings.first_token = end;
    } else {
      stats.inter_token_seconds.push_back(absl::ToDoubleSeconds(end - state.last_token));
    }
    state.last_token = end;
    state.sink->OnToken(*s.event);
    // Tokens a speculative step accepted arrive together: they add no inter-token samples of
    // their own (the step's gap already counts once).
    for (const TokenEvent& ev : s.more_events) {
      ++stats.num_sampled;
      state.sink->OnToken(ev);
    }
  }
  stats.spec_num_drafts = result.num_drafts;
  stats.spec_num_draft_tokens = result.num_draft_tokens;
  stats.spec_num_accepted_tokens = result.num_accepted_tokens;
  stats.spec_accepted_per_position = result.accepted_per_position;
  for (SequenceId id : it.finished) {
    State& state = *active_.at(id);
    absl::StatusOr<GenerationResult> r = engine_->Result(id);
    if (!r.ok()) {
      Finish(id, r.status());
      continue;
    }
    FinishedRequest done;
    done.result = *std::move(r);
    state.timings.finished = end;
    done.timings = state.timings;
    done.threshold = state.request.request.threshold.value_or(default_threshold_);
    Finish(id, std::move(done));
  }

  if (observer_ != nullptr) {
    const KvCacheStats kv = engine_->kv_stats();
    stats.num_running = scheduler_.num_running();
    stats.num_waiting = scheduler_.num_waiting();
    stats.kv_usage_ratio =
        kv.num_pages > 0 ? static_cast<double>(kv.num_used_pages) / kv.num_pages : 0.0;
    double layers = static_cast<double>(n_layers_ - static_cast<int32_t>(routed_layers_.size()));
    for (size_t k = 0; k < routed_layers_.size(); ++k) {
      layers += scheduler_.estimator().RoutedFraction(k);
    }
    stats.kv_bytes_per_token = layers * kv_bytes_per_token_layer_;
    stats.kv_bytes_per_token_dense = n_layers_ * kv_bytes_per_token_layer_;
    observer_->OnStep(stats);
  }
  return true;
}

}  // namespace modserve::engine
