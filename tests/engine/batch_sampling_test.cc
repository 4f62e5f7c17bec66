// The rows of a step are sampled in parallel (Backend::HostParallelFor): the Sampler called from
// several threads at once for distinct requests gives each request the tokens, logprobs and
// alternatives it gets when the rows are sampled one by one, and an engine on three threads gives
// every seeded request of a batch the tokens it gets alone.
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler/sampler.h"
#include "gtest/gtest.h"

namespace modserve::engine {
namespace {

constexpr int kVocab = 3001;

// The logits request r sees at its step-th token: fixed by (r, step), whatever else runs.
std::vector<float> LogitsFor(int r, int64_t step) {
  std::mt19937 rng(static_cast<uint32_t>(r * 7919 + step * 104729 + 1));
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(kVocab);
  for (float& l : logits) l = normal(rng);
  return logits;
}

// Every sampling mode the sampler has, one per request, seeded so that draws are reproducible.
std::vector<SamplingParams> MixedParams(int count) {
  std::vector<SamplingParams> all;
  for (int r = 0; r < count; ++r) {
    SamplingParams p;
    p.seed = 500 + r;
    p.temperature = r % 5 == 0 ? 0.0f : 0.6f + 0.1f * (r % 4);
    if (r % 3 == 1) p.top_k = 40;
    if (r % 4 == 2) p.top_p = 0.9f;
    if (r % 6 == 3) p.min_p = 0.05f;
    if (r % 7 == 4) p.repetition_penalty = 1.3f;
    if (r % 5 == 1) p.presence_penalty = 0.5f;
    if (r % 8 == 5) p.frequency_penalty = 0.4f;
    p.top_logprobs = r % 3;
    all.push_back(p);
  }
  return all;
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

void ExpectSameResult(const SampleResult& got, const SampleResult& want, const std::string& what) {
  EXPECT_EQ(got.token, want.token) << what;
  EXPECT_TRUE(SameBits(got.logprob, want.logprob))
      << what << ": " << got.logprob << " against " << want.logprob;
  ASSERT_EQ(got.top_logprobs.size(), want.top_logprobs.size()) << what;
  for (size_t i = 0; i < got.top_logprobs.size(); ++i) {
    EXPECT_EQ(got.top_logprobs[i].id, want.top_logprobs[i].id) << what;
    EXPECT_TRUE(SameBits(got.top_logprobs[i].logprob, want.top_logprobs[i].logprob)) << what;
  }
}

TEST(BatchSamplingTest, ConcurrentSamplingEqualsSamplingOneByOne) {
  constexpr int kRequests = 24, kSteps = 12, kThreads = 4;
  const std::vector<SamplingParams> params = MixedParams(kRequests);
  const std::vector<TokenId> prompt = {5, 17, 17, 300, 2999};

  // One by one, on this thread.
  Sampler serial(1);
  std::vector<SamplingState> serial_states;
  for (const SamplingParams& p : params) serial_states.push_back(serial.NewState(p, prompt));
  std::vector<std::vector<SampleResult>> want(kRequests);
  for (int step = 0; step < kSteps; ++step) {
    for (int r = 0; r < kRequests; ++r) {
      absl::StatusOr<SampleResult> s =
          serial.Sample(LogitsFor(r, step), params[r], &serial_states[r]);
      ASSERT_TRUE(s.ok()) << s.status();
      want[r].push_back(*std::move(s));
    }
  }

  // Each step's rows spread over kThreads threads at once, a different split every step, with
  // Distribution calls for other requests in between.
  Sampler batched(2);
  std::vector<SamplingState> states;
  for (const SamplingParams& p : params) states.push_back(batched.NewState(p, prompt));
  std::vector<std::vector<SampleResult>> got(kRequests, std::vector<SampleResult>(kSteps));
  std::vector<std::vector<float>> logits(kRequests);
  for (int step = 0; step < kSteps; ++step) {
    for (int r = 0; r < kRequests; ++r) logits[r] = LogitsFor(r, step);
    std::vector<absl::Status> errors(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int r = (t + step) % kThreads; r < kRequests; r += kThreads) {
          const SamplingState before = states[r];
          absl::StatusOr<std::vector<TokenLogprob>> dist =
              batched.Distribution(logits[r], params[r], before);
          absl::StatusOr<SampleResult> s = batched.Sample(logits[r], params[r], &states[r]);
          if (!dist.ok() || !s.ok()) {
            errors[t] = dist.ok() ? s.status() : dist.status();
            return;
          }
          got[r][step] = *std::move(s);
        }
      });
    }
    for (std::thread& th : threads) th.join();
    for (const absl::Status& e : errors) ASSERT_TRUE(e.ok()) << e;
  }
  for (int r = 0; r < kRequests; ++r) {
    for (int step = 0; step < kSteps; ++step) {
      ExpectSameResult(got[r][step], want[r][step],
                       "request " + std::to_string(r) + " step " + std::to_string(step));
    }
    EXPECT_EQ(states[r].num_generated(), kSteps);
  }
}

TEST(BatchSamplingTest, SeededRequestsOfABatchSampleAsAlone) {
  EngineOptions opts;
  opts.model_dir = std::string(MODSERVE_SOURCE_DIR) + "/models/demo";
  opts.num_threads = 3;  // the pool samples the batch's rows on three threads on any machine
  opts.kv_cache_bytes = 16 << 20;
  auto engine = Engine::Create(opts);
  ASSERT_TRUE(engine.ok()) << engine.status();
  // 16 requests decode together (the backend's row-invariant range, so each row's logits are
  // the bits of a one-row step); only the prefill steps differ from running alone.
  std::vector<Request> batch;
  const std::vector<SamplingParams> params = MixedParams(16);
  for (int i = 0; i < 16; ++i) {
    Request r;
    for (int t = 0; t < 4 + i; ++t) r.prompt.push_back(3 + (t * 31 + i * 7) % 1900);
    r.sampling = params[i];
    r.sampling.max_new_tokens = 20;
    r.sampling.ignore_eos = true;
    batch.push_back(r);
  }
  auto together = (*engine)->Generate(batch);
  ASSERT_TRUE(together.ok()) << together.status();
  for (int i = 0; i < 16; ++i) {
    auto alone = (*engine)->Generate({batch[i]});
    ASSERT_TRUE(alone.ok()) << alone.status();
    EXPECT_EQ((*together)[i].token_ids, (*alone)[0].token_ids) << "request " << i;
    ASSERT_EQ((*together)[i].logprobs.size(), (*alone)[0].logprobs.size());
    for (size_t t = 0; t < (*alone)[0].logprobs.size(); ++t) {
      // The first token comes from a prefill step, whose sums may differ in the last bits.
      EXPECT_NEAR((*together)[i].logprobs[t], (*alone)[0].logprobs[t], 1e-4)
          << "request " << i << " token " << t;
    }
  }
  EXPECT_EQ((*engine)->kv_stats().num_used_pages, 0);
}

}  // namespace
}  // namespace modserve::engine
