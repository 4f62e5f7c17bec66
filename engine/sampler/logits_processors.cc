// Logits transforms; probabilities are summed in double so that a 128k-entry vocabulary does
// not lose the tail mass that top-p compares against.
#include "engine/sampler/logits_processors.h"

#include <algorithm>
#include <cmath>

#include "engine/common/logging.h"

namespace modserve::engine {

void ApplyRepetitionPenalty(absl::Span<float> logits, absl::Span<const TokenId> token_ids,
                            float penalty) {
  MODSERVE_CHECK(penalty > 0.0f) << "repetition_penalty=" << penalty;
  const auto vocab = static_cast<TokenId>(logits.size());
  for (TokenId id : token_ids) {
    MODSERVE_CHECK(id >= 0 && id < vocab) << "token " << id << " outside vocab " << vocab;
    float& logit = logits[id];
    logit = logit > 0.0f ? logit / penalty : logit * penalty;
  }
}

void ApplyPresenceFrequencyPenalties(absl::Span<float> logits,
                                     absl::Span<const std::pair<TokenId, int32_t>> counts,
                                     float presence_penalty, float frequency_penalty) {
  const auto vocab = static_cast<TokenId>(logits.size());
  for (const auto& [id, count] : counts) {
    MODSERVE_CHECK(id >= 0 && id < vocab) << "token " << id << " outside vocab " << vocab;
    if (count <= 0) continue;
    logits[id] -= frequency_penalty * static_cast<float>(count) + presence_penalty;
  }
}

void ApplyTemperature(absl::Span<float> logits, float temperature) {
  MODSERVE_CHECK(temperature > 0.0f) << "temperature=" << temperature;
  // Division, not multiplication by 1/T: bit-identical to the reference formula logit / T.
  for (float& logit : logits) logit /= temperature;
}

void KeepTopK(std::vector<Candidate>& candidates, int32_t k) {
  MODSERVE_CHECK(k > 0) << "top_k=" << k;
  const size_t keep = std::min(candidates.size(), static_cast<size_t>(k));
  // Selection then a sort of only the survivors: O(V + k log k) instead of O(V log V).
  if (keep < candidates.size()) {
    std::nth_element(candidates.begin(), candidates.begin() + static_cast<ptrdiff_t>(keep),
                     candidates.end(), kCandidateOrder);
    candidates.resize(keep);
  }
  std::sort(candidates.begin(), candidates.end(), kCandidateOrder);
}

size_t TopPCount(absl::Span<const Candidate> sorted, float top_p, double tail_weight) {
  if (sorted.empty()) return 0;
  if (top_p >= 1.0f) return sorted.size();
  const double max_logit = sorted[0].logit;
  double total = tail_weight;
  for (const Candidate& c : sorted) total += std::exp(static_cast<double>(c.logit) - max_logit);
  const double target = static_cast<double>(top_p) * total;
  double cumulative = 0.0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    cumulative += std::exp(static_cast<double>(sorted[i].logit) - max_logit);
    if (cumulative >= target) return i + 1;
  }
  // Only reachable through rounding when top_p is within an ulp of 1.
  return sorted.size();
}

void KeepMinP(std::vector<Candidate>& candidates, float min_p) {
  if (min_p <= 0.0f || candidates.empty()) return;
  float max_logit = candidates[0].logit;
  for (const Candidate& c : candidates) max_logit = std::max(max_logit, c.logit);
  // p_i >= min_p * p_max  <=>  logit_i - max_logit >= log(min_p); the normaliser cancels.
  const double threshold = std::log(static_cast<double>(min_p));
  std::erase_if(candidates, [&](const Candidate& c) {
    return static_cast<double>(c.logit) - max_logit < threshold;
  });
}

double LogSumExp(absl::Span<const Candidate> candidates) {
  MODSERVE_CHECK(!candidates.empty());
  double max_logit = candidates[0].logit;
  for (const Candidate& c : candidates) max_logit = std::max<double>(max_logit, c.logit);
  double total = 0.0;
  for (const Candidate& c : candidates) total += std::exp(c.logit - max_logit);
  return max_logit + std::log(total);
}

}  // namespace modserve::engine
