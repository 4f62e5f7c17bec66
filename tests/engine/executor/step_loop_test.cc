// StepLoop on the engine thread with a tiny real checkpoint: every way a request ends (finish,
// cancel, deadline, drain timeout, refusal) reaches the sink once and leaves no KV pages held.
#include "engine/executor/step_loop.h"

#include <memory>
#include <optional>
#include <utility>
#include <vector>

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

std::unique_ptr<Engine> MakeEngine() {
  EngineOptions eo;
  eo.model_dir = kCheckpoint;
  eo.num_threads = 1;
  auto e = Engine::Create(eo);
  MODSERVE_CHECK(e.ok()) << e.status();
  return *std::move(e);
}

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

TEST(StepLoopTest, CancelledRequestEndsWithCancelledAndFreesItsPages) {
  std::unique_ptr<Engine> engine = MakeEngine();
  auto loop = StepLoop::Create(engine.get(), Options(), nullptr);
  ASSERT_THAT(loop, IsOk());
  auto sink = std::make_shared<RecordingSink>();
  auto handle = (*loop)->Submit(MakeRequest(400), sink);
  ASSERT_THAT(handle, IsOk());
  (*handle)->Cancel();
  sink->done.WaitForNotification();
  EXPECT_THAT(*sink->result, StatusIs(absl::StatusCode::kCancelled, "cancelled"));
  EXPECT_LT(sink->tokens.size(), 400u);
  EXPECT_EQ((*loop)->kv_used_pages(), 0);
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
