// The vdpbf16ps BF16 Gemm (kernels_avx512bf16.cc, KernelTable::gemm_dpbf16) and its x packer,
// on CPUs with AVX512_BF16 (AMD Zen 4 and 5, Xeons from Cooper Lake on); skipped elsewhere. The
// packer is held to the AMX split's bits (amx_gemm_impl.h's AmxSplit, the scalar definition of the
// terms), the Gemm to a double sum within each precision's bound, and the backend to taking it
// only at kMedium and only for prefill-sized calls on weights it did not copy. The panel copy
// (repack_dpbf16) and its Gemms: gemm_dpbf16_panels to the packing Gemm's bits, gemm_bf16_panels
// (the f32 FMA one, kHighest and kHigh) to a double sum within the f32 bound, and both to one-row
// bits for every row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cpu/kernels.h"
#include "tests/engine/backend/bf16_terms_check.h"

namespace modserve::backend::cpu {
namespace {

#include "engine/backend/cpu/amx_gemm_impl.h"

bool Usable() { return CpuHasIsa(Isa::kAvx512) && CpuHasAvx512Bf16(); }

#define SKIP_WITHOUT_AVX512_BF16() \
  if (!Usable()) GTEST_SKIP() << "no AVX-512 with AVX512_BF16 on this CPU"

std::vector<uint16_t> Pack(const std::vector<float>& x, int64_t n, int64_t k, int terms) {
  std::vector<uint16_t> packed(DpBf16PackedXBytes(n, k, terms) / 2, 0xffff);
  // In two row ranges, as the backend's threads pack.
  KernelsFor(Isa::kAvx512).pack_x_dpbf16(x.data(), k, 0, n / 2, packed.data(), terms);
  KernelsFor(Isa::kAvx512).pack_x_dpbf16(x.data(), k, n / 2, n, packed.data(), terms);
  return packed;
}

// The panel copy of w [m, k] (repack_dpbf16), written in two group ranges as the backend's
// threads write it, over a buffer of 0xdeadbeef.
std::vector<uint32_t> Panels(const std::vector<bf16_t>& w, int64_t m, int64_t k) {
  const int64_t groups = m / kDpBf16PanelRows;
  std::vector<uint32_t> panels(groups * DpBf16PanelGroupBytes(k) / 4, 0xdeadbeefu);
  KernelsFor(Isa::kAvx512).repack_dpbf16(w.data(), k, 0, groups / 2, panels.data());
  KernelsFor(Isa::kAvx512).repack_dpbf16(w.data(), k, groups / 2, groups, panels.data());
  return panels;
}

TEST(DpBf16GemmTest, TheTablesCarryTheKernelExactlyWhereTheCpuHasAvx512Bf16) {
  if (!CpuHasIsa(Isa::kAvx512)) GTEST_SKIP() << "no AVX-512";
  for (Isa isa : {Isa::kAvx512, Isa::kAvx512Vnni}) {
    if (!CpuHasIsa(isa)) continue;
    const KernelTable& t = KernelsFor(isa);
    EXPECT_EQ(t.gemm_dpbf16 != nullptr, CpuHasAvx512Bf16()) << IsaName(isa);
    EXPECT_EQ(t.pack_x_dpbf16 != nullptr, CpuHasAvx512Bf16()) << IsaName(isa);
  }
  EXPECT_EQ(KernelsFor(Isa::kAvx2).gemm_dpbf16, nullptr);
}

// Every element's terms are AmxSplit's, bit for bit, including the awkward ones: zeros,
// denormals, values whose nearest bf16 is infinite, infinities and NaNs with payloads; an odd k
// gets one zero pad element per term.
TEST(DpBf16GemmTest, ThePackerWritesTheAmxSplitOfEveryElement) {
  SKIP_WITHOUT_AVX512_BF16();
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> bits;
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const float special[] = {0.0f,
                           -0.0f,
                           1e-40f,
                           -3e-39f,
                           1.1754942e-38f,
                           3.3895e38f,
                           -3.40282347e38f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(),
                           1.0f + 0x1p-8f,
                           1.0f + 0x1p-8f + 0x1p-16f,
                           1.0f + 0x1p-7f + 0x1p-8f};
  for (int64_t k : {1, 2, 15, 16, 17, 33, 64, 97}) {
    constexpr int64_t n = 5;
    std::vector<float> x(n * k);
    for (size_t i = 0; i < x.size(); ++i) {
      const uint32_t u = bits(rng);
      if (i % 3 == 0) {
        std::memcpy(&x[i], &u, 4);  // any bit pattern, NaN payloads included
      } else if (i % 3 == 1) {
        x[i] = special[u % std::size(special)];
      } else {
        x[i] = dist(rng) * std::ldexp(1.0f, static_cast<int>(u % 60) - 30);
      }
    }
    for (int terms = 1; terms <= 3; ++terms) {
      SCOPED_TRACE("k " + std::to_string(k) + " terms " + std::to_string(terms));
      const std::vector<uint16_t> packed = Pack(x, n, k, terms);
      const int64_t kp = DpBf16PackedK(k);
      int bad = 0;
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t kk = 0; kk < kp; ++kk) {
          uint16_t want[3] = {0, 0, 0};
          if (kk < k) AmxSplit(x[r * k + kk], want);
          for (int t = 0; t < terms; ++t) {
            const uint16_t got = packed[(r * terms + t) * kp + kk];
            if (got != want[t] && ++bad <= 5) {
              uint32_t u;
              std::memcpy(&u, &x[r * k + kk], 4);
              ADD_FAILURE() << "row " << r << " k " << kk << " term " << t << " of x bits 0x"
                            << std::hex << u << ": 0x" << got << ", want 0x" << want[t];
            }
          }
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

using Case = testing::TermsCase;
using testing::Describe;

void RunCase(const Case& c, int terms, std::mt19937& rng) {
  SCOPED_TRACE(Describe(c) + " terms " + std::to_string(terms));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(c.n * c.k), bias(c.m);
  std::vector<bf16_t> w(c.m * c.k);
  for (float& v : x) v = dist(rng) * c.x_scale;
  for (bf16_t& v : w) v = F32ToBf16(dist(rng) * c.w_scale);
  for (float& v : bias) v = dist(rng);
  const std::vector<uint16_t> packed = Pack(x, c.n, c.k, terms);
  const float sentinel = -12345.0f;
  std::vector<float> out(c.n * c.m, sentinel);
  KernelsFor(Isa::kAvx512)
      .gemm_dpbf16(packed.data(), c.k, c.x_begin, c.x_end, w.data(), c.bias ? bias.data() : nullptr,
                   out.data(), c.m, c.row_begin, c.row_end, terms);
  std::vector<float> wf(w.size());
  for (size_t i = 0; i < w.size(); ++i) wf[i] = Bf16ToF32(w[i]);
  testing::ExpectWithinTermsBound(c, terms, x, wf, bias, out, sentinel);
}

TEST(DpBf16GemmTest, TheGemmMatchesADoubleSumAtEachTermCountOverOddShapesAndRanges) {
  SKIP_WITHOUT_AVX512_BF16();
  std::mt19937 rng(11);
  const Case cases[] = {
      {1, 1, 1, 0, 1, 0, 1, false},
      {1, 2, 16, 0, 1, 0, 16, true},
      {17, 33, 17, 0, 17, 0, 17, true},
      {16, 31, 15, 0, 16, 0, 15, false},
      {33, 64, 33, 0, 33, 0, 33, true},
      {40, 70, 50, 3, 40, 0, 50, true},
      {65, 255, 129, 0, 65, 0, 129, true},
      {100, 257, 200, 64, 100, 17, 190, true},
      {128, 511, 48, 0, 128, 16, 48, false},
      {9, 512, 32, 0, 9, 0, 32, false},     // one whole slice
      {9, 513, 32, 0, 9, 0, 32, true},      // a slice of one element after it
      {33, 1100, 47, 0, 33, 5, 47, true},   // three slices, the last odd
      {20, 96, 300, 0, 20, 0, 300, false},  // three column blocks, the last partial
      {24, 64, 160, 8, 24, 128, 160, true},
      {16, 64, 32, 0, 16, 0, 32, true, 1e30f, 1e-30f},
      {16, 64, 32, 0, 16, 0, 32, true, 1e-20f, 1e20f},
      {16, 64, 32, 0, 16, 0, 32, false, 1e-3f, 1e3f},
  };
  for (const Case& c : cases) {
    for (int terms = 1; terms <= 3; ++terms) RunCase(c, terms, rng);
  }
}

std::unique_ptr<CpuBackend> Backend(Isa isa, MatmulPrecision precision) {
  auto created = CpuBackend::Create({.num_threads = 2, .isa = isa, .matmul_precision = precision});
  EXPECT_TRUE(created.ok()) << created.status();
  return created.ok() ? std::move(*created) : nullptr;
}

// At kMedium, calls of more than kDpBf16SmallNMax rows run on vdpbf16ps, within one term's bound,
// and the row-invariant range shrinks to match; kHighest and kHigh keep the FMA kernels' bits
// (those of the same backend with the entry removed) and range, and calls of at most
// kDpBf16SmallNMax rows give the same bits at every precision.
TEST(DpBf16GemmTest, TheBackendTakesItAtMediumBeyondTheDecodeRange) {
  SKIP_WITHOUT_AVX512_BF16();
  for (Isa isa : {Isa::kAvx512, Isa::kAvx512Vnni}) {
    if (!CpuHasIsa(isa)) continue;
    SCOPED_TRACE(std::string(IsaName(isa)));
    const KernelTable& table = KernelsFor(isa);
    KernelTable fma_only = table;
    fma_only.gemm_dpbf16 = nullptr;
    fma_only.pack_x_dpbf16 = nullptr;
    auto fma = CpuBackend::Create({.num_threads = 2, .kernels = &fma_only});
    ASSERT_TRUE(fma.ok()) << fma.status();
    for (auto precision :
         {MatmulPrecision::kHighest, MatmulPrecision::kHigh, MatmulPrecision::kMedium}) {
      SCOPED_TRACE(std::string(MatmulPrecisionName(precision)));
      auto backend = Backend(isa, precision);
      ASSERT_NE(backend, nullptr);
      const bool medium = precision == MatmulPrecision::kMedium;
      // 4080 rows are not whole 32-row groups, so such a weight stays unprepared; 4096 become
      // panels at every precision (TheBackendKeepsBf16WeightsAsPanels).
      EXPECT_EQ(backend->MaxRowInvariantRows(DType::kBF16, 4080),
                medium ? kDpBf16SmallNMax : table.float_small_n_max);
      EXPECT_EQ(backend->MaxRowInvariantRows(DType::kBF16, 4096),
                std::numeric_limits<int64_t>::max());
      EXPECT_EQ(backend->MaxRowInvariantRows(DType::kF32, 4096), table.float_small_n_max);
      for (int64_t n : {kDpBf16SmallNMax + 1, table.float_small_n_max + 37}) {
        SCOPED_TRACE("rows " + std::to_string(n));
        std::vector<float> x, w;
        const std::vector<float> out = testing::RandomBf16Gemm(*backend, n, &x, &w);
        if (!medium) {
          EXPECT_EQ(out, testing::RandomBf16Gemm(**fma, n));
        } else {
          EXPECT_NE(out, testing::RandomBf16Gemm(**fma, n));
          testing::ExpectWithinTermsBound({n, testing::kRandomGemmK, testing::kRandomGemmM, 0, n, 0,
                                           testing::kRandomGemmM, false},
                                          1, x, w, {}, out, 0.0f);
        }
      }
      EXPECT_EQ(testing::RandomBf16Gemm(*backend, kDpBf16SmallNMax),
                testing::RandomBf16Gemm(**fma, kDpBf16SmallNMax));
    }
  }
}

// The panel copy (Panels) and gemm_dpbf16_panels give gemm_dpbf16's bits from the same weights, at
// each term count, for every tile height (1 to 8 rows, and tiles beside them), odd and sliced k,
// group ranges that do not start at 0, with and without a bias; and each x row the bits of a
// one-row call.
TEST(DpBf16GemmTest, ThePanelCopyGivesThePackingGemmsBitsAtEveryRowCount) {
  SKIP_WITHOUT_AVX512_BF16();
  const KernelTable& t = KernelsFor(Isa::kAvx512);
  ASSERT_NE(t.repack_dpbf16, nullptr);
  ASSERT_NE(t.gemm_dpbf16_panels, nullptr);
  std::mt19937 rng(17);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  struct Shape {
    int64_t m, k, row_begin, row_end;
  };
  const Shape shapes[] = {{32, 1, 0, 32},      {32, 2, 0, 32},     {64, 31, 0, 64},
                          {96, 512, 32, 96},   {160, 513, 0, 160}, {288, 1100, 64, 288},
                          {320, 1536, 0, 320}, {128, 2048, 0, 128}};
  for (const Shape& sh : shapes) {
    std::vector<bf16_t> w(sh.m * sh.k);
    for (bf16_t& v : w) v = F32ToBf16(dist(rng));
    std::vector<float> bias(sh.m);
    for (float& v : bias) v = dist(rng);
    const std::vector<uint32_t> panels = Panels(w, sh.m, sh.k);
    for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 35}) {
      std::vector<float> x(n * sh.k);
      for (float& v : x) v = dist(rng);
      for (int terms = 1; terms <= 3; ++terms) {
        SCOPED_TRACE("m=" + std::to_string(sh.m) + " k=" + std::to_string(sh.k) + " rows [" +
                     std::to_string(sh.row_begin) + ", " + std::to_string(sh.row_end) +
                     ") n=" + std::to_string(n) + " terms " + std::to_string(terms));
        const std::vector<uint16_t> packed = Pack(x, n, sh.k, terms);
        const float* b = n % 2 == 0 ? bias.data() : nullptr;
        std::vector<float> got(n * sh.m, -1.0f), want(n * sh.m, -1.0f);
        t.gemm_dpbf16_panels(packed.data(), sh.k, 0, n, panels.data(), b, got.data(), sh.m,
                             sh.row_begin, sh.row_end, terms);
        t.gemm_dpbf16(packed.data(), sh.k, 0, n, w.data(), b, want.data(), sh.m, sh.row_begin,
                      sh.row_end, terms);
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
        // Row by row, each as its own one-row call (its terms at row 0 of a packing of its own).
        for (int64_t i = 0; i < n; ++i) {
          const std::vector<float> xi(x.begin() + i * sh.k, x.begin() + (i + 1) * sh.k);
          const std::vector<uint16_t> pi = Pack(xi, 1, sh.k, terms);
          std::vector<float> one(sh.m, -1.0f);
          t.gemm_dpbf16_panels(pi.data(), sh.k, 0, 1, panels.data(), b, one.data(), sh.m,
                               sh.row_begin, sh.row_end, terms);
          ASSERT_EQ(std::memcmp(one.data(), got.data() + i * sh.m, sh.m * sizeof(float)), 0)
              << "row " << i;
        }
      }
    }
  }
}

// gemm_bf16_panels, the f32 FMA Gemm over the same panels (kHighest and kHigh): within the f32
// bound of a double sum (x exact, one rounding per product's sum: TermsBound's three terms), over
// odd and sliced k, group ranges that do not start at 0, x ranges that do not start at 0, every
// tile height, extreme scales, with and without a bias, and nothing written outside its ranges;
// each x row gets the bits of a one-row call, and a row range split in two the bits of the whole.
TEST(DpBf16GemmTest, TheFmaPanelGemmIsWithinTheF32BoundAndGivesEachRowItsOneRowBits) {
  SKIP_WITHOUT_AVX512_BF16();
  const KernelTable& t = KernelsFor(Isa::kAvx512);
  ASSERT_NE(t.repack_dpbf16, nullptr);
  ASSERT_NE(t.gemm_bf16_panels, nullptr);
  std::mt19937 rng(29);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const Case cases[] = {
      {1, 1, 32, 0, 1, 0, 32, false},
      {2, 2, 32, 0, 2, 0, 32, true},
      {3, 31, 64, 1, 3, 0, 64, true},
      {8, 512, 96, 0, 8, 32, 96, false},      // one whole slice
      {9, 513, 160, 0, 9, 0, 160, true},      // a slice of one element after it
      {17, 1100, 288, 5, 17, 64, 288, true},  // three slices, the last even
      {35, 1027, 64, 0, 35, 0, 64, false},    // the last slice odd
      {16, 64, 32, 0, 16, 0, 32, true, 1e30f, 1e-30f},
      {16, 64, 32, 0, 16, 0, 32, true, 1e-20f, 1e20f},
      {16, 64, 32, 0, 16, 0, 32, false, 1e-3f, 1e3f},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(Describe(c));
    std::vector<float> x(c.n * c.k), bias(c.m);
    std::vector<bf16_t> w(c.m * c.k);
    for (float& v : x) v = dist(rng) * c.x_scale;
    for (bf16_t& v : w) v = F32ToBf16(dist(rng) * c.w_scale);
    for (float& v : bias) v = dist(rng);
    const std::vector<uint32_t> panels = Panels(w, c.m, c.k);
    const float* b = c.bias ? bias.data() : nullptr;
    const float sentinel = -12345.0f;
    std::vector<float> out(c.n * c.m, sentinel);
    t.gemm_bf16_panels(x.data(), c.k, c.x_begin, c.x_end, panels.data(), b, out.data(), c.m,
                       c.row_begin, c.row_end);
    std::vector<float> wf(w.size());
    for (size_t i = 0; i < w.size(); ++i) wf[i] = Bf16ToF32(w[i]);
    testing::ExpectWithinTermsBound(c, 3, x, wf, bias, out, sentinel);
    for (int64_t i = c.x_begin; i < c.x_end; ++i) {
      std::vector<float> one(c.m, sentinel);
      t.gemm_bf16_panels(x.data() + i * c.k, c.k, 0, 1, panels.data(), b, one.data(), c.m,
                         c.row_begin, c.row_end);
      ASSERT_EQ(std::memcmp(one.data() + c.row_begin, out.data() + i * c.m + c.row_begin,
                            (c.row_end - c.row_begin) * sizeof(float)),
                0)
          << "row " << i;
    }
    const int64_t mid = (c.row_begin + c.row_end) / 2 / kDpBf16PanelRows * kDpBf16PanelRows;
    std::vector<float> split(c.n * c.m, sentinel);
    t.gemm_bf16_panels(x.data(), c.k, c.x_begin, c.x_end, panels.data(), b, split.data(), c.m,
                       c.row_begin, mid);
    t.gemm_bf16_panels(x.data(), c.k, c.x_begin, c.x_end, panels.data(), b, split.data(), c.m, mid,
                       c.row_end);
    EXPECT_EQ(std::memcmp(split.data(), out.data(), out.size() * sizeof(float)), 0);
  }
}

// PrepareGemmWeight keeps a BF16 weight of a multiple of kDpBf16PanelRows rows as panels at every
// precision (and leaves other row counts alone, and tables with neither panel Gemm). At kMedium,
// Gemms from the copy give the unprepared backend's bits beyond kDpBf16SmallNMax rows and stay
// within one term's bound below it; at kHighest and kHigh they stay within the f32 bound. Every
// row gets a one-row call's bits, and a view of whole groups of the copy is a Gemm weight too.
TEST(DpBf16GemmTest, TheBackendKeepsBf16WeightsAsPanels) {
  SKIP_WITHOUT_AVX512_BF16();
  for (Isa isa : {Isa::kAvx512, Isa::kAvx512Vnni}) {
    if (!CpuHasIsa(isa)) continue;
    KernelTable no_panels = KernelsFor(isa);
    no_panels.gemm_bf16_panels = nullptr;
    auto plain = CpuBackend::Create({.num_threads = 2, .kernels = &no_panels});
    ASSERT_TRUE(plain.ok()) << plain.status();
    for (auto precision :
         {MatmulPrecision::kMedium, MatmulPrecision::kHigh, MatmulPrecision::kHighest}) {
      SCOPED_TRACE(std::string(IsaName(isa)) + " " + std::string(MatmulPrecisionName(precision)));
      const bool medium = precision == MatmulPrecision::kMedium;
      auto backend = Backend(isa, precision);
      ASSERT_NE(backend, nullptr);
      std::mt19937 rng(23);
      std::normal_distribution<float> dist(0.0f, 1.0f);
      const int64_t k = 600, m = 160;
      std::vector<bf16_t> w(m * k), w48(48 * k);
      for (bf16_t& v : w) v = F32ToBf16(dist(rng));
      for (bf16_t& v : w48) v = F32ToBf16(dist(rng));
      const TensorView wv(w.data(), DType::kBF16, {m, k});
      absl::StatusOr<TensorView> prepared = backend->PrepareGemmWeight(wv);
      ASSERT_TRUE(prepared.ok()) << prepared.status();
      EXPECT_NE(prepared->data, wv.data) << "not copied";
      absl::StatusOr<TensorView> again = backend->PrepareGemmWeight(*prepared);
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(again->data, prepared->data) << "a copy copied again";
      const TensorView w48v(w48.data(), DType::kBF16, {48, k});
      EXPECT_EQ(backend->PrepareGemmWeight(w48v)->data, w48v.data) << "48 rows are not groups";
      // Without gemm_bf16_panels only kMedium's vdpbf16ps panels remain.
      EXPECT_EQ((*plain)->PrepareGemmWeight(wv)->data, wv.data)
          << "copied at highest without the FMA panel Gemm";
      std::vector<float> wf(w.size());
      for (size_t i = 0; i < w.size(); ++i) wf[i] = Bf16ToF32(w[i]);
      auto gemm = [&](const TensorView& weight, const std::vector<float>& x, int64_t n,
                      int64_t rows) {
        std::vector<float> out(n * rows, 0.0f);
        backend->Gemm(TensorView(const_cast<float*>(x.data()), DType::kF32, {n, k}), weight,
                      TensorView(), TensorView(out.data(), DType::kF32, {n, rows}));
        return out;
      };
      for (int64_t n : {int64_t{1}, int64_t{3}, kDpBf16SmallNMax, kDpBf16SmallNMax + 1, int64_t{40},
                        int64_t{300}}) {
        SCOPED_TRACE("rows " + std::to_string(n));
        std::vector<float> x(n * k);
        for (float& v : x) v = dist(rng);
        const std::vector<float> got = gemm(*prepared, x, n, m);
        if (medium && n > kDpBf16SmallNMax) {
          EXPECT_EQ(got, gemm(wv, x, n, m)) << "not the packing Gemm's bits";
        }
        testing::ExpectWithinTermsBound({n, k, m, 0, n, 0, m, false}, medium ? 1 : 3, x, wf, {},
                                        got, 0.0f);
        for (int64_t i = 0; i < n; i += std::max<int64_t>(1, n / 5)) {
          const std::vector<float> xi(x.begin() + i * k, x.begin() + (i + 1) * k);
          const std::vector<float> one = gemm(*prepared, xi, 1, m);
          ASSERT_TRUE(std::equal(one.begin(), one.end(), got.begin() + i * m)) << "row " << i;
        }
        // Groups 1 and 2 of the copy as a weight of their own: rows 32..95 of the whole's output.
        const TensorView part(static_cast<char*>(prepared->data) + DpBf16PanelGroupBytes(k),
                              DType::kBF16, {64, k}, Device::kCpu);
        const std::vector<float> sub = gemm(part, x, n, 64);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_TRUE(std::equal(sub.begin() + i * 64, sub.begin() + (i + 1) * 64,
                                 got.begin() + i * m + 32))
              << "row " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace modserve::backend::cpu
