// CUDA-backend behaviour that the cross-backend conformance suite does not reach: the no-device
// error, allocation failure, upload staging, device faults at Synchronize, the chunked Gemm paths,
// attention at long contexts and every head-dim bucket, graph capture and replay, a device row
// count read at replay time, and RouteRows. Without a GPU only the no-device cases run; the rest
// GTEST_SKIP with a message.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/reference_ops.h"
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/backend/registry.h"
#include "engine/common/dtype.h"
#include "engine/common/tensor_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/backend/host_tensor.h"

namespace modserve::backend {
namespace {

using test_util::ExpectClose;
using test_util::HostTensor;
using test_util::Ints;
using test_util::Random;

using ::testing::HasSubstr;

// The CUDA Gemm and attention claim f32-exact inputs and f32 sums, so they get the conformance
// suite's accumulation-order tolerance: only the summation order differs from the reference.
constexpr double kAccumOrderRelTol = 1e-5;

// ---- without a device --------------------------------------------------------------------------
TEST(CudaBackendNoDeviceTest, CreateWithoutDeviceIsUnavailableWithClearMessage) {
  if (cuda::VisibleDeviceCount() > 0) {
    GTEST_SKIP() << "a CUDA device is visible; this case checks machines without one";
  }
  auto backend = CreateBackend("cuda");
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable) << backend.status();
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("no CUDA device visible"));
}

TEST(CudaBackendNoDeviceTest, OrdinalPastTheLastDeviceIsUnavailable) {
  auto backend = CreateBackend("cuda", {.device_ordinal = cuda::VisibleDeviceCount()});
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kUnavailable) << backend.status();
}

// ---- with a device -----------------------------------------------------------------------------
class CudaBackendTest : public ::testing::Test {
 public:
  void SetUp() override {
    if (cuda::VisibleDeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA device visible; the CUDA backend cases need a GPU";
    }
    Make({});
  }
  void Make(const cuda::CudaTuning& tuning) {
    buffers_.clear();
    auto created = cuda::CreateCudaBackend({}, tuning);
    ASSERT_TRUE(created.ok()) << created.status();
    backend_ = std::move(created).value();
  }
  TensorView Upload(const HostTensor& host) {
    auto buffer = backend_->Allocate(host.storage.size());
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    buffers_.push_back(std::move(buffer).value());
    TensorView dst = host.MakeView(buffers_.back().data(), Device::kCuda);
    HostTensor copy = host;
    EXPECT_TRUE(backend_->CopyToDevice(copy.view(), dst).ok());
    return dst;
  }
  // Overwrites an uploaded tensor (between graph replays).
  void Refill(const TensorView& dst, const HostTensor& host) {
    HostTensor copy = host;
    const absl::Status st = backend_->CopyToDevice(copy.view(), dst);
    EXPECT_TRUE(st.ok()) << st;
  }
  HostTensor Download(const TensorView& src, const HostTensor& like) {
    HostTensor out = like;
    const absl::Status st = backend_->CopyToHost(src, out.view());
    EXPECT_TRUE(st.ok()) << st;
    return out;
  }

  std::unique_ptr<Backend> backend_;
  std::vector<DeviceBuffer> buffers_;
};

TEST_F(CudaBackendTest, AllocateBeyondMemoryIsResourceExhaustedAndRecoverable) {
  const size_t huge = size_t{1} << 50;
  auto buffer = backend_->Allocate(huge);
  ASSERT_FALSE(buffer.ok());
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kResourceExhausted) << buffer.status();
  EXPECT_THAT(std::string(buffer.status().message()), HasSubstr(std::to_string(huge)));
  auto small = backend_->Allocate(1024);
  EXPECT_TRUE(small.ok()) << small.status();
  EXPECT_TRUE(backend_->Synchronize().ok());
}

TEST_F(CudaBackendTest, CopiesRejectSizeAndDeviceMismatch) {
  HostTensor a(DType::kF32, {16}), b(DType::kF32, {17});
  TensorView d = Upload(a);
  EXPECT_EQ(backend_->CopyToDevice(b.view(), d).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->CopyToHost(d, b.view()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->CopyToDevice(a.view(), a.view()).code(),
            absl::StatusCode::kInvalidArgument);
}

// Many small uploads between syncs (more than the pinned staging buffer holds) and one large one,
// each from a host buffer that is overwritten right after the call returns.
TEST_F(CudaBackendTest, UploadsMayReuseHostMemoryImmediately) {
  constexpr int kSmall = 300;
  constexpr int64_t kSmallElems = 16 * 1024;  // 64 KiB each, ~19 MiB in all
  HostTensor scratch(DType::kF32, {kSmallElems});
  std::vector<TensorView> dsts;
  for (int i = 0; i < kSmall; ++i) {
    auto* f = reinterpret_cast<float*>(scratch.storage.data());
    for (int64_t e = 0; e < kSmallElems; ++e) f[e] = static_cast<float>(i * 100000 + e);
    auto buffer = backend_->Allocate(scratch.storage.size());
    ASSERT_TRUE(buffer.ok());
    buffers_.push_back(std::move(buffer).value());
    dsts.push_back(scratch.MakeView(buffers_.back().data(), Device::kCuda));
    ASSERT_TRUE(backend_->CopyToDevice(scratch.view(), dsts.back()).ok());
  }
  std::mt19937 rng(5);
  HostTensor big = Random(rng, DType::kF32, {3 * 1024 * 1024});
  TensorView big_d = Upload(big);
  for (int i = 0; i < kSmall; ++i) {
    HostTensor got = Download(dsts[i], scratch);
    const auto* f = reinterpret_cast<const float*>(got.storage.data());
    ASSERT_EQ(f[0], static_cast<float>(i * 100000)) << "upload " << i;
    ASSERT_EQ(f[kSmallElems - 1], static_cast<float>(i * 100000 + kSmallElems - 1));
  }
  EXPECT_EQ(Download(big_d, big).storage, big.storage);
}

// The child of the fault test: an Embed with an id past the vocab traps in the kernel; exits 0 when
// Synchronize() reports it as Internal (and prints the status for the parent to match).
[[noreturn]] void RunOutOfRangeEmbedAndExit() {
  auto created = CreateBackend("cuda");
  if (!created.ok()) std::exit(2);
  Backend& b = **created;
  HostTensor ids = Ints({1000});  // vocab is 10
  HostTensor table(DType::kF32, {10, 4});
  HostTensor out(DType::kF32, {1, 4});
  auto ib = b.Allocate(4);
  auto tb = b.Allocate(table.storage.size());
  auto ob = b.Allocate(16);
  if (!ib.ok() || !tb.ok() || !ob.ok()) std::exit(3);
  const TensorView id = ids.MakeView(ib->data(), Device::kCuda);
  if (!b.CopyToDevice(ids.view(), id).ok()) std::exit(4);
  b.Embed(id, table.MakeView(tb->data(), Device::kCuda), out.MakeView(ob->data(), Device::kCuda));
  const absl::Status st = b.Synchronize();
  std::fprintf(stderr, "%s\n", st.ToString().c_str());
  std::exit(st.code() == absl::StatusCode::kInternal ? 0 : 1);
}

// A kernel that meets an out-of-range index traps; the error must come back from Synchronize() as
// Internal naming the CUDA error. The trap kills the CUDA context, so this runs in a child process
// ("threadsafe" death tests re-execute the binary rather than fork a process that holds CUDA).
TEST_F(CudaBackendTest, DeviceFaultSurfacesAtSynchronizeAsInternal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(RunOutOfRangeEmbedAndExit(), ::testing::ExitedWithCode(0), "cudaError");
}

void CheckGemm(CudaBackendTest* t, DType dt, int64_t n, int64_t m, int64_t k, bool with_bias,
               uint32_t seed) {
  std::mt19937 rng(seed);
  HostTensor x = Random(rng, DType::kF32, {n, k});
  HostTensor w = Random(rng, dt, {m, k});
  HostTensor bias = with_bias ? Random(rng, dt, {m}) : HostTensor();
  HostTensor want(DType::kF32, {n, m});
  TensorView none;
  cpu::reference::Gemm(x.view(), w.view(), with_bias ? bias.view() : none, want.view());
  TensorView out = t->Upload(want);
  t->backend_->Gemm(t->Upload(x), t->Upload(w), with_bias ? t->Upload(bias) : none, out);
  ExpectClose(t->Download(out, want), want, kAccumOrderRelTol,
              "Gemm " + std::string(DTypeName(dt)) + " n=" + std::to_string(n) +
                  " m=" + std::to_string(m) + " k=" + std::to_string(k));
}

// Small scratch forces the row-chunked bf16-plane path and the weight-chunked f16 path.
TEST_F(CudaBackendTest, GemmChunkedPathsMatchReference) {
  Make({.gemm_scratch_bytes = 256 << 10});
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (bool with_bias : {false, true}) CheckGemm(this, dt, 100, 300, 1000, with_bias, 11);
  }
}

// Decode (GEMV, vectorised loads) and prefill (cuBLAS) row counts at a Llama-like width, with a
// large activation scale so the low bf16 planes matter.
TEST_F(CudaBackendTest, GemmAtModelWidthsMatchesReference) {
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int64_t n : {1, 2, 5, 8, 9, 64, 300}) CheckGemm(this, dt, n, 264, 4096, n % 2 == 1, 7 + n);
  }
}

struct AttnCase {
  int n_heads, n_kv_heads, head_dim, block_size;
  std::vector<int32_t> kv_lens;  // one decode row per sequence
};

void CheckAttention(CudaBackendTest* t, const AttnCase& c, DType dt, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t n = static_cast<int64_t>(c.kv_lens.size());
  int64_t max_pages = 1, total_pages = 0;
  for (int32_t len : c.kv_lens) {
    max_pages = std::max<int64_t>(max_pages, (len + c.block_size - 1) / c.block_size);
    total_pages += (len + c.block_size - 1) / c.block_size;
  }
  std::vector<int32_t> ids(total_pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  HostTensor table(DType::kI32, {n, max_pages});
  auto* pt = reinterpret_cast<int32_t*>(table.storage.data());
  std::fill(pt, pt + n * max_pages, -1);
  size_t next = 0;
  std::vector<int32_t> row_seq(n);
  for (int64_t s = 0; s < n; ++s) {
    row_seq[s] = static_cast<int32_t>(s);
    for (int64_t p = 0; p < (c.kv_lens[s] + c.block_size - 1) / c.block_size; ++p) {
      pt[s * max_pages + p] = ids[next++];
    }
  }
  const AttentionParams p{.n_heads = c.n_heads,
                          .n_kv_heads = c.n_kv_heads,
                          .head_dim = c.head_dim,
                          .block_size = c.block_size,
                          .scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim))};
  HostTensor q = Random(rng, DType::kF32, {n, c.n_heads, c.head_dim});
  HostTensor pool = Random(rng, dt, {total_pages, 2 * c.n_kv_heads, c.block_size, c.head_dim}, 2.0f);
  HostTensor seq_t = Ints(row_seq), len_t = Ints(c.kv_lens);
  HostTensor want(DType::kF32, {n, int64_t{c.n_heads} * c.head_dim});
  cpu::reference::Attention(p, q.view(), pool.view(), table.view(), seq_t.view(), len_t.view(),
                            want.view());
  TensorView out = t->Upload(want);
  t->backend_->Attention(p, t->Upload(q), t->Upload(pool), t->Upload(table), t->Upload(seq_t),
                         t->Upload(len_t), out);
  ExpectClose(t->Download(out, want), want, kAccumOrderRelTol,
              "Attention " + std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) +
                  " hd=" + std::to_string(c.head_dim) + " " + std::string(DTypeName(dt)));
}

TEST_F(CudaBackendTest, AttentionLongContextEveryHeadDimBucketMatchesReference) {
  const std::vector<AttnCase> cases = {
      {32, 8, 128, 16, {5000}},            // Llama-3-8B decode, many splits
      {32, 4, 128, 16, {3000, 17, 900}},   // batch with very different lengths
      {32, 1, 96, 32, {2100}},             // MQA: 32 heads in 4 chunks of 8, partial lanes
      {8, 8, 256, 16, {1500, 1}},          // widest head bucket
      {4, 2, 30, 7, {777}},                // narrow, odd block size
  };
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (size_t i = 0; i < cases.size(); ++i) CheckAttention(this, cases[i], dt, 100 + i);
  }
}

// Scratch for one split only: the plan must fall back to fewer splits, never overflow.
TEST_F(CudaBackendTest, AttentionWithTinyScratchMatchesReference) {
  Make({.attention_scratch_bytes = 4096});
  CheckAttention(this, {32, 8, 128, 16, {4000, 2000}}, DType::kBF16, 9);
}

// ---- graphs, device row counts, RouteRows ------------------------------------------------------

// One Gemm and one Add captured once and replayed with a new x each time: the replay must read the
// tensors' contents when it runs. n = 4 takes the GEMV, n = 33 the cuBLAS bf16-plane path (split,
// cuBLAS, combine), both of which must be capturable.
TEST_F(CudaBackendTest, GraphReplayReadsInputsUploadedBeforeEachReplay) {
  constexpr int64_t kM = 96, kK = 256;
  for (int64_t n : {4, 33}) {
    std::mt19937 rng(21 + n);
    HostTensor w = Random(rng, DType::kBF16, {kM, kK});
    HostTensor r = Random(rng, DType::kF32, {n, kM});
    HostTensor prod(DType::kF32, {n, kM}), sum(DType::kF32, {n, kM});
    TensorView x_d = Upload(Random(rng, DType::kF32, {n, kK}));
    TensorView w_d = Upload(w), r_d = Upload(r), prod_d = Upload(prod), sum_d = Upload(sum);
    ASSERT_TRUE(backend_->SupportsGraphs());
    ASSERT_TRUE(backend_->BeginCapture().ok());
    backend_->Gemm(x_d, w_d, TensorView(), prod_d);
    backend_->Add(prod_d, r_d, sum_d);
    absl::StatusOr<int> graph = backend_->EndCapture();
    ASSERT_TRUE(graph.ok()) << graph.status();
    for (int replay = 0; replay < 2; ++replay) {
      HostTensor x = Random(rng, DType::kF32, {n, kK}, 1.0f + replay);
      Refill(x_d, x);
      ASSERT_TRUE(backend_->Replay(*graph).ok());
      HostTensor want_prod(DType::kF32, {n, kM}), want_sum(DType::kF32, {n, kM});
      cpu::reference::Gemm(x.view(), w.view(), TensorView(), want_prod.view());
      cpu::reference::Add(want_prod.view(), r.view(), want_sum.view());
      const std::string what = "n=" + std::to_string(n) + " replay " + std::to_string(replay);
      ExpectClose(Download(sum_d, want_sum), want_sum, kAccumOrderRelTol, "Gemm + Add " + what);
    }
    backend_->ReleaseGraphs();
    EXPECT_TRUE(backend_->Synchronize().ok());
  }
}

// One capture of RmsNorm over a capacity of 8 rows with the device row count set; the count
// buffer holds 3, then 0, then 8 across replays. Counted rows match the reference. This backend's
// kernels write nothing for uncounted rows (backend.h leaves them unspecified), so here they must
// keep the sentinel.
TEST_F(CudaBackendTest, GraphReadsTheDeviceRowCountAtEachReplay) {
  constexpr int64_t kN = 8, kD = 320;
  constexpr float kSentinel = -12345.0f;
  std::mt19937 rng(33);
  HostTensor x = Random(rng, DType::kF32, {kN, kD});
  HostTensor w = Random(rng, DType::kBF16, {kD});
  HostTensor want(DType::kF32, {kN, kD});
  const RmsNormParams params{.eps = 1e-5f};
  cpu::reference::RmsNorm(params, x.view(), w.view(), want.view());
  HostTensor sentinel(DType::kF32, {kN, kD});
  std::fill(sentinel.f32(), sentinel.f32() + sentinel.numel(), kSentinel);
  TensorView x_d = Upload(x), w_d = Upload(w), out_d = Upload(sentinel);
  TensorView count_d = Upload(Ints({static_cast<int32_t>(kN)}));
  ASSERT_TRUE(backend_->SupportsDeviceRowCount());
  backend_->SetDeviceRowCount(count_d);
  ASSERT_TRUE(backend_->BeginCapture().ok());
  backend_->RmsNorm(params, x_d, w_d, out_d);
  absl::StatusOr<int> graph = backend_->EndCapture();
  backend_->SetDeviceRowCount(TensorView());  // the graph keeps reading count_d
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (int32_t count : {3, 0, 8}) {
    Refill(out_d, sentinel);
    Refill(count_d, Ints({count}));
    ASSERT_TRUE(backend_->Replay(*graph).ok());
    HostTensor got = Download(out_d, sentinel);
    const std::string what = "count " + std::to_string(count);
    if (count > 0) {
      HostTensor got_rows(DType::kF32, {count, kD}), want_rows(DType::kF32, {count, kD});
      std::memcpy(got_rows.f32(), got.f32(), count * kD * sizeof(float));
      std::memcpy(want_rows.f32(), want.f32(), count * kD * sizeof(float));
      ExpectClose(got_rows, want_rows, kAccumOrderRelTol, "RmsNorm " + what);
    }
    for (int64_t e = count * kD; e < kN * kD; ++e) {
      ASSERT_EQ(got.f32()[e], kSentinel) << what << ": row " << e / kD << " was written";
    }
  }
  // Without a count the same op outside the graph computes every row.
  backend_->RmsNorm(params, x_d, w_d, out_d);
  ExpectClose(Download(out_d, want), want, kAccumOrderRelTol, "RmsNorm without a count");
}

TEST_F(CudaBackendTest, GraphCallsOutOfOrderAreRefused) {
  EXPECT_EQ(backend_->EndCapture().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(backend_->Replay(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->Replay(-1).code(), absl::StatusCode::kInvalidArgument);
  TensorView a_d = Upload(HostTensor(DType::kF32, {1, 4}));
  ASSERT_TRUE(backend_->BeginCapture().ok());
  EXPECT_EQ(backend_->BeginCapture().code(), absl::StatusCode::kFailedPrecondition);
  backend_->Add(a_d, a_d, a_d);
  absl::StatusOr<int> graph = backend_->EndCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_TRUE(backend_->Replay(*graph).ok());
  EXPECT_EQ(backend_->Replay(*graph + 1).code(), absl::StatusCode::kInvalidArgument);
  backend_->ReleaseGraphs();
  EXPECT_EQ(backend_->Replay(*graph).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(backend_->Synchronize().ok());
}

// Backend::RouteRows, written out literally: the rank counts the earlier selected rows that are
// not below the sequence's first row, one by one (no binary search).
struct RouteRowsWant {
  std::vector<int32_t> pos, slots, seq, kv_len;
};
RouteRowsWant RouteRowsByFormula(const std::vector<int32_t>& idx,
                                 const std::vector<int32_t>& row_seq,
                                 const std::vector<int32_t>& row_pos,
                                 const std::vector<int32_t>& cand_slots,
                                 const std::vector<int32_t>& seq_first_row,
                                 const std::vector<int32_t>& seq_kv_base) {
  RouteRowsWant want;
  for (size_t j = 0; j < idx.size(); ++j) {
    const int32_t r = idx[j], s = row_seq[r];
    int32_t before = 0;
    for (size_t jp = 0; jp < j; ++jp) before += idx[jp] < seq_first_row[s] ? 1 : 0;
    const int32_t rank = static_cast<int32_t>(j) - before;
    want.pos.push_back(row_pos[r]);
    want.slots.push_back(cand_slots[seq_first_row[s] + rank]);
    want.seq.push_back(s);
    want.kv_len.push_back(seq_kv_base[s] + rank + 1);
  }
  return want;
}

class CudaRouteRowsTest : public CudaBackendTest {
 public:
  // Runs RouteRows (under `count` when >= 0) and returns the four outputs; entries the op does not
  // write keep -7.
  RouteRowsWant Run(const std::vector<int32_t>& idx, const std::vector<int32_t>& row_seq,
                    const std::vector<int32_t>& row_pos, const std::vector<int32_t>& cand_slots,
                    const std::vector<int32_t>& seq_first_row,
                    const std::vector<int32_t>& seq_kv_base, int32_t count) {
    const HostTensor unset = Ints(std::vector<int32_t>(idx.size(), -7));
    TensorView outs[4] = {Upload(unset), Upload(unset), Upload(unset), Upload(unset)};
    if (count >= 0) backend_->SetDeviceRowCount(Upload(Ints({count})));
    backend_->RouteRows(Upload(Ints(idx)), Upload(Ints(row_seq)), Upload(Ints(row_pos)),
                        Upload(Ints(cand_slots)), Upload(Ints(seq_first_row)),
                        Upload(Ints(seq_kv_base)), outs[0], outs[1], outs[2], outs[3]);
    backend_->SetDeviceRowCount(TensorView());
    std::vector<int32_t> got[4];
    for (int o = 0; o < 4; ++o) {
      HostTensor t = Download(outs[o], unset);
      got[o].assign(t.i32(), t.i32() + idx.size());
    }
    return {got[0], got[1], got[2], got[3]};
  }
};

// Three sequences own step rows [0, 2), [2, 5), [5, 6); rows 1, 2, 4 and 5 were selected.
TEST_F(CudaRouteRowsTest, SmallCaseMatchesTheFormula) {
  ASSERT_TRUE(backend_->Supports(OpKind::kRouteRows, DType::kI32));
  EXPECT_FALSE(backend_->Supports(OpKind::kRouteRows, DType::kF32));
  const std::vector<int32_t> idx = {1, 2, 4, 5}, row_seq = {0, 0, 1, 1, 1, 2},
                             row_pos = {10, 11, 20, 21, 22, 30},
                             cand_slots = {100, 101, 200, 201, 202, 300},
                             seq_first_row = {0, 2, 5}, seq_kv_base = {7, 3, 0};
  // Worked by hand: row 1 is sequence 0's first pick, rows 2 and 4 sequence 1's first and second,
  // row 5 sequence 2's first.
  const RouteRowsWant hand = {{11, 20, 22, 30}, {100, 200, 201, 300}, {0, 1, 1, 2}, {8, 4, 5, 1}};
  const RouteRowsWant formula =
      RouteRowsByFormula(idx, row_seq, row_pos, cand_slots, seq_first_row, seq_kv_base);
  ASSERT_EQ(formula.pos, hand.pos);
  ASSERT_EQ(formula.slots, hand.slots);
  ASSERT_EQ(formula.seq, hand.seq);
  ASSERT_EQ(formula.kv_len, hand.kv_len);
  const RouteRowsWant got =
      Run(idx, row_seq, row_pos, cand_slots, seq_first_row, seq_kv_base, /*count=*/-1);
  EXPECT_EQ(got.pos, hand.pos);
  EXPECT_EQ(got.slots, hand.slots);
  EXPECT_EQ(got.seq, hand.seq);
  EXPECT_EQ(got.kv_len, hand.kv_len);
  // Under a device row count of 2 only j < 2 is computed; this backend leaves the rest alone.
  const RouteRowsWant counted =
      Run(idx, row_seq, row_pos, cand_slots, seq_first_row, seq_kv_base, /*count=*/2);
  EXPECT_EQ(counted.pos, (std::vector<int32_t>{11, 20, -7, -7}));
  EXPECT_EQ(counted.slots, (std::vector<int32_t>{100, 200, -7, -7}));
  EXPECT_EQ(counted.seq, (std::vector<int32_t>{0, 1, -7, -7}));
  EXPECT_EQ(counted.kv_len, (std::vector<int32_t>{8, 4, -7, -7}));
}

// Many sequences of random lengths and a random ascending selection (some sequences empty), more
// rows than one CTA holds.
TEST_F(CudaRouteRowsTest, RandomSelectionMatchesTheFormula) {
  std::mt19937 rng(77);
  std::vector<int32_t> row_seq, row_pos, cand_slots, seq_first_row, seq_kv_base, idx;
  for (int32_t s = 0; s < 100; ++s) {
    seq_first_row.push_back(static_cast<int32_t>(row_seq.size()));
    seq_kv_base.push_back(static_cast<int32_t>(rng() % 1000));
    const int len = 1 + static_cast<int>(rng() % 30);
    for (int t = 0; t < len; ++t) {
      row_seq.push_back(s);
      row_pos.push_back(seq_kv_base.back() + t);
      cand_slots.push_back(static_cast<int32_t>(rng() % 100000));
    }
  }
  for (int32_t r = 0; r < static_cast<int32_t>(row_seq.size()); ++r) {
    if (rng() % 3 == 0) idx.push_back(r);
  }
  ASSERT_GT(idx.size(), 256u);
  const RouteRowsWant want =
      RouteRowsByFormula(idx, row_seq, row_pos, cand_slots, seq_first_row, seq_kv_base);
  const RouteRowsWant got =
      Run(idx, row_seq, row_pos, cand_slots, seq_first_row, seq_kv_base, /*count=*/-1);
  EXPECT_EQ(got.pos, want.pos);
  EXPECT_EQ(got.slots, want.slots);
  EXPECT_EQ(got.seq, want.seq);
  EXPECT_EQ(got.kv_len, want.kv_len);
}

}  // namespace
}  // namespace modserve::backend
