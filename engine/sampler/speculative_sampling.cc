// Speculative sampling in double precision: probabilities are exp(logprob) of the final
// distributions, so the accept ratio and the residual see what the sampler would have drawn from.
#include "engine/sampler/speculative_sampling.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "engine/common/logging.h"

namespace modserve::engine {

TokenId DrawToken(absl::Span<const TokenLogprob> dist, double u) {
  MODSERVE_CHECK(!dist.empty());
  double cumulative = 0.0;
  for (const TokenLogprob& t : dist) {
    cumulative += std::exp(static_cast<double>(t.logprob));
    if (u < cumulative) return t.id;
  }
  return dist.back().id;  // rounding can leave u just above the total
}

SpeculativeChoice AcceptOrResample(absl::Span<const TokenLogprob> p,
                                   absl::Span<const TokenLogprob> q, TokenId draft,
                                   double u_accept, double u_resample) {
  MODSERVE_CHECK(!p.empty());
  absl::flat_hash_map<TokenId, double> q_prob;
  q_prob.reserve(q.size());
  for (const TokenLogprob& t : q) q_prob[t.id] = std::exp(static_cast<double>(t.logprob));
  double p_draft = 0.0;
  for (const TokenLogprob& t : p) {
    if (t.id == draft) p_draft = std::exp(static_cast<double>(t.logprob));
  }
  const auto qd = q_prob.find(draft);
  const double q_draft = qd == q_prob.end() ? 0.0 : qd->second;
  // q_draft > 0 for a token drawn from q; the guard keeps a caller bug from dividing by zero.
  if (q_draft > 0.0 && u_accept < p_draft / q_draft) return {draft, true};
  double total = 0.0;
  for (const TokenLogprob& t : p) {
    const auto it = q_prob.find(t.id);
    total += std::max(0.0, std::exp(static_cast<double>(t.logprob)) -
                               (it == q_prob.end() ? 0.0 : it->second));
  }
  if (!(total > 0.0)) return {DrawToken(p, u_resample), false};
  const double target = u_resample * total;
  double cumulative = 0.0;
  TokenId last = p.front().id;
  for (const TokenLogprob& t : p) {
    const auto it = q_prob.find(t.id);
    const double r = std::max(0.0, std::exp(static_cast<double>(t.logprob)) -
                                       (it == q_prob.end() ? 0.0 : it->second));
    if (r <= 0.0) continue;
    last = t.id;
    cumulative += r;
    if (target < cumulative) return {t.id, false};
  }
  return {last, false};
}

}  // namespace modserve::engine
