// CPU kernel benchmark: machine read bandwidth, decode Gemm weight-read GB/s (n = 1, 4, 16) and
// prefill Gemm GFLOP/s (n = 512) on TinyLlama-1.1B shapes, plus paged decode attention.
// Prints numbers only; it asserts nothing. Usage: kernel_bench [num_threads] [scalar|avx2|avx512]
// [decode|attention] (the last: only that benchmark).
// Large buffers are madvise'd for 2 MiB pages, as the engine's weights get when the checkpoint is
// read from disk through its mapping (on a VM, 4 KiB pages cost ~30% of the bandwidth).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <sys/mman.h>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/cpu/thread_pool.h"
#include "engine/common/dtype.h"
#include "engine/common/logging.h"
#include "engine/common/tensor_view.h"

namespace modserve::backend::cpu {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A 2 MiB-aligned buffer of `count` T, madvise'd for transparent huge pages.
template <typename T>
struct HugeBuffer {
  explicit HugeBuffer(size_t n) : count(n) {
    const size_t align = size_t{2} << 20;
    const size_t bytes = (n * sizeof(T) + align - 1) / align * align;
    ptr = static_cast<T*>(std::aligned_alloc(align, bytes));
    MODSERVE_CHECK(ptr != nullptr);
    ::madvise(ptr, bytes, MADV_HUGEPAGE);
  }
  HugeBuffer(HugeBuffer&& o) noexcept : ptr(o.ptr), count(o.count) { o.ptr = nullptr; }
  HugeBuffer(const HugeBuffer&) = delete;
  ~HugeBuffer() { std::free(ptr); }
  T* data() { return ptr; }
  T* ptr;
  size_t count;
};

// Multi-threaded sum over a 1 GiB buffer (integer adds vectorise freely, so the loop is bound by
// memory, not by a float dependency chain); best of 5 passes.
double MeasureReadBandwidth(int num_threads) {
  const size_t bytes = size_t{1} << 30;
  const size_t words = bytes / sizeof(uint64_t);
  HugeBuffer<uint64_t> hb(words);
  uint64_t* buf = hb.data();
  ThreadPool pool(num_threads);
  pool.ParallelFor(0, static_cast<int64_t>(words), 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) buf[i] = static_cast<uint64_t>(i);
  });
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<uint64_t> partial(64 * 64, 0);
    const auto t0 = Clock::now();
    pool.ParallelFor(0, static_cast<int64_t>(words), 1 << 20, [&](int64_t b, int64_t e) {
      uint64_t s = 0;
      for (int64_t i = b; i < e; ++i) s += buf[i];
      partial[(b >> 20) % partial.size()] += s;
    });
    const double sec = Seconds(t0, Clock::now());
    uint64_t total = 0;
    for (uint64_t v : partial) total += v;
    if (total == 42) std::printf(" ");  // keeps the sum alive
    best = std::max(best, bytes / sec / 1e9);
  }
  return best;
}

template <typename T>
HugeBuffer<T> RandomWeights(size_t count, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 0.02f);
  HugeBuffer<T> w(count);
  for (size_t i = 0; i < count; ++i) {
    T& v = w.data()[i];
    if constexpr (std::is_same_v<T, float>) {
      v = dist(rng);
    } else {
      v = F32ToBf16(dist(rng));
    }
  }
  return w;
}

// Decode Gemm: rotates through enough weight copies (>= 2 GiB, beyond the L3) that every call
// streams its weights from DRAM, as a real decode step over all layers does.
template <typename T>
void BenchDecodeGemm(CpuBackend& backend, DType dtype, int64_t m, int64_t k, double bandwidth) {
  std::mt19937 rng(1);
  const size_t w_bytes = static_cast<size_t>(m * k) * sizeof(T);
  const int copies = static_cast<int>(std::max<size_t>(2, (size_t{2} << 30) / w_bytes));
  std::vector<HugeBuffer<T>> weights;
  for (int c = 0; c < copies; ++c) weights.push_back(RandomWeights<T>(m * k, rng));
  for (int64_t n : {1, 4, 16}) {
    std::vector<float> x(n * k, 0.5f), out(n * m);
    TensorView xv(x.data(), DType::kF32, {n, k}), ov(out.data(), DType::kF32, {n, m});
    for (int c = 0; c < copies; ++c) {  // warm-up: page in, fault in
      backend.Gemm(xv, TensorView(weights[c].data(), dtype, {m, k}), TensorView(), ov);
    }
    int calls = 0;
    const auto t0 = Clock::now();
    while (Seconds(t0, Clock::now()) < 0.5 || calls < copies) {
      backend.Gemm(xv, TensorView(weights[calls % copies].data(), dtype, {m, k}), TensorView(), ov);
      ++calls;
    }
    const double sec = Seconds(t0, Clock::now()) / calls;
    const double gbs = w_bytes / sec / 1e9;
    std::printf(
        "  decode %-4s m=%-5lld k=%-5lld n=%-3lld %8.1f us  %6.1f GB/s  %5.1f%% of read bw\n",
        std::string(DTypeName(dtype)).c_str(), static_cast<long long>(m), static_cast<long long>(k),
        static_cast<long long>(n), sec * 1e6, gbs, 100.0 * gbs / bandwidth);
  }
}

template <typename T>
void BenchPrefillGemm(CpuBackend& backend, DType dtype, int64_t m, int64_t k) {
  std::mt19937 rng(2);
  const int64_t n = 512;
  HugeBuffer<T> w = RandomWeights<T>(m * k, rng);
  std::vector<float> x(n * k, 0.25f), out(n * m);
  TensorView xv(x.data(), DType::kF32, {n, k}), ov(out.data(), DType::kF32, {n, m});
  TensorView wv(w.data(), dtype, {m, k});
  backend.Gemm(xv, wv, TensorView(), ov);
  int calls = 0;
  const auto t0 = Clock::now();
  while (Seconds(t0, Clock::now()) < 1.0 || calls < 2) {
    backend.Gemm(xv, wv, TensorView(), ov);
    ++calls;
  }
  const double sec = Seconds(t0, Clock::now()) / calls;
  std::printf("  prefill %-4s m=%-5lld k=%-5lld n=512  %8.2f ms  %6.1f GFLOP/s\n",
              std::string(DTypeName(dtype)).c_str(), static_cast<long long>(m),
              static_cast<long long>(k), sec * 1e3, 2.0 * n * m * k / sec / 1e9);
}

// TinyLlama attention: 32 q heads, 4 kv heads, head_dim 64, BF16 KV, pages of 16 shuffled.
void BenchDecodeAttention(CpuBackend& backend, int64_t batch, int32_t context) {
  const int n_heads = 32, n_kv = 4, hd = 64, bs = 16;
  const int64_t pages_per_seq = (context + bs - 1) / bs, num_pages = batch * pages_per_seq;
  std::mt19937 rng(3);
  HugeBuffer<bf16_t> pool = RandomWeights<bf16_t>(num_pages * 2 * n_kv * bs * hd, rng);
  std::vector<int32_t> ids(num_pages);
  for (int64_t i = 0; i < num_pages; ++i) ids[i] = static_cast<int32_t>(i);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> row_seq(batch), row_len(batch, context);
  for (int64_t b = 0; b < batch; ++b) row_seq[b] = static_cast<int32_t>(b);
  std::vector<float> q(batch * n_heads * hd, 0.1f), out(batch * n_heads * hd);
  const AttentionParams p{
      .n_heads = n_heads, .n_kv_heads = n_kv, .head_dim = hd, .block_size = bs, .scale = 0.125f};
  auto run = [&] {
    backend.Attention(p, TensorView(q.data(), DType::kF32, {batch, n_heads, hd}),
                      TensorView(pool.data(), DType::kBF16, {num_pages, 2 * n_kv, bs, hd}),
                      TensorView(ids.data(), DType::kI32, {batch, pages_per_seq}),
                      TensorView(row_seq.data(), DType::kI32, {batch}),
                      TensorView(row_len.data(), DType::kI32, {batch}),
                      TensorView(out.data(), DType::kF32, {batch, n_heads * hd}));
  };
  run();
  int calls = 0;
  const auto t0 = Clock::now();
  while (Seconds(t0, Clock::now()) < 0.5) {
    run();
    ++calls;
  }
  const double sec = Seconds(t0, Clock::now()) / calls;
  const double kv_bytes = 2.0 * batch * context * n_kv * hd * sizeof(bf16_t);
  std::printf("  attention decode batch=%lld ctx=%d  %8.1f us/layer  %6.1f GB/s of KV\n",
              static_cast<long long>(batch), context, sec * 1e6, kv_bytes / sec / 1e9);
}

int Main(int argc, char** argv) {
  CpuBackendOptions options;
  if (argc > 1) options.num_threads = std::atoi(argv[1]);
  if (argc > 2) {
    const std::string isa = argv[2];
    options.isa = isa == "scalar" ? Isa::kScalar : isa == "avx2" ? Isa::kAvx2 : Isa::kAvx512;
  }
  auto created = CpuBackend::Create(options);
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
    return 1;
  }
  CpuBackend& backend = **created;
  std::printf("cpu backend: isa %s, %d threads, avx512_bf16 %s\n",
              std::string(IsaName(backend.isa())).c_str(), backend.num_threads(),
              CpuHasAvx512Bf16() ? "present (unused)" : "absent");
  const double bw = MeasureReadBandwidth(backend.num_threads());
  std::printf("measured read bandwidth (1 GiB sum, %d threads): %.1f GB/s\n", backend.num_threads(),
              bw);
  // Optional third argument: "decode" runs only the BF16 decode Gemm, "attention" only the
  // paged decode attention (quick kernel iteration).
  const std::string only = argc > 3 ? argv[3] : "";
  if (only == "attention") {
    for (int64_t batch : {1, 16}) BenchDecodeAttention(backend, batch, 1024);
    return 0;
  }
  const bool decode_only = only == "decode";
  const std::pair<int64_t, int64_t> shapes[] = {{2048, 2048}, {5632, 2048}, {2048, 5632}};
  for (auto [m, k] : shapes) {
    BenchDecodeGemm<bf16_t>(backend, DType::kBF16, m, k, bw);
    if (!decode_only) BenchDecodeGemm<float>(backend, DType::kF32, m, k, bw);
  }
  if (decode_only) return 0;
  for (auto [m, k] : shapes) {
    BenchPrefillGemm<bf16_t>(backend, DType::kBF16, m, k);
    BenchPrefillGemm<float>(backend, DType::kF32, m, k);
  }
  for (int64_t batch : {1, 16}) BenchDecodeAttention(backend, batch, 1024);
  return 0;
}

}  // namespace
}  // namespace modserve::backend::cpu

int main(int argc, char** argv) {
  if (argc > 1 && (std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h")) {
    std::printf("usage: kernel_bench [THREADS (0 = every core)] [scalar|avx2|avx512] "
                "[decode|attention]\nCPU kernels in isolation: decode and prefill GEMMs, paged "
                "decode attention; GB/s against the measured read bandwidth.\n");
    return 0;
  }
  return modserve::backend::cpu::Main(argc, argv);
}
