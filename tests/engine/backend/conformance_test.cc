// Backend conformance: every op of every backend (the registry's, plus the CPU backend forced to
// each kernel ISA) against the reference ops, on seeded random inputs and odd shapes.
// A backend or ISA this machine lacks is a GTEST_SKIP with the reason, never a pass.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/cpu/reference_ops.h"
#include "engine/backend/registry.h"
#include "engine/common/dtype.h"
#include "engine/common/quant.h"
#include "engine/common/tensor_view.h"
#include "gtest/gtest.h"
#include "tests/engine/backend/amx_int8_emulated.h"
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
  for (cpu::Isa isa : {cpu::Isa::kScalar, cpu::Isa::kAvx2, cpu::Isa::kAvx512, cpu::Isa::kAvx512Vnni, cpu::Isa::kAmx}) {
    names.push_back("cpu-" + std::string(cpu::IsaName(isa)));
  }
  return names;
}

class BackendConformanceTest : public ::testing::TestWithParam<std::string> {
 public:
  void SetUp() override {
    const std::string& name = GetParam();
    for (cpu::Isa isa : {cpu::Isa::kScalar, cpu::Isa::kAvx2, cpu::Isa::kAvx512, cpu::Isa::kAvx512Vnni, cpu::Isa::kAmx}) {
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

  // Each row of the Gemm of x [n, k] by the device weight w [m, k] (no bias) gets the bits of a
  // one-row call.
  void ExpectRowsGetOneRowBits(const HostTensor& x, const TensorView& w, const std::string& what) {
    const int64_t n = x.dims[0], k = x.dims[1], m = w.dim(0);
    HostTensor all(DType::kF32, {n, m});
    const TensorView all_d = Upload(all);
    backend_->Gemm(Upload(x), w, TensorView(), all_d);
    all = Download(all_d, all);
    for (int64_t i = 0; i < n; ++i) {
      HostTensor xi(DType::kF32, {1, k});
      std::memcpy(xi.f32(), x.f32() + i * k, k * sizeof(float));
      HostTensor oi(DType::kF32, {1, m});
      const TensorView oi_d = Upload(oi);
      backend_->Gemm(Upload(xi), w, TensorView(), oi_d);
      oi = Download(oi_d, oi);
      EXPECT_EQ(std::memcmp(oi.f32(), all.f32() + i * m, m * sizeof(float)), 0)
          << what << " row " << i << " of " << n;
    }
  }

  // The backend's Gemm of x [n, k] by rows [first, m) of the device weight `prepared` (a view of
  // whole groups, no bias), and the reference's output columns first.. of x by the host weight w
  // [m, k]: {got, want}.
  std::pair<HostTensor, HostTensor> SliceGemm(HostTensor x, HostTensor w,
                                              const TensorView& prepared, int64_t first) {
    const int64_t n = x.dims[0], m = w.dims[0];
    HostTensor all(DType::kF32, {n, m});
    cpu::reference::Gemm(x.view(), w.view(), TensorView(), all.view());
    HostTensor got(DType::kF32, {n, m - first});
    const TensorView out = Upload(got);
    backend_->Gemm(Upload(x), prepared.rows(first, m - first), TensorView(), out);
    got = Download(out, got);
    HostTensor want(DType::kF32, {n, m - first});
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t r = first; r < m; ++r) {
        want.f32()[i * (m - first) + r - first] = all.f32()[i * m + r];
      }
    }
    return {std::move(got), std::move(want)};
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
  // n covers both kernels (the CPU's small-n kernel up to 16 or 32 rows depending on the ISA,
  // packed above) and their edges; (m, k) are odd so every SIMD and tile remainder runs; m = 1 is
  // the router.
  const std::vector<std::pair<int64_t, int64_t>> mk = {{1, 67}, {35, 67}, {130, 257}, {261, 520}};
  for (DType dt : kStorageDTypes) {
    for (int64_t n : {1, 3, 4, 16, 17, 31, 32, 33, 64, 128}) {
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

// The page table of these page lists, one row per sequence. Unused entries hold -1: a kernel
// that reads past kv_len would fault or fail.
HostTensor PageTable(const std::vector<std::vector<int32_t>>& seq_pages) {
  size_t max_pages = 1;
  for (const auto& pages : seq_pages) max_pages = std::max(max_pages, pages.size());
  HostTensor table(DType::kI32,
                   {static_cast<int64_t>(seq_pages.size()), static_cast<int64_t>(max_pages)});
  for (size_t s = 0; s < seq_pages.size(); ++s) {
    for (size_t e = 0; e < max_pages; ++e) {
      table.i32()[s * max_pages + e] = e < seq_pages[s].size() ? seq_pages[s][e] : -1;
    }
  }
  return table;
}

void RunAttentionCase(BackendConformanceTest* test, const AttentionCase& c, DType dt,
                      uint32_t seed) {
  const AttentionParams& p = c.params;
  std::mt19937 rng(seed);
  const int64_t n = static_cast<int64_t>(c.row_seq.size());
  HostTensor table = PageTable(c.seq_pages);
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
             {4, 2, 64, 16},
             {6, 1, 20, 5},
             {2, 2, 33, 8},
             {9, 3, 64, 16},
             {7, 7, 40, 16},
             // head_dim 64 and 128 take the CPU's q-in-registers scores on AVX-512 (blocks of
             // 4 and 2 heads): groups of 8 and 5 leave every block size, block_size 5 partial
             // key blocks.
             {16, 2, 128, 16},
             {5, 1, 128, 5},
             {10, 2, 64, 5},
             {8, 1, 64, 16}}) {
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

TEST_P(BackendConformanceTest, AttentionPrefillRunsMatchReference) {
  // Prompt rows (AttentionParams::prompt), which the CPU backend sends to the matrix unit with
  // bf16 K/V on CPUs with AMX, in blocks of up to 32 rows of one sequence with kv lengths
  // counting up by one: a chunk that crosses the 256-key split boundary, one that starts a
  // sequence, one whose last block has a single row (97 = 3 x 32 + 1), a single row and a short
  // chunk; head dims 32 to 256, MQA and odd GQA groups, pages of 5 keys (tiles of 16 keys span
  // pages) and of 64. A head dim that is not a multiple of 32 (48) keeps the row kernels.
  for (DType dt : kStorageDTypes) {
    for (auto [n_heads, n_kv_heads, head_dim, block_size] :
         std::vector<std::tuple<int, int, int, int>>{{8, 4, 64, 16},
                                                     {6, 2, 32, 16},
                                                     {9, 3, 64, 5},
                                                     {4, 1, 128, 64},
                                                     {2, 2, 256, 16},
                                                     {4, 2, 48, 16}}) {
      std::mt19937 rng(n_heads * 1000 + head_dim * 10 + block_size + static_cast<int>(dt));
      AttentionCase c;
      c.params = {.n_heads = n_heads,
                  .n_kv_heads = n_kv_heads,
                  .head_dim = head_dim,
                  .block_size = block_size,
                  .scale = 1.0f / std::sqrt(float(head_dim)),
                  .prompt = true};
      c.name = "prefill " + std::to_string(n_heads) + "/" + std::to_string(n_kv_heads) +
               " hd=" + std::to_string(head_dim) + " bs=" + std::to_string(block_size);
      // Sequence 0: 70 rows on top of 230 cached entries (kv lengths 231..300). Sequence 1: one
      // row at 600. Sequence 2: 97 rows from the start (1..97). Sequence 3: 20 rows at 11..30.
      const std::vector<int64_t> lens = {300, 600, 97, 30};
      std::vector<int64_t> pages_per_seq;
      for (int64_t len : lens) pages_per_seq.push_back((len + block_size - 1) / block_size);
      c.num_pages = std::accumulate(pages_per_seq.begin(), pages_per_seq.end(), int64_t{0}) + 2;
      c.seq_pages = ScatteredPages(rng, c.num_pages, pages_per_seq);
      auto add_run = [&](int32_t seq, int32_t first_len, int32_t count) {
        for (int32_t r = 0; r < count; ++r) {
          c.row_seq.push_back(seq);
          c.row_kv_len.push_back(first_len + r);
        }
      };
      add_run(0, 231, 70);
      add_run(1, 600, 1);
      add_run(2, 1, 97);
      add_run(3, 11, 20);
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

TEST_P(BackendConformanceTest, AttentionRowsGetTheBitsOfAOneRowCallWithinTheRowInvariantRange) {
  // Backend::MaxRowInvariantRows covers every op of a step, attention included: self-speculative
  // verification relies on it. Each row of a multi-row call must get exactly the bits it gets
  // alone, at contexts long enough to be split, for MQA, odd GQA groups and every storage type.
  const int64_t bound = std::min(backend_->MaxRowInvariantRows(DType::kBF16, 4096),
                                 backend_->MaxRowInvariantRows(DType::kQ4_1, 4096));
  if (bound < 2) GTEST_SKIP() << GetParam() << " claims no row invariance";
  const std::vector<int32_t> lens = {1500, 40, 700, 257, 3001, 256, 1, 1024, 511, 2048};
  const int64_t n = std::min<int64_t>(bound, static_cast<int64_t>(lens.size()));
  for (DType dt : kStorageDTypes) {
    for (auto [n_heads, n_kv_heads] : std::vector<std::pair<int, int>>{{6, 1}, {9, 3}, {8, 4}}) {
      std::mt19937 rng(n_heads * 31 + n_kv_heads + static_cast<int>(dt));
      const AttentionParams p = {.n_heads = n_heads,
                                 .n_kv_heads = n_kv_heads,
                                 .head_dim = 64,
                                 .block_size = 16,
                                 .scale = 0.125f};
      std::vector<int64_t> pages_per_seq;
      for (int64_t i = 0; i < n; ++i) pages_per_seq.push_back((lens[i] + 15) / 16);
      const int64_t num_pages =
          std::accumulate(pages_per_seq.begin(), pages_per_seq.end(), int64_t{0});
      const HostTensor table = PageTable(ScatteredPages(rng, num_pages, pages_per_seq));
      HostTensor q = Random(rng, DType::kF32, {n, p.n_heads, p.head_dim});
      HostTensor pool = Random(rng, dt, {num_pages, 2 * p.n_kv_heads, 16, p.head_dim}, 2.0f);
      std::vector<int32_t> row_seq(n);
      std::iota(row_seq.begin(), row_seq.end(), 0);
      const HostTensor seq_t = Ints(row_seq), len_t = Ints(std::vector<int32_t>(
                                                   lens.begin(), lens.begin() + n));
      const TensorView pool_d = Upload(pool), table_d = Upload(table);
      HostTensor all(DType::kF32, {n, int64_t{p.n_heads} * p.head_dim});
      const TensorView all_d = Upload(all);
      backend_->Attention(p, Upload(q), pool_d, table_d, Upload(seq_t), Upload(len_t), all_d);
      const HostTensor got_all = Download(all_d, all);
      const size_t row_bytes = static_cast<size_t>(p.n_heads) * p.head_dim * sizeof(float);
      for (int64_t i = 0; i < n; ++i) {
        HostTensor qi(DType::kF32, {1, p.n_heads, p.head_dim});
        std::memcpy(qi.storage.data(), q.storage.data() + i * row_bytes, row_bytes);
        HostTensor one(DType::kF32, {1, int64_t{p.n_heads} * p.head_dim});
        const TensorView one_d = Upload(one);
        backend_->Attention(p, Upload(qi), pool_d, table_d,
                            Upload(Ints(std::vector<int32_t>{static_cast<int32_t>(i)})),
                            Upload(Ints(std::vector<int32_t>{lens[i]})), one_d);
        const HostTensor got_one = Download(one_d, one);
        EXPECT_EQ(std::memcmp(got_one.storage.data(), got_all.storage.data() + i * row_bytes,
                              row_bytes),
                  0)
            << DTypeName(dt) << " " << n_heads << "/" << n_kv_heads << " row " << i << " of "
            << n << " (kv_len " << lens[i] << ")";
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

TEST_P(BackendConformanceTest, CopyKvPagesMatchesReference) {
  for (DType dt : kStorageDTypes) {
    std::mt19937 rng(static_cast<uint32_t>(dt) + 5);
    // [pages, 2 * kv_heads, block_size, head_dim]
    HostTensor pool = Random(rng, dt, {9, 4, 16, 24});
    const std::vector<std::pair<int32_t, int32_t>> copies = {{2, 7}, {0, 5}, {8, 1}};
    HostTensor want = pool;
    cpu::reference::CopyKvPages(want.view(), copies);
    TensorView dev = Upload(pool);
    backend_->CopyKvPages(dev, copies);
    backend_->CopyKvPages(dev, {});  // nothing to copy is fine
    ExpectClose(Download(dev, want), want, 0.0, "CopyKvPages " + std::string(DTypeName(dt)));
    EXPECT_TRUE(backend_->Supports(OpKind::kCopyKvPages, dt));
  }
}

TEST_P(BackendConformanceTest, ScatterCombineMatchesReferenceForEveryMode) {
  for (WeightFn fn : {WeightFn::kIdentity, WeightFn::kSigmoid, WeightFn::kOne}) {
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

TEST_P(BackendConformanceTest, RouteSelectMatchesReferenceDecisionsAndCompaction) {
  // 1500 rows span two tiles of the CUDA kernel's block; cuts differ per row (sequences of
  // different request tau in one step) and include +inf (nothing passes), -inf (all pass) and
  // z itself (a row exactly at its cut stays out: the comparison is strict).
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{17}, int64_t{64}, int64_t{1500}}) {
    std::mt19937 rng(static_cast<uint32_t>(n) + 2024);
    std::uniform_real_distribution<float> zd(-6.0f, 6.0f), cd(-3.0f, 3.0f);
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<float> z(n), cut(n);
    for (int64_t i = 0; i < n; ++i) {
      z[i] = zd(rng);
      cut[i] = i % 11 == 5 ? inf : (i % 13 == 7 ? -inf : (i % 7 == 3 ? z[i] : cd(rng)));
    }
    HostTensor z_t(DType::kF32, {n}), tau_t(DType::kF32, {n});
    std::memcpy(z_t.storage.data(), z.data(), z.size() * 4);
    std::memcpy(tau_t.storage.data(), cut.data(), cut.size() * 4);
    HostTensor s_t = Random(rng, DType::kF32, {n}, 2.0f);
    HostTensor want_probs(DType::kF32, {n}), want_s_sel(DType::kF32, {n});
    HostTensor want_idx = Ints(std::vector<int32_t>(n, -1));
    HostTensor want_count = Ints({-1});
    std::memset(want_s_sel.storage.data(), 0, want_s_sel.storage.size());
    cpu::reference::RouteSelect(z_t.view(), tau_t.view(), s_t.view(), want_probs.view(),
                                want_idx.view(), want_s_sel.view(), want_count.view());
    const int32_t m = want_count.view().as<int32_t>()[0];
    ASSERT_GE(m, 0);
    ASSERT_LE(m, n);
    if (n >= 64) {
      EXPECT_GT(m, 0);  // the inputs exercise both outcomes
      EXPECT_LT(m, n);
    }
    const TensorView probs = Upload(want_probs), idx = Upload(want_idx),
                     s_sel = Upload(want_s_sel), count = Upload(want_count);
    backend_->RouteSelect(Upload(z_t), Upload(tau_t), Upload(s_t), probs, idx, s_sel, count);
    const std::string what = "RouteSelect n=" + std::to_string(n);
    HostTensor got_count = Download(count, want_count);
    ASSERT_EQ(got_count.view().as<int32_t>()[0], m) << what;
    HostTensor got_idx = Download(idx, want_idx);
    HostTensor got_s_sel = Download(s_sel, want_s_sel);
    for (int32_t j = 0; j < m; ++j) {
      ASSERT_EQ(got_idx.view().as<int32_t>()[j], want_idx.view().as<int32_t>()[j])
          << what << " j=" << j;
      // A copy of s, so exact.
      ASSERT_EQ(got_s_sel.view().as<float>()[j], want_s_sel.view().as<float>()[j])
          << what << " j=" << j;
    }
    ExpectClose(Download(probs, want_probs), want_probs, kSameOrderRelTol, what + " probs");
  }
  EXPECT_TRUE(backend_->Supports(OpKind::kRouteSelect, DType::kF32));
}

// ---- block-quantized weights ----------------------------------------------------------------
constexpr DType kQuantDTypes[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                                  DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

// Overwrites the f16 at p with a random finite value of magnitude ~10^[lo, hi], sign random.
void PutRandomHalf(std::mt19937& rng, uint8_t* p, float lo, float hi, bool allow_negative) {
  std::uniform_real_distribution<float> e(lo, hi);
  float v = std::pow(10.0f, e(rng));
  if (allow_negative && (rng() & 1)) v = -v;
  const f16_t h = F32ToF16(v);
  std::memcpy(p, &h.bits, 2);
}

// A [m, k] quantized matrix whose rows cover the cases the kernels must get right: rows
// quantized from Gaussian floats at scales 1e-4 .. 1e3, all-zero rows, all-negative rows (the
// Q4_1/Q4_K minimums carry them), single spikes, and rows of random bytes with random f16 scales
// (every level, Q6_K scale -128, Q8_0 level -128, Q4_K/Q5_K 6-bit scales up to 63, negative
// minimums).
HostTensor RandomQuantized(std::mt19937& rng, DType t, int64_t m, int64_t k) {
  HostTensor w(t, {m, k});
  const size_t row_bytes = DTypeRowBytes(t, k), block_bytes = DTypeBlockBytes(t);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> row(k);
  for (int64_t r = 0; r < m; ++r) {
    uint8_t* dst = w.storage.data() + r * row_bytes;
    const int kind = static_cast<int>(r % 6);
    if (kind == 5) {  // raw random blocks
      for (size_t b = 0; b < row_bytes; ++b) dst[b] = static_cast<uint8_t>(rng());
      for (size_t off = 0; off < row_bytes; off += block_bytes) {
        uint8_t* blk = dst + off;
        switch (t) {
          case DType::kQ8_0:
          case DType::kQ4_0:
            PutRandomHalf(rng, blk, -4.0f, 0.0f, true);
            break;
          case DType::kQ4_1:
          case DType::kQ5_1:  // every level 0..31 among the random bytes of qh and qs
            PutRandomHalf(rng, blk, -4.0f, 0.0f, true);
            PutRandomHalf(rng, blk + 2, -3.0f, 1.0f, true);
            break;
          case DType::kQ5_0:
            PutRandomHalf(rng, blk, -4.0f, 0.0f, true);
            break;
          case DType::kQ4_K:
          case DType::kQ5_K:  // every level 0..31 among the random bytes of qh and qs
            PutRandomHalf(rng, blk, -5.0f, -1.0f, false);
            PutRandomHalf(rng, blk + 2, -5.0f, -1.0f, true);  // negative dmin: a valid file may
            break;
          case DType::kQ6_K:
            PutRandomHalf(rng, blk + 208, -5.0f, -2.0f, true);
            blk[192] = 0x80;  // scale -128 once per block
            break;
          case DType::kF32:
          case DType::kF16:
          case DType::kBF16:
          case DType::kI32:
            ADD_FAILURE() << "not a quantized dtype";
            break;
        }
      }
      continue;
    }
    const float scale = std::pow(10.0f, -4.0f + 7.0f * static_cast<float>(rng() % 1000) / 1000);
    for (int64_t c = 0; c < k; ++c) {
      switch (kind) {
        case 0:
        case 1:
          row[c] = scale * normal(rng);
          break;
        case 2:
          row[c] = 0.0f;
          break;
        case 3:
          row[c] = -scale * (1.0f + std::fabs(normal(rng)));
          break;
        default:
          row[c] = c % 37 == 3 ? 30.0f * scale : 0.01f * scale * normal(rng);
          break;
      }
    }
    const absl::Status status = quant::QuantizeRow(t, row.data(), k, dst);
    EXPECT_TRUE(status.ok()) << status;
  }
  return w;
}

// Activations with one outlier block per row (x100) and an all-zero row, so the per-block
// 8-bit rounding of x sees both extremes.
HostTensor QuantGemmInput(std::mt19937& rng, int64_t n, int64_t k) {
  HostTensor x = Random(rng, DType::kF32, {n, k});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = static_cast<int64_t>(rng() % (k / 32));
    for (int64_t j = 0; j < 32; ++j) x.f32()[i * k + 32 * b + j] *= 100.0f;
  }
  if (n > 2) std::fill(x.f32() + k, x.f32() + 2 * k, 0.0f);
  return x;
}

// The worst case of rounding x to 8 bits per 32-block: each element moves by at most half a
// step (max |x| of its block / 254), so |got - want| <= sum_j |w_j| * step_j / 2 exactly, plus the
// f32 rounding of a sum of k products in a different order (kAccumOrderRelTol of sum |w_j x_j|).
// A wrong nibble, scale or offset breaks this bound by orders of magnitude.
void ExpectWithinActivationRounding(const HostTensor& got, const HostTensor& want,
                                    const HostTensor& x, const std::vector<float>& w_f32,
                                    int64_t m, const std::string& what) {
  const int64_t n = x.dims[0], k = x.dims[1];
  int failures = 0;
  for (int64_t i = 0; i < n && failures < 5; ++i) {
    std::vector<double> half_step(k / 32);
    for (int64_t b = 0; b < k / 32; ++b) {
      double amax = 0.0;
      for (int64_t j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(double{x.f32()[i * k + 32 * b + j]}));
      half_step[b] = amax / 254.0;
    }
    for (int64_t r = 0; r < m && failures < 5; ++r) {
      double rounding = 0.0, magnitude = 0.0;
      for (int64_t c = 0; c < k; ++c) {
        const double wv = std::fabs(double{w_f32[r * k + c]});
        rounding += wv * half_step[c / 32];
        magnitude += wv * std::fabs(double{x.f32()[i * k + c]});
      }
      const double bound = rounding * (1 + 1e-5) + kAccumOrderRelTol * magnitude + 1e-30;
      const double err = std::fabs(double{got.At(i * m + r)} - want.At(i * m + r));
      if (!(err <= bound)) {
        ADD_FAILURE() << what << ": out[" << i << ", " << r << "] = " << got.At(i * m + r)
                      << ", reference " << want.At(i * m + r) << ", |err| " << err
                      << " > bound " << bound;
        ++failures;
      }
    }
  }
}

TEST_P(BackendConformanceTest, QuantizedEmbedMatchesReferenceExactly) {
  int ran = 0;
  for (DType dt : kQuantDTypes) {
    if (!backend_->Supports(OpKind::kEmbed, dt)) continue;
    ++ran;
    const int64_t d = DTypeBlockElems(dt) == 32 ? 96 : 512;
    for (int64_t n : kRowCounts) {
      std::mt19937 rng(n * 13 + static_cast<int>(dt));
      HostTensor table = RandomQuantized(rng, dt, 41, d);
      std::vector<int32_t> ids(n);
      for (auto& id : ids) id = static_cast<int32_t>(rng() % 41);
      HostTensor ids_t = Ints(ids);
      HostTensor want(DType::kF32, {n, d});
      cpu::reference::Embed(ids_t.view(), table.view(), want.view());
      TensorView out = Upload(want);
      backend_->Embed(Upload(ids_t), Upload(table), out);
      ExpectClose(Download(out, want), want, 0.0,
                  "Embed " + std::string(DTypeName(dt)) + " n=" + std::to_string(n));
    }
  }
  if (ran == 0) GTEST_SKIP() << backend_->name() << " runs no block-quantized Embed table";
}

TEST_P(BackendConformanceTest, QuantizedGemmMatchesReference) {
  // k: odd block counts, a partial 8-block chunk, a whole one; m: the router (1), odd sizes;
  // n: every row count 1..64 (decode batches, the small-n/packed switch, partial x tiles), and
  // 128.
  const std::vector<int64_t> k32 = {32, 96, 288, 576, 2080};
  const std::vector<int64_t> k256 = {256, 768, 2304};
  std::vector<int64_t> ns;
  for (int64_t n = 1; n <= 64; ++n) ns.push_back(n);
  ns.push_back(128);
  // The CPU backend's own scalar kernels: the SIMD ones must match them to f32 rounding.
  std::unique_ptr<cpu::CpuBackend> scalar;
  if (GetParam().rfind("cpu", 0) == 0) {
    auto created = cpu::CpuBackend::Create({.num_threads = 2, .isa = cpu::Isa::kScalar});
    ASSERT_TRUE(created.ok()) << created.status();
    scalar = std::move(created).value();
  }
  int ran = 0;
  for (DType dt : kQuantDTypes) {
    if (!backend_->Supports(OpKind::kGemm, dt)) continue;
    ++ran;
    const std::vector<int64_t>& ks = DTypeBlockElems(dt) == 32 ? k32 : k256;
    for (size_t ki = 0; ki < ks.size(); ++ki) {
      const int64_t k = ks[ki];
      for (int64_t m : {1, 7, 37}) {
        for (int64_t n : ns) {
          // Above 17 rows on fewer shapes: 31, 33, 64 and 128 on every other k, the rest on
          // the first k only.
          const bool main_sizes = n == 31 || n == 33 || n == 64 || n == 128;
          if (n > 17 && (m != 37 || ki % 2 == 1 || (!main_sizes && ki != 0))) continue;
          const bool with_bias = (n + m) % 2 == 1;
          std::mt19937 rng(static_cast<uint32_t>(n * 7919 + m * 31 + k + 1000 * static_cast<int>(dt)));
          HostTensor x = QuantGemmInput(rng, n, k);
          HostTensor w = RandomQuantized(rng, dt, m, k);
          HostTensor bias = with_bias ? Random(rng, DType::kF32, {m}) : HostTensor();
          TensorView no_bias;
          HostTensor want(DType::kF32, {n, m});
          cpu::reference::Gemm(x.view(), w.view(), with_bias ? bias.view() : no_bias,
                               want.view());
          TensorView out = Upload(want);
          backend_->Gemm(Upload(x), Upload(w), with_bias ? Upload(bias) : no_bias, out);
          const HostTensor got = Download(out, want);
          std::vector<float> w_f32(m * k);
          quant::DequantizeRow(dt, w.storage.data(), m * k, w_f32.data());
          const std::string what = "Gemm " + std::string(DTypeName(dt)) + " n=" +
                                   std::to_string(n) + " m=" + std::to_string(m) +
                                   " k=" + std::to_string(k) + (with_bias ? " +bias" : "");
          ExpectWithinActivationRounding(got, want, x, w_f32, m, what);
          if (scalar != nullptr) {
            HostTensor same = want;
            scalar->Gemm(x.view(), w.view(), with_bias ? bias.view() : no_bias, same.view());
            // Same integer sums on every ISA; only the f32 additions are reordered.
            ExpectClose(got, same, kAccumOrderRelTol, what + " vs the scalar kernels");
          }
        }
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << backend_->name() << " runs no block-quantized Gemm weight";
}

TEST_P(BackendConformanceTest, GemmRowsGetTheBitsOfAOneRowCallWithinTheRowInvariantRange) {
  // Backend::MaxRowInvariantRows(dtype, m): up to that many x rows, every row of a Gemm gets
  // exactly the bits of a one-row call. Every row count in the range (up to 70: past the CPU's
  // decode/prefill switches at 16-64 rows and its quantized prefill kernels' 64-row blocks),
  // float and quantized weights, k with and without a vector tail, m with a partial weight-row
  // group, and for float weights m on both sides of the CPU's skinny-weight bound (64 rows).
  std::vector<DType> dtypes(std::begin(kStorageDTypes), std::end(kStorageDTypes));
  dtypes.insert(dtypes.end(), std::begin(kQuantDTypes), std::end(kQuantDTypes));
  int ran = 0;
  for (DType dt : dtypes) {
    if (!backend_->Supports(OpKind::kGemm, dt)) continue;
    const bool quantized = DTypeIsQuantized(dt);
    for (int64_t m : quantized ? std::vector<int64_t>{23} : std::vector<int64_t>{23, 71}) {
      const int64_t bound = std::min<int64_t>(backend_->MaxRowInvariantRows(dt, m), 70);
      if (bound < 2) continue;
      ++ran;
      for (int64_t k : quantized ? std::vector<int64_t>{DTypeBlockElems(dt) * 9}
                                 : std::vector<int64_t>{1100, 1030}) {
        std::mt19937 rng(static_cast<uint32_t>(k * 13 + m + static_cast<int>(dt)));
        HostTensor x =
            quantized ? QuantGemmInput(rng, bound, k) : Random(rng, DType::kF32, {bound, k});
        HostTensor w = quantized ? RandomQuantized(rng, dt, m, k) : Random(rng, dt, {m, k});
        HostTensor bias = Random(rng, DType::kF32, {m});
        const TensorView w_d = Upload(w), bias_d = Upload(bias);
        const size_t x_row = static_cast<size_t>(k) * sizeof(float);
        const size_t out_row = static_cast<size_t>(m) * sizeof(float);
        std::vector<HostTensor> one_row;
        for (int64_t i = 0; i < bound; ++i) {
          HostTensor xi(DType::kF32, {1, k});
          std::memcpy(xi.storage.data(), x.storage.data() + i * x_row, x_row);
          HostTensor oi(DType::kF32, {1, m});
          const TensorView oi_d = Upload(oi);
          backend_->Gemm(Upload(xi), w_d, bias_d, oi_d);
          one_row.push_back(Download(oi_d, oi));
        }
        for (int64_t n = 2; n <= bound; ++n) {
          HostTensor xn(DType::kF32, {n, k});
          std::memcpy(xn.storage.data(), x.storage.data(), n * x_row);
          HostTensor on(DType::kF32, {n, m});
          const TensorView on_d = Upload(on);
          backend_->Gemm(Upload(xn), w_d, bias_d, on_d);
          const HostTensor got = Download(on_d, on);
          for (int64_t i = 0; i < n; ++i) {
            EXPECT_EQ(std::memcmp(got.storage.data() + i * out_row, one_row[i].storage.data(),
                                  out_row),
                      0)
                << DTypeName(dt) << " m=" << m << " k=" << k << " row " << i << " of " << n;
          }
        }
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << backend_->name() << " claims no row invariance";
}

TEST_P(BackendConformanceTest, PreparedGemmWeightsGiveTheReferenceGemm) {
  // Backend::PrepareGemmWeight may return a copy in the backend's own layout (the CPU backend:
  // every quantized type in groups of 16 rows, where its kernels read that layout). Whatever
  // it returns must be a Gemm weight within the quantized Gemm's bound of the reference, for every
  // row count (the decode and prefill row ranges, partial x tiles), with and without bias; a slice
  // of whole row groups must give those rows; and each row of x must get the bits of a one-row call
  // within MaxRowInvariantRows. m: one group, several, and a count that is no multiple of 16 (left
  // as it is); every quantized dtype passes through.
  std::vector<int64_t> ns;
  for (int64_t n = 1; n <= 17; ++n) ns.push_back(n);
  for (int64_t n : {31, 64, 128}) ns.push_back(n);
  int ran = 0;
  for (DType dt : kQuantDTypes) {
    if (!backend_->Supports(OpKind::kGemm, dt)) continue;
    ++ran;
    const int64_t blk = DTypeBlockElems(dt);
    for (int64_t m : {16, 48, 40, 160}) {
      for (int64_t k : {blk == 32 ? int64_t{96} : int64_t{256}, int64_t{768}, int64_t{2304}}) {
        std::mt19937 rng(static_cast<uint32_t>(m * 131 + k + 7 * static_cast<int>(dt)));
        HostTensor w = RandomQuantized(rng, dt, m, k);
        HostTensor bias = Random(rng, DType::kF32, {m});
        const TensorView w_d = Upload(w);
        absl::StatusOr<TensorView> prepared = backend_->PrepareGemmWeight(w_d);
        ASSERT_TRUE(prepared.ok()) << prepared.status();
        EXPECT_EQ(prepared->dtype, dt);
        ASSERT_EQ(prepared->ndim, 2);
        EXPECT_EQ(prepared->dim(0), m);
        EXPECT_EQ(prepared->dim(1), k);
        EXPECT_EQ(prepared->bytes(), w_d.bytes());
        if (m % 16 != 0 || (DTypeBlockElems(dt) == 32 && k % 64 != 0)) {
          EXPECT_EQ(prepared->data, w_d.data) << DTypeName(dt) << " m=" << m << " was copied";
        }
        std::vector<float> w_f32(m * k);
        quant::DequantizeRow(dt, w.storage.data(), m * k, w_f32.data());
        for (int64_t n : ns) {
          if (n > 17 && k != 768) continue;
          const bool with_bias = (n + k / blk) % 2 == 1;
          HostTensor x = QuantGemmInput(rng, n, k);
          HostTensor want(DType::kF32, {n, m});
          TensorView no_bias;
          cpu::reference::Gemm(x.view(), w.view(), with_bias ? bias.view() : no_bias,
                               want.view());
          const TensorView out = Upload(want);
          backend_->Gemm(Upload(x), *prepared, with_bias ? Upload(bias) : no_bias, out);
          const std::string what = "prepared Gemm " + std::string(DTypeName(dt)) +
                                   " n=" + std::to_string(n) + " m=" + std::to_string(m) +
                                   " k=" + std::to_string(k) + (with_bias ? " +bias" : "");
          ExpectWithinActivationRounding(Download(out, want), want, x, w_f32, m, what);
        }
        // Row groups 1.. of a multi-group weight, alone: the reference's rows 16...
        if (m >= 48 && m % 16 == 0) {
          HostTensor x = QuantGemmInput(rng, 3, k);
          auto [got, want_tail] = SliceGemm(x, w, *prepared, 16);
          std::vector<float> tail_f32(w_f32.begin() + 16 * k, w_f32.end());
          ExpectWithinActivationRounding(got, want_tail, x, tail_f32, m - 16,
                                         "rows 16.. of a prepared " + std::string(DTypeName(dt)));
        }
        // Row invariance, up to 20 rows.
        const int64_t bound = std::min<int64_t>(backend_->MaxRowInvariantRows(dt, m), 20);
        if (bound >= 2 && k == 768) {
          ExpectRowsGetOneRowBits(QuantGemmInput(rng, bound, k), *prepared,
                                  std::string(DTypeName(dt)) + " prepared m=" + std::to_string(m));
        }
      }
    }
  }
  if (ran == 0) GTEST_SKIP() << backend_->name() << " runs no block-quantized Gemm weight";
}

TEST_P(BackendConformanceTest, PreparedFloatGemmWeightsGiveTheReferenceGemm) {
  // The same for float weights (the CPU backend: BF16 weights of whole 32-row groups in its bf16
  // pair panels where the CPU has AVX512_BF16 and no AMX tiles, at every matmul precision; F32,
  // F16 and other row counts as they are): within the f32 Gemm's tolerance of the reference at
  // every row count, with and without bias, a slice of whole 32-row groups gives those rows, and
  // each x row gets a one-row call's bits within MaxRowInvariantRows (up to 40 rows).
  const std::vector<std::pair<int64_t, int64_t>> mk = {{32, 1},   {32, 67},   {48, 67},
                                                       {96, 257}, {160, 520}, {64, 1030}};
  for (DType dt : kStorageDTypes) {
    for (auto [m, k] : mk) {
      std::mt19937 rng(static_cast<uint32_t>(m * 31 + k + 5 * static_cast<int>(dt)));
      HostTensor w = Random(rng, dt, {m, k});
      HostTensor bias = Random(rng, DType::kF32, {m});
      absl::StatusOr<TensorView> prepared = backend_->PrepareGemmWeight(Upload(w));
      ASSERT_TRUE(prepared.ok()) << prepared.status();
      EXPECT_EQ(prepared->dtype, dt);
      ASSERT_EQ(prepared->ndim, 2);
      EXPECT_EQ(prepared->dim(0), m);
      EXPECT_EQ(prepared->dim(1), k);
      const std::string shape =
          std::string(DTypeName(dt)) + " m=" + std::to_string(m) + " k=" + std::to_string(k);
      for (int64_t n : {1, 3, 4, 8, 9, 16, 17, 31, 33, 64, 128}) {
        const bool with_bias = (n + m) % 2 == 1;
        HostTensor x = Random(rng, DType::kF32, {n, k});
        HostTensor want(DType::kF32, {n, m});
        TensorView no_bias;
        cpu::reference::Gemm(x.view(), w.view(), with_bias ? bias.view() : no_bias, want.view());
        const TensorView out = Upload(want);
        backend_->Gemm(Upload(x), *prepared, with_bias ? Upload(bias) : no_bias, out);
        ExpectClose(
            Download(out, want), want, kAccumOrderRelTol,
            "prepared Gemm " + shape + " n=" + std::to_string(n) + (with_bias ? " +bias" : ""));
      }
      if (m >= 96) {
        // Row groups 1.. alone: the reference's rows 32...
        auto [got, want_tail] = SliceGemm(Random(rng, DType::kF32, {5, k}), w, *prepared, 32);
        ExpectClose(got, want_tail, kAccumOrderRelTol, "rows 32.. of a prepared " + shape);
      }
      const int64_t bound = std::min<int64_t>(backend_->MaxRowInvariantRows(dt, m), 40);
      if (bound >= 2) {
        ExpectRowsGetOneRowBits(Random(rng, DType::kF32, {bound, k}), *prepared,
                                "prepared " + shape);
      }
    }
  }
}

TEST_P(BackendConformanceTest, AllocateOfAnImpossibleSizeFailsCleanly) {
  // Sizes whose rounding up to the allocation granule would wrap around must fail, not return a
  // small buffer that claims to be huge. (Sizes that merely exceed memory are left out: under
  // ASan the allocator aborts on them by design.)
  const size_t max = std::numeric_limits<size_t>::max();
  for (size_t bytes : {max, max - 100, max - (size_t{2} << 20) + 2}) {
    auto buffer = backend_->Allocate(bytes);
    EXPECT_FALSE(buffer.ok()) << bytes;
    if (!buffer.ok() && backend_->device() == Device::kCpu) {
      EXPECT_EQ(buffer.status().code(), absl::StatusCode::kResourceExhausted) << buffer.status();
    }
  }
  auto small = backend_->Allocate(4096);
  EXPECT_TRUE(small.ok()) << small.status();
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
  // Block-quantized types are only ever Embed tables and Gemm weights; the CPU backend runs all
  // of them, another backend may refuse them (Transformer::Create then names the tensor).
  for (DType dt : kQuantDTypes) {
    for (OpKind op : {OpKind::kRmsNorm, OpKind::kRopeAndAppendKv, OpKind::kAttention,
                      OpKind::kSwiGlu, OpKind::kAdd}) {
      EXPECT_FALSE(backend_->Supports(op, dt)) << OpKindName(op) << " " << DTypeName(dt);
    }
    if (backend_->device() == Device::kCpu) {
      EXPECT_TRUE(backend_->Supports(OpKind::kEmbed, dt)) << DTypeName(dt);
      EXPECT_TRUE(backend_->Supports(OpKind::kGemm, dt)) << DTypeName(dt);
    }
  }
}

// ---- device row counts and RouteRows (backend.h: SetDeviceRowCount, RouteRows) ------------
// The first `rows` rows of a host tensor, as a tensor of its own.
HostTensor FirstRows(const HostTensor& t, int64_t rows) {
  HostTensor out = t;
  out.dims[0] = rows;
  out.numel_ = t.numel() / t.dims[0] * rows;
  out.storage.resize(DTypeRowBytes(t.dtype, out.numel_));
  return out;
}

// A RouteRows problem: step rows of `seq_lens` sequences, routed rows `idx` (ascending), each
// sequence's candidate slots at the layer in its own rows' places, entries before the step.
struct RouteRowsCase {
  std::vector<int32_t> idx, row_seq, row_pos, cand_slots, seq_first_row, seq_kv_base;
};

RouteRowsCase MakeRouteRowsCase(std::mt19937& rng, const std::vector<int32_t>& seq_lens,
                                double p_routed) {
  RouteRowsCase c;
  std::bernoulli_distribution routed(p_routed);
  int32_t row = 0, slot = 1000;
  for (size_t s = 0; s < seq_lens.size(); ++s) {
    c.seq_first_row.push_back(row);
    c.seq_kv_base.push_back(static_cast<int32_t>(rng() % 300));
    const int32_t start = static_cast<int32_t>(rng() % 500);
    for (int32_t t = 0; t < seq_lens[s]; ++t, ++row) {
      c.row_seq.push_back(static_cast<int32_t>(s));
      c.row_pos.push_back(start + t);
      c.cand_slots.push_back(slot += 1 + static_cast<int32_t>(rng() % 40));
      if (routed(rng)) c.idx.push_back(row);
    }
  }
  return c;
}

TEST_P(BackendConformanceTest, RouteRowsMatchesReference) {
  for (auto [lens, p_routed] : std::vector<std::pair<std::vector<int32_t>, double>>{
           {{1}, 1.0},
           {{1, 1, 1, 1, 1, 1, 1, 1}, 0.5},   // a decode step
           {{40, 1, 3, 1, 17}, 0.3},          // prefill chunks and decode rows
           {{300, 200, 1, 600, 5}, 0.125},    // long prompts, ~12.5% routed
           {{64, 64}, 1.0}}) {                // everything routed in
    std::mt19937 rng(static_cast<uint32_t>(lens.size() * 31 + lens[0]));
    RouteRowsCase c = MakeRouteRowsCase(rng, lens, p_routed);
    if (c.idx.empty()) c.idx.push_back(0);
    const int64_t m = static_cast<int64_t>(c.idx.size());
    HostTensor idx = Ints(c.idx), row_seq = Ints(c.row_seq), row_pos = Ints(c.row_pos),
               cand = Ints(c.cand_slots), first = Ints(c.seq_first_row),
               base = Ints(c.seq_kv_base);
    HostTensor want[4] = {Ints(std::vector<int32_t>(m, -7)), Ints(std::vector<int32_t>(m, -7)),
                          Ints(std::vector<int32_t>(m, -7)), Ints(std::vector<int32_t>(m, -7))};
    cpu::reference::RouteRows(idx.view(), row_seq.view(), row_pos.view(), cand.view(),
                              first.view(), base.view(), want[0].view(), want[1].view(),
                              want[2].view(), want[3].view());
    TensorView out[4];
    for (int o = 0; o < 4; ++o) out[o] = Upload(Ints(std::vector<int32_t>(m, -7)));
    backend_->RouteRows(Upload(idx), Upload(row_seq), Upload(row_pos), Upload(cand),
                        Upload(first), Upload(base), out[0], out[1], out[2], out[3]);
    for (int o = 0; o < 4; ++o) {
      ExpectClose(Download(out[o], want[o]), want[o], 0.0,
                  "RouteRows output " + std::to_string(o) + " m=" + std::to_string(m));
    }
  }
  EXPECT_TRUE(backend_->Supports(OpKind::kRouteRows, DType::kI32));
}

TEST_P(BackendConformanceTest, DeviceRowCountLimitsEveryOpToTheCountedRows) {
  if (!backend_->SupportsDeviceRowCount()) {
    GTEST_SKIP() << backend_->name() << " has no device row counts";
  }
  constexpr int64_t kCap = 7, kD = 67, kF = 45;
  const TensorView count = Upload(Ints({0}));
  for (int64_t c : {int64_t{0}, int64_t{1}, int64_t{5}, kCap}) {
    for (int64_t stored : {c, kCap + 3}) {  // a stored count above the capacity means all rows
      const std::string what = " count=" + std::to_string(stored) + " capacity 7";
      const int64_t rows = std::min(stored, kCap);
      std::mt19937 rng(static_cast<uint32_t>(c * 13 + stored));
      ASSERT_TRUE(backend_->CopyToDevice(Ints({static_cast<int32_t>(stored)}).view(), count).ok());
      // Reads a device output and checks its first `rows` rows against `want` (computed by the
      // reference on exactly those rows).
      auto expect_rows = [&](const TensorView& got, const HostTensor& like, const HostTensor& want,
                             double tol, const std::string& op) {
        if (rows == 0) return;
        ExpectClose(FirstRows(Download(got, like), rows), want, tol, op + what);
      };
      // Embed, RmsNorm, Gemm, GemmGroup, SwiGlu, Activation, Add.
      HostTensor table = Random(rng, DType::kBF16, {37, kD});
      std::vector<int32_t> ids(kCap);
      for (auto& id : ids) id = static_cast<int32_t>(rng() % 37);
      HostTensor x = Random(rng, DType::kF32, {kCap, kD}, 2.0f);
      HostTensor x2 = Random(rng, DType::kF32, {kCap, kD});
      HostTensor nw = Random(rng, DType::kF32, {kD});
      HostTensor w = Random(rng, DType::kBF16, {kF, kD});
      HostTensor w2 = Random(rng, DType::kF32, {11, kD});
      HostTensor e_out(DType::kF32, {kCap, kD}), g_out(DType::kF32, {kCap, kF}),
          g2_out(DType::kF32, {kCap, 11});
      HostTensor want_e(DType::kF32, {rows, kD}), want_n(DType::kF32, {rows, kD}),
          want_g(DType::kF32, {rows, kF}), want_g2(DType::kF32, {rows, 11}),
          want_add(DType::kF32, {rows, kD});
      HostTensor xr = FirstRows(x, rows), x2r = FirstRows(x2, rows);
      HostTensor ids_r = FirstRows(Ints(ids), rows);
      HostTensor want_swi = xr, want_act = xr;
      if (rows > 0) {
        cpu::reference::Embed(ids_r.view(), table.view(), want_e.view());
        cpu::reference::RmsNorm({.eps = 1e-5f}, xr.view(), nw.view(), want_n.view());
        cpu::reference::Gemm(xr.view(), w.view(), {}, want_g.view());
        cpu::reference::Gemm(xr.view(), w2.view(), {}, want_g2.view());
        cpu::reference::SwiGlu(xr.view(), x2r.view(), want_swi.view());
        cpu::reference::Activation({ActivationKind::kGelu}, want_act.view());
        cpu::reference::Add(xr.view(), x2r.view(), want_add.view());
      }
      const TensorView xd = Upload(x), x2d = Upload(x2), ed = Upload(e_out), nd = Upload(e_out),
                       gd = Upload(g_out), g2d = Upload(g2_out), g3d = Upload(g_out),
                       swid = Upload(e_out), actd = Upload(x), addd = Upload(e_out),
                       table_d = Upload(table), ids_d = Upload(Ints(ids)), nw_d = Upload(nw),
                       w_d = Upload(w), w2_d = Upload(w2);
      backend_->SetDeviceRowCount(count);
      backend_->Embed(ids_d, table_d, ed);
      backend_->RmsNorm({.eps = 1e-5f}, xd, nw_d, nd);
      backend_->Gemm(xd, w_d, {}, gd);
      backend_->GemmGroup(xd, {{w_d, {}, g3d}, {w2_d, {}, g2d}});
      backend_->SwiGlu(xd, x2d, swid);
      backend_->Activation({ActivationKind::kGelu}, actd);
      backend_->Add(xd, x2d, addd);
      backend_->SetDeviceRowCount({});
      expect_rows(ed, e_out, want_e, kSameOrderRelTol, "Embed");
      expect_rows(nd, e_out, want_n, kAccumOrderRelTol, "RmsNorm");
      expect_rows(gd, g_out, want_g, kAccumOrderRelTol, "Gemm");
      expect_rows(g3d, g_out, want_g, kAccumOrderRelTol, "GemmGroup member 0");
      expect_rows(g2d, g2_out, want_g2, kAccumOrderRelTol, "GemmGroup member 1");
      expect_rows(swid, e_out, want_swi, kSameOrderRelTol, "SwiGlu");
      expect_rows(actd, x, want_act, kSameOrderRelTol, "Activation");
      expect_rows(addd, e_out, want_add, kSameOrderRelTol, "Add");

      // RopeAndAppendKv: only the counted rows' slots are written.
      const RopeParams rp{.n_heads = 4, .n_kv_heads = 2, .head_dim = 18, .block_size = 4};
      HostTensor q = Random(rng, DType::kF32, {kCap, 4, 18});
      HostTensor k = Random(rng, DType::kF32, {kCap, 2, 18});
      HostTensor v = Random(rng, DType::kF32, {kCap, 2, 18});
      HostTensor pool = Random(rng, DType::kBF16, {5, 4, 4, 18});
      std::vector<int32_t> slots = {3, 17, 0, 9, 12, 5, 19}, positions = {4, 9, 100, 3, 77, 8, 1};
      HostTensor want_q = FirstRows(q, rows), want_k = FirstRows(k, rows), want_pool = pool;
      HostTensor v_r = FirstRows(v, rows), pos_r = FirstRows(Ints(positions), rows),
                 slots_r = FirstRows(Ints(slots), rows);
      if (rows > 0) {
        cpu::reference::RopeAndAppendKv(rp, want_q.view(), want_k.view(), v_r.view(),
                                        pos_r.view(), slots_r.view(), want_pool.view());
      }
      const TensorView qd = Upload(q), kd = Upload(k), pool_d = Upload(pool);
      backend_->SetDeviceRowCount(count);
      backend_->RopeAndAppendKv(rp, qd, kd, Upload(v), Upload(Ints(positions)),
                                Upload(Ints(slots)), pool_d);
      backend_->SetDeviceRowCount({});
      expect_rows(qd, q, want_q, kSameOrderRelTol, "Rope q");
      expect_rows(kd, k, want_k, kSameOrderRelTol, "Rope k");
      ExpectClose(Download(pool_d, pool), want_pool, 0.0,
                  "Rope pool (uncounted slots kept)" + what);

      // Attention: rows past the count carry metadata that would fault if read.
      const AttentionParams ap{.n_heads = 4, .n_kv_heads = 2, .head_dim = 18, .block_size = 4,
                               .scale = 0.25f};
      HostTensor table_t = Ints({2, 0, 4, 1, 3, -1});  // [2 seqs, 3 pages]
      table_t.dims = {2, 3};
      std::vector<int32_t> row_seq = {0, 1, 0, 1, 0, 1, 0}, kv_len = {12, 8, 5, 1, 11, 3, 7};
      for (int64_t r = rows; r < kCap; ++r) {
        row_seq[r] = 1 << 20;
        kv_len[r] = 1 << 20;
      }
      HostTensor want_att(DType::kF32, {rows, 4 * 18});
      HostTensor q_r = FirstRows(q, rows), seq_r = FirstRows(Ints(row_seq), rows),
                 len_r = FirstRows(Ints(kv_len), rows);
      if (rows > 0) {
        cpu::reference::Attention(ap, q_r.view(), pool.view(), table_t.view(), seq_r.view(),
                                  len_r.view(), want_att.view());
      }
      HostTensor att_out(DType::kF32, {kCap, 4 * 18});
      const TensorView att_d = Upload(att_out);
      backend_->SetDeviceRowCount(count);
      backend_->Attention(ap, Upload(q), Upload(pool), Upload(table_t), Upload(Ints(row_seq)),
                          Upload(Ints(kv_len)), att_d);
      backend_->SetDeviceRowCount({});
      expect_rows(att_d, att_out, want_att, kAccumOrderRelTol, "Attention");

      // GatherRows and ScatterCombine: idx entries past the count are out of range on purpose.
      std::vector<int32_t> gidx = {6, 0, 3, 2, 5, 1, 4};
      for (int64_t r = rows; r < kCap; ++r) gidx[r] = 1 << 20;
      HostTensor gidx_r = FirstRows(Ints(gidx), rows);
      HostTensor want_gather(DType::kF32, {rows, kD});
      HostTensor y = Random(rng, DType::kF32, {kCap, kD});
      HostTensor sc = Random(rng, DType::kF32, {kCap}, 2.0f);
      HostTensor y_r = FirstRows(y, rows), sc_r = FirstRows(sc, rows);
      HostTensor want_scatter = x;
      const ScatterCombineParams sp{.weight_fn = WeightFn::kSigmoid,
                                    .scale_target = ScaleTarget::kUpdate};
      if (rows > 0) {
        cpu::reference::GatherRows(x.view(), gidx_r.view(), want_gather.view());
        cpu::reference::ScatterCombine(sp, want_scatter.view(), y_r.view(), gidx_r.view(),
                                       sc_r.view());
      }
      const TensorView gather_d = Upload(e_out), scatter_x = Upload(x), gidx_d = Upload(Ints(gidx));
      backend_->SetDeviceRowCount(count);
      backend_->GatherRows(xd, gidx_d, gather_d);
      backend_->ScatterCombine(sp, scatter_x, Upload(y), gidx_d, Upload(sc));
      backend_->SetDeviceRowCount({});
      expect_rows(gather_d, e_out, want_gather, 0.0, "GatherRows");
      ExpectClose(Download(scatter_x, x), want_scatter, kSameOrderRelTol,
                  "ScatterCombine (uncounted rows kept)" + what);

      // RouteSelect over the counted rows, then RouteRows of its selection.
      HostTensor z = Random(rng, DType::kF32, {kCap}, 3.0f);
      HostTensor tau(DType::kF32, {kCap});  // z cuts
      for (int64_t i = 0; i < kCap; ++i) tau.f32()[i] = 0.0f;
      HostTensor want_probs(DType::kF32, {std::max<int64_t>(rows, 1)}),
          want_sidx = Ints(std::vector<int32_t>(std::max<int64_t>(rows, 1), -1)),
          want_ssel(DType::kF32, {std::max<int64_t>(rows, 1)}), want_count = Ints({0});
      HostTensor z_r = FirstRows(z, rows), tau_r = FirstRows(tau, rows), s_r = FirstRows(sc, rows);
      if (rows > 0) {
        cpu::reference::RouteSelect(z_r.view(), tau_r.view(), s_r.view(), want_probs.view(),
                                    want_sidx.view(), want_ssel.view(), want_count.view());
      }
      const TensorView sel_idx = Upload(Ints(std::vector<int32_t>(kCap, -1))),
                       sel_count = Upload(Ints({-1}));
      HostTensor ssel(DType::kF32, {kCap}), probs(DType::kF32, {kCap});
      const TensorView ssel_d = Upload(ssel);
      backend_->SetDeviceRowCount(count);
      backend_->RouteSelect(Upload(z), Upload(tau), Upload(sc), Upload(probs), sel_idx, ssel_d,
                            sel_count);
      backend_->SetDeviceRowCount({});
      const int32_t m = Download(sel_count, want_count).i32()[0];
      ASSERT_EQ(m, want_count.i32()[0]) << "RouteSelect count" << what;
      HostTensor got_idx = Download(sel_idx, Ints(std::vector<int32_t>(kCap)));
      for (int32_t j = 0; j < m; ++j) {
        EXPECT_EQ(got_idx.i32()[j], want_sidx.i32()[j]) << "RouteSelect idx " << j << what;
      }
      // RouteRows under the routed count: 2 sequences over the 7 rows.
      std::vector<int32_t> rr_seq = {0, 0, 0, 1, 1, 1, 1}, rr_pos = {10, 11, 12, 3, 4, 5, 6},
                           rr_cand = {40, 41, 42, 70, 71, 72, 73};
      const TensorView outs[4] = {Upload(Ints(std::vector<int32_t>(kCap, -7))),
                                  Upload(Ints(std::vector<int32_t>(kCap, -7))),
                                  Upload(Ints(std::vector<int32_t>(kCap, -7))),
                                  Upload(Ints(std::vector<int32_t>(kCap, -7)))};
      backend_->SetDeviceRowCount(sel_count);
      backend_->RouteRows(sel_idx, Upload(Ints(rr_seq)), Upload(Ints(rr_pos)),
                          Upload(Ints(rr_cand)), Upload(Ints({0, 3})), Upload(Ints({5, 0})),
                          outs[0], outs[1], outs[2], outs[3]);
      backend_->SetDeviceRowCount({});
      if (m > 0) {
        HostTensor sidx_m = FirstRows(want_sidx, m);
        HostTensor want_rr[4] = {Ints(std::vector<int32_t>(m)), Ints(std::vector<int32_t>(m)),
                                 Ints(std::vector<int32_t>(m)), Ints(std::vector<int32_t>(m))};
        HostTensor rr_seq_t = Ints(rr_seq), rr_pos_t = Ints(rr_pos), rr_cand_t = Ints(rr_cand),
                   first_t = Ints({0, 3}), base_t = Ints({5, 0});
        cpu::reference::RouteRows(sidx_m.view(), rr_seq_t.view(), rr_pos_t.view(),
                                  rr_cand_t.view(), first_t.view(), base_t.view(),
                                  want_rr[0].view(), want_rr[1].view(), want_rr[2].view(),
                                  want_rr[3].view());
        for (int o = 0; o < 4; ++o) {
          ExpectClose(FirstRows(Download(outs[o], Ints(std::vector<int32_t>(kCap))), m),
                      want_rr[o], 0.0, "RouteRows output " + std::to_string(o) + what);
        }
      }
    }
  }
}

// A captured graph runs nothing until replayed, then reads its inputs (and the device row count
// in force when each op was captured) at replay time.
TEST_P(BackendConformanceTest, GraphReplaysReadTheirInputsWhenTheyRun) {
  if (!backend_->SupportsGraphs()) GTEST_SKIP() << backend_->name() << " has no graphs";
  if (!backend_->SupportsDeviceRowCount()) {
    GTEST_SKIP() << backend_->name() << " has no device row counts";
  }
  constexpr int64_t kCap = 6, kK = 40, kM = 23;
  std::mt19937 rng(77);
  HostTensor w = Random(rng, DType::kBF16, {kM, kK});
  HostTensor sentinel(DType::kF32, {kCap, kM});
  for (int64_t i = 0; i < sentinel.numel(); ++i) sentinel.f32()[i] = -12345.0f;
  const TensorView x = Upload(Random(rng, DType::kF32, {kCap, kK}));
  const TensorView b = Upload(Random(rng, DType::kF32, {kCap, kM}));
  const TensorView y = Upload(sentinel), out = Upload(sentinel);
  const TensorView count = Upload(Ints({kCap}));
  const TensorView wd = Upload(w);
  ASSERT_TRUE(backend_->BeginCapture().ok());
  backend_->SetDeviceRowCount(count);
  backend_->Gemm(x, wd, {}, y);  // y = x w^T on the counted rows
  backend_->SetDeviceRowCount({});
  backend_->Add(y, b, out);  // out = y + b on every row
  absl::StatusOr<int> graph = backend_->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  // Nothing ran yet.
  ExpectClose(Download(out, sentinel), sentinel, 0.0, "before the first replay");
  for (int32_t rows : {6, 2, 4}) {
    HostTensor xh = Random(rng, DType::kF32, {kCap, kK}), bh = Random(rng, DType::kF32, {kCap, kM});
    ASSERT_TRUE(backend_->CopyToDevice(xh.view(), x).ok());
    ASSERT_TRUE(backend_->CopyToDevice(bh.view(), b).ok());
    ASSERT_TRUE(backend_->CopyToDevice(Ints({rows}).view(), count).ok());
    ASSERT_TRUE(backend_->Replay(*graph).ok());
    HostTensor xr = FirstRows(xh, rows), want_y(DType::kF32, {rows, kM});
    cpu::reference::Gemm(xr.view(), w.view(), {}, want_y.view());
    HostTensor br = FirstRows(bh, rows), want(DType::kF32, {rows, kM});
    cpu::reference::Add(want_y.view(), br.view(), want.view());
    ExpectClose(FirstRows(Download(out, sentinel), rows), want, kAccumOrderRelTol,
                "replay with " + std::to_string(rows) + " counted rows");
  }
  EXPECT_FALSE(backend_->Replay(*graph + 1000).ok());
  backend_->ReleaseGraphs();
  EXPECT_FALSE(backend_->Replay(*graph).ok()) << "a released graph is gone";
}

// The kAvx512Vnni table's quantized Gemms compute every block's integer sum with vpdpbusd where
// the kAvx512 table uses vpmaddubsw chains, and scale the sums with the same f32 operations in
// the same order (kernels_avx512vnni.cc): the outputs must be the same bits, decode and prefill,
// whole and partial chunks, every x tile remainder, with and without a bias.
TEST(QuantizedGemmIsaTest, VnniGivesTheBitsOfTheAvx512Kernels) {
  if (!cpu::CpuHasIsa(cpu::Isa::kAvx512Vnni)) GTEST_SKIP() << "this CPU has no AVX512_VNNI";
  auto vnni = cpu::CpuBackend::Create({.num_threads = 2, .isa = cpu::Isa::kAvx512Vnni});
  auto avx512 = cpu::CpuBackend::Create({.num_threads = 3, .isa = cpu::Isa::kAvx512});
  ASSERT_TRUE(vnni.ok() && avx512.ok());
  for (DType dt : kQuantDTypes) {
    const int64_t k = DTypeBlockElems(dt) == 32 ? 608 : 768;  // 608: 2 chunks and 3 blocks
    for (int64_t n : {1, 2, 3, 4, 5, 8, 9, 13, 16, 17, 24, 31, 64, 100}) {
      const int64_t m = 37;
      std::mt19937 rng(static_cast<uint32_t>(n * 101 + static_cast<int>(dt)));
      HostTensor x = QuantGemmInput(rng, n, k);
      HostTensor w = RandomQuantized(rng, dt, m, k);
      HostTensor bias = Random(rng, DType::kF32, {m});
      const TensorView no_bias;
      const TensorView b = n % 2 == 0 ? bias.view() : no_bias;
      HostTensor got(DType::kF32, {n, m}), want(DType::kF32, {n, m});
      (*vnni)->Gemm(x.view(), w.view(), b, got.view());
      (*avx512)->Gemm(x.view(), w.view(), b, want.view());
      EXPECT_EQ(std::memcmp(got.storage.data(), want.storage.data(), got.storage.size()), 0)
          << DTypeName(dt) << " n=" << n;
    }
  }
}

// `got` and `want` give the same bits for weights of each dtype in dts (prepared by each, so
// copied where the backend copies: both or neither, and `got` must have copied all but Q4_0 and
// Q4_1), for every x tile remainder of the AMX-INT8 Gemms (n = 16 and 48 end on a half step, 31
// and 33 leave rows beside one), row groups left over beside whole steps (m = 48, 80), with and
// without a bias. Q4_0 / Q4_1 stay in the file's layout where the AMX-INT8 tiles run them; their k
// leave blocks past the whole 256-element chunks (2 of 18, 1 of 41) and odd chunk counts (5), and
// 768 and 1280 none.
void ExpectSameQuantGemmBits(cpu::CpuBackend& got_backend, cpu::CpuBackend& want_backend,
                             std::initializer_list<DType> dts) {
  for (DType dt : dts) {
    const bool row_layout = dt == DType::kQ4_0 || dt == DType::kQ4_1;
    for (int64_t m : {48, 80}) {
      for (int64_t k : row_layout ? std::vector<int64_t>{576, 1312, m == 48 ? 768 : 1280}
                                  : std::vector<int64_t>{m == 48 ? 768 : 1280}) {
        SCOPED_TRACE(testing::Message() << DTypeName(dt) << " m=" << m << " k=" << k);
        std::mt19937 rng(static_cast<uint32_t>(7 + m + k + static_cast<int>(dt)));
        HostTensor w = RandomQuantized(rng, dt, m, k);
        HostTensor bias = Random(rng, DType::kF32, {m});
        absl::StatusOr<TensorView> wg = got_backend.PrepareGemmWeight(w.view());
        absl::StatusOr<TensorView> ww = want_backend.PrepareGemmWeight(w.view());
        ASSERT_TRUE(wg.ok() && ww.ok());
        ASSERT_EQ(wg->data != w.view().data, ww->data != w.view().data) << "copied by one";
        if (!row_layout) {
          ASSERT_NE(wg->data, w.view().data) << "was not copied";
        }
        for (int64_t n : {1, 2, 3, 5, 7, 16, 17, 31, 32, 33, 48, 50, 64, 100, 128, 300}) {
          HostTensor x = QuantGemmInput(rng, n, k);
          const TensorView b = n % 2 == 0 ? bias.view() : TensorView();
          HostTensor got(DType::kF32, {n, m}), want(DType::kF32, {n, m});
          got_backend.Gemm(x.view(), *wg, b, got.view());
          want_backend.Gemm(x.view(), *ww, b, want.view());
          EXPECT_EQ(std::memcmp(got.storage.data(), want.storage.data(), got.storage.size()), 0)
              << "n=" << n;
        }
      }
    }
  }
}

// The kAmx table's interleaved-copy Q6_K and Q8_0 Gemms (one-row tiles that prefetch) and, where
// the CPU has AMX-INT8, its Q4_K, Q5_K and Q8_0 copies' Gemms and its Q4_0 and Q4_1 Gemms (weights
// in the file's layout, packed per call) on the tiles (32 x rows by 32 weight rows a step, then a
// half step of 16 x rows where 16 to 31 are left, the rest on the VNNI kernels) are the VNNI
// table's arithmetic: the same bits from the same weights.
TEST(QuantizedGemmIsaTest, AmxTableGivesTheVnniTablesBitsFromPreparedCopies) {
  if (!cpu::CpuHasIsa(cpu::Isa::kAmx) || !cpu::CpuHasIsa(cpu::Isa::kAvx512Vnni)) {
    GTEST_SKIP() << "this CPU has no usable AMX unit or no AVX512_VNNI";
  }
  auto amx = cpu::CpuBackend::Create({.num_threads = 2, .isa = cpu::Isa::kAmx});
  // Where the tiles take Q4_0 and Q4_1 in the file's layout, the VNNI table's kernels for that
  // layout, not its interleaved copies.
  cpu::KernelTable vnni_table = cpu::KernelsFor(cpu::Isa::kAvx512Vnni);
  vnni_table.gemm_q4_0_x16 = cpu::KernelsFor(cpu::Isa::kAmx).gemm_q4_0_x16;
  vnni_table.gemm_q4_1_x16 = cpu::KernelsFor(cpu::Isa::kAmx).gemm_q4_1_x16;
  auto vnni = cpu::CpuBackend::Create({.num_threads = 3, .kernels = &vnni_table});
  ASSERT_TRUE(amx.ok() && vnni.ok());
  ExpectSameQuantGemmBits(
      **amx, **vnni,
      {DType::kQ6_K, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ4_0, DType::kQ4_1});
}

// The K-quant copies' Gemms whose one-row tiles prefetch into L2 (kFarPrefetchQuantGemms, the VNNI
// table's on AMD family 1Ah) give the bits of those without, on every CPU with AVX512_VNNI.
TEST(QuantizedGemmIsaTest, FarPrefetchKQuantGemmsGiveTheVnniTablesBits) {
  if (!cpu::CpuHasIsa(cpu::Isa::kAvx512Vnni)) GTEST_SKIP() << "this CPU has no AVX512_VNNI";
  const cpu::KernelTable& far = cpu::internal::kFarPrefetchQuantGemms;
  cpu::KernelTable with = cpu::KernelsFor(cpu::Isa::kAvx512Vnni);
  with.gemm_q4_k_x16 = far.gemm_q4_k_x16;
  with.gemm_q5_k_x16 = far.gemm_q5_k_x16;
  with.gemm_q6_k_x16 = far.gemm_q6_k_x16;
  cpu::KernelTable without = cpu::KernelsFor(cpu::Isa::kAvx512Vnni);
  without.gemm_q4_k_x16 = cpu::internal::kAvx512VnniQuantGemms.gemm_q4_k_x16;
  without.gemm_q5_k_x16 = cpu::internal::kAvx512VnniQuantGemms.gemm_q5_k_x16;
  without.gemm_q6_k_x16 = cpu::internal::kAvx512VnniQuantGemms.gemm_q6_k_x16;
  ASSERT_NE(with.gemm_q4_k_x16, without.gemm_q4_k_x16);
  EXPECT_EQ(cpu::KernelsFor(cpu::Isa::kAvx512Vnni).gemm_q4_k_x16,
            cpu::CpuIsAmdFamily1Ah() ? far.gemm_q4_k_x16 : without.gemm_q4_k_x16);
  auto got = cpu::CpuBackend::Create({.num_threads = 2, .kernels = &with});
  auto want = cpu::CpuBackend::Create({.num_threads = 3, .kernels = &without});
  ASSERT_TRUE(got.ok() && want.ok());
  ExpectSameQuantGemmBits(**got, **want, {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K});
}

// The same AMX-INT8 Gemms on a software model of the tiles (amx_int8_emulated.cc), so that their
// steps, packing and remainders are checked on every CPU with AVX512_VNNI, AMX or not: a VNNI
// table with the five emulated Gemms in place gives the VNNI table's bits.
TEST(QuantizedGemmIsaTest, EmulatedAmxInt8GemmsGiveTheVnniTablesBits) {
  if (!cpu::CpuHasIsa(cpu::Isa::kAvx512Vnni)) GTEST_SKIP() << "this CPU has no AVX512_VNNI";
  cpu::KernelTable table = cpu::KernelsFor(cpu::Isa::kAvx512Vnni);
  const cpu::EmulatedInt8Gemms emulated =
      cpu::EmulatedAmxInt8Gemms({.q4_0 = table.gemm_q4_0,
                                 .q4_1 = table.gemm_q4_1,
                                 .q4_k_x16 = table.gemm_q4_k_x16,
                                 .q5_k_x16 = table.gemm_q5_k_x16,
                                 .q8_0_x16 = table.gemm_q8_0_x16});
  table.gemm_q4_0 = emulated.q4_0;
  table.gemm_q4_1 = emulated.q4_1;
  table.gemm_q4_k_x16 = emulated.q4_k_x16;
  table.gemm_q5_k_x16 = emulated.q5_k_x16;
  table.gemm_q8_0_x16 = emulated.q8_0_x16;
  // Q4_0 and Q4_1 in the file's layout on both sides, as the AMX table runs them.
  table.gemm_q4_0_x16 = table.gemm_q4_1_x16 = nullptr;
  cpu::KernelTable vnni_table = cpu::KernelsFor(cpu::Isa::kAvx512Vnni);
  vnni_table.gemm_q4_0_x16 = vnni_table.gemm_q4_1_x16 = nullptr;
  auto tiles = cpu::CpuBackend::Create({.num_threads = 2, .kernels = &table});
  auto vnni = cpu::CpuBackend::Create({.num_threads = 3, .kernels = &vnni_table});
  ASSERT_TRUE(tiles.ok() && vnni.ok());
  const int64_t calls_before = cpu::EmulatedAmxInt8Calls();
  ExpectSameQuantGemmBits(**tiles, **vnni,
                          {DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ4_0, DType::kQ4_1});
  EXPECT_GT(cpu::EmulatedAmxInt8Calls(), calls_before) << "the emulated Gemms were not called";
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
