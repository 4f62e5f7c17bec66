// Scheduler tests as iteration tables (STYLE.md section 7): the real step runner (the code the
// server's engine thread and Engine::Generate run) drives a fake executor with exact page
// accounting; each row states, for a range of steps, the running ids, the tokens scheduled per
// sequence and the sequences evicted in that step. Expected rows follow from the rules in
// scheduler.h by hand, not from running the scheduler.
#include "engine/scheduler/scheduler.h"

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/executor/step_runner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/model/checkpoint_test_util.h"

namespace modserve::engine {
namespace {

using ::modserve::engine::testing::IsOk;
using ::modserve::engine::testing::StatusIs;
using ::testing::ElementsAre;

// Engine stand-in: every fed token is stored at every layer (so a MoD estimate that expects
// fewer routed tokens underestimates, which is what forces preemption), a token is sampled when
// a sequence's last pending token is fed, and a step that would exceed the pages fails whole.
class FakeExecutor final : public StepExecutor {
 public:
  FakeExecutor(int32_t n_layers, int32_t num_routed, int32_t block_size, int32_t num_pages)
      : n_layers_(n_layers),
        num_routed_(num_routed),
        block_size_(block_size),
        num_pages_(num_pages) {}

  void Add(SequenceId id, int32_t prompt, int32_t max_new) { seqs_[id] = {prompt, 0, max_new, 0}; }
  absl::Status Preempt(SequenceId id) override {
    seqs_.at(id).computed = 0;
    ++num_preempted;
    return absl::OkStatus();
  }
  void Release(SequenceId id) { seqs_.erase(id); }
  // Sequence `id` fails on its own when its next token is sampled.
  void FailSampling(SequenceId id) { failing_ = id; }

  absl::StatusOr<StepResult> Step(absl::Span<const StepEntry> entries) override {
    std::map<SequenceId, int32_t> computed;
    for (const auto& [id, s] : seqs_) computed[id] = s.computed;
    for (const StepEntry& e : entries) computed[e.seq_id] += e.num_tokens;
    int32_t pages = 0;
    for (const auto& [id, c] : computed) pages += (c + block_size_ - 1) / block_size_ * n_layers_;
    if (pages > num_pages_) return absl::ResourceExhaustedError("out of pages");
    StepResult r;
    for (const StepEntry& e : entries) {
      Seq& s = seqs_.at(e.seq_id);
      EXPECT_LE(s.computed + e.num_tokens, s.tokens) << "sequence " << e.seq_id;
      s.computed += e.num_tokens;
      r.num_tokens += e.num_tokens;
      SequenceStepResult sr{e.seq_id, e.num_tokens, std::nullopt, absl::OkStatus(),
                            std::vector<int32_t>(num_routed_, e.num_tokens)};
      if (s.computed == s.tokens && e.seq_id == failing_) {
        sr.status = absl::InternalError("sampling failed");
      } else if (s.computed == s.tokens) {
        ++s.generated;
        ++s.tokens;
        TokenEvent ev;
        if (s.generated == s.max_new) ev.finish_reason = FinishReason::kLength;
        sr.event = ev;
      }
      r.sequences.push_back(sr);
    }
    r.routed_rows.assign(num_routed_, r.num_tokens);
    return r;
  }

 private:
  struct Seq {
    int32_t tokens, computed, max_new, generated;
  };
  int32_t n_layers_, num_routed_, block_size_, num_pages_;
  std::map<SequenceId, Seq> seqs_;
  SequenceId failing_ = 0;

 public:
  int32_t num_preempted = 0;  // Preempt calls (evictions of sequences holding pages)
};

struct Row {
  int first_step, last_step;
  std::vector<SequenceId> running;
  std::vector<std::pair<SequenceId, int32_t>> scheduled;
  std::vector<SequenceId> preempted;
};

struct Observed {
  std::vector<SequenceId> running;
  std::vector<std::pair<SequenceId, int32_t>> scheduled;
  std::vector<SequenceId> preempted;  // evicted (with or without pages)
  std::vector<SequenceId> failed;
};

// Runs the step runner against the fake until nothing is left (or max_steps), removing what
// ends as the engine thread does.
std::vector<Observed> Drive(Scheduler& sched, FakeExecutor& fake, int max_steps = 100) {
  StepRunner runner(&fake, &sched);
  std::vector<Observed> steps;
  while (static_cast<int>(steps.size()) < max_steps) {
    IterationResult it = runner.RunOnce();
    if (it.plan.empty()) break;
    EXPECT_TRUE(it.engine_error.ok()) << it.engine_error;
    EXPECT_TRUE(it.step.has_value()) << "step " << steps.size() << " did not run";
    Observed o;
    o.running = sched.RunningIds();
    for (const StepEntry& e : it.plan.entries) o.scheduled.emplace_back(e.seq_id, e.num_tokens);
    for (const Scheduler::Eviction& e : it.evicted) o.preempted.push_back(e.seq_id);
    for (const auto& [id, status] : it.failed) {
      o.failed.push_back(id);
      fake.Release(id);
      EXPECT_TRUE(sched.Remove(id));
    }
    for (SequenceId id : it.finished) {
      fake.Release(id);
      EXPECT_TRUE(sched.Remove(id));
    }
    steps.push_back(std::move(o));
  }
  return steps;
}

void ExpectTable(const std::vector<Observed>& steps, const std::vector<Row>& table) {
  int expected_steps = 0;
  for (const Row& row : table) {
    for (int t = row.first_step; t <= row.last_step; ++t) {
      ASSERT_LT(t, static_cast<int>(steps.size())) << "the run ended before step " << t;
      SCOPED_TRACE(absl::StrCat("step ", t));
      EXPECT_EQ(steps[t].running, row.running);
      EXPECT_EQ(steps[t].scheduled, row.scheduled);
      EXPECT_EQ(steps[t].preempted, row.preempted);
    }
    expected_steps = row.last_step + 1;
  }
  EXPECT_EQ(static_cast<int>(steps.size()), expected_steps);
}

SchedulerOptions Options(int32_t max_num_seqs, int32_t max_batch_tokens, int32_t num_pages,
                         int32_t max_queue = 8) {
  SchedulerOptions o;
  o.max_num_seqs = max_num_seqs;
  o.max_batch_tokens = max_batch_tokens;
  o.num_pages = num_pages;
  o.max_queue = max_queue;
  return o;
}

TEST(SchedulerTest, DecodesFirstThenPrefillChunksInTheBudget) {
  // 4 dense layers, block 4, plenty of pages; budget 8 tokens.
  FakeExecutor fake(4, 0, 4, 1000);
  Scheduler sched(Options(4, 8, 1000), KvPageEstimator(4, {}, 1.0, 4));
  fake.Add(1, 3, 4);
  fake.Add(2, 20, 2);
  ASSERT_THAT(sched.Enqueue({1, 3, 4, 0}), IsOk());
  ASSERT_THAT(sched.Enqueue({2, 20, 2, 0}), IsOk());
  ExpectTable(
      Drive(sched, fake),
      {
          {0, 0, {1, 2}, {{1, 3}, {2, 5}}, {}},
          {1, 2, {1, 2}, {{1, 1}, {2, 7}}, {}},  // the long prompt never holds back the decode
          {3, 3, {1, 2}, {{1, 1}, {2, 1}}, {}},
          {4, 4, {2}, {{2, 1}}, {}},
      });
}

TEST(SchedulerTest, MaxNumSeqsBoundsTheRunningSet) {
  FakeExecutor fake(2, 0, 4, 1000);
  Scheduler sched(Options(2, 64, 1000), KvPageEstimator(2, {}, 1.0, 4));
  for (SequenceId id = 1; id <= 3; ++id) {
    fake.Add(id, 2, 2);
    ASSERT_THAT(sched.Enqueue({id, 2, 2, 0}), IsOk());
  }
  ExpectTable(Drive(sched, fake), {
                                      {0, 0, {1, 2}, {{1, 2}, {2, 2}}, {}},
                                      {1, 1, {1, 2}, {{1, 1}, {2, 1}}, {}},
                                      {2, 2, {3}, {{3, 2}}, {}},
                                      {3, 3, {3}, {{3, 1}}, {}},
                                  });
}

TEST(SchedulerTest, TheSameCacheAdmitsMoreModSequencesThanDense) {
  // 4 layers, block 4, 24 pages; sequences of 8 + 8 tokens.
  // Dense: 4 layers * ceil(16 / 4) = 16 pages each, so one at a time.
  // MoD (layers 1 and 3 routed, prior 0.25 + margin 0.05): 2 * 4 + 2 * ceil(ceil(0.3 * 16) / 4)
  // = 12 pages each, so two at once.
  Scheduler dense(Options(4, 64, 24), KvPageEstimator(4, {}, 1.0, 4));
  Scheduler mod(Options(4, 64, 24), KvPageEstimator(4, {1, 3}, 0.25, 4));
  EXPECT_EQ(dense.estimator().ExpectedPages(16), 16);
  EXPECT_EQ(mod.estimator().ExpectedPages(16), 12);
  for (SequenceId id = 1; id <= 3; ++id) {
    ASSERT_THAT(dense.Enqueue({id, 8, 8, 0}), IsOk());
    ASSERT_THAT(mod.Enqueue({id, 8, 8, 0}), IsOk());
  }
  EXPECT_THAT(dense.Plan().admitted, ElementsAre(1));
  EXPECT_THAT(mod.Plan().admitted, ElementsAre(1, 2));
}

TEST(SchedulerTest, EstimatorFollowsTheMeasuredFraction) {
  KvPageEstimator est(2, {1}, 0.25, 4);
  EXPECT_DOUBLE_EQ(est.RoutedFraction(0), 0.25);
  // 256 measured rows, all routed in: (0.25 * 256 + 256) / 512.
  est.Observe(0.5, {256}, 256);
  EXPECT_DOUBLE_EQ(est.RoutedFraction(0), 0.625);
  EXPECT_EQ(est.WorstCasePages(9), 6);
}

TEST(SchedulerTest, PreemptsTheLastAdmittedWhenPagesRunOut) {
  // 2 layers (layer 1 routed, prior 0.25), block 4, 6 pages. The estimate gives each
  // 4 + 4-token sequence 2 + 1 = 3 pages (fraction 0.25 + margin 0.08 of 8 tokens = 3 entries),
  // so both are admitted, but the fake stores every token at every layer: at 5 tokens each they
  // need 8 pages, and the later one is preempted (its prompt and sampled token are recomputed
  // once the first finishes). Re-admitted after each commit, it fails again before computing
  // anything: then it holds no pages and is only deferred, which is not a preemption.
  FakeExecutor fake(2, 1, 4, 6);
  Scheduler sched(Options(4, 64, 6), KvPageEstimator(2, {1}, 0.25, 4));
  fake.Add(1, 4, 4);
  fake.Add(2, 4, 4);
  ASSERT_THAT(sched.Enqueue({1, 4, 4, 0}), IsOk());
  ASSERT_THAT(sched.Enqueue({2, 4, 4, 0}), IsOk());
  ExpectTable(Drive(sched, fake),
              {
                  {0, 0, {1, 2}, {{1, 4}, {2, 4}}, {}},
                  {1, 1, {1}, {{1, 1}}, {2}},
                  {2, 3, {1}, {{1, 1}}, {2}},  // re-admitted after each commit, deferred again
                  {4, 4, {2}, {{2, 5}}, {}},   // recompute: prompt + the token sampled before
                  {5, 6, {2}, {{2, 1}}, {}},
              });
  EXPECT_EQ(sched.num_preemptions(), 1);
  EXPECT_EQ(fake.num_preempted, 1);
}

TEST(SchedulerTest, EvictingASequenceWithoutPagesIsNotAPreemption) {
  // Dense, 1 layer, block 4. The scheduler believes in 6 pages, the fake has 2: sequence 1
  // (4 + 4 tokens) holds a page after its prefill; sequence 2 (8 + 4) is admitted next to it
  // (2 + 3 expected pages fit 6), but 1's decode and 2's prefill need 2 + 2 pages of the 2.
  // Sequence 2 has computed nothing: it goes back without a recompute.
  FakeExecutor fake(1, 0, 4, 2);
  Scheduler sched(Options(4, 64, 6), KvPageEstimator(1, {}, 1.0, 4));
  fake.Add(1, 4, 4);
  ASSERT_THAT(sched.Enqueue({1, 4, 4, 0}), IsOk());
  StepRunner runner(&fake, &sched);
  ASSERT_TRUE(runner.RunOnce().step.has_value());  // prefill of 1: one page
  fake.Add(2, 8, 4);
  ASSERT_THAT(sched.Enqueue({2, 8, 4, 0}), IsOk());
  IterationResult second = runner.RunOnce();
  ASSERT_TRUE(second.step.has_value());
  ASSERT_EQ(second.evicted.size(), 1u);
  EXPECT_EQ(second.evicted[0].seq_id, 2);
  EXPECT_FALSE(second.evicted[0].held_pages);
  EXPECT_EQ(second.num_preemptions(), 0);
  EXPECT_EQ(sched.num_preemptions(), 0);
  EXPECT_EQ(fake.num_preempted, 0);
  EXPECT_THAT(sched.RunningIds(), ElementsAre(1));
  EXPECT_TRUE(second.admitted.empty());  // 2 ran nothing, so it was never admitted
}

TEST(SchedulerTest, AdmissionsHeldByAnEvictionResumeWhenNothingRuns) {
  // As above with a fake of 1 page: after 2 is deferred (holding admissions), 1 still does not
  // fit alone and ends with ResourceExhausted, so no step commits. With nothing running, the
  // hold must not keep 2 waiting forever.
  FakeExecutor fake(1, 0, 4, 1);
  Scheduler sched(Options(4, 64, 6), KvPageEstimator(1, {}, 1.0, 4));
  fake.Add(1, 4, 4);
  ASSERT_THAT(sched.Enqueue({1, 4, 4, 0}), IsOk());
  StepRunner runner(&fake, &sched);
  ASSERT_TRUE(runner.RunOnce().step.has_value());
  fake.Add(2, 8, 4);
  ASSERT_THAT(sched.Enqueue({2, 8, 4, 0}), IsOk());
  IterationResult it = runner.RunOnce();
  EXPECT_FALSE(it.step.has_value());
  ASSERT_EQ(it.failed.size(), 1u);
  EXPECT_EQ(it.failed[0].first, 1);
  EXPECT_THAT(it.failed[0].second, StatusIs(absl::StatusCode::kResourceExhausted, ""));
  fake.Release(1);
  ASSERT_TRUE(sched.Remove(1));
  EXPECT_THAT(sched.Plan().admitted, ElementsAre(2));
}

TEST(SchedulerTest, ASequenceThatFailsAloneEndsAndTheOthersRunOn) {
  FakeExecutor fake(1, 0, 4, 100);
  Scheduler sched(Options(4, 64, 100), KvPageEstimator(1, {}, 1.0, 4));
  for (SequenceId id = 1; id <= 3; ++id) {
    fake.Add(id, 3, 3);
    ASSERT_THAT(sched.Enqueue({id, 3, 3, 0}), IsOk());
  }
  fake.FailSampling(2);
  std::vector<Observed> steps = Drive(sched, fake);
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_THAT(steps[0].failed, ElementsAre(2));
  EXPECT_THAT(steps[1].running, ElementsAre(1, 3));
  EXPECT_THAT(steps[2].scheduled, ElementsAre(std::pair<SequenceId, int32_t>{1, 1},
                                              std::pair<SequenceId, int32_t>{3, 1}));
}

TEST(SchedulerTest, EstimatorTracksEachThresholdAndBoundsUnmeasuredOnes) {
  // One routed layer of two, prior capacity 0.125, default tau 0.5.
  KvPageEstimator est(2, {1}, 0.125, 16, 0.5);
  EXPECT_DOUBLE_EQ(est.RoutedFraction(0, 0.5), 0.125);
  EXPECT_DOUBLE_EQ(est.RoutedFraction(0, 0.9), 0.125);  // above the default: the capacity
  EXPECT_DOUBLE_EQ(est.RoutedFraction(0, 0.2), 1.0);    // below it, unmeasured: dense
  // A burst at tau 0.01 routes every token in; the default's estimate does not move.
  est.Observe(0.01, {768}, 768);
  EXPECT_DOUBLE_EQ(est.RoutedFraction(0, 0.01), 1.0);
  EXPECT_DOUBLE_EQ(est.RoutedFraction(0, 0.5), 0.125);
  // An unmeasured tau borrows the nearest measured one below it (an upper bound).
  EXPECT_DOUBLE_EQ(est.RoutedFraction(0, 0.2), 1.0);
  est.Observe(0.5, {32}, 256);  // measured 12.5% at the default
  est.Observe(0.2, {128}, 256);  // and 50% at 0.2
  EXPECT_DOUBLE_EQ(est.RoutedFraction(0, 0.2), (1.0 * 256 + 128) / 512.0);
  EXPECT_DOUBLE_EQ(est.RoutedFraction(0, 0.3), (1.0 * 256 + 128) / 512.0);
  EXPECT_DOUBLE_EQ(est.RoutedFraction(0, 0.5), (0.125 * 256 + 32) / 512.0);
  // Pages follow: 512 tokens at tau 0.01 are dense (32 + 32), at 0.5 far fewer.
  EXPECT_EQ(est.ExpectedPages(512, 0.01), 64);
  EXPECT_LT(est.ExpectedPages(512, 0.5), 64);
}

TEST(SchedulerTest, EstimatorBoundsTheThresholdsItTracks) {
  KvPageEstimator est(2, {1}, 0.125, 16, 0.5);
  est.Observe(0.5, {10}, 100);
  for (int i = 0; i < 1000; ++i) est.Observe(0.6 + i * 1e-4, {1}, 1);
  // The default's measurement survives the churn of client-chosen thresholds.
  EXPECT_DOUBLE_EQ(est.RoutedFraction(0, 0.5), (0.125 * 256 + 10) / 356.0);
}

TEST(SchedulerTest, FullQueueIsResourceExhaustedNamingTheLimit) {
  Scheduler sched(Options(1, 8, 100, /*max_queue=*/2), KvPageEstimator(1, {}, 1.0, 4));
  ASSERT_THAT(sched.Enqueue({1, 4, 4, 0}), IsOk());
  ASSERT_THAT(sched.Enqueue({2, 4, 4, 0}), IsOk());
  EXPECT_THAT(sched.Enqueue({3, 4, 4, 0}),
              StatusIs(absl::StatusCode::kResourceExhausted, "max_queue 2"));
}

TEST(SchedulerTest, RequestLargerThanTheCacheIsRefused) {
  Scheduler sched(Options(1, 8, 10), KvPageEstimator(2, {}, 1.0, 4));
  // 2 layers * ceil(24 / 4) = 12 pages > 10.
  EXPECT_THAT(sched.Enqueue({1, 16, 8, 0}),
              StatusIs(absl::StatusCode::kResourceExhausted, "the cache has 10"));
  EXPECT_THAT(sched.Enqueue({1, 0, 8, 0}), StatusIs(absl::StatusCode::kInvalidArgument, ""));
}

TEST(SchedulerTest, RemoveDropsWaitingAndRunningSequences) {
  FakeExecutor fake(1, 0, 4, 100);
  Scheduler sched(Options(1, 8, 100), KvPageEstimator(1, {}, 1.0, 4));
  fake.Add(1, 2, 8);
  fake.Add(2, 2, 8);
  ASSERT_THAT(sched.Enqueue({1, 2, 8, 0}), IsOk());
  ASSERT_THAT(sched.Enqueue({2, 2, 8, 0}), IsOk());
  StepPlan plan = sched.Plan();
  ASSERT_THAT(plan.admitted, ElementsAre(1));
  EXPECT_TRUE(sched.Remove(2));
  EXPECT_EQ(sched.num_waiting(), 0);
  EXPECT_TRUE(sched.Remove(1));
  EXPECT_EQ(sched.num_running(), 0);
  EXPECT_FALSE(sched.Remove(1));
  EXPECT_TRUE(sched.Plan().empty());
}

TEST(SchedulerTest, PhaseNamesTheStepKind) {
  FakeExecutor fake(1, 0, 4, 100);
  Scheduler sched(Options(2, 8, 100), KvPageEstimator(1, {}, 1.0, 4));
  fake.Add(1, 2, 3);
  ASSERT_THAT(sched.Enqueue({1, 2, 3, 0}), IsOk());
  StepPlan p0 = sched.Plan();
  EXPECT_EQ(p0.Phase(), "prefill");
  sched.Commit(*fake.Step(p0.entries));
  fake.Add(2, 4, 3);
  ASSERT_THAT(sched.Enqueue({2, 4, 3, 0}), IsOk());
  StepPlan p1 = sched.Plan();
  EXPECT_EQ(p1.Phase(), "mixed");
  sched.Commit(*fake.Step(p1.entries));
  EXPECT_EQ(sched.Plan().Phase(), "decode");
}

TEST(SchedulerTest, DraftsKeepTheStepWithinTheSpeculativeRowBound) {
  // Four decoding sequences drafting up to 4 tokens each: within a 16-row bound the drafts get
  // the 12 rows after the decodes; a prompt chunk that leaves no room below the bound takes the
  // step's rows and nothing is drafted; without a bound every sequence drafts 4.
  for (int32_t bound : {16, 0}) {
    SCOPED_TRACE(absl::StrCat("bound ", bound));
    FakeExecutor fake(1, 0, 4, 1000);
    SchedulerOptions o = Options(8, 64, 1000);
    o.max_speculative_step_rows = bound;
    Scheduler sched(o, KvPageEstimator(1, {}, 1.0, 4));
    for (SequenceId id = 1; id <= 4; ++id) {
      fake.Add(id, 2, 20);
      ASSERT_THAT(sched.Enqueue({id, 2, 20, 0, std::nullopt, 4}), IsOk());
    }
    StepPlan prefill = sched.Plan();
    for (const StepEntry& e : prefill.entries) EXPECT_EQ(e.num_draft, 0);
    sched.Commit(*fake.Step(prefill.entries));
    StepPlan decode = sched.Plan();
    ASSERT_EQ(decode.entries.size(), 4u);
    std::vector<int32_t> drafts;
    for (const StepEntry& e : decode.entries) drafts.push_back(e.num_draft);
    EXPECT_EQ(drafts, bound == 16 ? std::vector<int32_t>({4, 4, 4, 0})
                                  : std::vector<int32_t>({4, 4, 4, 4}));
    EXPECT_EQ(decode.num_tokens, bound == 16 ? 16 : 20);
    sched.Commit(*fake.Step(decode.entries));
    fake.Add(5, 30, 2);
    ASSERT_THAT(sched.Enqueue({5, 30, 2, 0, std::nullopt, 4}), IsOk());
    StepPlan mixed = sched.Plan();
    ASSERT_EQ(mixed.entries.size(), 5u);
    int32_t drafted = 0;
    for (const StepEntry& e : mixed.entries) drafted += e.num_draft;
    EXPECT_EQ(drafted, bound == 16 ? 0 : 16);
    EXPECT_EQ(mixed.num_tokens, 34 + drafted);
  }
}

}  // namespace
}  // namespace modserve::engine
