#include "engine/sampler/sum_exp.h"

#include <bit>
#include <cstddef>
#include <cstdint>

namespace modserve {

namespace {

// Branch-free, in plain multiplies and adds (no FMA: the baseline build has none, and
// std::fma would be a library call), so the loop below vectorises and every CPU gets the same
// bits.
inline float Exp(float v) {
  constexpr float kMin = -87.0f;  // exp(-87) = 1.6e-38, near the smallest normal f32
  constexpr float kLog2e = 1.44269504088896341f;
  // ln 2 in two parts; kLn2Hi has few enough bits that n * kLn2Hi is exact for |n| < 2^9.
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  const bool zero = !(v >= kMin);  // also -inf and NaN
  const float c = zero ? 0.0f : v;
  // n = round(c / ln 2): c <= 0, so truncating c log2(e) - 0.5 toward zero rounds it.
  const int32_t n = static_cast<int32_t>(c * kLog2e - 0.5f);
  const float nf = static_cast<float>(n);
  const float r = (c - nf * kLn2Hi) - nf * kLn2Lo;  // |r| <= ~0.35
  // exp(r) = 1 + r + r^2 p(r) (the minimax coefficients of Cephes' expf).
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = (p * (r * r) + r) + 1.0f;
  // 2^n with n in [-126, 0]: an exponent field of n + 127.
  const float scale = std::bit_cast<float>(static_cast<uint32_t>(n + 127) << 23);
  return zero ? 0.0f : e * scale;
}

}  // namespace

float ExpNonPositive(float v) { return Exp(v); }

double SumExpShifted(absl::Span<const float> x, float shift) {
  constexpr size_t kLanes = 8;
  double lane[kLanes] = {};
  const float* p = x.data();
  const size_t n = x.size();
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    float e[kLanes];
    for (size_t j = 0; j < kLanes; ++j) e[j] = Exp(p[i + j] - shift);
    for (size_t j = 0; j < kLanes; ++j) lane[j] += static_cast<double>(e[j]);
  }
  double total = 0.0;
  for (; i < n; ++i) total += static_cast<double>(Exp(p[i] - shift));
  for (size_t j = 0; j < kLanes; ++j) total += lane[j];
  return total;
}

}  // namespace modserve
