// The acceptance rule of speculative sampling (Leviathan et al., 2023; Chen et al., 2023): a
// token drafted from q is kept with probability min(1, p/q), else replaced by a draw from
// norm(max(0, p - q)), so every output token is distributed exactly as p. No model or engine here.
#ifndef MODSERVE_ENGINE_SAMPLER_SPECULATIVE_SAMPLING_H_
#define MODSERVE_ENGINE_SAMPLER_SPECULATIVE_SAMPLING_H_

#include <cstdint>

#include "absl/types/span.h"
#include "engine/sampler/sampler.h"

namespace modserve::engine {

// Philox streams of a request's draws (UniformDraw(seed, token index, stream)): stream 0 is
// ordinary sampling; speculation draws each draft, its acceptance test and its replacement on
// streams of their own, so the three are independent of each other and of stream 0.
inline constexpr uint32_t kDraftStream = 1;
inline constexpr uint32_t kAcceptStream = 2;
inline constexpr uint32_t kResampleStream = 3;

// Inverse CDF of `dist` (ids with logprobs, walked in the given order) at u in [0, 1).
// Precondition: dist is not empty.
TokenId DrawToken(absl::Span<const TokenLogprob> dist, double u);

struct SpeculativeChoice {
  TokenId token;
  bool accepted;  // token is the draft
};

// p: the target's final distribution, q: the draft's (Sampler::Distribution; distinct ids, any
// order), `draft` drawn from q. Accepts when u_accept < p(draft) / q(draft); otherwise draws from
// max(0, p - q) renormalised, walked in p's order, at u_resample (from p itself when rounding
// leaves no mass there, which happens only when p and q agree).
SpeculativeChoice AcceptOrResample(absl::Span<const TokenLogprob> p,
                                   absl::Span<const TokenLogprob> q, TokenId draft,
                                   double u_accept, double u_resample);

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_SAMPLER_SPECULATIVE_SAMPLING_H_
