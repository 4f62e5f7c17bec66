// What the tests of the BF16 Gemms that split x into bf16 terms (the AMX tile Gemm, the vdpbf16ps
// Gemm) share: a call's shape and ranges, and the check of its outputs against a double sum.
#ifndef MODSERVE_TESTS_ENGINE_BACKEND_BF16_TERMS_CHECK_H_
#define MODSERVE_TESTS_ENGINE_BACKEND_BF16_TERMS_CHECK_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/common/dtype.h"
#include "engine/common/tensor_view.h"

namespace modserve::backend::cpu::testing {

// x [n, k] by w [m, k]; the call computes x rows [x_begin, x_end) and weight rows
// [row_begin, row_end), with a bias or without; x and w drawn at these scales.
struct TermsCase {
  int64_t n, k, m;
  int64_t x_begin, x_end, row_begin, row_end;
  bool bias;
  float x_scale = 1.0f, w_scale = 1.0f;
};

inline std::string Describe(const TermsCase& c) {
  return "n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) + " m=" + std::to_string(c.m) +
         " x [" + std::to_string(c.x_begin) + ", " + std::to_string(c.x_end) + ") w rows [" +
         std::to_string(c.row_begin) + ", " + std::to_string(c.row_end) + ")" +
         (c.bias ? " bias" : "") + " x scale " + std::to_string(c.x_scale) + " w scale " +
         std::to_string(c.w_scale);
}

// Against a double sum of the same bf16 w and f32 x. Bound: the split's first `terms` terms are
// exact to 2^-(8 terms) of each |x| (2^-24 for all three), and C takes about terms * k + 1 f32
// additions (one per term and k, the bias; vdpbf16ps rounds after each of a lane's two products at
// most), each rounding within 2^-24 of a partial sum no larger than the sum of |terms|. A packing
// or indexing error is off by the size of a whole term, far outside it (at one term, by the size
// of a whole product).
inline double TermsBound(double magnitude, int terms, int64_t k) {
  return magnitude * (std::ldexp(1.0, -8 * terms) + std::ldexp(terms * k + 2.0, -24)) + 1e-30;
}

// out [n, m] of the call `c` at `terms` terms: inside its ranges within TermsBound of the double
// sum of x and w (w as f32 values) plus the bias, outside them still `sentinel`.
inline void ExpectWithinTermsBound(const TermsCase& c, int terms, const std::vector<float>& x,
                                   const std::vector<float>& w, const std::vector<float>& bias,
                                   const std::vector<float>& out, float sentinel) {
  int bad = 0;
  for (int64_t i = 0; i < c.n; ++i) {
    for (int64_t j = 0; j < c.m; ++j) {
      const float got = out[i * c.m + j];
      const bool inside = i >= c.x_begin && i < c.x_end && j >= c.row_begin && j < c.row_end;
      if (!inside) {
        if (got != sentinel && ++bad <= 5) ADD_FAILURE() << "wrote out[" << i << ", " << j << "]";
        continue;
      }
      double want = c.bias ? bias[j] : 0.0, magnitude = c.bias ? std::fabs(bias[j]) : 0.0;
      for (int64_t kk = 0; kk < c.k; ++kk) {
        const double p = static_cast<double>(x[i * c.k + kk]) * w[j * c.k + kk];
        want += p;
        magnitude += std::fabs(p);
      }
      const double bound = TermsBound(magnitude, terms, c.k);
      if (!(std::fabs(got - want) <= bound) && ++bad <= 5) {
        ADD_FAILURE() << "out[" << i << ", " << j << "] = " << got << ", want " << want
                      << " (bound " << bound << ")";
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

// A BF16 Gemm of n random x rows (k = kRandomGemmK) by kRandomGemmM random bf16 weight rows, no
// bias, through `backend`; the same x and w for every n (their first rows) and every call. x and
// w (as f32 values) are returned where asked for.
inline constexpr int64_t kRandomGemmK = 96, kRandomGemmM = 70;
inline std::vector<float> RandomBf16Gemm(Backend& backend, int64_t n,
                                         std::vector<float>* x_out = nullptr,
                                         std::vector<float>* w_out = nullptr) {
  constexpr int64_t k = kRandomGemmK, m = kRandomGemmM;
  std::mt19937 rng(21);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n * k), out(n * m, 0.0f);
  std::vector<bf16_t> w(m * k);
  for (float& v : x) v = dist(rng);
  for (bf16_t& v : w) v = F32ToBf16(dist(rng));
  backend.Gemm(TensorView(x.data(), DType::kF32, {n, k}),
               TensorView(w.data(), DType::kBF16, {m, k}), TensorView(),
               TensorView(out.data(), DType::kF32, {n, m}));
  if (x_out != nullptr) *x_out = x;
  if (w_out != nullptr) {
    w_out->resize(w.size());
    for (size_t i = 0; i < w.size(); ++i) (*w_out)[i] = Bf16ToF32(w[i]);
  }
  return out;
}

}  // namespace modserve::backend::cpu::testing

#endif  // MODSERVE_TESTS_ENGINE_BACKEND_BF16_TERMS_CHECK_H_
