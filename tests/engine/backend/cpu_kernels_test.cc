// The CPU kernel table on every ISA this CPU runs: the online-softmax tile against
// double-precision exp (its vectorised exp is within 2 ulp; m, l and the rescale follow the
// contract in kernels.h; several heads in a call get the bits of one-head calls), SwiGLU and SiLU
// against double precision, and both float-weight Gemm kernels, called directly whatever the
// backend's crossover, against a double-precision product.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/cpu/kernels.h"
#include "engine/backend/cpu/scalar_convert.h"
#include "gtest/gtest.h"

namespace modserve::backend::cpu {
namespace {

// |got - want| in units in the last place of the float nearest `want`.
double Ulps(float got, double want) {
  return std::fabs(got - want) / std::ldexp(1.0, std::ilogb(want) - 23);
}

class CpuKernelsTest : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!CpuHasIsa(GetParam())) GTEST_SKIP() << "this CPU cannot run " << IsaName(GetParam());
  }
  const KernelTable& kernels() const { return KernelsFor(GetParam()); }
};

TEST_P(CpuKernelsTest, SoftmaxTileExpIsWithinTwoUlpOverTheWholeRange) {
  std::mt19937 rng(7);
  for (float low : {-87.0f, -4.0f}) {
    std::uniform_real_distribution<float> dist(low, 0.0f);
    double worst = 0.0;
    for (int rep = 0; rep < 2000; ++rep) {
      std::vector<float> x(64), s(64);
      x[0] = 0.0f;  // the tile's max, so s[t] becomes exp(x[t])
      for (size_t t = 1; t < x.size(); ++t) x[t] = dist(rng);
      s = x;
      float m = -std::numeric_limits<float>::infinity(), l = 0.0f, rescale = -1.0f;
      kernels().attn_softmax(s.data(), 64, 1, 64, &m, &l, &rescale);
      ASSERT_EQ(rescale, 0.0f) << "first tile";
      ASSERT_EQ(m, 0.0f);
      double sum = 0.0;
      for (size_t t = 0; t < x.size(); ++t) {
        worst = std::max(worst, Ulps(s[t], std::exp(double{x[t]})));
        sum += s[t];
      }
      ASSERT_NEAR(l, sum, 1e-6 * sum);
    }
    EXPECT_LE(worst, 2.0) << "inputs in [" << low << ", 0]";
  }
}

TEST_P(CpuKernelsTest, SoftmaxTileRescalesTheRunningStateAndHandlesTails) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-6.0f, 3.0f);
  for (int64_t n : {1, 7, 37, 64}) {
    std::vector<float> x(n);
    for (float& v : x) v = dist(rng);
    x[n / 2] = 3.0f;  // the tile max, above the running max below
    std::vector<float> s = x;
    float m = 1.5f, l = 2.0f, rescale = -1.0f;
    kernels().attn_softmax(s.data(), n, 1, n, &m, &l, &rescale);
    EXPECT_EQ(m, 3.0f) << "n=" << n;
    EXPECT_NEAR(rescale, std::exp(1.5 - 3.0), 1e-7) << "n=" << n;
    double sum = 0.0;
    for (int64_t t = 0; t < n; ++t) {
      // s - m' is an f32 subtraction; its rounding is not the exp's error.
      const double want = std::exp(double{x[t] - 3.0f});
      EXPECT_LE(Ulps(s[t], want), 2.0) << "n=" << n << " t=" << t;
      sum += want;
    }
    EXPECT_NEAR(l, 2.0 * std::exp(-1.5) + sum, 1e-6 * (2.0 + sum)) << "n=" << n;
    // A tile below the running max leaves m alone and scales nothing down.
    std::vector<float> low(n, -1.0f);
    float keep = -1.0f;
    kernels().attn_softmax(low.data(), n, 1, n, &m, &l, &keep);
    EXPECT_EQ(m, 3.0f);
    EXPECT_EQ(keep, 1.0f);
  }
}

// Several heads in one call (in blocks of up to 4, with 1-3 left over) get the bits each head gets
// in a call of its own: scores, m, l and the rescale, over a first tile and a later one, for
// tiles that are and are not a whole number of vectors.
TEST_P(CpuKernelsTest, SoftmaxTileOfSeveralHeadsHasTheBitsOfOneHeadCalls) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-8.0f, 8.0f);
  for (int64_t num_heads : {1, 2, 3, 4, 5, 7, 8, 9}) {
    for (int64_t n : {1, 13, 16, 40, 64}) {
      const int64_t ld = 67;
      std::vector<float> tiles[2];
      for (auto& t : tiles) {
        t.resize(num_heads * ld);
        for (float& v : t) v = dist(rng);
      }
      std::vector<float> m(num_heads), l(num_heads), rescale(num_heads);
      std::vector<float> m1(num_heads), l1(num_heads), rescale1(num_heads);
      for (int64_t h = 0; h < num_heads; ++h) {
        m[h] = m1[h] = -std::numeric_limits<float>::infinity();
        l[h] = l1[h] = 0.0f;
      }
      for (const auto& tile : tiles) {
        std::vector<float> all = tile, one = tile;
        kernels().attn_softmax(all.data(), ld, num_heads, n, m.data(), l.data(), rescale.data());
        for (int64_t h = 0; h < num_heads; ++h) {
          kernels().attn_softmax(one.data() + h * ld, ld, 1, n, &m1[h], &l1[h], &rescale1[h]);
        }
        for (int64_t h = 0; h < num_heads; ++h) {
          const std::string at = "heads=" + std::to_string(num_heads) + " n=" + std::to_string(n) +
                                 " h=" + std::to_string(h);
          ASSERT_EQ(std::bit_cast<uint32_t>(m[h]), std::bit_cast<uint32_t>(m1[h])) << at;
          ASSERT_EQ(std::bit_cast<uint32_t>(l[h]), std::bit_cast<uint32_t>(l1[h])) << at;
          ASSERT_EQ(std::bit_cast<uint32_t>(rescale[h]), std::bit_cast<uint32_t>(rescale1[h]))
              << at;
          for (int64_t t = 0; t < ld; ++t) {
            ASSERT_EQ(std::bit_cast<uint32_t>(all[h * ld + t]),
                      std::bit_cast<uint32_t>(one[h * ld + t]))
                << at << " t=" << t;
          }
        }
      }
    }
  }
}

// A key's score and its value's share of the sum do not depend on how the keys are cut into
// runs (pages): the same keys in one run, in runs of 5, 3, 16, 1 and 7, and in runs of 8 give the
// same bits, for head dims that are and are not a whole number of vectors and every group size
// the kernels block differently. (With pages of 5 tokens and head_dim 12, the server's tokens
// once depended on it.) Nor on whether the scores of the runs come from one call over all of them
// or from a call per run, nor on the runs' offset, nor on prefetching: the cut calls pass ranges
// to prefetch (unaligned, of odd sizes, more or fewer lines than the call has steps), and each
// call issues all of them.
template <class K>
void ExpectAttentionIndependentOfRuns(const KernelTable& kt, int64_t head_dim, int64_t num_q) {
  constexpr int64_t kKeys = 32;
  std::mt19937 rng(static_cast<uint32_t>(head_dim * 10 + num_q));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> q(num_q * head_dim);
  for (float& v : q) v = dist(rng);
  // Two rows of padding before the keys: the cut calls point their runs two rows early and pass
  // an offset of two rows.
  std::vector<K> padded((kKeys + 2) * head_dim);
  for (K& v : padded) v = FromF32<K>(dist(rng));
  const K* keys = padded.data() + 2 * head_dim;
  auto scores_fn = AttnScoresFor<K>(kt);
  auto acc_fn = AttnAccumulateFor<K>(kt);
  std::vector<char> other(100000);
  const char* bases[3] = {other.data() + 3, other.data() + 5000, other.data() + 64};
  const int64_t bytes[3] = {130, 1, 40000};
  auto run = [&](const std::vector<int64_t>& lens, bool call_per_run, std::vector<float>* scores,
                 std::vector<float>* acc) {
    const bool cut = lens.size() > 1;
    const int64_t offset = cut ? 2 * head_dim : 0;
    scores->assign(num_q * kKeys, 0.0f);
    std::vector<const K*> rows;
    int64_t t = 0;
    for (int64_t len : lens) {
      rows.push_back(keys + t * head_dim - offset);
      t += len;
    }
    const int64_t num_runs = static_cast<int64_t>(lens.size());
    if (call_per_run) {
      for (int64_t r = 0, t0 = 0; r < num_runs; t0 += lens[r++]) {
        AttnPrefetch pf{
            .base = bases, .bytes = bytes, .num_ranges = 1 + lens[r] % 3, .offset = lens[r]};
        scores_fn(q.data(), num_q, &rows[r], &lens[r], 1, offset, head_dim, 0.3f,
                  scores->data() + t0, kKeys, cut ? &pf : nullptr);
        if (cut) {
          EXPECT_EQ(pf.Left(), 0) << "scores, " << lens[r] << " keys";
        }
      }
    } else {
      AttnPrefetch pf{.base = bases, .bytes = bytes, .num_ranges = 3, .offset = num_runs};
      scores_fn(q.data(), num_q, rows.data(), lens.data(), num_runs, offset, head_dim, 0.3f,
                scores->data(), kKeys, cut ? &pf : nullptr);
      if (cut) {
        EXPECT_EQ(pf.Left(), 0) << "scores, " << num_runs << " runs";
      }
    }
    acc->assign(num_q * head_dim, 0.5f);
    std::vector<float> rescale(num_q, 0.75f);
    AttnPrefetch pf{.base = bases, .bytes = bytes, .num_ranges = 3};
    acc_fn(scores->data(), kKeys, num_q, rows.data(), lens.data(), num_runs, offset, head_dim,
           rescale.data(), acc->data(), cut ? &pf : nullptr);
    if (cut) {
      EXPECT_EQ(pf.Left(), 0) << "accumulate";
    }
  };
  std::vector<float> want_s, want_acc, got_s, got_acc;
  run({kKeys}, false, &want_s, &want_acc);
  for (const std::vector<int64_t>& lens :
       {std::vector<int64_t>{5, 3, 16, 1, 7}, std::vector<int64_t>(4, 8)}) {
    for (bool call_per_run : {false, true}) {
      run(lens, call_per_run, &got_s, &got_acc);
      for (size_t i = 0; i < want_s.size(); ++i) {
        ASSERT_EQ(got_s[i], want_s[i])
            << "score " << i << " head_dim " << head_dim << " num_q " << num_q << " runs "
            << lens.size() << " call per run " << call_per_run;
      }
      for (size_t i = 0; i < want_acc.size(); ++i) {
        ASSERT_EQ(got_acc[i], want_acc[i])
            << "acc " << i << " head_dim " << head_dim << " num_q " << num_q << " runs "
            << lens.size() << " call per run " << call_per_run;
      }
    }
  }
}

// AttnPrefetch counts the cache lines its ranges touch (a range that starts or ends inside a
// line counts that line), issues them in order across ranges, and spreads them over steps.
TEST(AttnPrefetchTest, CountsAndIssuesTheLinesOfItsRanges) {
  alignas(64) static char buf[4096];
  const char* bases[3] = {buf + 3, buf + 1000, buf + 2048};
  const int64_t bytes[3] = {130, 0, 64};
  AttnPrefetch pf{.base = bases, .bytes = bytes, .num_ranges = 3};
  // [3, 133) spans lines 0, 64 and 128; the empty range none; [2048, 2112) one line.
  EXPECT_EQ(pf.Left(), 4);
  EXPECT_EQ(pf.PerStep(3), 2);
  EXPECT_EQ(pf.PerStep(4), 1);
  EXPECT_EQ(pf.PerStep(0), 0);
  pf.Issue(2);
  EXPECT_EQ(pf.Left(), 2);
  pf.Issue(1);
  EXPECT_EQ(pf.Left(), 1);
  pf.IssueRest();
  EXPECT_EQ(pf.Left(), 0);
  pf.Issue(5);
  EXPECT_EQ(pf.Left(), 0);
  // The offset moves every range: [64, 194) spans lines 64, 128 and 192 of range 0.
  AttnPrefetch moved{.base = bases, .bytes = bytes, .num_ranges = 1, .offset = 61};
  EXPECT_EQ(moved.Left(), 3);
}

TEST_P(CpuKernelsTest, AttentionBitsDoNotDependOnHowKeysAreCutIntoRuns) {
  for (int64_t head_dim : {12, 20, 64, 100}) {
    for (int64_t num_q : {1, 2, 3, 5, 8}) {
      ExpectAttentionIndependentOfRuns<float>(kernels(), head_dim, num_q);
      ExpectAttentionIndependentOfRuns<f16_t>(kernels(), head_dim, num_q);
      ExpectAttentionIndependentOfRuns<bf16_t>(kernels(), head_dim, num_q);
    }
  }
}

// silu(g) * u against double precision over the range where the result is a normal float; the
// exp's 2 ulp plus three roundings (1 + e, the division, the product) bound it at 4 ulp. Beyond
// it: silu of a large positive g is g exactly, of a large negative g a tiny negative number, and
// infinities and NaN go where the formula sends them. Every element's bits are those it gets at
// any other position of a call of any length (vector body and tail alike), and silu in place is
// swiglu with up = 1.
TEST_P(CpuKernelsTest, SwiGluAndSiluAreWithinFourUlpWhereverAnElementSits) {
  const KernelTable& kt = kernels();
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> gd(-85.0f, 85.0f), ud(-2.0f, 2.0f);
  double worst = 0.0;
  for (int64_t n : {1, 7, 16, 37, 1000}) {
    std::vector<float> g(n), u(n), out(n);
    for (int64_t i = 0; i < n; ++i) g[i] = gd(rng), u[i] = ud(rng);
    g[0] = n % 2 == 0 ? 0.0f : -0.0f;
    kt.swiglu(g.data(), u.data(), out.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double want = double{g[i]} / (1.0 + std::exp(-double{g[i]})) * double{u[i]};
      if (want == 0.0) {
        EXPECT_EQ(out[i], 0.0f) << "n=" << n << " i=" << i;
        continue;
      }
      worst = std::max(worst, Ulps(out[i], want));
    }
    // The same elements from offset 3 (a call that starts mid-vector, with another tail), and
    // silu in place against swiglu with up = 1.
    if (n > 3) {
      std::vector<float> shifted(n - 3);
      kt.swiglu(g.data() + 3, u.data() + 3, shifted.data(), n - 3);
      for (int64_t i = 3; i < n; ++i) ASSERT_EQ(shifted[i - 3], out[i]) << "n=" << n << " i=" << i;
    }
    std::vector<float> ones(n, 1.0f), by_swiglu(n), x = g;
    kt.swiglu(g.data(), ones.data(), by_swiglu.data(), n);
    kt.silu(x.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(x[i], by_swiglu[i]) << "n=" << n << " i=" << i;
  }
  EXPECT_LE(worst, 4.0);

  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> edge = {100.0f, 1e30f, inf, -100.0f, -1e30f, std::nanf("")};
  kt.silu(edge.data(), static_cast<int64_t>(edge.size()));
  EXPECT_EQ(edge[0], 100.0f);
  EXPECT_EQ(edge[1], 1e30f);
  EXPECT_EQ(edge[2], inf);
  EXPECT_LE(edge[3], 0.0f);
  EXPECT_GT(edge[3], -1e-30f);
  EXPECT_LE(edge[4], 0.0f);
  EXPECT_TRUE(std::isnan(edge[5]));
}

// Both kernels of every float weight type for n = 1..128 x rows (the decode/prefill crossover
// moves per ISA, so each kernel must hold over the whole range), odd m and k so every vector and
// tile remainder runs, with and without bias, and a row range that starts inside the matrix.
TEST_P(CpuKernelsTest, FloatGemmKernelsMatchADoubleProductForEveryRowCount) {
  // f32 accumulation over k <= 300 terms of unit-scale products: relative to the sum of |terms|
  // the rounding stays far below 1e-5.
  constexpr double kRelTol = 1e-5;
  const KernelTable& kt = kernels();
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto [m, k] : {std::pair<int64_t, int64_t>{37, 67}, {70, 300}}) {
    std::vector<float> w32(m * k);
    for (float& v : w32) v = u(rng);
    std::vector<bf16_t> wb(m * k);
    std::vector<f16_t> wh(m * k);
    for (int64_t i = 0; i < m * k; ++i) {
      wb[i] = F32ToBf16(w32[i]);
      wh[i] = F32ToF16(w32[i]);
    }
    std::vector<float> bias(m);
    for (float& v : bias) v = u(rng);
    for (int64_t n : {1, 2, 3, 5, 8, 16, 17, 31, 32, 33, 47, 64, 100, 128}) {
      std::vector<float> x(n * k);
      for (float& v : x) v = u(rng);
      for (int dt = 0; dt < 3; ++dt) {
        // The weights as the kernel sees them (bf16/f16 rounding is the input, not an error).
        std::vector<double> wd(m * k);
        for (int64_t i = 0; i < m * k; ++i) {
          wd[i] = dt == 0 ? w32[i] : dt == 1 ? Bf16ToF32(wb[i]) : F16ToF32(wh[i]);
        }
        const bool with_bias = (n + dt) % 2 == 0;
        // Rows [3, m) only: the row range is honoured and rows below it are left alone.
        const int64_t r0 = 3;
        for (int kernel = 0; kernel < 2; ++kernel) {
          std::vector<float> out(n * m, -7.0f);
          const float* b = with_bias ? bias.data() : nullptr;
          if (kernel == 0) {
            if (dt == 0) kt.gemm_small_f32(x.data(), n, k, w32.data(), b, out.data(), m, r0, m);
            if (dt == 1) {
              std::vector<float> xd = x;
              if (kt.prepare_x_bf16 != nullptr) kt.prepare_x_bf16(x.data(), n, k, xd.data());
              kt.gemm_small_bf16(xd.data(), n, k, wb.data(), b, out.data(), m, r0, m);
            }
            if (dt == 2) kt.gemm_small_f16(x.data(), n, k, wh.data(), b, out.data(), m, r0, m);
          } else {
            if (dt == 0) kt.gemm_large_f32(x.data(), 0, n, k, w32.data(), b, out.data(), m, r0, m);
            if (dt == 1) kt.gemm_large_bf16(x.data(), 0, n, k, wb.data(), b, out.data(), m, r0, m);
            if (dt == 2) kt.gemm_large_f16(x.data(), 0, n, k, wh.data(), b, out.data(), m, r0, m);
          }
          for (int64_t i = 0; i < n; ++i) {
            for (int64_t r = 0; r < m; ++r) {
              const float got = out[i * m + r];
              if (r < r0) {
                ASSERT_EQ(got, -7.0f) << "row " << r << " outside the range was written";
                continue;
              }
              double want = with_bias ? bias[r] : 0.0, mag = std::fabs(want);
              for (int64_t kk = 0; kk < k; ++kk) {
                want += double{x[i * k + kk]} * wd[r * k + kk];
                mag += std::fabs(double{x[i * k + kk]} * wd[r * k + kk]);
              }
              ASSERT_NEAR(got, want, kRelTol * mag)
                  << (kernel == 0 ? "small-n" : "large-n") << " dtype " << dt << " n=" << n
                  << " m=" << m << " k=" << k << " i=" << i << " r=" << r;
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, CpuKernelsTest,
                         ::testing::Values(Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Vnni, Isa::kAmx),
                         [](const auto& info) { return std::string(IsaName(info.param)); });

}  // namespace
}  // namespace modserve::backend::cpu
