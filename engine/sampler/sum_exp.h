// The normaliser of a softmax over a whole vocabulary, sum_i exp(x_i - shift), at ~1.4 ns a term
// (SSE2; 0.18 ms per 128k-entry row on an AMD EPYC Zen 4, tests/bench/sum_exp_bench.cc): a
// logprob for every sampled token needs it on every step, and with std::exp(double) it cost
// ~0.66 ms per row (~5 ns a term).
#ifndef MODSERVE_ENGINE_SAMPLER_SUM_EXP_H_
#define MODSERVE_ENGINE_SAMPLER_SUM_EXP_H_

#include "absl/types/span.h"

namespace modserve {

// exp(v) for v <= 0 in f32 arithmetic (Cody-Waite reduction by ln 2, degree-6 polynomial):
// relative error under 3e-7 for v >= -87; 0 below -87 and for -inf (and for NaN).
float ExpNonPositive(float v);

// sum_i exp(x_i - shift) for x_i <= shift (shift = the row's maximum): each term by
// ExpNonPositive, summed in f64 over eight fixed lanes, so the result is the same on every CPU
// and for any vector width the compiler picks. Relative error under 3e-7.
double SumExpShifted(absl::Span<const float> x, float shift);

}  // namespace modserve

#endif  // MODSERVE_ENGINE_SAMPLER_SUM_EXP_H_
