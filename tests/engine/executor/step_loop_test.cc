// StepLoop on the engine thread with a tiny real checkpoint: every way a request ends (finish,
// cancel, deadline, drain timeout, refusal) reaches the sink once and leaves no KV pages held.
#include "engine/executor/step_loop.h"

#include <time.h>

#include <atomic>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/model/checkpoint_test_util.h"

namespace modserve::engine {
namespace {

using ::modserve::engine::testing::IsOk;
using ::modserve::engine::testing::StatusIs;

const char kCheckpoint[] =
    MODSERVE_SOURCE_DIR "/tests/testdata/checkpoints/router_sigmoid_blockout_ln_bias";

// Records what the loop sends; the test waits on `done`.
class RecordingSink final : public GenerationSink {
 public:
  void OnToken(const TokenEvent& event) override { tokens.push_back(event.token); }
  void OnDone(absl::StatusOr<FinishedRequest> r) override {
    result = std::move(r);
    done.Notify();
  }

  std::vector<TokenId> tokens;
  std::optional<absl::StatusOr<FinishedRequest>> result;
  absl::Notification done;
};

std::unique_ptr<Engine> MakeEngine(const FaultInjection& faults = {}) {
  EngineOptions eo;
  eo.model_dir = kCheckpoint;
  eo.num_threads = 1;
  eo.faults = faults;
  auto e = Engine::Create(eo);
  MODSERVE_CHECK(e.ok()) << e.status();
  return *std::move(e);
}

// CPU seconds this process used so far (all threads).
double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// CPU time the process burns while the test thread sleeps for `wall`: an idle engine thread
// waits on its condition variable, a spinning one takes a whole core.
double IdleCpuFraction(absl::Duration wall) {
  const double before = ProcessCpuSeconds();
  absl::SleepFor(wall);
  return (ProcessCpuSeconds() - before) / absl::ToDoubleSeconds(wall);
}

// Under a loaded machine a spinning thread still gets a good share of a core; an idle loop
// wakes every idle_wait (50 ms) for microseconds.
constexpr double kIdleCpuLimit = 0.10;

LoopRequest MakeRequest(int32_t max_new_tokens, absl::Time deadline = absl::InfiniteFuture()) {
  LoopRequest r;
  r.request.prompt = {1, 5, 9, 13};
  r.request.sampling.temperature = 0.0f;
  r.request.sampling.max_new_tokens = max_new_tokens;
  r.request.sampling.ignore_eos = true;
  r.deadline = deadline;
  return r;
}

StepLoopOptions Options(int32_t max_queue = 8) {
  StepLoopOptions o;
  o.scheduler.max_num_seqs = 4;
  o.scheduler.max_batch_tokens = 32;
  o.scheduler.max_queue = max_queue;
  return o;
}

TEST(StepLoopTest, FinishedRequestGetsEveryTokenAndTheResult) {
  std::unique_ptr<Engine> engine = MakeEngine();
  auto loop = StepLoop::Create(engine.get(), Options(), nullptr);
  ASSERT_THAT(loop, IsOk());
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_THAT((*loop)->Submit(MakeRequest(6), sink), IsOk());
  sink->done.WaitForNotification();
  ASSERT_THAT(*sink->result, IsOk());
  const FinishedRequest& f = **sink->result;
  EXPECT_EQ(f.result.token_ids, sink->tokens);
  EXPECT_EQ(f.result.token_ids.size(), 6u);
  EXPECT_LE(f.timings.accepted, f.timings.scheduled);
  EXPECT_LE(f.timings.scheduled, f.timings.first_token);
  EXPECT_LE(f.timings.first_token, f.timings.finished);
  EXPECT_TRUE((*loop)->WaitIdle(absl::Seconds(30)));
  EXPECT_EQ((*loop)->kv_used_pages(), 0);
}

TEST(StepLoopTest, RequestPastItsDeadlineEndsWithDeadlineExceeded) {
  std::unique_ptr<Engine> engine = MakeEngine();
  auto loop = StepLoop::Create(engine.get(), Options(), nullptr);
  ASSERT_THAT(loop, IsOk());
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_THAT((*loop)->Submit(MakeRequest(100, absl::Now() - absl::Seconds(1)), sink), IsOk());
  sink->done.WaitForNotification();
  EXPECT_THAT(*sink->result, StatusIs(absl::StatusCode::kDeadlineExceeded, "deadline"));
  EXPECT_TRUE(sink->tokens.empty());
  EXPECT_EQ((*loop)->kv_used_pages(), 0);
}

// gRPC cancels a call whose deadline passed: such a request ended by expiry, not by its client.
TEST(StepLoopTest, CancelAfterTheDeadlineCountsAsExpired) {
  absl::Notification cancelled;  // holds the engine thread until both have happened
  StepLoopOptions options = Options();
  options.before_iteration = [&cancelled] { cancelled.WaitForNotification(); };
  std::unique_ptr<Engine> engine = MakeEngine();
  auto loop = StepLoop::Create(engine.get(), options, nullptr);
  ASSERT_THAT(loop, IsOk());
  auto sink = std::make_shared<RecordingSink>();
  auto handle = (*loop)->Submit(MakeRequest(100, absl::Now() - absl::Seconds(1)), sink);
  ASSERT_THAT(handle, IsOk());
  (*handle)->Cancel();
  cancelled.Notify();
  sink->done.WaitForNotification();
  EXPECT_THAT(*sink->result, StatusIs(absl::StatusCode::kDeadlineExceeded, "deadline"));
  EXPECT_EQ((*loop)->kv_used_pages(), 0);
}

// Cancels its own request when the first token arrives: by then the sequence holds KV pages.
class CancelOnFirstTokenSink final : public GenerationSink {
 public:
  explicit CancelOnFirstTokenSink(const Engine* engine) : engine_(engine) {}
  void OnToken(const TokenEvent&) override {
    if (++num_tokens == 1) {
      pages_at_cancel = engine_->kv_stats().num_used_pages;  // engine thread: safe to read
      absl::MutexLock lock(&mu);
      if (handle != nullptr) handle->Cancel();
    }
  }
  void OnDone(absl::StatusOr<FinishedRequest> r) override {
    result = std::move(r);
    done.Notify();
  }

  const Engine* engine_;
  absl::Mutex mu;
  std::shared_ptr<RequestHandle> handle ABSL_GUARDED_BY(mu);
  int num_tokens = 0;
  int32_t pages_at_cancel = 0;
  std::optional<absl::StatusOr<FinishedRequest>> result;
  absl::Notification done;
};

TEST(StepLoopTest, CancelledRequestEndsWithCancelledAndFreesItsPages) {
  std::unique_ptr<Engine> engine = MakeEngine();
  absl::Notification submitted;  // the first step waits until the handle is in the sink
  StepLoopOptions o = Options();
  o.before_iteration = [&submitted] { submitted.WaitForNotification(); };
  auto loop = StepLoop::Create(engine.get(), o, nullptr);
  ASSERT_THAT(loop, IsOk());
  auto sink = std::make_shared<CancelOnFirstTokenSink>(engine.get());
  auto handle = (*loop)->Submit(MakeRequest(400), sink);
  ASSERT_THAT(handle, IsOk());
  {
    absl::MutexLock lock(&sink->mu);
    sink->handle = *handle;
  }
  submitted.Notify();
  sink->done.WaitForNotification();
  EXPECT_THAT(*sink->result, StatusIs(absl::StatusCode::kCancelled, "cancelled"));
  EXPECT_GT(sink->pages_at_cancel, 0);  // cancelled while holding pages, not before admission
  EXPECT_LT(sink->num_tokens, 400);
  EXPECT_EQ((*loop)->kv_used_pages(), 0);
  EXPECT_EQ(engine->kv_stats().num_used_pages, 0);
}

TEST(StepLoopTest, ARequestWhoseSamplingFailsEndsAloneAndTheOthersFinish) {
  FaultInjection faults;
  faults.sampler_rate = 0.25;  // some tokens of some requests
  faults.seed = 11;
  std::unique_ptr<Engine> engine = MakeEngine(faults);
  auto loop = StepLoop::Create(engine.get(), Options(/*max_queue=*/16), nullptr);
  ASSERT_THAT(loop, IsOk());
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int i = 0; i < 12; ++i) {
    sinks.push_back(std::make_shared<RecordingSink>());
    ASSERT_THAT((*loop)->Submit(MakeRequest(6), sinks.back()), IsOk());
  }
  int failed = 0, finished = 0;
  for (auto& sink : sinks) {
    sink->done.WaitForNotification();
    if (sink->result->ok()) {
      ++finished;
      EXPECT_EQ((**sink->result).result.token_ids.size(), 6u);
    } else {
      ++failed;
      EXPECT_THAT(*sink->result, StatusIs(absl::StatusCode::kInternal, "injected sampler fault"));
    }
  }
  EXPECT_GT(failed, 0);    // the seed makes some fail...
  EXPECT_GT(finished, 0);  // ...and the others run to the end
  EXPECT_TRUE((*loop)->healthy());
  EXPECT_TRUE((*loop)->WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(engine->kv_stats().num_used_pages, 0);
}

TEST(StepLoopTest, ARequestArrivingDuringTheFailingStepEndsAndTheLoopSleeps) {
  // The forward pass of step 3 fails like a device error. While it runs (the hook), a second
  // request is accepted: it must end too, and the failed loop must not spin.
  std::unique_ptr<StepLoop>* loop_ptr = nullptr;
  auto late = std::make_shared<RecordingSink>();
  std::atomic<bool> late_accepted{false};
  FaultInjection faults;
  faults.backend_fault_step = 3;
  faults.on_backend_fault = [&] {
    if (late_accepted.load()) return;
    late_accepted.store((*loop_ptr)->Submit(MakeRequest(4), late).ok());
  };
  std::unique_ptr<Engine> engine = MakeEngine(faults);
  auto loop = StepLoop::Create(engine.get(), Options(), nullptr);
  ASSERT_THAT(loop, IsOk());
  loop_ptr = &*loop;
  auto first = std::make_shared<RecordingSink>();
  ASSERT_THAT((*loop)->Submit(MakeRequest(50), first), IsOk());
  first->done.WaitForNotification();
  EXPECT_THAT(*first->result, StatusIs(absl::StatusCode::kInternal, "the engine failed"));
  ASSERT_TRUE(late_accepted.load());
  ASSERT_TRUE(late->done.WaitForNotificationWithTimeout(absl::Seconds(10)))
      << "a request accepted during the failing step never ended";
  EXPECT_THAT(*late->result, StatusIs(absl::StatusCode::kUnavailable, "engine failed"));
  EXPECT_FALSE((*loop)->healthy());
  EXPECT_TRUE((*loop)->WaitIdle(absl::Seconds(10)));
  EXPECT_EQ(engine->kv_stats().num_used_pages, 0);
  EXPECT_LT(IdleCpuFraction(absl::Seconds(1)), kIdleCpuLimit);
  EXPECT_THAT((*loop)->Submit(MakeRequest(4), std::make_shared<RecordingSink>()),
              StatusIs(absl::StatusCode::kUnavailable, "restart"));
}

TEST(StepLoopTest, IdleLoopDoesNotSpin) {
  std::unique_ptr<Engine> engine = MakeEngine();
  auto loop = StepLoop::Create(engine.get(), Options(), nullptr);
  ASSERT_THAT(loop, IsOk());
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_THAT((*loop)->Submit(MakeRequest(3), sink), IsOk());
  sink->done.WaitForNotification();
  EXPECT_LT(IdleCpuFraction(absl::Seconds(1)), kIdleCpuLimit);
}

TEST(StepLoopTest, EveryRequestAcceptedWhileStoppingEnds) {
  // Submitters race Stop(): whatever Submit accepted must reach OnDone, whichever side of the
  // engine thread's last inbox swap it landed on.
  for (int round = 0; round < 20; ++round) {
    std::unique_ptr<Engine> engine = MakeEngine();
    auto loop = StepLoop::Create(engine.get(), Options(/*max_queue=*/1000), nullptr);
    ASSERT_THAT(loop, IsOk());
    absl::Mutex mu;
    std::vector<std::shared_ptr<RecordingSink>> accepted;
    std::atomic<bool> refused{false};
    std::vector<std::thread> submitters;
    for (int t = 0; t < 2; ++t) {
      submitters.emplace_back([&] {
        while (!refused.load()) {
          auto sink = std::make_shared<RecordingSink>();
          if ((*loop)->Submit(MakeRequest(2), sink).ok()) {
            absl::MutexLock lock(&mu);
            accepted.push_back(sink);
          } else {
            refused.store(true);
          }
        }
      });
    }
    absl::SleepFor(absl::Milliseconds(round % 5));
    (*loop)->Stop();
    for (std::thread& t : submitters) t.join();
    absl::MutexLock lock(&mu);
    for (auto& sink : accepted) {
      ASSERT_TRUE(sink->done.WaitForNotificationWithTimeout(absl::Seconds(10)))
          << "round " << round << ": an accepted request never ended";
    }
    EXPECT_TRUE((*loop)->WaitIdle(absl::Seconds(10)));
  }
}

TEST(StepLoopTest, SubmitRefusesBeyondTheQueueAndWhileDraining) {
  std::unique_ptr<Engine> engine = MakeEngine();
  absl::Notification release;
  StepLoopOptions o = Options(/*max_queue=*/1);
  absl::Notification arrived;
  // Hold the engine thread so the first request stays unadmitted.
  o.before_iteration = [&] {
    if (!arrived.HasBeenNotified()) arrived.Notify();
    release.WaitForNotification();
  };
  auto loop = StepLoop::Create(engine.get(), o, nullptr);
  ASSERT_THAT(loop, IsOk());
  arrived.WaitForNotification();
  auto first = std::make_shared<RecordingSink>();
  ASSERT_THAT((*loop)->Submit(MakeRequest(4), first), IsOk());
  EXPECT_THAT((*loop)->Submit(MakeRequest(4), std::make_shared<RecordingSink>()),
              StatusIs(absl::StatusCode::kResourceExhausted, "max_queue 1"));
  (*loop)->StartDrain(absl::Seconds(30));
  EXPECT_THAT((*loop)->Submit(MakeRequest(4), std::make_shared<RecordingSink>()),
              StatusIs(absl::StatusCode::kUnavailable, "draining"));
  release.Notify();
  first->done.WaitForNotification();
  EXPECT_THAT(*first->result, IsOk());  // accepted before the drain: it runs to the end
  EXPECT_TRUE((*loop)->WaitIdle(absl::Seconds(30)));
}

TEST(StepLoopTest, RequestThatCanNeverFitTheCacheIsRefusedAtSubmit) {
  EngineOptions eo;
  eo.model_dir = kCheckpoint;
  eo.num_threads = 1;
  eo.kv_cache_bytes = 8 * 3072;  // 8 pages of 16 tokens per layer-page, 4 layers
  auto engine = Engine::Create(eo);
  ASSERT_THAT(engine, IsOk());
  auto loop = StepLoop::Create(engine->get(), Options(), nullptr);
  ASSERT_THAT(loop, IsOk());
  // 4 + 60 tokens = 4 pages per layer x 4 layers = 16 pages > 8.
  EXPECT_THAT((*loop)->Submit(MakeRequest(60), std::make_shared<RecordingSink>()),
              StatusIs(absl::StatusCode::kResourceExhausted, "the cache has 8"));
}

TEST(StepLoopTest, CreateRejectsOptionsTheEngineCannotRun) {
  std::unique_ptr<Engine> engine = MakeEngine();
  StepLoopOptions o = Options();
  o.scheduler.max_num_seqs = engine->options().max_seqs + 1;
  EXPECT_THAT(StepLoop::Create(engine.get(), o, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, "max_seqs"));
}

}  // namespace
}  // namespace modserve::engine
