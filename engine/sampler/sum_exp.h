// Whole-row passes of the sampler over a vocabulary of logits: the normaliser of a softmax,
// sum_i exp(x_i - shift), the first position of its maximum for a greedy pick, and the
// position where the running sum of the exps passes a mass, for a draw.
// A logprob for every sampled token needs the normaliser on every step; with std::exp(double) it
// cost ~0.66 ms per 128k-entry row (~5 ns a term) on an AMD EPYC Zen 4, in SSE2 0.18 ms
// (tests/bench/sum_exp_bench.cc). Each function has an AVX-512, an AVX2 and a baseline body,
// the best the CPU runs picked when the process starts; none uses FMA, and every sum runs in a
// fixed order, so all three give the same bits (tests/engine/sampler/sum_exp_test.cc).
#ifndef MODSERVE_ENGINE_SAMPLER_SUM_EXP_H_
#define MODSERVE_ENGINE_SAMPLER_SUM_EXP_H_

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"

namespace modserve {

// exp(v) for v <= 0 in f32 arithmetic (Cody-Waite reduction by ln 2, degree-6 polynomial):
// relative error under 3e-7 for v >= -87; 0 below -87 and for -inf (and for NaN).
float ExpNonPositive(float v);

// sum_i exp(x_i - shift) for x_i <= shift (shift = the row's maximum): each term by
// ExpNonPositive, summed in f64 over eight fixed lanes, so the result is the same on every CPU
// and for any vector width the compiler picks. Relative error under 3e-7.
double SumExpShifted(absl::Span<const float> x, float shift);

// The same sum over the elements x_i >= t only (t = -inf: SumExpShifted, the same bits).
double SumExpShiftedAtLeast(absl::Span<const float> x, float shift, float t);

// The lowest i at which x holds its maximum (-0 and +0 count as equal; 0 when every element is
// -inf) in *first_max, as a walk over ascending i keeping the first strictly greater element
// would find it; false when some element is NaN or +inf (*first_max is then unspecified).
// Precondition: x is not empty and has fewer than 2^31 elements.
bool ArgMaxBelowInfinity(absl::Span<const float> x, size_t* first_max);

// The lowest i at which sum_{t <= i} ExpNonPositive(x_t - shift), summed in f64 in ascending t,
// exceeds mass; x.size() when the whole row's sum does not. With shift = the maximum and
// mass = u * SumExpShifted(x, shift), u in [0, 1), this is the inverse CDF of softmax(x) at u.
size_t FirstIndexPastMass(absl::Span<const float> x, float shift, double mass);

// How many elements of x are >= t (NaN never is; -inf is only for t = -inf).
int64_t CountAtLeast(absl::Span<const float> x, float t);

// The bodies by name, for tests and benchmarks; an ISA the CPU lacks must not be asked for.
enum class RowPassIsa { kBaseline, kAvx2, kAvx512 };
RowPassIsa BestRowPassIsa();
double SumExpShifted(absl::Span<const float> x, float shift, RowPassIsa isa);
double SumExpShiftedAtLeast(absl::Span<const float> x, float shift, float t, RowPassIsa isa);
bool ArgMaxBelowInfinity(absl::Span<const float> x, size_t* first_max, RowPassIsa isa);
size_t FirstIndexPastMass(absl::Span<const float> x, float shift, double mass, RowPassIsa isa);
int64_t CountAtLeast(absl::Span<const float> x, float t, RowPassIsa isa);

}  // namespace modserve

#endif  // MODSERVE_ENGINE_SAMPLER_SUM_EXP_H_
