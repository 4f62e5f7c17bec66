// Chooses the next token of one request from its f32 logits: penalties, temperature, top-k,
// top-p, min-p, then a seeded draw, plus the logprobs a client may ask for. No batching, no
// device work and no stop detection (stop_checker.h) in here.
#ifndef MODSERVE_ENGINE_SAMPLER_SAMPLER_H_
#define MODSERVE_ENGINE_SAMPLER_SAMPLER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "engine/sampler/logits_processors.h"

namespace modserve::engine {

// Per-request sampling and stopping options (engine/types.h re-exports this struct).
struct SamplingParams {
  // 0 = greedy (argmax, ties to the lowest id). Values below kGreedyTemperature are greedy too:
  // dividing by them would overflow float logits (vLLM uses the same 1e-5 cut-off).
  float temperature = 1.0f;
  int32_t top_k = 0;                    // 0 = off
  float top_p = 1.0f;                   // 1 = off
  float min_p = 0.0f;                   // 0 = off
  float repetition_penalty = 1.0f;      // 1 = off; over prompt + output tokens (HF semantics)
  float presence_penalty = 0.0f;        // over output tokens (OpenAI semantics)
  float frequency_penalty = 0.0f;       // over output tokens (OpenAI semantics)
  std::optional<uint64_t> seed;         // unset: drawn from the engine's generator
  int32_t top_logprobs = 0;             // alternatives to report, 0..kMaxTopLogprobs
  std::vector<TokenId> stop_token_ids;  // in addition to EOS
  bool ignore_eos = false;
  int32_t max_new_tokens = 16;
  std::vector<std::string> stop_strings;  // non-empty; matched across token boundaries
};

inline constexpr float kGreedyTemperature = 1e-5f;
inline constexpr int32_t kMaxTopLogprobs = 20;
// Stop ids a request may list (beyond the model's EOS): they are hashed on the engine thread.
inline constexpr size_t kMaxStopTokenIds = 256;

// InvalidArgument naming the field and its allowed range, or OK. Token ids are checked against
// the vocabulary later (Sampler::Sample), since the vocabulary is not known here.
absl::Status Validate(const SamplingParams& params);

// Philox4x32-10 (Salmon et al., SC'11; Random123): a counter-based bijection, so a draw depends
// only on (key, counter) and never on what else was drawn before it.
std::array<uint32_t, 4> Philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// Uniform double in [0, 1) with 53 random bits: the draw for step `step` of a request seeded
// with `seed` (key = seed, counter = (step lo, step hi, 0, 0)).
double UniformDraw(uint64_t seed, uint64_t step);
// The same on an independent stream (counter = (step lo, step hi, stream, 0)); stream 0 is the
// draw above. Speculative decoding draws its drafts and acceptance tests on other streams.
double UniformDraw(uint64_t seed, uint64_t step, uint32_t stream);

// What one request carries between steps: its seed, the step counter of its random stream, and
// the token statistics the penalties need. Owned by the request; engine thread only.
class SamplingState {
 public:
  SamplingState(uint64_t seed, absl::Span<const TokenId> prompt);

  uint64_t seed() const { return seed_; }
  // Tokens sampled so far, which is also the Philox counter of the next draw.
  int64_t num_generated() const { return num_generated_; }
  // Distinct ids of prompt + output (repetition penalty), in first-seen order.
  absl::Span<const TokenId> seen_tokens() const { return seen_list_; }
  // (id, count) of output tokens (presence/frequency penalties), in first-generated order.
  absl::Span<const std::pair<TokenId, int32_t>> output_counts() const { return output_counts_; }

  // Records a generated token. Sampler::Sample calls it; call it directly only for tokens that
  // were not sampled here (e.g. forced tokens) but must count for penalties and the step counter.
  void Accept(TokenId token);

 private:
  void See(TokenId token);

  uint64_t seed_;
  int64_t num_generated_ = 0;
  std::vector<TokenId> seen_list_;
  absl::flat_hash_set<TokenId> seen_set_;  // the ids of seen_list_
  std::vector<std::pair<TokenId, int32_t>> output_counts_;
  absl::flat_hash_map<TokenId, size_t> output_index_;  // id -> index into output_counts_
};

struct TokenLogprob {
  TokenId id;
  float logprob;
};

struct SampleResult {
  TokenId token;
  // log p(token) under the final distribution sampled from (see Sampler).
  float logprob;
  // Up to top_logprobs entries of that distribution, logprob descending, ties to the lower id;
  // fewer when truncation left fewer tokens with nonzero probability.
  std::vector<TokenLogprob> top_logprobs;
};

// Order of processing, per request and step:
//   1. repetition penalty (prompt + output), then presence/frequency penalties (output)
//   2. temperature             (greedy: argmax of the penalised logits, lowest id on ties)
//   3. top-k  4. top-p (renormalised over the top-k survivors)  5. min-p  6. seeded draw
// Reported logprobs are those of the FINAL distribution: softmax over the survivors of step 5 of
// the temperature-scaled, penalised logits (vLLM's "processed" logprobs). For greedy requests
// it is log_softmax of the penalised logits over the whole vocabulary (no temperature, no
// truncation: they cannot change an argmax).
// The draw for a request's n-th token is UniformDraw(seed, n), walked along the survivors'
// cumulative mass (canonical order when truncating, id order otherwise): the output depends on
// the seed and the request's own step count only, never on the batch. Greedy logprobs and, when
// nothing truncates, the whole draw take their exps in f32 (ExpNonPositive, relative error under
// 3e-7) summed in f64, vectorised with the same bits on every CPU (sum_exp.h); the truncated
// paths take std::exp in f64 over their survivors (top-p weighs the entries below its sorted
// prefix with the f32 exps).
// Thread contract: RequestSeed and NewState on one thread (the engine's). Sample and
// Distribution may run concurrently with each other for distinct states (a batch's rows are
// sampled in parallel): each call borrows scratch buffers from a pool the sampler owns.
class Sampler {
 public:
  // engine_seed seeds the generator that hands out seeds to requests without one.
  explicit Sampler(uint64_t engine_seed);

  // The request's own seed, or the next one from the engine generator.
  uint64_t RequestSeed(const SamplingParams& params);
  SamplingState NewState(const SamplingParams& params, absl::Span<const TokenId> prompt);

  // logits: [vocab] f32, host memory. On success the token is recorded in *state.
  // InvalidArgument: a penalised token id outside [0, vocab) (from the request's prompt).
  // Internal: an empty row, a NaN or +inf logit, or no finite logit (a model/backend bug).
  // Precondition: Validate(params) is OK.
  absl::StatusOr<SampleResult> Sample(absl::Span<const float> logits, const SamplingParams& params,
                                      SamplingState* state);

  // The final distribution Sample draws from, without drawing or recording anything: the
  // survivors of steps 1-5 with their logprobs, in the order Sample walks them. Greedy: the
  // argmax alone, logprob 0. Same errors as Sample.
  absl::StatusOr<std::vector<TokenLogprob>> Distribution(absl::Span<const float> logits,
                                                         const SamplingParams& params,
                                                         const SamplingState& state);

 private:
  struct Scratch {
    std::vector<float> work;            // [vocab] f32 processed logits
    std::vector<Candidate> candidates;  // survivors of truncation
    // The processed logits (work, or the caller's row when greedy and unpenalised) and a
    // position of their maximum (for greedy, the first one). Greedy and whole_row sampling
    // (nothing truncated) draw from these, with no candidate list.
    absl::Span<const float> processed;
    size_t best = 0;
    bool whole_row = false;
  };
  // Scratch of one call: taken from spare_ (or new) and given back when the call ends.
  class ScratchLease;

  // Steps 1-5 into scratch.candidates (processed logits); sets *sorted when they are in
  // canonical order.
  static absl::Status Process(absl::Span<const float> logits, const SamplingParams& params,
                              const SamplingState& state, bool* sorted, Scratch& scratch);
  // Chooses from what Process left in scratch.
  static absl::StatusOr<SampleResult> SampleImpl(const SamplingParams& params,
                                                 const SamplingState& state, bool sorted,
                                                 Scratch& scratch);

  uint64_t seed_generator_;  // SplitMix64 state
  absl::Mutex mu_;
  // Scratch not in use; as many as calls ever ran at once (one per thread of a batch).
  std::vector<std::unique_ptr<Scratch>> spare_ ABSL_GUARDED_BY(mu_);
};

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_SAMPLER_SAMPLER_H_
