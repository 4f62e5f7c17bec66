#include "engine/sampler/sum_exp.h"

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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

namespace {

// ---- The row passes, in plain C++: the baseline build, and (inlined into the target functions
// below) what GCC vectorises for AVX2 and AVX-512. -ffp-contract=off (CMakeLists.txt) keeps the
// multiplies and adds apart where the target has FMA.

// Terms of elements below t are 0 (t = -inf: every term; NaN's term is 0 either way).
inline float ExpAtLeast(float v, float shift, float t) { return v >= t ? Exp(v - shift) : 0.0f; }

inline double SumExpShiftedBody(absl::Span<const float> x, float shift, float t) {
  constexpr size_t kLanes = 8;
  double lane[kLanes] = {};
  const float* p = x.data();
  const size_t n = x.size();
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    float e[kLanes];
    for (size_t j = 0; j < kLanes; ++j) e[j] = ExpAtLeast(p[i + j], shift, t);
    for (size_t j = 0; j < kLanes; ++j) lane[j] += static_cast<double>(e[j]);
  }
  double total = 0.0;
  for (; i < n; ++i) total += static_cast<double>(ExpAtLeast(p[i], shift, t));
  for (size_t j = 0; j < kLanes; ++j) total += lane[j];
  return total;
}

// The walk in ascending order; `exps` computes a block's terms (the vector bodies) or is skipped.
template <int64_t kBlock, typename BlockExps>
inline size_t FirstIndexPastMassBody(absl::Span<const float> x, float shift, double mass,
                                     BlockExps&& exps) {
  const float* p = x.data();
  const size_t n = x.size();
  double cumulative = 0.0;
  size_t i = 0;
  if constexpr (kBlock > 1) {
    alignas(64) float e[kBlock];
    for (; i + kBlock <= n; i += kBlock) {
      exps(p + i, e);
      for (int64_t j = 0; j < kBlock; ++j) {
        cumulative += static_cast<double>(e[j]);
        if (mass < cumulative) return i + static_cast<size_t>(j);
      }
    }
  }
  for (; i < n; ++i) {
    cumulative += static_cast<double>(Exp(p[i] - shift));
    if (mass < cumulative) return i;
  }
  return n;
}

inline int64_t CountAtLeastBody(absl::Span<const float> x, float t) {
  constexpr size_t kLanes = 16;
  int32_t lane[kLanes] = {};
  const float* p = x.data();
  size_t i = 0;
  for (; i + kLanes <= x.size(); i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lane[j] += p[i + j] >= t ? 1 : 0;
  }
  int64_t count = 0;
  for (; i < x.size(); ++i) count += p[i] >= t ? 1 : 0;
  for (int32_t c : lane) count += c;
  return count;
}

inline bool ArgMaxBody(absl::Span<const float> x, size_t* first_max) {
  // Lane j walks i = j, j + 16, ... and keeps its first strictly greater element; the lowest
  // index among the lanes that hold the overall maximum is then the row's first.
  constexpr int32_t kLanes = 16;
  float lane_max[kLanes];
  int32_t lane_at[kLanes], bad[kLanes];
  for (int32_t j = 0; j < kLanes; ++j) {
    lane_max[j] = -INFINITY;
    lane_at[j] = j;
    bad[j] = 0;
  }
  const float* p = x.data();
  const auto n = static_cast<int32_t>(x.size());
  int32_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int32_t j = 0; j < kLanes; ++j) {
      const float v = p[i + j];
      bad[j] |= !(v < INFINITY);  // NaN or +inf
      const bool greater = v > lane_max[j];
      lane_at[j] = greater ? i + j : lane_at[j];
      lane_max[j] = greater ? v : lane_max[j];
    }
  }
  // Lanes that saw no element (n < 16) keep -inf at an index past every real one.
  for (int32_t j = 0; j < kLanes; ++j) {
    if (lane_at[j] >= i) lane_at[j] = n;
  }
  float m = -INFINITY;
  int32_t at = n, any_bad = 0;
  for (int32_t j = 0; j < kLanes; ++j) {
    any_bad |= bad[j];
    m = lane_max[j] > m ? lane_max[j] : m;
  }
  const int32_t tail = i;
  for (; i < n; ++i) {
    any_bad |= !(p[i] < INFINITY);
    m = p[i] > m ? p[i] : m;
  }
  for (int32_t j = 0; j < kLanes; ++j) {
    if (lane_max[j] == m && lane_at[j] < at) at = lane_at[j];
  }
  if (at == n) {  // the maximum lies in the tail only
    for (int32_t t = tail; t < n; ++t) {
      if (p[t] == m) {
        at = t;
        break;
      }
    }
  }
  *first_max = static_cast<size_t>(at);
  return any_bad == 0;
}

#if defined(__x86_64__)
// ---- SumExpShifted in intrinsics: GCC turns the body's selects into branches for AVX-512 (3x
// slower than SSE2). The same operations as Exp, lane by lane: compare, select, multiply,
// subtract, truncate, add; the eight f64 lanes take their terms in the body's order (16 floats
// are two rounds of eight).

#define MODSERVE_AVX2 __attribute__((target("avx2")))
#define MODSERVE_AVX512 __attribute__((target("avx512f")))

struct ExpConstants {
  static constexpr float kMin = -87.0f, kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f,
                         kLn2Lo = -2.12194440e-4f, kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f,
                         kP2 = 8.3334519073e-3f, kP3 = 4.1665795894e-2f, kP4 = 1.6666665459e-1f,
                         kP5 = 5.0000001201e-1f;
};

MODSERVE_AVX512 inline __m512 Exp16(__m512 v) {
  using C = ExpConstants;
  const __mmask16 live =
      _mm512_cmp_ps_mask(v, _mm512_set1_ps(C::kMin), _CMP_GE_OQ);  // false for NaN
  const __m512 c = _mm512_maskz_mov_ps(live, v);
  const __m512i n = _mm512_cvttps_epi32(
      _mm512_sub_ps(_mm512_mul_ps(c, _mm512_set1_ps(C::kLog2e)), _mm512_set1_ps(0.5f)));
  const __m512 nf = _mm512_cvtepi32_ps(n);
  const __m512 r = _mm512_sub_ps(_mm512_sub_ps(c, _mm512_mul_ps(nf, _mm512_set1_ps(C::kLn2Hi))),
                                 _mm512_mul_ps(nf, _mm512_set1_ps(C::kLn2Lo)));
  __m512 p = _mm512_set1_ps(C::kP0);
  for (float coeff : {C::kP1, C::kP2, C::kP3, C::kP4, C::kP5}) {
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(coeff));
  }
  const __m512 e =
      _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(p, _mm512_mul_ps(r, r)), r), _mm512_set1_ps(1.0f));
  const __m512 scale =
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n, _mm512_set1_epi32(127)), 23));
  return _mm512_maskz_mul_ps(live, e, scale);
}

// Exp16 of v - s where v >= t, 0 elsewhere.
MODSERVE_AVX512 inline __m512 Exp16AtLeast(__m512 v, __m512 s, __m512 t) {
  return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, t, _CMP_GE_OQ), Exp16(_mm512_sub_ps(v, s)));
}

MODSERVE_AVX512 double SumExpShiftedAvx512(absl::Span<const float> x, float shift, float t) {
  const float* p = x.data();
  const size_t n = x.size();
  const __m512 s = _mm512_set1_ps(shift), vt = _mm512_set1_ps(t);
  __m512d lane = _mm512_setzero_pd();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = Exp16AtLeast(_mm512_loadu_ps(p + i), s, vt);
    lane = _mm512_add_pd(lane, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    lane = _mm512_add_pd(
        lane, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
  }
  if (i + 8 <= n) {  // one more round of eight, from the low half of a masked vector
    const __m512 e = Exp16AtLeast(_mm512_maskz_loadu_ps(0xff, p + i), s, vt);
    lane = _mm512_add_pd(lane, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    i += 8;
  }
  double total = 0.0;
  for (; i < n; ++i) total += static_cast<double>(ExpAtLeast(p[i], shift, t));
  alignas(64) double l[8];
  _mm512_store_pd(l, lane);
  for (double v : l) total += v;
  return total;
}

MODSERVE_AVX2 inline __m256 Exp8(__m256 v) {
  using C = ExpConstants;
  const __m256 live = _mm256_cmp_ps(v, _mm256_set1_ps(C::kMin), _CMP_GE_OQ);
  const __m256 c = _mm256_and_ps(live, v);
  const __m256i n = _mm256_cvttps_epi32(
      _mm256_sub_ps(_mm256_mul_ps(c, _mm256_set1_ps(C::kLog2e)), _mm256_set1_ps(0.5f)));
  const __m256 nf = _mm256_cvtepi32_ps(n);
  const __m256 r = _mm256_sub_ps(_mm256_sub_ps(c, _mm256_mul_ps(nf, _mm256_set1_ps(C::kLn2Hi))),
                                 _mm256_mul_ps(nf, _mm256_set1_ps(C::kLn2Lo)));
  __m256 p = _mm256_set1_ps(C::kP0);
  for (float coeff : {C::kP1, C::kP2, C::kP3, C::kP4, C::kP5}) {
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(coeff));
  }
  const __m256 e =
      _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r), _mm256_set1_ps(1.0f));
  const __m256 scale =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
  return _mm256_and_ps(live, _mm256_mul_ps(e, scale));
}

MODSERVE_AVX2 double SumExpShiftedAvx2(absl::Span<const float> x, float shift, float t) {
  const float* p = x.data();
  const size_t n = x.size();
  const __m256 s = _mm256_set1_ps(shift), vt = _mm256_set1_ps(t);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();  // lanes 0-3 and 4-7
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(p + i);
    const __m256 e = _mm256_and_ps(_mm256_cmp_ps(v, vt, _CMP_GE_OQ), Exp8(_mm256_sub_ps(v, s)));
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  double total = 0.0;
  for (; i < n; ++i) total += static_cast<double>(ExpAtLeast(p[i], shift, t));
  alignas(32) double l[8];
  _mm256_store_pd(l, lo);
  _mm256_store_pd(l + 4, hi);
  for (double v : l) total += v;
  return total;
}

struct ExpBlock16 {
  float shift;
  MODSERVE_AVX512 void operator()(const float* p, float* e) const {
    _mm512_store_ps(e, Exp16(_mm512_sub_ps(_mm512_loadu_ps(p), _mm512_set1_ps(shift))));
  }
};

struct ExpBlock8 {
  float shift;
  MODSERVE_AVX2 void operator()(const float* p, float* e) const {
    _mm256_store_ps(e, Exp8(_mm256_sub_ps(_mm256_loadu_ps(p), _mm256_set1_ps(shift))));
  }
};

MODSERVE_AVX512 size_t FirstIndexPastMassAvx512(absl::Span<const float> x, float shift,
                                                double mass) {
  return FirstIndexPastMassBody<16>(x, shift, mass, ExpBlock16{shift});
}

MODSERVE_AVX2 size_t FirstIndexPastMassAvx2(absl::Span<const float> x, float shift, double mass) {
  return FirstIndexPastMassBody<8>(x, shift, mass, ExpBlock8{shift});
}

MODSERVE_AVX512 int64_t CountAtLeastAvx512(absl::Span<const float> x, float t) {
  return CountAtLeastBody(x, t);
}
MODSERVE_AVX2 int64_t CountAtLeastAvx2(absl::Span<const float> x, float t) {
  return CountAtLeastBody(x, t);
}

MODSERVE_AVX512 bool ArgMaxAvx512(absl::Span<const float> x, size_t* first_max) {
  return ArgMaxBody(x, first_max);
}
MODSERVE_AVX2 bool ArgMaxAvx2(absl::Span<const float> x, size_t* first_max) {
  return ArgMaxBody(x, first_max);
}

RowPassIsa Detect() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return RowPassIsa::kAvx512;
  if (__builtin_cpu_supports("avx2")) return RowPassIsa::kAvx2;
  return RowPassIsa::kBaseline;
}
#else
RowPassIsa Detect() { return RowPassIsa::kBaseline; }
#endif

const RowPassIsa kBest = Detect();

}  // namespace

RowPassIsa BestRowPassIsa() { return kBest; }

double SumExpShiftedAtLeast(absl::Span<const float> x, float shift, float t, RowPassIsa isa) {
#if defined(__x86_64__)
  switch (isa) {
    case RowPassIsa::kAvx512:
      return SumExpShiftedAvx512(x, shift, t);
    case RowPassIsa::kAvx2:
      return SumExpShiftedAvx2(x, shift, t);
    case RowPassIsa::kBaseline:
      break;
  }
#endif
  (void)isa;
  return SumExpShiftedBody(x, shift, t);
}

double SumExpShifted(absl::Span<const float> x, float shift, RowPassIsa isa) {
  return SumExpShiftedAtLeast(x, shift, -INFINITY, isa);
}

bool ArgMaxBelowInfinity(absl::Span<const float> x, size_t* first_max, RowPassIsa isa) {
#if defined(__x86_64__)
  switch (isa) {
    case RowPassIsa::kAvx512:
      return ArgMaxAvx512(x, first_max);
    case RowPassIsa::kAvx2:
      return ArgMaxAvx2(x, first_max);
    case RowPassIsa::kBaseline:
      break;
  }
#endif
  (void)isa;
  return ArgMaxBody(x, first_max);
}

size_t FirstIndexPastMass(absl::Span<const float> x, float shift, double mass, RowPassIsa isa) {
#if defined(__x86_64__)
  switch (isa) {
    case RowPassIsa::kAvx512:
      return FirstIndexPastMassAvx512(x, shift, mass);
    case RowPassIsa::kAvx2:
      return FirstIndexPastMassAvx2(x, shift, mass);
    case RowPassIsa::kBaseline:
      break;
  }
#endif
  (void)isa;
  return FirstIndexPastMassBody<1>(x, shift, mass, [](const float*, float*) {});
}

int64_t CountAtLeast(absl::Span<const float> x, float t, RowPassIsa isa) {
#if defined(__x86_64__)
  switch (isa) {
    case RowPassIsa::kAvx512:
      return CountAtLeastAvx512(x, t);
    case RowPassIsa::kAvx2:
      return CountAtLeastAvx2(x, t);
    case RowPassIsa::kBaseline:
      break;
  }
#endif
  (void)isa;
  return CountAtLeastBody(x, t);
}

double SumExpShifted(absl::Span<const float> x, float shift) {
  return SumExpShifted(x, shift, kBest);
}

double SumExpShiftedAtLeast(absl::Span<const float> x, float shift, float t) {
  return SumExpShiftedAtLeast(x, shift, t, kBest);
}

int64_t CountAtLeast(absl::Span<const float> x, float t) { return CountAtLeast(x, t, kBest); }

size_t FirstIndexPastMass(absl::Span<const float> x, float shift, double mass) {
  return FirstIndexPastMass(x, shift, mass, kBest);
}

bool ArgMaxBelowInfinity(absl::Span<const float> x, size_t* first_max) {
  return ArgMaxBelowInfinity(x, first_max, kBest);
}

}  // namespace modserve
