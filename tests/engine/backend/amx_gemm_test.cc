// The AMX BF16 Gemm's packing and tile loops (engine/backend/cpu/amx_gemm_impl.h) run here on a
// software model of the eight tile registers, so they are checked on every CPU, with or without
// a matrix unit. The model follows the instruction set reference for TILELOADD, TILESTORED and
// TDPBF16PS, including that TDPBF16PS treats bf16 denormal inputs as zero and flushes denormal
// results. On a CPU with usable AMX the conformance and Gemm-group suites run the hardware path
// too (backend "cpu-amx"), and kernels_amx.cc checks the unit against a double sum at start-up.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
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

struct EmulatedTiles {
  static inline thread_local uint8_t tile[8][16][64];
  static inline thread_local bool configured = false;

  static void Configure() { configured = true; }
  static void Release() { configured = false; }
  static void PackW(const uint16_t* w, int64_t k, int64_t c0, int64_t nc, int64_t ctiles,
                    int64_t s0, int64_t ns, uint32_t* bp);
  template <int kT>
  static void Load(const void* base, int64_t stride) {
    ASSERT_TRUE(configured) << "tile load before the configuration";
    for (int r = 0; r < 16; ++r) {
      std::memcpy(tile[kT][r], static_cast<const uint8_t*>(base) + r * stride, 64);
    }
  }
  template <int kT>
  static void Zero() {
    ASSERT_TRUE(configured) << "tile zero before the configuration";
    std::memset(tile[kT], 0, sizeof(tile[kT]));
  }
  static void WriteOutTransposed(const float* c, int64_t cs, int64_t nr, int64_t nc,
                                 const float* bias, float* out, int64_t ldo, int64_t r0,
                                 int64_t c0);
  template <int kT>
  static void Store(void* base, int64_t stride) {
    ASSERT_TRUE(configured) << "tile store before the configuration";
    for (int r = 0; r < 16; ++r) {
      std::memcpy(static_cast<uint8_t*>(base) + r * stride, tile[kT][r], 64);
    }
  }
  static float Bf16(const uint8_t* p) {
    uint16_t b;
    std::memcpy(&b, p, 2);
    if ((b & 0x7f80u) == 0) b &= 0x8000u;  // denormals are zero
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  template <int kC, int kA, int kB>
  static void Dot() {
    ASSERT_TRUE(configured) << "tile product before the configuration";
    for (int m = 0; m < 16; ++m) {
      for (int n = 0; n < 16; ++n) {
        float c;
        std::memcpy(&c, tile[kC][m] + 4 * n, 4);
        // The reference's order: two f32 multiply-adds per pair, each rounded to nearest with
        // denormal results flushed (a product of two bf16 is exact in f32).
        auto add = [&c](float product) {
          c += product;
          if (std::fpclassify(c) == FP_SUBNORMAL) c = std::copysign(0.0f, c);
        };
        for (int p = 0; p < 16; ++p) {
          add(Bf16(tile[kA][m] + 4 * p) * Bf16(tile[kB][p] + 4 * n));
          add(Bf16(tile[kA][m] + 4 * p + 2) * Bf16(tile[kB][p] + 4 * n + 2));
        }
        std::memcpy(tile[kC][m] + 4 * n, &c, 4);
      }
    }
  }
};

#include "engine/backend/cpu/amx_gemm_impl.h"

void EmulatedTiles::PackW(const uint16_t* w, int64_t k, int64_t c0, int64_t nc, int64_t ctiles,
                          int64_t s0, int64_t ns, uint32_t* bp) {
  PackWBf16(w, k, c0, nc, ctiles, s0, ns, bp);
}

void EmulatedTiles::WriteOutTransposed(const float* c, int64_t cs, int64_t nr, int64_t nc,
                                       const float* bias, float* out, int64_t ldo, int64_t r0,
                                       int64_t c0) {
  AmxWriteOutTransposed(c, cs, nr, nc, bias, out, ldo, r0, c0);
}

static_assert(kAmxScratchFloats == kAmxStagingFloats + kAmxBTilesWords);

double SumOfTerms(float v) {
  uint16_t t[3];
  AmxSplit(v, t);
  return static_cast<double>(AmxBf16Value(t[0])) + AmxBf16Value(t[1]) + AmxBf16Value(t[2]);
}

TEST(AmxSplitTest, ThreeBf16TermsCarryEveryFloatToF32Precision) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> bits;
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = bits(rng);
    float v;
    std::memcpy(&v, &u, 4);
    if (!std::isfinite(v)) continue;
    const double err = std::fabs(SumOfTerms(v) - v);
    // Normal x: within half an f32 ulp. Near the bottom of the range the lo term is a bf16
    // denormal, which the unit reads as zero; the bound there is absolute.
    ASSERT_LE(err, std::ldexp(std::fabs(v), -24) + 0x1p-125) << "x = " << v;
    uint16_t t[3];
    AmxSplit(v, t);
    for (uint16_t term : t) ASSERT_TRUE(std::isfinite(AmxBf16Value(term))) << "x = " << v;
    ++checked;
  }
  EXPECT_GT(checked, 190000);
  for (float v : {0.0f, -0.0f, 1.0f, -1.0f, std::numeric_limits<float>::max(),
                  -std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::denorm_min(), 3.3895314e38f, 1e-30f, 65504.0f}) {
    EXPECT_LE(std::fabs(SumOfTerms(v) - v), std::ldexp(std::fabs(v), -24) + 0x1p-125) << v;
  }
  uint16_t t[3];
  AmxSplit(std::numeric_limits<float>::infinity(), t);
  EXPECT_EQ(AmxBf16Value(t[0]), std::numeric_limits<float>::infinity());
  EXPECT_EQ(t[1], 0);
  EXPECT_EQ(t[2], 0);
  AmxSplit(-std::numeric_limits<float>::infinity(), t);
  EXPECT_EQ(AmxBf16Value(t[0]), -std::numeric_limits<float>::infinity());
  // A NaN whose payload sits only in the low 16 bits must not become infinity.
  uint32_t nan_bits = 0x7f800001u;
  float nan;
  std::memcpy(&nan, &nan_bits, 4);
  AmxSplit(nan, t);
  EXPECT_TRUE(std::isnan(AmxBf16Value(t[0])));
}

// The first `terms` terms (MatmulPrecision kHigh: 2, kMedium: 1) carry a normal x to within
// 2^-(8 terms) relative: each term is x's remainder rounded to bf16's 8 significant bits.
TEST(AmxSplitTest, FewerTermsCarryEveryFloatToTheirPrecision) {
  std::mt19937 rng(4);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 100000; ++i) {
    const uint32_t u = bits(rng);
    float v;
    std::memcpy(&v, &u, 4);
    if (!std::isfinite(v)) continue;
    uint16_t t[3];
    AmxSplit(v, t);
    const double one = AmxBf16Value(t[0]), two = one + AmxBf16Value(t[1]);
    ASSERT_LE(std::fabs(one - v), std::ldexp(std::fabs(v), -8) + 0x1p-125) << "x = " << v;
    ASSERT_LE(std::fabs(two - v), std::ldexp(std::fabs(v), -16) + 0x1p-125) << "x = " << v;
  }
}

using Case = testing::TermsCase;
using testing::Describe;
using testing::TermsBound;

template <int kTerms>
void RunCase(const Case& c, std::mt19937& rng) {
  SCOPED_TRACE(Describe(c) + " terms " + std::to_string(kTerms));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(c.n * c.k), bias(c.m);
  std::vector<uint16_t> w(c.m * c.k);
  for (float& v : x) v = dist(rng) * c.x_scale;
  for (uint16_t& v : w) v = AmxBf16Bits(dist(rng) * c.w_scale);
  for (float& v : bias) v = dist(rng);
  std::vector<uint16_t> packed(AmxPackedXBytes(c.n, c.k) / 2, 0xffff);
  // Packed in two row ranges, as the backend's threads do.
  const int64_t rows = AmxPackedRows(c.n), half = rows / 2;
  PackXBf16<kTerms>(x.data(), c.n, c.k, 0, half, packed.data());
  PackXBf16<kTerms>(x.data(), c.n, c.k, half, rows, packed.data());
  const size_t used = AmxPackedXBytes(c.n, c.k) / 2 / kAmxMaxTerms * kTerms;
  for (size_t i = 0; i < packed.size(); ++i) {
    ASSERT_EQ(packed[i] == 0xffff, i >= used) << "packed element " << i << " of " << used;
  }

  const float sentinel = -12345.0f;
  std::vector<float> out(c.n * c.m, sentinel);
  std::vector<float> scratch(kAmxScratchFloats, std::numeric_limits<float>::quiet_NaN());
  GemmAmxBf16<EmulatedTiles, kTerms>(packed.data(), c.n, c.k, c.x_begin, c.x_end, w.data(),
                                     c.bias ? bias.data() : nullptr, out.data(), c.m, c.row_begin,
                                     c.row_end, scratch.data());
  ASSERT_FALSE(EmulatedTiles::configured) << "the tiles were not released";
  std::vector<float> wf(w.size());
  for (size_t i = 0; i < w.size(); ++i) wf[i] = AmxBf16Value(w[i]);
  testing::ExpectWithinTermsBound(c, kTerms, x, wf, bias, out, sentinel);
}

TEST(AmxGemmTest, TileLoopsMatchADoubleSumOverOddShapesAndRanges) {
  std::mt19937 rng(11);
  const Case cases[] = {
      {1, 1, 1, 0, 1, 0, 1, false},
      {1, 32, 16, 0, 1, 0, 16, true},
      {17, 33, 17, 0, 17, 0, 17, true},
      {16, 31, 15, 0, 16, 0, 15, false},
      {33, 64, 33, 0, 33, 0, 33, true},
      {40, 70, 50, 0, 40, 0, 50, true},
      {64, 255, 129, 0, 64, 0, 129, true},
      {65, 256, 128, 32, 65, 0, 128, false},
      {100, 257, 200, 64, 100, 17, 190, true},
      {257, 96, 40, 0, 257, 0, 40, true},  // two row chunks, the second of 1 row
      {300, 576, 160, 256, 300, 128, 160, true},
      {48, 300, 300, 0, 48, 0, 300, false},  // three column chunks
      {33, 520, 47, 0, 33, 5, 47, true},     // k slices: 520 = 16 steps + 8
      {32, 64, 32, 0, 32, 0, 32, true, 1e30f, 1e-30f},
      {32, 64, 32, 0, 32, 0, 32, true, 1e-20f, 1e20f},
      {32, 64, 32, 0, 32, 0, 32, false, 1e-3f, 1e3f},
      // The general loop (more than 64 x rows) without a bias: three k slices and two row
      // chunks; one slice and a last chunk of 44 rows; a last column chunk of 48.
      {320, 520, 96, 0, 320, 32, 96, false},
      {300, 96, 64, 0, 300, 0, 64, false},
      {288, 256, 560, 0, 288, 0, 560, false},
  };
  for (const Case& c : cases) RunCase<3>(c, rng);
}

// MatmulPrecision kHigh and kMedium: the same loops over two terms and one, held to the bound of
// their precision. A layout that still assumed three terms per step would read the wrong tiles.
TEST(AmxGemmTest, TwoTermAndOneTermLoopsMatchADoubleSumToTheirPrecision) {
  std::mt19937 rng(12);
  const Case cases[] = {
      {1, 32, 16, 0, 1, 0, 16, true},
      {17, 33, 17, 0, 17, 0, 17, true},
      {40, 70, 50, 0, 40, 0, 50, true},
      {64, 255, 129, 0, 64, 0, 129, true},
      {65, 256, 128, 32, 65, 0, 128, false},
      {100, 257, 200, 64, 100, 17, 190, true},
      {257, 96, 40, 0, 257, 0, 40, true},
      {33, 520, 47, 0, 33, 5, 47, true},
      {32, 64, 32, 0, 32, 0, 32, true, 1e-20f, 1e20f},
      {320, 520, 96, 0, 320, 32, 96, false},
      {300, 96, 64, 0, 300, 0, 64, false},
  };
  for (const Case& c : cases) {
    RunCase<2>(c, rng);
    RunCase<1>(c, rng);
  }
}

TEST(AmxGemmTest, ElementsNearTheTopOfTheFloatRangeStaySplitFinite) {
  // x near FLT_MAX, where a rounded-to-nearest hi would be infinity; w tiny so the sums stay
  // finite.
  std::vector<float> x(32 * 32, 3.3895e38f), bias(16, 0.0f);
  std::vector<uint16_t> w(16 * 32, AmxBf16Bits(1e-10f));
  std::vector<uint16_t> packed(AmxPackedXBytes(32, 32) / 2);
  PackXBf16<3>(x.data(), 32, 32, 0, 32, packed.data());
  std::vector<float> out(32 * 16), scratch(kAmxScratchFloats);
  GemmAmxBf16<EmulatedTiles, 3>(packed.data(), 32, 32, 0, 32, w.data(), nullptr, out.data(), 16, 0,
                                16, scratch.data());
  const double want = 32.0 * 3.3895e38 * AmxBf16Value(AmxBf16Bits(1e-10f));
  for (float v : out) ASSERT_NEAR(v, want, want * 1e-6);
}

using PackXFn = void (*)(const float* x, int64_t n, int64_t k, int64_t row_begin, int64_t row_end,
                         void* packed, int terms);
using AmxGemmFn = void (*)(const void* packed_x, int64_t n, int64_t k, int64_t x_begin,
                           int64_t x_end, const bf16_t* w, const float* bias, float* out,
                           int64_t ldo, int64_t row_begin, int64_t row_end, float* scratch,
                           int terms);

// A Gemm of at most kAmxFewRows x rows (x packed transposed; GemmAmxBf16Decode, or DecodeWide
// from 33 rows: w as A tiles) must give the bits that the same rows get in a larger Gemm (x
// packed as A tiles, w packed into B tiles), both computed in one call of all its rows (the
// general loop: chunks of 256 x rows, k slices) and as a short call of it (GemmAmxBf16FewRows):
// the speculative decoder's row invariance rests on it. The larger Gemm's x is the same rows
// with 300 - n rows of other values below. Shapes: a partial last weight pair (m % 32), k past
// the whole steps and past one slice, row ranges from 32; each with 3, 2 and 1 terms of x
// (MatmulPrecision).
void ExpectDecodeLoopGivesTheBitsOfALargerGemm(PackXFn pack, AmxGemmFn gemm) {
  std::mt19937 rng(17);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int terms = 3; terms >= 1; --terms) {
    for (auto [n, k, m, x_begin] : {std::array<int64_t, 4>{1, 64, 32, 0},
                                    {17, 70, 50, 0},
                                    {32, 256, 64, 0},
                                    {40, 96, 129, 32},
                                    {64, 255, 48, 0},
                                    {64, 512, 100, 32},
                                    {48, 300, 40, 0}}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " k=" + std::to_string(k) +
                   " m=" + std::to_string(m) + " x from " + std::to_string(x_begin) + " terms " +
                   std::to_string(terms));
      constexpr int64_t big = 300;
      std::vector<float> x(big * k), bias(m);
      std::vector<uint16_t> w(m * k);
      for (float& v : x) v = dist(rng);
      for (uint16_t& v : w) v = AmxBf16Bits(dist(rng));
      for (float& v : bias) v = dist(rng);
      std::vector<uint16_t> packed_small(AmxPackedXBytes(n, k) / 2),
          packed_big(AmxPackedXBytes(big, k) / 2);
      pack(x.data(), n, k, 0, AmxPackedRows(n), packed_small.data(), terms);
      pack(x.data(), big, k, 0, AmxPackedRows(big), packed_big.data(), terms);
      std::vector<float> got(big * m, 0.0f), whole(big * m, 0.0f), short_call(big * m, 0.0f),
          scratch(kAmxScratchFloats);
      const bf16_t* wb = reinterpret_cast<const bf16_t*>(w.data());
      gemm(packed_small.data(), n, k, x_begin, n, wb, bias.data(), got.data(), m, 0, m,
           scratch.data(), terms);
      gemm(packed_big.data(), big, k, 0, big, wb, bias.data(), whole.data(), m, 0, m,
           scratch.data(), terms);
      gemm(packed_big.data(), big, k, x_begin, n, wb, bias.data(), short_call.data(), m, 0, m,
           scratch.data(), terms);
      const size_t from = x_begin * m, bytes = (n - x_begin) * m * sizeof(float);
      EXPECT_EQ(std::memcmp(got.data() + from, whole.data() + from, bytes), 0);
      EXPECT_EQ(std::memcmp(got.data() + from, short_call.data() + from, bytes), 0);
    }
  }
}

void EmulatedPackX(const float* x, int64_t n, int64_t k, int64_t row_begin, int64_t row_end,
                   void* packed, int terms);
void EmulatedGemm(const void* packed_x, int64_t n, int64_t k, int64_t x_begin, int64_t x_end,
                  const bf16_t* w, const float* bias, float* out, int64_t ldo, int64_t row_begin,
                  int64_t row_end, float* scratch, int terms);

TEST(AmxGemmTest, TheDecodeLoopsGiveTheBitsOfALargerGemm) {
  ExpectDecodeLoopGivesTheBitsOfALargerGemm(&EmulatedPackX, &EmulatedGemm);
}

#if defined(__x86_64__)
TEST(AmxGemmTest, OnTheUnitTheDecodeLoopsGiveTheBitsOfALargerGemm) {
  if (!CpuHasIsa(Isa::kAmx)) GTEST_SKIP() << "AMX unusable here: " << AmxUnavailableReason();
  ExpectDecodeLoopGivesTheBitsOfALargerGemm(&internal::AmxPackX, &internal::AmxGemmBf16);
}
#endif

void EmulatedPackX(const float* x, int64_t n, int64_t k, int64_t row_begin, int64_t row_end,
                   void* packed, int terms) {
  uint16_t* p = static_cast<uint16_t*>(packed);
  switch (terms) {
    case 1:
      return PackXBf16<1>(x, n, k, row_begin, row_end, p);
    case 2:
      return PackXBf16<2>(x, n, k, row_begin, row_end, p);
    default:
      return PackXBf16<3>(x, n, k, row_begin, row_end, p);
  }
}
std::atomic<int64_t> emulated_calls{0};
std::atomic<int> emulated_terms{0};  // of the last emulated Gemm
void EmulatedGemm(const void* packed_x, int64_t n, int64_t k, int64_t x_begin, int64_t x_end,
                  const bf16_t* w, const float* bias, float* out, int64_t ldo, int64_t row_begin,
                  int64_t row_end, float* scratch, int terms) {
  emulated_calls.fetch_add(1);
  emulated_terms.store(terms);
  GemmAmxBf16Terms<EmulatedTiles>(terms, static_cast<const uint16_t*>(packed_x), n, k, x_begin,
                                  x_end, reinterpret_cast<const uint16_t*>(w), bias, out, ldo,
                                  row_begin, row_end, scratch);
}

// The backend's side of the AMX path (x packed once per group by the pool, 2-D tiles, the
// per-thread scratch, BF16 members beside F32 ones) with the model in place of the unit: a table
// that is this CPU's plus the emulated kernels.
TEST(AmxGemmTest, TheBackendRunsBf16GroupsThroughTheTileKernels) {
  KernelTable table = KernelsFor(CpuHasIsa(Isa::kAvx2) ? Isa::kAvx2 : Isa::kScalar);
  table.pack_x_bf16 = &EmulatedPackX;
  table.gemm_amx_bf16 = &EmulatedGemm;
  table.float_small_n_max = kGemmSmallNMax;  // the AMX table's crossover for F32 and F16
  auto created = CpuBackend::Create({.num_threads = 3, .kernels = &table});
  ASSERT_TRUE(created.ok()) << created.status();
  CpuBackend& backend = **created;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (auto [n, k, m] : {std::array<int64_t, 3>{12, 64, 70},
                         {17, 64, 70},
                         {33, 70, 130},
                         {64, 96, 300},
                         {300, 40, 140},
                         {520, 64, 72},
                         {40, 40, 1100}}) {
    SCOPED_TRACE("n=" + std::to_string(n) + " k=" + std::to_string(k) + " m=" + std::to_string(m));
    ASSERT_GT(n, table.SmallNMax(DType::kBF16));
    ASSERT_GT(m, kGemmSkinnyRows);  // thinner weights always take the decode kernels
    std::vector<float> x(n * k), w32(m * k), bias(m), out_b(n * m, 0.0f), out_f(n * m, 0.0f);
    std::vector<bf16_t> wb(m * k);
    for (float& v : x) v = dist(rng);
    for (float& v : w32) v = dist(rng);
    for (int64_t i = 0; i < m * k; ++i) wb[i] = F32ToBf16(dist(rng));
    for (float& v : bias) v = dist(rng);
    TensorView xv(x.data(), DType::kF32, {n, k});
    const GemmOperand group[] = {
        {TensorView(wb.data(), DType::kBF16, {m, k}), TensorView(bias.data(), DType::kF32, {m}),
         TensorView(out_b.data(), DType::kF32, {n, m})},
        {TensorView(w32.data(), DType::kF32, {m, k}), TensorView(),
         TensorView(out_f.data(), DType::kF32, {n, m})},
    };
    const int64_t calls_before = emulated_calls.load();
    backend.GemmGroup(xv, group);
    EXPECT_GT(emulated_calls.load(), calls_before) << "the BF16 member did not take the AMX path";
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        double want_b = bias[j], mag_b = std::fabs(bias[j]), want_f = 0, mag_f = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          const double pb = static_cast<double>(x[i * k + kk]) * Bf16ToF32(wb[j * k + kk]);
          const double pf = static_cast<double>(x[i * k + kk]) * w32[j * k + kk];
          want_b += pb;
          mag_b += std::fabs(pb);
          want_f += pf;
          mag_f += std::fabs(pf);
        }
        const double got_b = out_b[i * m + j], got_f = out_f[i * m + j];
        if (!(std::fabs(got_b - want_b) <= std::ldexp(mag_b, -24) * (3.0 * k + 2) + 1e-30) &&
            ++bad <= 5) {
          ADD_FAILURE() << "bf16 out[" << i << ", " << j << "] = " << got_b << ", want " << want_b;
        }
        if (!(std::fabs(got_f - want_f) <= 1e-5 * mag_f + 1e-30) && ++bad <= 5) {
          ADD_FAILURE() << "f32 out[" << i << ", " << j << "] = " << got_f << ", want " << want_f;
        }
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

// One BF16 Gemm of 40 x rows (above every crossover) through `backend`, held to the bound of
// `terms` terms of x; returns the outputs.
std::vector<float> Bf16GemmWithinTermsBound(CpuBackend& backend, int terms) {
  constexpr int64_t n = 40;
  std::vector<float> x, w;
  const std::vector<float> out = testing::RandomBf16Gemm(backend, n, &x, &w);
  testing::ExpectWithinTermsBound(
      {n, testing::kRandomGemmK, testing::kRandomGemmM, 0, n, 0, testing::kRandomGemmM, false},
      terms, x, w, {}, out, 0.0f);
  return out;
}

constexpr std::pair<MatmulPrecision, int> kPrecisionTerms[] = {
    {MatmulPrecision::kHighest, 3}, {MatmulPrecision::kHigh, 2}, {MatmulPrecision::kMedium, 1}};

// CpuBackendOptions::matmul_precision reaches the tile kernels as their number of terms, and
// each precision gives other outputs than the last (so no setting is silently ignored).
TEST(AmxGemmTest, TheBackendRunsTheTileKernelsAtItsMatmulPrecision) {
  KernelTable table = KernelsFor(CpuHasIsa(Isa::kAvx2) ? Isa::kAvx2 : Isa::kScalar);
  table.pack_x_bf16 = &EmulatedPackX;
  table.gemm_amx_bf16 = &EmulatedGemm;
  std::vector<float> previous;
  for (auto [precision, terms] : kPrecisionTerms) {
    SCOPED_TRACE(std::string(MatmulPrecisionName(precision)));
    auto created =
        CpuBackend::Create({.num_threads = 2, .kernels = &table, .matmul_precision = precision});
    ASSERT_TRUE(created.ok()) << created.status();
    const std::vector<float> out = Bf16GemmWithinTermsBound(**created, terms);
    EXPECT_EQ(emulated_terms.load(), terms);
    if (!previous.empty()) {
      EXPECT_NE(out, previous);
    }
    previous = out;
  }
}

TEST(AmxGemmTest, OnTheUnitTheBackendRunsTheTileGemmAtItsMatmulPrecision) {
  if (!CpuHasIsa(Isa::kAmx)) GTEST_SKIP() << "AMX unusable here: " << AmxUnavailableReason();
  std::vector<float> previous;
  for (auto [precision, terms] : kPrecisionTerms) {
    SCOPED_TRACE(std::string(MatmulPrecisionName(precision)));
    auto created =
        CpuBackend::Create({.num_threads = 2, .isa = Isa::kAmx, .matmul_precision = precision});
    ASSERT_TRUE(created.ok()) << created.status();
    const std::vector<float> out = Bf16GemmWithinTermsBound(**created, terms);
    if (!previous.empty()) {
      EXPECT_NE(out, previous);
    }
    previous = out;
  }
}

TEST(MatmulPrecisionTest, NamesParseAndAnythingElseIsRefusedByName) {
  for (auto [precision, terms] : kPrecisionTerms) {
    const absl::StatusOr<MatmulPrecision> parsed =
        ParseMatmulPrecision(MatmulPrecisionName(precision));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, precision);
  }
  for (const char* bad : {"", "Highest", "low", "bf16", "highest "}) {
    const absl::StatusOr<MatmulPrecision> parsed = ParseMatmulPrecision(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(parsed.status().message().find(std::string("\"") + bad + "\""), std::string::npos)
        << parsed.status();
  }
}

#if defined(__x86_64__)
// The hardware path's packers (AVX-512 registers) against the plain ones above, bit for bit: x
// with every kind of float the split treats apart, w with whole and partial tiles and steps.
TEST(AmxPackTest, VectorPackersWriteThePlainPackersBits) {
  if (!CpuHasIsa(Isa::kAvx512)) GTEST_SKIP() << "no AVX-512 F/BW/VL here";
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> bits;
  std::normal_distribution<float> dist(0.0f, 3.0f);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::min(),
                            3.3895314e38f};  // rounds to infinity as a bf16
  for (auto [n, k] :
       {std::pair<int64_t, int64_t>{1, 1}, {5, 31}, {16, 32}, {17, 33}, {40, 100}, {33, 256}}) {
    SCOPED_TRACE("n=" + std::to_string(n) + " k=" + std::to_string(k));
    std::vector<float> x(n * k);
    for (int64_t i = 0; i < n * k; ++i) {
      const uint32_t pick = bits(rng) % 8;
      if (pick == 0) {
        x[i] = specials[bits(rng) % std::size(specials)];
      } else if (pick == 1) {
        const uint32_t u = bits(rng);
        std::memcpy(&x[i], &u, 4);  // any bit pattern, NaNs with payloads included
      } else {
        x[i] = dist(rng);
      }
    }
    const int64_t rows = AmxPackedRows(n), half = rows / 2 / 16 * 16;
    for (int terms = 1; terms <= 3; ++terms) {
      std::vector<uint16_t> want(AmxPackedXBytes(n, k) / 2, 0x5555), got(want.size(), 0x5555);
      EmulatedPackX(x.data(), n, k, 0, rows, want.data(), terms);
      internal::AmxPackX(x.data(), n, k, 0, half, got.data(), terms);
      internal::AmxPackX(x.data(), n, k, half, rows, got.data(), terms);
      EXPECT_EQ(got, want) << terms << " terms";
    }
  }
  for (auto [m, k, c0, nc, s0, ns] : {std::array<int64_t, 6>{16, 32, 0, 16, 0, 1},
                                      {40, 100, 3, 37, 0, 4},
                                      {64, 256, 0, 64, 2, 6},
                                      {130, 96, 16, 100, 1, 2},
                                      {48, 300, 32, 16, 8, 2}}) {
    SCOPED_TRACE("m=" + std::to_string(m) + " k=" + std::to_string(k) + " c0=" +
                 std::to_string(c0) + " nc=" + std::to_string(nc) + " s0=" + std::to_string(s0));
    std::vector<uint16_t> w(m * k);
    for (uint16_t& v : w) v = static_cast<uint16_t>(bits(rng));
    const int64_t ctiles = AmxRoundUp(nc, 2 * kAmxTileRows) / kAmxTileRows;
    std::vector<uint32_t> want(kAmxBTilesWords, 0x55555555u), got(want.size(), 0x55555555u);
    PackWBf16(w.data(), k, c0, nc, ctiles, s0, ns, want.data());
    internal::AmxPackW(reinterpret_cast<const bf16_t*>(w.data()), k, c0, nc, ctiles, s0, ns,
                       got.data());
    EXPECT_EQ(got, want);
  }
}
#endif

TEST(AmxAvailabilityTest, TheIsaIsUsableExactlyWhenNoReasonIsGiven) {
  const bool usable = CpuHasIsa(Isa::kAmx);
  EXPECT_EQ(usable, AmxUnavailableReason().empty()) << AmxUnavailableReason();
  const KernelTable& table = KernelsFor(Isa::kAmx);
  if (usable) {
    EXPECT_EQ(table.isa, Isa::kAmx);
    EXPECT_NE(table.gemm_amx_bf16, nullptr);
    EXPECT_EQ(BestIsa(), Isa::kAmx);
  } else {
    GTEST_LOG_(INFO) << "AMX unusable here: " << AmxUnavailableReason();
    EXPECT_NE(BestIsa(), Isa::kAmx);
  }
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Vnni}) {
    EXPECT_EQ(KernelsFor(isa).gemm_amx_bf16, nullptr) << IsaName(isa);
  }
}

// A self-test that ran and got wrong numbers is a kernel bug (or a faulty unit), not a CPU without
// AMX: it must fail here. Otherwise the engine falls back to the AVX-512 kernels at run time and
// every on-unit test above skips, so a broken tile kernel would pass the suite unseen. (No unit,
// no permission, or a tile instruction that raises SIGILL still skip.)
TEST(AmxAvailabilityTest, TheSelfTestsOnTheUnitDoNotFail) {
  for (const std::string_view reason : {AmxUnavailableReason(), AmxInt8UnavailableReason()}) {
    EXPECT_EQ(reason.find("self-test Gemm"), std::string_view::npos) << reason;
  }
  if (!CpuHasIsa(Isa::kAmx)) GTEST_SKIP() << "AMX unusable here: " << AmxUnavailableReason();
}

// The AMX table takes its quantized Gemms from the AMX-INT8 file exactly when no reason is given
// against it (CPUID, AVX512_VNNI and the self-test on the unit): otherwise they are the VNNI
// table's (or AVX-512's) own.
TEST(AmxAvailabilityTest, TheInt8TilesAreUsedExactlyWhenNoReasonIsGiven) {
  const std::string_view reason = AmxInt8UnavailableReason();
  if (!CpuHasIsa(Isa::kAmx)) {
    EXPECT_FALSE(reason.empty());
    GTEST_SKIP() << "AMX unusable here: " << AmxUnavailableReason();
  }
  const KernelTable& amx = KernelsFor(Isa::kAmx);
  const KernelTable& base =
      KernelsFor(CpuHasIsa(Isa::kAvx512Vnni) ? Isa::kAvx512Vnni : Isa::kAvx512);
  if (reason.empty()) {
    EXPECT_NE(amx.gemm_q4_0, base.gemm_q4_0);
    EXPECT_NE(amx.gemm_q4_1, base.gemm_q4_1);
    EXPECT_NE(amx.gemm_q4_k_x16, base.gemm_q4_k_x16);
    EXPECT_NE(amx.gemm_q5_k_x16, base.gemm_q5_k_x16);
    // The tiles read Q4_0 and Q4_1 in the file's layout: no interleaved copies of them.
    EXPECT_EQ(amx.gemm_q4_0_x16, nullptr);
    EXPECT_EQ(amx.gemm_q4_1_x16, nullptr);
  } else {
    GTEST_LOG_(INFO) << "AMX-INT8 tiles unused here: " << reason;
    EXPECT_EQ(amx.gemm_q4_0, base.gemm_q4_0);
    EXPECT_EQ(amx.gemm_q4_1, base.gemm_q4_1);
    EXPECT_EQ(amx.gemm_q4_k_x16, base.gemm_q4_k_x16);
    EXPECT_EQ(amx.gemm_q5_k_x16, base.gemm_q5_k_x16);
    EXPECT_EQ(amx.gemm_q4_0_x16, base.gemm_q4_0_x16);
    EXPECT_EQ(amx.gemm_q4_1_x16, base.gemm_q4_1_x16);
  }
}

}  // namespace
}  // namespace modserve::backend::cpu
