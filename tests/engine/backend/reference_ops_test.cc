// Checks the oracle itself: reference ops against numbers from the PyTorch reference
// (tools/modref) and against independent fp64 computations written here without paging.
#include "engine/backend/cpu/reference_ops.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/common/dtype.h"
#include "engine/common/tensor_view.h"
#include "gtest/gtest.h"

namespace modserve::backend::cpu {
namespace {

// f32 results against fp64 recomputations of the same formula: a few f32 roundings of O(1)
// values, or f32 sums of ~100 O(1) terms.
constexpr float kF32VsF64Tol = 2e-5f;

TEST(ReferenceOpsTest, RopeMatchesPyTorchReference) {
  // Produced by tools/modref/model.py rope() with theta 10000, head_dim 8, positions 3 and 70001:
  //   x = [0.5, -1.25, 2.0, 0.75, -0.3, 1.5, -2.5, 0.125] for both tokens.
  const float want[2][8] = {
      {-0.4526602625846863f, -1.637450933456421f, 2.0740888118743896f, 0.7496216893196106f,
       0.3675577640533447f, 1.063604474067688f, -2.4388842582702637f, 0.12724943459033966f},
      {0.5094821453094482f, -1.894494891166687f, -0.3501228094100952f, 0.3775932788848877f,
       -0.2835981547832489f, 0.47264063358306885f, 3.1823596954345703f, 0.6599608063697815f}};
  const float x[8] = {0.5f, -1.25f, 2.0f, 0.75f, -0.3f, 1.5f, -2.5f, 0.125f};
  std::vector<float> q(16), k(16), v(16, 0.0f), pool(2 * 2 * 2 * 8, 0.0f);
  for (int t = 0; t < 2; ++t) {
    for (int d = 0; d < 8; ++d) q[t * 8 + d] = k[t * 8 + d] = x[d];
  }
  std::vector<int32_t> positions = {3, 70001}, slots = {1, 2};
  const RopeParams p{
      .n_heads = 1, .n_kv_heads = 1, .head_dim = 8, .rope_theta = 10000.0, .block_size = 2};
  reference::RopeAndAppendKv(
      p, TensorView(q.data(), DType::kF32, {2, 1, 8}), TensorView(k.data(), DType::kF32, {2, 1, 8}),
      TensorView(v.data(), DType::kF32, {2, 1, 8}), TensorView(positions.data(), DType::kI32, {2}),
      TensorView(slots.data(), DType::kI32, {2}),
      TensorView(pool.data(), DType::kF32, {2, 2, 2, 8}));
  for (int t = 0; t < 2; ++t) {
    for (int d = 0; d < 8; ++d) {
      EXPECT_NEAR(q[t * 8 + d], want[t][d], 1e-6f) << "token " << t << " dim " << d;
      EXPECT_EQ(k[t * 8 + d], q[t * 8 + d]);
    }
  }
  // Slot 1 = page 0 offset 1; slot 2 = page 1 offset 0. Page layout [K (1 head, 2 slots), V ...].
  for (int d = 0; d < 8; ++d) {
    EXPECT_EQ(pool[(0 * 2 + 0) * 16 + 1 * 8 + d], k[d]);
    EXPECT_EQ(pool[(1 * 2 + 0) * 16 + 0 * 8 + d], k[8 + d]);
  }
}

TEST(ReferenceOpsTest, GeluMatchesTorchExactGelu) {
  // torch.nn.GELU()(torch.tensor([-3.0, -0.5, 0.0, 0.7, 2.5])).
  std::vector<float> x = {-3.0f, -0.5f, 0.0f, 0.7f, 2.5f};
  const float want[5] = {-0.004049867391586304f, -0.1542687863111496f, 0.0f, 0.5306254625320435f,
                         2.48447585105896f};
  reference::Activation({.kind = ActivationKind::kGelu}, TensorView(x.data(), DType::kF32, {1, 5}));
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(x[i], want[i], 1e-6f) << i;
}

TEST(ReferenceOpsTest, GemmMatchesFp64DotProducts) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist;
  const int64_t n = 3, m = 5, k = 97;
  std::vector<float> x(n * k), bias(m), out(n * m);
  std::vector<bf16_t> w(m * k);
  for (float& v : x) v = dist(rng);
  for (bf16_t& v : w) v = F32ToBf16(dist(rng));
  std::vector<bf16_t> bias_bf16(m);
  for (bf16_t& v : bias_bf16) v = F32ToBf16(dist(rng));
  reference::Gemm(
      TensorView(x.data(), DType::kF32, {n, k}), TensorView(w.data(), DType::kBF16, {m, k}),
      TensorView(bias_bf16.data(), DType::kBF16, {m}), TensorView(out.data(), DType::kF32, {n, m}));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t r = 0; r < m; ++r) {
      double want = Bf16ToF32(bias_bf16[r]);
      for (int64_t c = 0; c < k; ++c) want += double{x[i * k + c]} * Bf16ToF32(w[r * k + c]);
      EXPECT_NEAR(out[i * m + r], want, kF32VsF64Tol * 10) << i << " " << r;
    }
  }
}

TEST(ReferenceOpsTest, PagedAttentionMatchesContiguousFp64Attention) {
  // Two sequences with pages in reverse order and GQA (4 q heads on 2 kv heads); the expected
  // output is softmax(q k^T * scale) v over the contiguous keys, computed in fp64.
  const int n_heads = 4, n_kv = 2, hd = 6, bs = 3, num_pages = 6;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  std::vector<float> pool(num_pages * 2 * n_kv * bs * hd);
  for (float& v : pool) v = dist(rng);
  std::vector<int32_t> table = {5, 3, 1, 4, 2, 0};  // [2 seqs, 3 pages]
  std::vector<int32_t> row_seq = {0, 1, 1}, row_len = {8, 2, 9};
  std::vector<float> q(3 * n_heads * hd), out(3 * n_heads * hd);
  for (float& v : q) v = dist(rng);
  const float scale = 0.4f;
  reference::Attention(
      {.n_heads = n_heads, .n_kv_heads = n_kv, .head_dim = hd, .block_size = bs, .scale = scale},
      TensorView(q.data(), DType::kF32, {3, n_heads, hd}),
      TensorView(pool.data(), DType::kF32, {num_pages, 2 * n_kv, bs, hd}),
      TensorView(table.data(), DType::kI32, {2, 3}), TensorView(row_seq.data(), DType::kI32, {3}),
      TensorView(row_len.data(), DType::kI32, {3}),
      TensorView(out.data(), DType::kF32, {3, n_heads * hd}));
  for (int i = 0; i < 3; ++i) {
    for (int h = 0; h < n_heads; ++h) {
      const int g = h / (n_heads / n_kv);
      // Contiguous copies of the sequence's first row_len entries.
      std::vector<double> scores;
      std::vector<const float*> values;
      for (int j = 0; j < row_len[i]; ++j) {
        const int page = table[row_seq[i] * 3 + j / bs];
        const float* key = &pool[((page * 2 * n_kv + g) * bs + j % bs) * hd];
        values.push_back(&pool[((page * 2 * n_kv + n_kv + g) * bs + j % bs) * hd]);
        double dot = 0;
        for (int d = 0; d < hd; ++d) dot += double{q[(i * n_heads + h) * hd + d]} * key[d];
        scores.push_back(dot * scale);
      }
      double denom = 0;
      for (double s : scores) denom += std::exp(s);
      for (int d = 0; d < hd; ++d) {
        double want = 0;
        for (size_t j = 0; j < scores.size(); ++j)
          want += std::exp(scores[j]) / denom * values[j][d];
        EXPECT_NEAR(out[(i * n_heads + h) * hd + d], want, kF32VsF64Tol)
            << "row " << i << " head " << h << " dim " << d;
      }
    }
  }
}

TEST(ReferenceOpsTest, ScatterCombineFollowsDesignFormulas) {
  // x' = x + g (y - x) for "update", x' = g y for "block_output"; g = s or sigmoid(s).
  for (WeightFn fn : {WeightFn::kIdentity, WeightFn::kSigmoid}) {
    for (ScaleTarget target : {ScaleTarget::kUpdate, ScaleTarget::kBlockOutput}) {
      std::vector<float> x = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};  // [3, 2]
      std::vector<float> y = {10.0f, 20.0f};                        // [1, 2], goes to row 2
      std::vector<int32_t> idx = {2};
      std::vector<float> s = {0.25f};
      reference::ScatterCombine(
          {.weight_fn = fn, .scale_target = target}, TensorView(x.data(), DType::kF32, {3, 2}),
          TensorView(y.data(), DType::kF32, {1, 2}), TensorView(idx.data(), DType::kI32, {1}),
          TensorView(s.data(), DType::kF32, {1}));
      const double g = fn == WeightFn::kIdentity ? 0.25 : 1.0 / (1.0 + std::exp(-0.25));
      const double want0 = target == ScaleTarget::kUpdate ? 5.0 + g * (10.0 - 5.0) : g * 10.0;
      const double want1 = target == ScaleTarget::kUpdate ? 6.0 + g * (20.0 - 6.0) : g * 20.0;
      EXPECT_NEAR(x[4], want0, 1e-6);
      EXPECT_NEAR(x[5], want1, 1e-6);
      EXPECT_EQ(x[0], 1.0f);  // untouched rows stay
      EXPECT_EQ(x[3], 4.0f);
    }
  }
}

TEST(ReferenceOpsTest, ScatterCombineWithWeightOneCopiesTheBlockOutput) {
  // g = 1: the routed row becomes y bit for bit (x + (y - x) would round), whatever the target.
  for (ScaleTarget target : {ScaleTarget::kUpdate, ScaleTarget::kBlockOutput}) {
    std::vector<float> x = {1.0f, 2.0f, 3.0f, 1e8f};       // [2, 2]
    std::vector<float> y = {0.1f, 3.0f};                   // [1, 2], goes to row 1
    std::vector<int32_t> idx = {1};
    std::vector<float> s = {-7.0f};                        // not used
    reference::ScatterCombine(
        {.weight_fn = WeightFn::kOne, .scale_target = target},
        TensorView(x.data(), DType::kF32, {2, 2}), TensorView(y.data(), DType::kF32, {1, 2}),
        TensorView(idx.data(), DType::kI32, {1}), TensorView(s.data(), DType::kF32, {1}));
    EXPECT_EQ(x, (std::vector<float>{1.0f, 2.0f, 0.1f, 3.0f}));
  }
}


// Worked by hand from the definition: three sequences with rows [0, 2), [2, 5), [5, 6); rows
// 1, 2, 4 and 5 routed in. Row 2 is sequence 1's first routed row (rank 0), row 4 its second.
TEST(ReferenceOpsTest, RouteRowsGivesEachRoutedRowItsRankSlotAndKvLength) {
  std::vector<int32_t> idx = {1, 2, 4, 5}, row_seq = {0, 0, 1, 1, 1, 2},
                       row_pos = {7, 8, 30, 31, 32, 0}, cand = {100, 101, 200, 201, 202, 300},
                       first = {0, 2, 5}, base = {7, 30, 0};
  std::vector<int32_t> pos(4, -1), slots(4, -1), seq(4, -1), kv_len(4, -1);
  auto v = [](std::vector<int32_t>& d) {
    return TensorView(d.data(), DType::kI32, {static_cast<int64_t>(d.size())});
  };
  reference::RouteRows(v(idx), v(row_seq), v(row_pos), v(cand), v(first), v(base), v(pos),
                       v(slots), v(seq), v(kv_len));
  EXPECT_EQ(pos, (std::vector<int32_t>{8, 30, 32, 0}));
  EXPECT_EQ(slots, (std::vector<int32_t>{100, 200, 201, 300}));
  EXPECT_EQ(seq, (std::vector<int32_t>{0, 1, 1, 2}));
  EXPECT_EQ(kv_len, (std::vector<int32_t>{8, 31, 32, 1}));
}

}  // namespace
}  // namespace modserve::backend::cpu
