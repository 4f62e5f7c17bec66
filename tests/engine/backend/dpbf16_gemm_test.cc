// The vdpbf16ps BF16 Gemm (kernels_avx512bf16.cc, KernelTable::gemm_dpbf16) and its x packer,
// on CPUs with AVX512_BF16 (AMD Zen 4 and 5, Xeons from Cooper Lake on); skipped elsewhere. The
// packer is held to the AMX split's bits (amx_gemm_impl.h's AmxSplit, the scalar definition of the
// terms), the Gemm to a double sum within each precision's bound, and the backend to taking it
// only below kHighest and only for prefill-sized calls.
#include <gtest/gtest.h>

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
      EXPECT_EQ(backend->MaxRowInvariantRows(DType::kBF16, 4096),
                medium ? kDpBf16SmallNMax : table.float_small_n_max);
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

}  // namespace
}  // namespace modserve::backend::cpu
