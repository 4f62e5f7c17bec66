// Attention on the matrix unit (KernelTable::attn_block_bf16, kernels_amx.cc): the kernel against
// a double-precision softmax at each bf16 term count, a q-row's outputs against the same q-row in
// other blocks (bit for bit), and the CPU backend's rows against the same rows in other runs and
// alone (bit for bit) and at each matmul precision. Every case skips on CPUs without usable
// AMX; the conformance suite holds the backend's prefill runs to the reference op everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cpu/kernels.h"

namespace modserve::backend::cpu {
namespace {

// The split's keys and values of one kv head, and a block's q rows.
struct Problem {
  int64_t rows, group, head_dim, kv_len0, key_begin, num_keys;
  std::vector<float> q;      // [rows, group, head_dim]
  std::vector<bf16_t> k, v;  // [num_keys, head_dim]
};

Problem MakeProblem(std::mt19937& rng, int64_t rows, int64_t group, int64_t head_dim,
                    int64_t kv_len0, int64_t key_begin, int64_t num_keys) {
  Problem p{rows, group, head_dim, kv_len0, key_begin, num_keys, {}, {}, {}};
  std::normal_distribution<float> dist(0.0f, 1.0f);
  p.q.resize(rows * group * head_dim);
  for (float& x : p.q) x = dist(rng);
  p.k.resize(num_keys * head_dim);
  p.v.resize(num_keys * head_dim);
  // Keys scaled by 2: peaky scores, so the max subtraction matters.
  for (bf16_t& x : p.k) x = F32ToBf16(2.0f * dist(rng));
  for (bf16_t& x : p.v) x = F32ToBf16(dist(rng));
  return p;
}

struct Outputs {
  std::vector<float> m, l, acc;
};

// The kernel on q-rows [r0, rows) of p: the block that starts r0 rows later.
Outputs RunKernel(const Problem& p, int terms, int64_t r0 = 0) {
  const KernelTable& table = KernelsFor(Isa::kAmx);
  std::vector<const bf16_t*> keys(p.num_keys), values(p.num_keys);
  for (int64_t j = 0; j < p.num_keys; ++j) {
    keys[j] = p.k.data() + j * p.head_dim;
    values[j] = p.v.data() + j * p.head_dim;
  }
  const int64_t f_count = (p.rows - r0) * p.group;
  Outputs out{std::vector<float>(f_count, 7.0f), std::vector<float>(f_count, 7.0f),
              std::vector<float>(f_count * p.head_dim, 7.0f)};
  const size_t bytes = AmxAttnScratchBytes(p.head_dim);
  std::unique_ptr<void, decltype(&std::free)> scratch(std::aligned_alloc(64, bytes), &std::free);
  // Garbage in the scratch: the kernel must not read what it did not write.
  std::memset(scratch.get(), 0xff, bytes);
  const AmxAttnBlock block = {.q = p.q.data() + r0 * p.group * p.head_dim,
                              .ldq = p.group * p.head_dim,
                              .rows = p.rows - r0,
                              .group = p.group,
                              .head_dim = p.head_dim,
                              .kv_len0 = p.kv_len0 + r0,
                              .key_begin = p.key_begin,
                              .num_keys = p.num_keys,
                              .keys = keys.data(),
                              .values = values.data(),
                              .scale = 1.0f / std::sqrt(static_cast<float>(p.head_dim)),
                              .terms = terms,
                              .m = out.m.data(),
                              .l = out.l.data(),
                              .acc = out.acc.data(),
                              .scratch = scratch.get()};
  table.attn_block_bf16(block);
  return out;
}

// Each q-row's normalised output acc / l and its max m against a double softmax over the keys the
// row sees: |error| <= tol * max(1, max |v|) for the outputs, tol * max(1, |m|) for m; a row that
// sees no key has m = -inf and l = 0.
void ExpectMatchesDouble(const Problem& p, const Outputs& got, double tol,
                         const std::string& what) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.head_dim));
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t seen = std::clamp<int64_t>(p.kv_len0 + r - p.key_begin, 0, p.num_keys);
    for (int64_t h = 0; h < p.group; ++h) {
      const int64_t f = r * p.group + h;
      const std::string where =
          what + " q-row " + std::to_string(f) + " (sees " + std::to_string(seen) + " keys)";
      if (seen == 0) {
        EXPECT_EQ(got.m[f], -INFINITY) << where;
        EXPECT_EQ(got.l[f], 0.0f) << where;
        continue;
      }
      const float* q = p.q.data() + f * p.head_dim;
      std::vector<double> s(seen);
      double mx = -INFINITY;
      for (int64_t j = 0; j < seen; ++j) {
        double dot = 0.0;
        for (int64_t d = 0; d < p.head_dim; ++d) {
          dot += static_cast<double>(q[d]) * Bf16ToF32(p.k[j * p.head_dim + d]);
        }
        s[j] = scale * dot;
        mx = std::max(mx, s[j]);
      }
      EXPECT_NEAR(got.m[f], mx, tol * std::max(1.0, std::fabs(mx))) << where;
      double l = 0.0;
      std::vector<double> o(p.head_dim, 0.0);
      for (int64_t j = 0; j < seen; ++j) {
        const double e = std::exp(s[j] - mx);
        l += e;
        for (int64_t d = 0; d < p.head_dim; ++d) o[d] += e * Bf16ToF32(p.v[j * p.head_dim + d]);
      }
      // l is relative to the kernel's own max, which may differ from mx within tol.
      EXPECT_NEAR(got.l[f] * std::exp(static_cast<double>(got.m[f]) - mx), l, tol * l) << where;
      for (int64_t d = 0; d < p.head_dim; ++d) {
        EXPECT_NEAR(got.acc[f * p.head_dim + d] / got.l[f], o[d] / l, tol * 4.0)
            << where << " dim " << d;
      }
    }
  }
}

bool AmxUsable() { return CpuHasIsa(Isa::kAmx) && KernelsFor(Isa::kAmx).attn_block_bf16; }

TEST(AmxAttentionTest, OnTheUnitEachTermCountMatchesADoubleSoftmaxToItsPrecision) {
  if (!AmxUsable()) GTEST_SKIP() << "AMX unusable here: " << AmxUnavailableReason();
  // Terms of q and of the probabilities: 3 keep every product exact, so only the f32 sums round
  // (about 1e-7 relative to |s| ~ 10 and |v| ~ 4 here, against 2e-6); 2 carry q and p to 2^-17
  // relative (2e-5, which 3 terms with one dropped in the scores fail); 1 (bf16 as it stands)
  // to 2^-9, so a score moves by up to ~|s| * 2^-9 and an output by about as much.
  const std::pair<int, double> kTermsTol[] = {{3, 2e-6}, {2, 2e-5}, {1, 2e-2}};
  std::mt19937 rng(2024);
  struct Shape {
    int64_t rows, group, head_dim, kv_len0, key_begin, num_keys;
  };
  // A split that starts a sequence (rows see 1, 2, ... keys), one past the first 256 keys whose
  // first rows see none, one of 1 key, and partial key tiles (17, 100) at MQA, odd GQA and 8.
  const Shape shapes[] = {{40, 1, 64, 1, 0, 40},    {32, 3, 64, 231, 256, 74},
                          {5, 8, 32, 1, 0, 5},      {33, 8, 64, 240, 0, 256},
                          {17, 2, 128, 84, 0, 100}, {3, 5, 256, 17, 0, 17}};
  for (const Shape& sh : shapes) {
    const Problem p =
        MakeProblem(rng, sh.rows, sh.group, sh.head_dim, sh.kv_len0, sh.key_begin, sh.num_keys);
    for (auto [terms, tol] : kTermsTol) {
      ExpectMatchesDouble(p, RunKernel(p, terms), tol,
                          "terms " + std::to_string(terms) + " rows " + std::to_string(sh.rows) +
                              " group " + std::to_string(sh.group) + " hd " +
                              std::to_string(sh.head_dim));
    }
  }
}

TEST(AmxAttentionTest, OnTheUnitAQRowsOutputsDoNotDependOnTheBlockAroundIt) {
  if (!AmxUsable()) GTEST_SKIP() << "AMX unusable here: " << AmxUnavailableReason();
  std::mt19937 rng(77);
  // Group 3: starting the block 5 rows later moves every q-row to another tile and tile row.
  const Problem p = MakeProblem(rng, 37, 3, 64, 200, 0, 236);
  for (int terms : {1, 3}) {
    const Outputs whole = RunKernel(p, terms), later = RunKernel(p, terms, 5);
    const int64_t skip = 5 * p.group;
    EXPECT_EQ(0, std::memcmp(later.m.data(), whole.m.data() + skip, later.m.size() * 4));
    EXPECT_EQ(0, std::memcmp(later.l.data(), whole.l.data() + skip, later.l.size() * 4));
    EXPECT_EQ(0, std::memcmp(later.acc.data(), whole.acc.data() + skip * p.head_dim,
                             later.acc.size() * 4))
        << "terms " << terms;
  }
}

// One sequence's prompt rows kv_len0 .. kv_len0 + rows - 1 through CpuBackend::Attention with
// bf16 K/V in shuffled pages of 16 keys: the output [rows, n_heads * head_dim].
struct BackendCase {
  AttentionParams params{.n_heads = 8,
                         .n_kv_heads = 2,
                         .head_dim = 64,
                         .block_size = 16,
                         .scale = 0.125f,
                         .prompt = true};
  int64_t num_pages = 40;  // 640 keys
  std::vector<float> q;    // [640, n_heads, head_dim]: row of kv length L is q[L - 1]
  std::vector<bf16_t> pool;
  std::vector<int32_t> pages;

  explicit BackendCase(std::mt19937& rng) {
    std::normal_distribution<float> dist(0.0f, 1.0f);
    q.resize(num_pages * 16 * params.n_heads * params.head_dim);
    for (float& x : q) x = dist(rng);
    pool.resize(num_pages * 2 * params.n_kv_heads * 16 * params.head_dim);
    for (bf16_t& x : pool) x = F32ToBf16(2.0f * dist(rng));
    pages.resize(num_pages);
    for (int32_t i = 0; i < num_pages; ++i) pages[i] = i;
    std::shuffle(pages.begin(), pages.end(), rng);
  }

  std::vector<float> Run(Backend& backend, int32_t kv_len0, int32_t rows) {
    const int64_t width = int64_t{params.n_heads} * params.head_dim;
    std::vector<float> qr(q.begin() + (kv_len0 - 1) * width,
                          q.begin() + (kv_len0 - 1 + rows) * width);
    std::vector<int32_t> seq(rows, 0), len(rows);
    for (int32_t r = 0; r < rows; ++r) len[r] = kv_len0 + r;
    std::vector<float> out(rows * width, 0.0f);
    backend.Attention(
        params, TensorView(qr.data(), DType::kF32, {rows, params.n_heads, params.head_dim}),
        TensorView(pool.data(), DType::kBF16,
                   {num_pages, 2 * params.n_kv_heads, 16, params.head_dim}),
        TensorView(pages.data(), DType::kI32, {1, num_pages}),
        TensorView(seq.data(), DType::kI32, {rows}), TensorView(len.data(), DType::kI32, {rows}),
        TensorView(out.data(), DType::kF32, {rows, width}));
    return out;
  }
};

TEST(AmxAttentionTest, OnTheUnitTheBackendGivesAPromptRowTheSameBitsInEveryCall) {
  if (!AmxUsable()) GTEST_SKIP() << "AMX unusable here: " << AmxUnavailableReason();
  auto created = CpuBackend::Create({.num_threads = 2, .isa = Isa::kAmx});
  ASSERT_TRUE(created.ok()) << created.status();
  std::mt19937 rng(5);
  BackendCase c(rng);
  const int64_t width = int64_t{c.params.n_heads} * c.params.head_dim;
  // Rows 200..299 as one run (blocks from 200, 232, 264, 296; the split boundary at 256), rows
  // 243..299 as another (blocks from 243, 275), and single rows as the prefix cache's short
  // steps send them: same bits for every shared row.
  const std::vector<float> whole = c.Run(**created, 200, 100), later = c.Run(**created, 243, 57);
  for (int64_t r = 0; r < 57; ++r) {
    EXPECT_EQ(0, std::memcmp(later.data() + r * width, whole.data() + (r + 43) * width,
                             width * sizeof(float)))
        << "row of kv length " << 243 + r;
  }
  for (int32_t len : {200, 231, 232, 256, 257, 299}) {
    const std::vector<float> one = c.Run(**created, len, 1);
    EXPECT_EQ(0, std::memcmp(one.data(), whole.data() + (len - 200) * width, width * sizeof(float)))
        << "row of kv length " << len << " alone";
  }
}

TEST(AmxAttentionTest, OnTheUnitRowsNotOfThePromptKeepTheRowKernels) {
  if (!AmxUsable()) GTEST_SKIP() << "AMX unusable here: " << AmxUnavailableReason();
  // Decode, draft and verification rows (AttentionParams::prompt false) get the AVX-512 row
  // kernels' bits on the AMX table, so a verification row gets a one-row decode step's bits;
  // prompt rows get the tiles' (other) bits.
  auto amx = CpuBackend::Create({.num_threads = 2, .isa = Isa::kAmx});
  auto vector = CpuBackend::Create(
      {.num_threads = 2, .isa = CpuHasIsa(Isa::kAvx512Vnni) ? Isa::kAvx512Vnni : Isa::kAvx512});
  ASSERT_TRUE(amx.ok() && vector.ok());
  std::mt19937 rng(8);
  BackendCase c(rng);
  c.params.prompt = false;
  EXPECT_EQ(c.Run(**amx, 200, 60), c.Run(**vector, 200, 60));
  const std::vector<float> rows = c.Run(**amx, 200, 60);
  c.params.prompt = true;
  EXPECT_NE(c.Run(**amx, 200, 60), rows);
}

TEST(AmxAttentionTest, OnTheUnitTheBackendRunsAttentionAtItsMatmulPrecision) {
  if (!AmxUsable()) GTEST_SKIP() << "AMX unusable here: " << AmxUnavailableReason();
  std::mt19937 rng(6);
  BackendCase c(rng);
  std::vector<std::vector<float>> outs;
  for (MatmulPrecision precision :
       {MatmulPrecision::kHighest, MatmulPrecision::kHigh, MatmulPrecision::kMedium}) {
    auto created =
        CpuBackend::Create({.num_threads = 2, .isa = Isa::kAmx, .matmul_precision = precision});
    ASSERT_TRUE(created.ok()) << created.status();
    outs.push_back(c.Run(**created, 1, 300));
  }
  // Each setting gives other numbers than the next, and all stay near highest's.
  EXPECT_NE(outs[0], outs[1]);
  EXPECT_NE(outs[1], outs[2]);
  double max_diff = 0.0;
  for (size_t i = 0; i < outs[0].size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(outs[2][i]) - outs[0][i]));
  }
  EXPECT_LT(max_diff, 0.1);
}

}  // namespace
}  // namespace modserve::backend::cpu
