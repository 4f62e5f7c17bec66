// sum_exp_bench: the softmax normaliser of one logits row, sum_i exp(x_i - max), by
// std::exp(double) (what the sampler used) and by SumExpShifted, for the vocabularies of the
// models served here, and one Sampler::Sample of the row: greedy (checks, argmax, logprob), at
// temperature 1 with nothing truncated (the whole distribution, one seeded draw), and at
// temperature 1 with top_p 0.9 or top_k 50. The row's logits are normal with sd 3, a flat
// distribution whose 0.9 nucleus holds thousands of ids (a costly case for top-p).
// Prints one markdown table: the best of 20 calls each, and the relative difference between the
// two sums.
//   build/bin/sum_exp_bench
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "engine/sampler/sampler.h"
#include "engine/sampler/sum_exp.h"
#include "tests/bench/cpu_model.h"

namespace {

template <typename F>
double BestMs(F&& f) {
  double best = 1e30;
  for (int r = 0; r < 20; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(
        best,
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main() {
  std::printf("sum_exp_bench: %s, one thread\n\n", modserve::bench::CpuModel().c_str());
  std::printf(
      "| vocab | std::exp(double) ms | SumExpShifted ms | speed-up | relative difference | Sample "
      "ms: greedy | temperature 1 | top_p 0.9 | top_k 50 |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  modserve::engine::Sampler sampler(1);
  modserve::engine::SamplingParams greedy;
  greedy.temperature = 0.0f;
  const modserve::engine::SamplingParams t1;  // temperature 1, no truncation, no penalties
  modserve::engine::SamplingParams top_p = t1, top_k = t1;
  top_p.top_p = 0.9f;
  top_k.top_k = 50;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (size_t vocab : {32000u, 49152u, 128256u}) {
    std::vector<float> row(vocab);
    for (float& x : row) x = dist(rng);
    const float mx = *std::max_element(row.begin(), row.end());
    volatile double sink = 0;
    double ref = 0, fast = 0;
    const double t_ref = BestMs([&] {
      double total = 0;
      for (float x : row) total += std::exp(static_cast<double>(x) - mx);
      ref = total;
      sink = total;
    });
    const double t_fast = BestMs([&] {
      fast = modserve::SumExpShifted(row, mx);
      sink = fast;
    });
    double t_sample[4];
    const modserve::engine::SamplingParams* kinds[4] = {&greedy, &t1, &top_p, &top_k};
    for (int i = 0; i < 4; ++i) {
      const modserve::engine::SamplingParams& params = *kinds[i];
      modserve::engine::SamplingState state = sampler.NewState(params, {});
      t_sample[i] = BestMs([&] {
        auto r = sampler.Sample(row, params, &state);
        sink = r.ok() ? r->logprob : -1.0;
      });
    }
    std::printf("| %zu | %.3f | %.3f | %.1fx | %.1e | %.3f | %.3f | %.3f | %.3f |\n", vocab, t_ref,
                t_fast, t_ref / t_fast, std::fabs(fast - ref) / ref, t_sample[0], t_sample[1],
                t_sample[2], t_sample[3]);
  }
  return 0;
}
