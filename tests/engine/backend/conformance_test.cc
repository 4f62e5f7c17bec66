// Backend conformance: every op of every backend (the registry's, plus the CPU backend forced to
// each kernel ISA) against the reference ops, on seeded random inputs and odd shapes.
// A backend or ISA this machine lacks is a GTEST_SKIP with the reason, never a pass.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/cpu/reference_ops.h"
#include "engine/backend/registry.h"
#include "engine/common/dtype.h"
#include "engine/common/tensor_view.h"
#include "gtest/gtest.h"
#include "tests/engine/backend/host_tensor.h"

namespace modserve::backend {
namespace {

using test_util::ExpectClose;
using test_util::HostTensor;
using test_util::Ints;
using test_util::Random;

// f32 sums over up to ~1000 terms in another order (SIMD lanes, tiles, split-K): both orders are
// within ~k * 2^-24 of the exact sum relative to the largest output; 1e-5 leaves a 10x margin.
constexpr double kAccumOrderRelTol = 1e-5;
// Ops whose fast version does the same f32 operations in the same order as the reference (RoPE,
// elementwise, copies) may still differ by one rounding in a fused or reordered step.
constexpr double kSameOrderRelTol = 1e-6;

// ---- backends under test -------------------------------------------------------------------
// "cpu", "cuda" (from the registry) and "cpu-<isa>" (the CPU backend forced to one kernel ISA).
std::vector<std::string> BackendVariants() {
  std::vector<std::string> names = CompiledBackends();
  for (cpu::Isa isa : {cpu::Isa::kScalar, cpu::Isa::kAvx2, cpu::Isa::kAvx512}) {
    names.push_back("cpu-" + std::string(cpu::IsaName(isa)));
  }
  return names;
}

class BackendConformanceTest : public ::testing::TestWithParam<std::string> {
 public:
  void SetUp() override {
    const std::string& name = GetParam();
    for (cpu::Isa isa : {cpu::Isa::kScalar, cpu::Isa::kAvx2, cpu::Isa::kAvx512}) {
      if (name != "cpu-" + std::string(cpu::IsaName(isa))) continue;
      if (!cpu::CpuHasIsa(isa)) GTEST_SKIP() << "this CPU cannot run the " << name << " kernels";
      // 3 threads on any machine, so the threaded and split-context paths always run.
      auto created = cpu::CpuBackend::Create({.num_threads = 3, .isa = isa});
      ASSERT_TRUE(created.ok()) << created.status();
      backend_ = std::move(created).value();
      return;
    }
    const std::vector<std::string> available = AvailableBackends();
    if (std::find(available.begin(), available.end(), name) == available.end()) {
      GTEST_SKIP() << "backend " << name << " is compiled in but has no usable device here";
    }
    auto created = CreateBackend(name);
    ASSERT_TRUE(created.ok()) << created.status();
    backend_ = std::move(created).value();
  }

  // A device copy of a host tensor; lives as long as the test.
  TensorView Upload(const HostTensor& host) {
    auto buffer = backend_->Allocate(host.storage.size());
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    buffers_.push_back(std::move(buffer).value());
    TensorView dst = host.MakeView(buffers_.back().data(), backend_->device());
    HostTensor copy = host;
    EXPECT_TRUE(backend_->CopyToDevice(copy.view(), dst).ok());
    return dst;
  }
  HostTensor Download(const TensorView& src, const HostTensor& like) {
    HostTensor out = like;
    EXPECT_TRUE(backend_->Synchronize().ok());
    EXPECT_TRUE(backend_->CopyToHost(src, out.view()).ok());
    return out;
  }

  std::unique_ptr<Backend> backend_;
  std::vector<DeviceBuffer> buffers_;
};

constexpr DType kStorageDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
constexpr int64_t kRowCounts[] = {1, 3, 17, 64};

TEST_P(BackendConformanceTest, EmbedMatchesReference) {
  for (DType dt : kStorageDTypes) {
    for (int64_t n : kRowCounts) {
      std::mt19937 rng(n * 7 + static_cast<int>(dt));
      HostTensor table = Random(rng, dt, {37, 67});
      std::vector<int32_t> ids(n);
      for (auto& id : ids) id = static_cast<int32_t>(rng() % 37);
      HostTensor ids_t = Ints(ids);
      HostTensor want(DType::kF32, {n, 67});
      cpu::reference::Embed(ids_t.view(), table.view(), want.view());
      TensorView out = Upload(want);
      backend_->Embed(Upload(ids_t), Upload(table), out);
      ExpectClose(Download(out, want), want, kSameOrderRelTol,
                  "Embed " + std::string(DTypeName(dt)) + " n=" + std::to_string(n));
    }
  }
}

TEST_P(BackendConformanceTest, RmsNormMatchesReferenceIncludingInPlace) {
  for (DType dt : kStorageDTypes) {
    for (int64_t n : kRowCounts) {
      for (int64_t d : {67, 1001}) {
        std::mt19937 rng(n * 131 + d + static_cast<int>(dt));
        HostTensor x = Random(rng, DType::kF32, {n, d}, 3.0f);
        HostTensor w = Random(rng, dt, {d});
        HostTensor want(DType::kF32, {n, d});
        cpu::reference::RmsNorm({.eps = 1e-5f}, x.view(), w.view(), want.view());
        const std::string what = "RmsNorm " + std::string(DTypeName(dt)) +
                                 " n=" + std::to_string(n) + " d=" + std::to_string(d);
        TensorView xd = Upload(x);
        TensorView out = Upload(want);
        backend_->RmsNorm({.eps = 1e-5f}, xd, Upload(w), out);
        ExpectClose(Download(out, want), want, kAccumOrderRelTol, what);
        backend_->RmsNorm({.eps = 1e-5f}, xd, Upload(w), xd);  // out aliases x
        ExpectClose(Download(xd, want), want, kAccumOrderRelTol, what + " in place");
      }
    }
  }
}

TEST_P(BackendConformanceTest, GemmMatchesReference) {
  // n covers both kernels (small-n up to 16, packed above) and their edges; (m, k) are odd so
  // every SIMD and tile remainder runs; m = 1 is the router.
  const std::vector<std::pair<int64_t, int64_t>> mk = {{1, 67}, {35, 67}, {130, 257}, {261, 520}};
  for (DType dt : kStorageDTypes) {
    for (int64_t n : {1, 3, 4, 16, 17, 64}) {
      for (auto [m, k] : mk) {
        for (bool with_bias : {false, true}) {
          std::mt19937 rng(n * 1000 + m * 10 + k + static_cast<int>(dt) + with_bias);
          HostTensor x = Random(rng, DType::kF32, {n, k});
          HostTensor w = Random(rng, dt, {m, k});
          HostTensor bias = with_bias ? Random(rng, dt, {m}) : HostTensor();
          HostTensor want(DType::kF32, {n, m});
          TensorView no_bias;
          cpu::reference::Gemm(x.view(), w.view(), with_bias ? bias.view() : no_bias, want.view());
          TensorView out = Upload(want);
          backend_->Gemm(Upload(x), Upload(w), with_bias ? Upload(bias) : no_bias, out);
          ExpectClose(Download(out, want), want, kAccumOrderRelTol,
                      "Gemm " + std::string(DTypeName(dt)) + " n=" + std::to_string(n) +
                          " m=" + std::to_string(m) + " k=" + std::to_string(k) +
                          (with_bias ? " +bias" : ""));
        }
      }
    }
  }
}

TEST_P(BackendConformanceTest, RopeAndAppendKvMatchesReference) {
  for (DType dt : kStorageDTypes) {
    for (int64_t n : kRowCounts) {
      for (int head_dim : {18, 64}) {
        const RopeParams p{.n_heads = 4,
                           .n_kv_heads = 2,
                           .head_dim = head_dim,
                           .rope_theta = 10000.0,
                           .block_size = 16};
        const int64_t num_pages = 9;
        std::mt19937 rng(n * 17 + head_dim + static_cast<int>(dt));
        HostTensor q = Random(rng, DType::kF32, {n, p.n_heads, head_dim});
        HostTensor k = Random(rng, DType::kF32, {n, p.n_kv_heads, head_dim});
        HostTensor v = Random(rng, DType::kF32, {n, p.n_kv_heads, head_dim});
        // Pre-filled pool: entries the op must not touch have to survive.
        HostTensor pool = Random(rng, dt, {num_pages, 2 * p.n_kv_heads, p.block_size, head_dim});
        std::vector<int32_t> all_slots(num_pages * p.block_size);
        std::iota(all_slots.begin(), all_slots.end(), 0);
        std::shuffle(all_slots.begin(), all_slots.end(), rng);
        std::vector<int32_t> slots(all_slots.begin(), all_slots.begin() + n);
        std::vector<int32_t> positions(n);
        for (auto& pos : positions) pos = static_cast<int32_t>(rng() % 40000);
        HostTensor pos_t = Ints(positions), slots_t = Ints(slots);

        HostTensor want_q = q, want_k = k, want_pool = pool;
        cpu::reference::RopeAndAppendKv(p, want_q.view(), want_k.view(), v.view(), pos_t.view(),
                                        slots_t.view(), want_pool.view());
        TensorView qd = Upload(q), kd = Upload(k), pool_d = Upload(pool);
        backend_->RopeAndAppendKv(p, qd, kd, Upload(v), Upload(pos_t), Upload(slots_t), pool_d);
        const std::string what = "Rope " + std::string(DTypeName(dt)) + " n=" + std::to_string(n) +
                                 " hd=" + std::to_string(head_dim);
        ExpectClose(Download(qd, q), want_q, kSameOrderRelTol, what + " q");
        ExpectClose(Download(kd, k), want_k, kSameOrderRelTol, what + " k");
        ExpectClose(Download(pool_d, pool), want_pool, kSameOrderRelTol, what + " pool");
      }
    }
  }
}

// One attention problem: sequences own scattered pages of a shared pool; rows name a sequence
// and how many of its entries they see.
struct AttentionCase {
  std::string name;
  AttentionParams params;
  int64_t num_pages;
  std::vector<std::vector<int32_t>> seq_pages;  // page list per sequence
  std::vector<int32_t> row_seq;
  std::vector<int32_t> row_kv_len;
};

void RunAttentionCase(BackendConformanceTest* test, const AttentionCase& c, DType dt,
                      uint32_t seed) {
  const AttentionParams& p = c.params;
  std::mt19937 rng(seed);
  const int64_t n = static_cast<int64_t>(c.row_seq.size());
  size_t max_pages = 1;
  for (const auto& pages : c.seq_pages) max_pages = std::max(max_pages, pages.size());
  // Unused page-table entries hold -1: a kernel that reads past kv_len would fault or fail.
  HostTensor table(DType::kI32,
                   {static_cast<int64_t>(c.seq_pages.size()), static_cast<int64_t>(max_pages)});
  for (size_t s = 0; s < c.seq_pages.size(); ++s) {
    for (size_t e = 0; e < max_pages; ++e) {
      table.i32()[s * max_pages + e] = e < c.seq_pages[s].size() ? c.seq_pages[s][e] : -1;
    }
  }
  HostTensor q = Random(rng, DType::kF32, {n, p.n_heads, p.head_dim});
  // Scale 2 on the pool makes the scores peaky enough that max subtraction matters.
  HostTensor pool =
      Random(rng, dt, {c.num_pages, 2 * p.n_kv_heads, p.block_size, p.head_dim}, 2.0f);
  HostTensor seq_t = Ints(c.row_seq), len_t = Ints(c.row_kv_len);
  HostTensor want(DType::kF32, {n, int64_t{p.n_heads} * p.head_dim});
  cpu::reference::Attention(p, q.view(), pool.view(), table.view(), seq_t.view(), len_t.view(),
                            want.view());
  TensorView out = test->Upload(want);
  test->backend_->Attention(p, test->Upload(q), test->Upload(pool), test->Upload(table),
                            test->Upload(seq_t), test->Upload(len_t), out);
  ExpectClose(test->Download(out, want), want, kAccumOrderRelTol,
              "Attention " + c.name + " " + std::string(DTypeName(dt)));
}

// Pages 0..num_pages-1 dealt to sequences in a shuffled order, so no list is contiguous.
std::vector<std::vector<int32_t>> ScatteredPages(std::mt19937& rng, int64_t num_pages,
                                                 const std::vector<int64_t>& pages_per_seq) {
  std::vector<int32_t> ids(num_pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<std::vector<int32_t>> out;
  size_t next = 0;
  for (int64_t count : pages_per_seq) {
    out.emplace_back(ids.begin() + next, ids.begin() + next + count);
    next += count;
  }
  return out;
}

TEST_P(BackendConformanceTest, AttentionMixedPrefillAndDecodeMatchesReference) {
  for (DType dt : kStorageDTypes) {
    for (auto [n_heads, n_kv_heads, head_dim, block_size] :
         std::vector<std::tuple<int, int, int, int>>{
             {4, 2, 64, 16}, {6, 1, 20, 5}, {2, 2, 33, 8}}) {
      std::mt19937 rng(n_heads * 100 + head_dim + static_cast<int>(dt));
      AttentionCase c;
      c.params = {.n_heads = n_heads,
                  .n_kv_heads = n_kv_heads,
                  .head_dim = head_dim,
                  .block_size = block_size,
                  .scale = 1.0f / std::sqrt(float(head_dim))};
      c.name = std::to_string(n_heads) + "/" + std::to_string(n_kv_heads) +
               " hd=" + std::to_string(head_dim) + " bs=" + std::to_string(block_size);
      // Sequence 0: a 17-token prefill chunk on top of 40 cached entries (each row sees one
      // more entry). Sequence 1: one decode row at 3 entries. Sequence 2: decode at 1 entry.
      const std::vector<int64_t> lens = {57, 3, 1};
      std::vector<int64_t> pages_per_seq;
      for (int64_t len : lens) pages_per_seq.push_back((len + block_size - 1) / block_size + 1);
      c.num_pages = std::accumulate(pages_per_seq.begin(), pages_per_seq.end(), int64_t{0}) + 3;
      c.seq_pages = ScatteredPages(rng, c.num_pages, pages_per_seq);
      for (int32_t r = 0; r < 17; ++r) {
        c.row_seq.push_back(0);
        c.row_kv_len.push_back(41 + r);
      }
      c.row_seq.insert(c.row_seq.end(), {1, 2});
      c.row_kv_len.insert(c.row_kv_len.end(), {3, 1});
      RunAttentionCase(this, c, dt, rng());
    }
  }
}

TEST_P(BackendConformanceTest, AttentionLongContextDecodeMatchesReference) {
  // Batch-1 and batch-3 decode at contexts long enough that the CPU backend splits the context
  // across threads (split-K + combine), with one kv head (MQA) and with GQA.
  for (DType dt : kStorageDTypes) {
    for (int n_kv_heads : {1, 4}) {
      for (int64_t batch : {1, 3}) {
        std::mt19937 rng(n_kv_heads * 10 + batch + static_cast<int>(dt));
        AttentionCase c;
        c.params = {.n_heads = 8,
                    .n_kv_heads = n_kv_heads,
                    .head_dim = 64,
                    .block_size = 16,
                    .scale = 0.125f};
        c.name = "long ctx kv=" + std::to_string(n_kv_heads) + " batch=" + std::to_string(batch);
        std::vector<int64_t> pages_per_seq;
        for (int64_t b = 0; b < batch; ++b) {
          const int32_t len = static_cast<int32_t>(1024 + 77 * b);
          pages_per_seq.push_back((len + 15) / 16);
          c.row_seq.push_back(static_cast<int32_t>(b));
          c.row_kv_len.push_back(len);
        }
        c.num_pages = std::accumulate(pages_per_seq.begin(), pages_per_seq.end(), int64_t{0});
        c.seq_pages = ScatteredPages(rng, c.num_pages, pages_per_seq);
        RunAttentionCase(this, c, dt, rng());
      }
    }
  }
}

TEST_P(BackendConformanceTest, AttentionRoutedSparsePatternMatchesReference) {
  // A routed layer's cache: of 300 prompt tokens about 30% were selected; the layer's page list
  // holds only those, and each selected row sees the selected tokens up to and including itself.
  for (DType dt : kStorageDTypes) {
    std::mt19937 rng(4242 + static_cast<int>(dt));
    AttentionCase c;
    c.name = "routed";
    c.params = {.n_heads = 4, .n_kv_heads = 2, .head_dim = 48, .block_size = 16, .scale = 0.15f};
    std::bernoulli_distribution selected(0.3);
    int32_t num_selected = 0;
    for (int t = 0; t < 300; ++t) {
      if (!selected(rng)) continue;
      ++num_selected;
      c.row_seq.push_back(1);  // sequence 1; sequence 0 is a dense neighbour with decode rows
      c.row_kv_len.push_back(num_selected);
    }
    c.row_seq.insert(c.row_seq.end(), {0, 0});
    c.row_kv_len.insert(c.row_kv_len.end(), {250, 251});
    const std::vector<int64_t> pages_per_seq = {16, (num_selected + 15) / 16};
    c.num_pages = pages_per_seq[0] + pages_per_seq[1] + 5;
    c.seq_pages = ScatteredPages(rng, c.num_pages, pages_per_seq);
    RunAttentionCase(this, c, dt, rng());
  }
}

TEST_P(BackendConformanceTest, SwiGluMatchesReferenceIncludingInPlace) {
  for (int64_t n : kRowCounts) {
    for (int64_t f : {67, 1000}) {
      std::mt19937 rng(n * 3 + f);
      HostTensor gate = Random(rng, DType::kF32, {n, f}, 4.0f);
      HostTensor up = Random(rng, DType::kF32, {n, f});
      HostTensor want(DType::kF32, {n, f});
      cpu::reference::SwiGlu(gate.view(), up.view(), want.view());
      TensorView gd = Upload(gate);
      backend_->SwiGlu(gd, Upload(up), gd);
      ExpectClose(Download(gd, want), want, kSameOrderRelTol, "SwiGlu n=" + std::to_string(n));
    }
  }
}

TEST_P(BackendConformanceTest, ActivationMatchesReferenceForEveryKind) {
  for (ActivationKind kind :
       {ActivationKind::kSilu, ActivationKind::kGelu, ActivationKind::kRelu}) {
    for (int64_t n : kRowCounts) {
      std::mt19937 rng(n * 5 + static_cast<int>(kind));
      HostTensor x = Random(rng, DType::kF32, {n, 131}, 4.0f);
      HostTensor want = x;
      cpu::reference::Activation({.kind = kind}, want.view());
      TensorView xd = Upload(x);
      backend_->Activation({.kind = kind}, xd);
      ExpectClose(
          Download(xd, want), want, kSameOrderRelTol,
          "Activation " + std::to_string(static_cast<int>(kind)) + " n=" + std::to_string(n));
    }
  }
}

TEST_P(BackendConformanceTest, AddMatchesReference) {
  for (int64_t n : kRowCounts) {
    std::mt19937 rng(n);
    HostTensor a = Random(rng, DType::kF32, {n, 1001});
    HostTensor b = Random(rng, DType::kF32, {n, 1001});
    HostTensor want(DType::kF32, {n, 1001});
    cpu::reference::Add(a.view(), b.view(), want.view());
    TensorView ad = Upload(a);
    backend_->Add(ad, Upload(b), ad);
    ExpectClose(Download(ad, want), want, kSameOrderRelTol, "Add n=" + std::to_string(n));
  }
}

TEST_P(BackendConformanceTest, GatherRowsMatchesReference) {
  for (int64_t n : kRowCounts) {
    std::mt19937 rng(n + 99);
    HostTensor x = Random(rng, DType::kF32, {n, 67});
    std::vector<int32_t> idx;
    for (int64_t j = 0; j < n; j += 2) idx.push_back(static_cast<int32_t>(rng() % n));
    HostTensor idx_t = Ints(idx);
    HostTensor want(DType::kF32, {static_cast<int64_t>(idx.size()), 67});
    cpu::reference::GatherRows(x.view(), idx_t.view(), want.view());
    TensorView out = Upload(want);
    backend_->GatherRows(Upload(x), Upload(idx_t), out);
    ExpectClose(Download(out, want), want, 0.0, "GatherRows n=" + std::to_string(n));
  }
}

TEST_P(BackendConformanceTest, ScatterCombineMatchesReferenceForEveryMode) {
  for (WeightFn fn : {WeightFn::kIdentity, WeightFn::kSigmoid}) {
    for (ScaleTarget target : {ScaleTarget::kUpdate, ScaleTarget::kBlockOutput}) {
      for (int64_t n : kRowCounts) {
        std::mt19937 rng(n * 4 + static_cast<int>(fn) * 2 + static_cast<int>(target));
        HostTensor x = Random(rng, DType::kF32, {n, 67});
        std::vector<int32_t> rows(n);
        std::iota(rows.begin(), rows.end(), 0);
        std::shuffle(rows.begin(), rows.end(), rng);
        rows.resize((n + 1) / 2);  // distinct, unsorted
        const int64_t m = static_cast<int64_t>(rows.size());
        HostTensor idx = Ints(rows);
        HostTensor y = Random(rng, DType::kF32, {m, 67});
        HostTensor s = Random(rng, DType::kF32, {m}, 2.0f);
        const ScatterCombineParams p{.weight_fn = fn, .scale_target = target};
        HostTensor want = x;
        cpu::reference::ScatterCombine(p, want.view(), y.view(), idx.view(), s.view());
        TensorView xd = Upload(x);
        backend_->ScatterCombine(p, xd, Upload(y), Upload(idx), Upload(s));
        ExpectClose(Download(xd, want), want, kSameOrderRelTol,
                    "ScatterCombine fn=" + std::to_string(static_cast<int>(fn)) + " target=" +
                        std::to_string(static_cast<int>(target)) + " n=" + std::to_string(n));
      }
    }
  }
}

TEST_P(BackendConformanceTest, SupportsEveryStorageDTypeForWeightOps) {
  for (DType dt : kStorageDTypes) {
    for (OpKind op : {OpKind::kEmbed, OpKind::kRmsNorm, OpKind::kGemm, OpKind::kRopeAndAppendKv,
                      OpKind::kAttention}) {
      EXPECT_TRUE(backend_->Supports(op, dt)) << OpKindName(op) << " " << DTypeName(dt);
    }
  }
  EXPECT_TRUE(backend_->Supports(OpKind::kSwiGlu, DType::kF32));
  EXPECT_FALSE(backend_->Supports(OpKind::kGemm, DType::kI32));
}

INSTANTIATE_TEST_SUITE_P(AllBackends, BackendConformanceTest,
                         ::testing::ValuesIn(BackendVariants()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           // "cpu-avx512" -> "CpuAvx512": no '_' in gtest names.
                           std::string name;
                           bool upper = true;
                           for (char ch : info.param) {
                             if (ch == '-') {
                               upper = true;
                               continue;
                             }
                             name += upper ? static_cast<char>(std::toupper(ch)) : ch;
                             upper = false;
                           }
                           return name;
                         });

}  // namespace
}  // namespace modserve::backend
