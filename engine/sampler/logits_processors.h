// The logits transforms of one sampling step, as separate functions so that each can be tested
// against its formula: penalties, temperature, and the top-k / top-p / min-p truncations.
// They do not draw random numbers or choose tokens; sampler.cc composes them.
#ifndef MODSERVE_ENGINE_SAMPLER_LOGITS_PROCESSORS_H_
#define MODSERVE_ENGINE_SAMPLER_LOGITS_PROCESSORS_H_

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/types/span.h"

namespace modserve::engine {

using TokenId = int32_t;

// Hugging Face repetition penalty, applied once per distinct id in `token_ids` (prompt and
// output): logit / penalty where logit > 0, logit * penalty otherwise.
// logits: [vocab] f32. Precondition (CHECK): ids in [0, vocab), penalty > 0.
void ApplyRepetitionPenalty(absl::Span<float> logits, absl::Span<const TokenId> token_ids,
                            float penalty);

// OpenAI presence/frequency penalties over the output tokens:
//   logit -= frequency_penalty * count + presence_penalty * (count > 0).
// counts: (token id, number of times generated so far), ids distinct, in [0, vocab) (CHECK).
void ApplyPresenceFrequencyPenalties(absl::Span<float> logits,
                                     absl::Span<const std::pair<TokenId, int32_t>> counts,
                                     float presence_penalty, float frequency_penalty);

// logit / temperature. Precondition: temperature > 0.
void ApplyTemperature(absl::Span<float> logits, float temperature);

// One candidate token of the truncation stage.
struct Candidate {
  TokenId id;
  float logit;
};

// Canonical candidate order: higher logit first, lower id first among equal logits. Every
// truncation below keeps a prefix of this order, so ties at a cut-off go to the lower id.
inline bool CandidateBefore(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}
// The same order as a function object, for std::sort and friends: a function pointer passed
// there is called, not inlined, for every comparison (~3x the time of a 32k-candidate sort).
inline constexpr auto kCandidateOrder = [](const Candidate& a, const Candidate& b) {
  return CandidateBefore(a, b);
};

// Keeps the k best candidates (k > 0), sorted in canonical order; with k >= size it sorts all.
void KeepTopK(std::vector<Candidate>& candidates, int32_t k);

// `sorted` in canonical order. Returns the length of the shortest prefix whose probability mass
// is >= top_p (the token that crosses top_p is kept), at least 1. top_p in (0, 1]; 1 keeps all.
// The distribution is softmax over `sorted` plus candidates left out of it (all ranked after
// it) whose total weight sum(exp(logit - sorted[0].logit)) is `tail_weight`; this lets a caller
// sort only a prefix that is known to hold the nucleus.
size_t TopPCount(absl::Span<const Candidate> sorted, float top_p, double tail_weight = 0.0);

// Removes (order-preserving) candidates whose probability is below min_p times the largest
// probability, i.e. keeps logit >= max_logit + log(min_p). min_p in [0, 1]: 1 keeps only the most probable token(s); the best always stays.
void KeepMinP(std::vector<Candidate>& candidates, float min_p);

// log(sum(exp(logit))) over the candidates, in double. Precondition: not empty, max finite.
double LogSumExp(absl::Span<const Candidate> candidates);

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_SAMPLER_LOGITS_PROCESSORS_H_
