// CPU kernel benchmark: machine read bandwidth, decode Gemm weight-read GB/s (n = 1, 4, 8, 16) and
// prefill Gemm GFLOP/s (n = 512) on TinyLlama-1.1B shapes, plus paged decode attention, and the
// same for block-quantized weights (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K; plus
// SmolLM2-135M's shapes).
// Prints numbers only; it asserts nothing. Usage: kernel_bench [num_threads]
// [best|scalar|avx2|avx512|avx512vnni|amx] [MODE] (only that benchmark; the modes are kModes
// below, and --help lists them; quant-compute is one core's kernel throughput in CPU time,
// isa-rates one core's vector instruction rates, tests/bench/isa_rates.h; crossover-shapes the
// float crossover on the 110m and TinyLlama matrices). Prefill GFLOP/s are printed against an
// f32 FMA peak probe measured in the same run (tests/bench/matmul_peak.h: AVX2's or AVX-512's
// chains, whichever run faster).
// QUANT_TYPES=Q4_K,Q6_K (DTypeName spellings) and QUANT_ROWS=1,4 in the environment: the quant
// modes time only those weight types and (decode and quant-compute) x row counts. quant-pairs
// also takes BF16 (the panel copy where the CPU has AVX512_BF16 and no AMX, else the file's rows).
// DECODE_ROWS=16,32,64: the float decode rows at those x row counts (of 1, 4, 8, 16, 32, 64;
// unset: 1, 4, 8, 16).
// MATMUL_PRECISION=highest|high|medium in the environment: the backend's --matmul_precision (bf16
// terms of x on the AMX tiles; highest when unset).
// Large buffers are madvise'd for 2 MiB pages, as the engine's weights get when the checkpoint is
// read from disk through its mapping (on a VM, 4 KiB pages cost ~30% of the bandwidth).
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/cpu/thread_pool.h"
#include "engine/common/dtype.h"
#include "engine/common/logging.h"
#include "engine/common/quant.h"
#include "engine/common/tensor_view.h"
#include "tests/bench/cpu_model.h"
#include "tests/bench/isa_rates.h"
#include "tests/bench/matmul_peak.h"
#include "tests/bench/overlap_probe.h"

namespace modserve::backend::cpu {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Mode "attention-4k": buffers stay on 4 KiB pages (the engine's KV pool before it madvised).
// Mode "attention-pages64": KV pages of 64 tokens instead of 16 (the server's --kv_block_size).
// Mode "attention-inorder": each sequence's pages in ascending order, one after the other, as a
// fresh pool hands them out (modserve-bench's case), instead of shuffled over the pool.
// Mode "attention-hot": one layer's KV pool, small enough to stay in the cache from call to call
// (batch 1 at 1024 keys, batch 16 at 128): the kernels' own speed, without DRAM.
// Mode "attention-softmax": the online-softmax tile alone (BenchAttentionSoftmax).
bool g_small_pages = false;
int g_attn_block_size = 16;
bool g_attn_in_order = false;
int g_attn_layers = 12;

// A 2 MiB-aligned buffer of `count` T, madvise'd for transparent huge pages.
template <typename T>
struct HugeBuffer {
  explicit HugeBuffer(size_t n) : count(n) {
    const size_t align = size_t{2} << 20;
    const size_t bytes = (n * sizeof(T) + align - 1) / align * align;
    ptr = static_cast<T*>(std::aligned_alloc(align, bytes));
    MODSERVE_CHECK(ptr != nullptr);
    if (!g_small_pages) ::madvise(ptr, bytes, MADV_HUGEPAGE);
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

// Whether the comma-separated list in environment variable `var` names `item` (unset: all).
bool EnvListHas(const char* var, std::string_view item) {
  const char* list = std::getenv(var);
  if (list == nullptr) return true;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    if (std::string_view(part.data(), part.size()) == item) return true;
  }
  return false;
}

TensorView AsRun(CpuBackend& backend, const TensorView& w, bool prepare, std::string* name);

// Decode Gemm: rotates through enough weight copies (>= 2 GiB, beyond the L3) that every call
// streams its weights from DRAM, as a real decode step over all layers does. Each copy goes
// through PrepareGemmWeight as the engine's do (BF16 at medium on vdpbf16ps: panels).
template <typename T>
void BenchDecodeGemm(CpuBackend& backend, DType dtype, int64_t m, int64_t k, double bandwidth) {
  std::mt19937 rng(1);
  const size_t w_bytes = static_cast<size_t>(m * k) * sizeof(T);
  const int copies = static_cast<int>(std::max<size_t>(2, (size_t{2} << 30) / w_bytes));
  std::vector<HugeBuffer<T>> weights;
  std::vector<TensorView> views;
  std::string name;
  for (int c = 0; c < copies; ++c) {
    weights.push_back(RandomWeights<T>(m * k, rng));
    views.push_back(AsRun(backend, TensorView(weights[c].data(), dtype, {m, k}), true, &name));
  }
  for (int64_t n : {1, 4, 8, 16, 32, 64}) {
    const bool wanted = std::getenv("DECODE_ROWS") == nullptr
                            ? n <= 16
                            : EnvListHas("DECODE_ROWS", std::to_string(n));
    if (!wanted) continue;
    std::vector<float> x(n * k, 0.5f), out(n * m);
    TensorView xv(x.data(), DType::kF32, {n, k}), ov(out.data(), DType::kF32, {n, m});
    for (int c = 0; c < copies; ++c) backend.Gemm(xv, views[c], TensorView(), ov);  // fault in
    int calls = 0;
    const auto t0 = Clock::now();
    while (Seconds(t0, Clock::now()) < 0.5 || calls < copies) {
      backend.Gemm(xv, views[calls % copies], TensorView(), ov);
      ++calls;
    }
    const double sec = Seconds(t0, Clock::now()) / calls;
    const double gbs = w_bytes / sec / 1e9;
    std::printf(
        "  decode %-4s m=%-5lld k=%-5lld n=%-3lld %8.1f us  %6.1f GB/s  %5.1f%% of read bw\n",
        name.c_str(), static_cast<long long>(m), static_cast<long long>(k),
        static_cast<long long>(n), sec * 1e6, gbs, 100.0 * gbs / bandwidth);
  }
}

template <typename T>
void BenchPrefillGemm(CpuBackend& backend, DType dtype, int64_t m, int64_t k, double peak) {
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
  const double gflops = 2.0 * n * m * k / sec / 1e9;
  std::printf("  prefill %-4s m=%-5lld k=%-5lld n=512  %8.2f ms  %6.1f GFLOP/s  %5.1f%% of FMA peak\n",
              std::string(DTypeName(dtype)).c_str(), static_cast<long long>(m),
              static_cast<long long>(k), sec * 1e3, gflops, peak > 0 ? 100.0 * gflops / peak : 0.0);
}

// A [m, k] matrix of `dtype` quantized from N(0, 0.02) values (the scale of real weights).
HugeBuffer<uint8_t> QuantizedWeights(DType dtype, int64_t m, int64_t k, std::mt19937& rng) {
  const size_t row_bytes = DTypeRowBytes(dtype, k);
  HugeBuffer<uint8_t> w(row_bytes * m);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> row(k);
  for (int64_t r = 0; r < m; ++r) {
    for (float& v : row) v = dist(rng);
    const absl::Status status = quant::QuantizeRow(dtype, row.data(), k, w.data() + r * row_bytes);
    MODSERVE_CHECK(status.ok()) << status;
  }
  return w;
}

// w as the engine runs it: through PrepareGemmWeight (prepare = true), which may return a copy
// in the backend's own layout (Q4_K in 16-row groups where the kernels read it, BF16 in pair
// panels where the CPU has AVX512_BF16 and no AMX), or as the file stores it. Sets *name to the
// dtype's name, with "x16" (or "p", panels) when it was copied.
TensorView AsRun(CpuBackend& backend, const TensorView& w, bool prepare, std::string* name) {
  absl::StatusOr<TensorView> p = prepare ? backend.PrepareGemmWeight(w) : w;
  MODSERVE_CHECK(p.ok()) << p.status();
  *name = std::string(DTypeName(w.dtype)) + (p->data == w.data         ? ""
                                             : w.dtype == DType::kBF16 ? "p"
                                                                       : "x16");
  return *p;
}

// One read-only pass over a copy: its whole pieces (OverlapPass takes multiples of kReadPiece),
// summed by overlap_probe.h's zero-op stream on `pool`'s threads (the same chunks as a Gemm's
// pool). Returns the bytes read.
constexpr int64_t kReadPiece = 2 * bench::kOverlapChunkBytes;
int64_t ReadOnlyPass(ThreadPool& pool, const TensorView& copy, size_t w_bytes,
                     std::atomic<int64_t>& sink) {
  const uint8_t* base = static_cast<const uint8_t*>(copy.data);
  const int64_t pieces = static_cast<int64_t>(w_bytes) / kReadPiece;
  pool.ParallelFor(0, pieces, 1, [&](int64_t b, int64_t e) {
    sink.fetch_add(bench::OverlapPass<0, 1>(base + b * kReadPiece, (e - b) * kReadPiece),
                   std::memory_order_relaxed);
  });
  return pieces * kReadPiece;
}

// GB/s of a pass that sums the prepared copies (views[c].data, w_bytes each, in rotation, as
// BenchQuantDecode calls them) in 4 KiB pieces over a pool of `threads`, best of 3 runs of 0.3 s.
double ReadOnlyGbs(const std::vector<TensorView>& views, size_t w_bytes, int copies, int threads) {
  static ThreadPool pool(threads);
  std::atomic<int64_t> sink{0};
  double best = 0;
  for (int run = 0; run < 3; ++run) {
    int calls = 0;
    int64_t bytes = 0;
    const auto t0 = Clock::now();
    while (Seconds(t0, Clock::now()) < 0.3 || calls < copies) {
      bytes += ReadOnlyPass(pool, views[calls % copies], w_bytes, sink);
      ++calls;
    }
    best = std::max(best, bytes / Seconds(t0, Clock::now()) / 1e9);
  }
  if (sink.load() == 42) std::printf(" ");  // keeps the sums alive
  return best;
}

// Copies of the quantized matrix `first` [m, k], at least `min_copies` and >= 1 GiB in all, so
// that calls rotating through them read DRAM; views are the copies as the engine runs them
// (AsRun), name the layout's.
struct DramCopies {
  std::vector<HugeBuffer<uint8_t>> weights;
  std::vector<TensorView> views;
  std::string name;
};
DramCopies MakeDramCopies(CpuBackend& backend, const HugeBuffer<uint8_t>& first, DType dtype,
                          int64_t m, int64_t k, size_t min_copies) {
  const size_t w_bytes = DTypeRowBytes(dtype, k) * m;
  const size_t copies = std::max<size_t>(min_copies, (size_t{1} << 30) / w_bytes);
  DramCopies d;
  for (size_t c = 0; c < copies; ++c) {
    d.weights.emplace_back(w_bytes);
    std::memcpy(d.weights.back().data(), first.ptr, w_bytes);
    d.views.push_back(
        AsRun(backend, TensorView(d.weights.back().data(), dtype, {m, k}), true, &d.name));
  }
  return d;
}

// Decode Gemm with quantized w: bytes moved = the quantized weight bytes (x and out are
// ~0.1% of them). Copies of one quantized matrix (>= 1 GiB in all) keep every call in DRAM.
void BenchQuantDecode(CpuBackend& backend, DType dtype, int64_t m, int64_t k, double bandwidth,
                      const char* label) {
  if (!EnvListHas("QUANT_TYPES", DTypeName(dtype))) return;
  std::mt19937 rng(5);
  const HugeBuffer<uint8_t> first = QuantizedWeights(dtype, m, k, rng);
  const size_t w_bytes = DTypeRowBytes(dtype, k) * m;
  // As the engine runs them (a copy in the backend's own layout is read instead of the file's).
  const DramCopies dram = MakeDramCopies(backend, first, dtype, m, k, 2);
  const std::vector<TensorView>& views = dram.views;
  const std::string& name = dram.name;
  const int copies = static_cast<int>(views.size());
  for (int64_t n : {1, 4, 16}) {
    if (!EnvListHas("QUANT_ROWS", std::to_string(n))) continue;
    std::vector<float> x(n * k), out(n * m);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (float& v : x) v = dist(rng);
    TensorView xv(x.data(), DType::kF32, {n, k}), ov(out.data(), DType::kF32, {n, m});
    for (int c = 0; c < copies; ++c) backend.Gemm(xv, views[c], TensorView(), ov);
    int calls = 0;
    const auto t0 = Clock::now();
    while (Seconds(t0, Clock::now()) < 0.5 || calls < copies) {
      backend.Gemm(xv, views[calls % copies], TensorView(), ov);
      ++calls;
    }
    const double sec = Seconds(t0, Clock::now()) / calls;
    const double gbs = w_bytes / sec / 1e9;
    // At one x row, the same copies read by a pass that only sums them (overlap_probe.h's zero-op
    // stream, the same 8 pool chunks per call): what the kernel leaves of the memory's rate.
    const double read_only = n == 1 && CpuHasIsa(Isa::kAvx512Vnni)
                                 ? ReadOnlyGbs(views, w_bytes, copies, backend.num_threads())
                                 : 0.0;
    std::printf(
        "  decode %-7s m=%-5lld k=%-5lld n=%-3lld %8.1f us  %7.2f MB  %6.1f GB/s  %5.1f%% of read "
        "bw  %s\n",
        name.c_str(), static_cast<long long>(m), static_cast<long long>(k),
        static_cast<long long>(n), sec * 1e6, w_bytes / 1e6, gbs, 100.0 * gbs / bandwidth, label);
    if (read_only > 0) {
      std::printf(
          "         read-only pass over the same copies: %6.1f GB/s; the kernel keeps %.0f%%\n",
          read_only, 100.0 * gbs / read_only);
    }
  }
}

// One x row of TinyLlama's 5632 x 2048 matrix (BF16 or a quantized type, through
// PrepareGemmWeight as the engine runs it) from DRAM, in pairs: a Gemm call over one copy,
// then the read-only pass (ReadOnlyGbs's zero-op stream, as many threads) over the next,
// QUANT_PAIRS times (default 300), 4 calls of each per sample. A host whose read bandwidth changes
// from second to second (the Zen 5 VMs here switch between about 45 and 80 GB/s) moves both sides
// of a pair alike, so the pairs sorted by their read-only rate show what the kernel keeps in each
// state.
void BenchQuantPairs(CpuBackend& backend, DType dtype) {
  if (!EnvListHas("QUANT_TYPES", DTypeName(dtype))) return;
  constexpr int64_t m = 5632, k = 2048;
  constexpr int kCallsPerSample = 4;
  std::mt19937 rng(9);
  const HugeBuffer<uint8_t> first = QuantizedWeights(dtype, m, k, rng);
  const size_t w_bytes = DTypeRowBytes(dtype, k) * m;
  const DramCopies dram = MakeDramCopies(backend, first, dtype, m, k, 8);
  const std::vector<TensorView>& views = dram.views;
  const int copies = static_cast<int>(views.size());
  std::vector<float> x(k), out(m);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& v : x) v = dist(rng);
  TensorView xv(x.data(), DType::kF32, {1, k}), ov(out.data(), DType::kF32, {1, m});
  ThreadPool pool(backend.num_threads());
  std::atomic<int64_t> sink{0};
  const char* env = std::getenv("QUANT_PAIRS");
  const int num_pairs = env != nullptr ? std::max(1, std::atoi(env)) : 300;
  std::vector<std::pair<double, double>> pairs;  // (read-only GB/s, kernel GB/s)
  int c = 0;
  // The two pools' workers spin for a while after a region (thread_pool.cc): each side waits
  // until the other's have gone to sleep, so that no spinning thread takes its cores.
  auto settle = [] { std::this_thread::sleep_for(std::chrono::microseconds(300)); };
  for (int i = 0; i < num_pairs; ++i) {
    settle();
    auto t0 = Clock::now();
    for (int r = 0; r < kCallsPerSample; ++r)
      backend.Gemm(xv, views[c++ % copies], TensorView(), ov);
    const double kernel = kCallsPerSample * w_bytes / Seconds(t0, Clock::now()) / 1e9;
    settle();
    t0 = Clock::now();
    int64_t bytes = 0;
    for (int r = 0; r < kCallsPerSample; ++r) {
      bytes += ReadOnlyPass(pool, views[c++ % copies], w_bytes, sink);
    }
    pairs.emplace_back(bytes / Seconds(t0, Clock::now()) / 1e9, kernel);
  }
  if (sink.load() == 42) std::printf(" ");  // keeps the sums alive
  std::sort(pairs.begin(), pairs.end());
  std::printf(
      "  pairs %-7s m=%lld k=%lld n=1: %d pairs of %d calls, by the read-only pass's GB/s\n",
      dram.name.c_str(), static_cast<long long>(m), static_cast<long long>(k), num_pairs,
      kCallsPerSample);
  // Bands of 10 GB/s of the read-only rate: pairs, mean read-only and kernel GB/s, and the
  // kernel's share of the read-only rate.
  for (size_t i = 0; i < pairs.size();) {
    const double band = std::floor(pairs[i].first / 10.0) * 10.0;
    double ro = 0, kern = 0;
    size_t j = i;
    for (; j < pairs.size() && pairs[j].first < band + 10.0; ++j) {
      ro += pairs[j].first;
      kern += pairs[j].second;
    }
    const double cnt = static_cast<double>(j - i);
    std::printf(
        "    read-only %3.0f-%3.0f GB/s: %4zu pairs, read-only %6.1f, kernel %6.1f GB/s (%.0f%%)\n",
        band, band + 10.0, j - i, ro / cnt, kern / cnt, 100.0 * kern / ro);
    i = j;
  }
}

void BenchQuantPrefill(CpuBackend& backend, DType dtype, int64_t m, int64_t k, int64_t n,
                       double peak) {
  if (!EnvListHas("QUANT_TYPES", DTypeName(dtype))) return;
  std::mt19937 rng(6);
  HugeBuffer<uint8_t> w = QuantizedWeights(dtype, m, k, rng);
  std::vector<float> x(n * k), out(n * m);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& v : x) v = dist(rng);
  TensorView xv(x.data(), DType::kF32, {n, k}), ov(out.data(), DType::kF32, {n, m});
  std::string name;
  const TensorView wv = AsRun(backend, TensorView(w.data(), dtype, {m, k}), true, &name);
  backend.Gemm(xv, wv, TensorView(), ov);
  int calls = 0;
  const auto t0 = Clock::now();
  while (Seconds(t0, Clock::now()) < 1.0 || calls < 2) {
    backend.Gemm(xv, wv, TensorView(), ov);
    ++calls;
  }
  const double sec = Seconds(t0, Clock::now()) / calls;
  const double gflops = 2.0 * n * m * k / sec / 1e9;
  std::printf("  prefill %-7s m=%-5lld k=%-5lld n=%-4lld %8.2f ms  %6.1f GFLOP/s  %5.1f%% of f32 FMA peak\n",
              name.c_str(), static_cast<long long>(m),
              static_cast<long long>(k), static_cast<long long>(n), sec * 1e3, gflops,
              peak > 0 ? 100.0 * gflops / peak : 0.0);
}

double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Process CPU seconds per call of call(i) (i = 0, 1, ... counts the calls), over one run of at
// least min_seconds.
template <class Fn>
double CpuSecondsPerCall(double min_seconds, Fn&& call) {
  int calls = 0;
  const double t0 = ProcessCpuSeconds();
  while (ProcessCpuSeconds() - t0 < min_seconds) call(calls++);
  return (ProcessCpuSeconds() - t0) / calls;
}

// Kernel throughput on one thread with w resident in L2 (m * k small), timed in CPU time of the
// process, so that other processes on the machine barely change it: how many quantized bytes per
// second one core can consume. Decode is memory-bound only if this is well above the read
// bandwidth per core. Run with num_threads = 1.
void BenchQuantCompute(CpuBackend& backend, DType dtype, int64_t k, int64_t n, bool prepare) {
  // A multiple of 16 rows, so that a layout in 16-row groups covers all of them.
  const int64_t m =
      std::max<int64_t>(16, (int64_t{256} << 10) / DTypeRowBytes(dtype, k) / 16 * 16);
  std::mt19937 rng(7);
  HugeBuffer<uint8_t> w = QuantizedWeights(dtype, m, k, rng);
  std::vector<float> x(n * k), out(n * m);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& v : x) v = dist(rng);
  TensorView xv(x.data(), DType::kF32, {n, k}), ov(out.data(), DType::kF32, {n, m});
  std::string name;
  const TensorView wv = AsRun(backend, TensorView(w.data(), dtype, {m, k}), prepare, &name);
  backend.Gemm(xv, wv, TensorView(), ov);
  // Best of 5 runs of 0.1 s: CPU time still picks up cache misses caused by other processes.
  double sec = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    sec = std::min(sec, CpuSecondsPerCall(0.1, [&](int) {
                     backend.Gemm(xv, wv, TensorView(), ov);
                   }));
  }
  const double w_bytes = static_cast<double>(DTypeRowBytes(dtype, k) * m);
  std::printf(
      "  compute %-7s k=%-5lld n=%-3lld m=%-5lld %7.2f GB/s of w per core-second  %6.2f ns "
      "per row per 256 elements\n",
      name.c_str(), static_cast<long long>(k), static_cast<long long>(n),
      static_cast<long long>(m), w_bytes / sec / 1e9, sec * 1e9 / m / (k / 256.0));
}

// The per-core FMA peak probe of the compute modes, printed with the ISA of its chains.
double MeasureAndPrintCorePeak() {
  const char* isa = "none";
  const double peak = bench::MeasureFmaPeakGflopsPerCoreSecond(&isa);
  std::printf(
      "f32 FMA peak probe (%s chains), one thread, CPU time: %.1f GFLOP/s per core-second\n", isa,
      peak);
  return peak;
}

// Prefill Gemm (n x rows; w as the engine runs it, AsRun) on one thread in process CPU time, best
// of 5 runs of >= 0.3 s: GFLOP/s per core-second, against the per-core FMA peak probe measured
// the same way. Run with num_threads = 1 (other threads' spinning would count as CPU time too).
void BenchPrefillCompute(CpuBackend& backend, DType dtype, int64_t m, int64_t k, int64_t n,
                         double peak) {
  std::mt19937 rng(8);
  std::vector<uint8_t> w;
  if (dtype == DType::kF32 || dtype == DType::kBF16) {
    std::normal_distribution<float> dist(0.0f, 0.02f);
    w.resize(static_cast<size_t>(m * k) * DTypeBytes(dtype));
    for (int64_t i = 0; i < m * k; ++i) {
      const float v = dist(rng);
      if (dtype == DType::kF32) {
        std::memcpy(w.data() + 4 * i, &v, 4);
      } else {
        const bf16_t b = F32ToBf16(v);
        std::memcpy(w.data() + 2 * i, &b, 2);
      }
    }
  } else {
    HugeBuffer<uint8_t> q = QuantizedWeights(dtype, m, k, rng);
    w.assign(q.data(), q.data() + DTypeRowBytes(dtype, k) * m);
  }
  std::vector<float> x(n * k), out(n * m);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& v : x) v = dist(rng);
  TensorView xv(x.data(), DType::kF32, {n, k}), ov(out.data(), DType::kF32, {n, m});
  std::string name;
  const TensorView wv = AsRun(backend, TensorView(w.data(), dtype, {m, k}), true, &name);
  backend.Gemm(xv, wv, TensorView(), ov);
  double sec = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    sec = std::min(sec, CpuSecondsPerCall(0.3, [&](int) {
                     backend.Gemm(xv, wv, TensorView(), ov);
                   }));
  }
  const double gflops = 2.0 * n * m * k / sec / 1e9;
  std::printf(
      "  prefill %-7s m=%-5lld k=%-5lld n=%-4lld %6.1f GFLOP/s per core-second  %5.1f%% of "
      "the probe\n",
      name.c_str(), static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n),
      gflops, peak > 0 ? 100.0 * gflops / peak : 0.0);
}

// Memory / compute overlap (overlap_probe.h): each thread streams its share of a 1 GiB buffer
// (DRAM) and, separately, 64 passes over its own 256 KiB (L2), with 0-24 AVX-512 instructions per
// 64-byte line, as one stream and as two alternating streams; and the buffer again as a decode
// step meets its weights, in calls of 6.5 MB that the pool splits into chunks. Wall time over all
// threads, best of three alternating rounds. "serial" is what the DRAM figure would be if the core
// ran memory and compute one after the other: 1 / (1 / the zero-op DRAM rate + 1 / the L2 rate).
void BenchOverlap(int num_threads) {
  if (!CpuHasIsa(Isa::kAvx512Vnni)) {
    std::printf("overlap: needs AVX512_VNNI, not on this CPU\n");
    return;
  }
  const size_t dram_bytes = size_t{1} << 30, l2_bytes = size_t{256} << 10;
  const size_t part =
      dram_bytes / num_threads / (2 * bench::kOverlapChunkBytes) * (2 * bench::kOverlapChunkBytes);
  HugeBuffer<uint8_t> dram(dram_bytes), l2(l2_bytes * num_threads);
  ThreadPool pool(num_threads);
  pool.ParallelFor(0, num_threads, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      std::memset(dram.data() + t * part, static_cast<int>(t + 1), part);
      std::memset(l2.data() + t * l2_bytes, static_cast<int>(t + 1), l2_bytes);
    }
  });
  constexpr int kN = sizeof(bench::kOverlapOps) / sizeof(bench::kOverlapOps[0]);
  auto run = [&](bench::OverlapPassFn fn, bool in_l2) {
    std::vector<int64_t> sink(num_threads);
    const int passes = in_l2 ? 64 : 1;
    const auto t0 = Clock::now();
    pool.ParallelFor(0, num_threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        for (int i = 0; i < passes; ++i) {
          sink[t] +=
              in_l2 ? fn(l2.data() + t * l2_bytes, l2_bytes) : fn(dram.data() + t * part, part);
        }
      }
    });
    const double sec = Seconds(t0, Clock::now());
    int64_t total = 0;
    for (int64_t v : sink) total += v;
    if (total == 42) std::printf(" ");  // keeps the sums alive
    return static_cast<double>(in_l2 ? l2_bytes : part) * passes * num_threads / sec / 1e9;
  };
  // As a decode step calls a Gemm: 6.5 MB at a time (a TinyLlama MLP matrix at 4.5 bits), the
  // pool's ParallelFor splitting its 4 KiB pieces into chunks, one stream per chunk.
  auto run_calls = [&](bench::OverlapPassFn fn) {
    constexpr int64_t kUnit = 2 * bench::kOverlapChunkBytes;
    const int64_t units_per_call = (size_t{6488064} / kUnit);
    const int64_t calls = static_cast<int64_t>(dram_bytes / kUnit) / units_per_call;
    std::atomic<int64_t> sink{0};
    const auto t0 = Clock::now();
    for (int64_t c = 0; c < calls; ++c) {
      const uint8_t* base = dram.data() + c * units_per_call * kUnit;
      pool.ParallelFor(0, units_per_call, 1, [&](int64_t b, int64_t e) {
        sink.fetch_add(fn(base + b * kUnit, (e - b) * kUnit), std::memory_order_relaxed);
      });
    }
    const double sec = Seconds(t0, Clock::now());
    if (sink.load() == 42) std::printf(" ");  // keeps the sums alive
    return static_cast<double>(calls * units_per_call * kUnit) / sec / 1e9;
  };
  double best_calls[kN] = {};
  double best[2][kN][2] = {};  // [streams - 1][ops][dram, l2]
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < kN; ++i) {
      for (int st = 0; st < 2; ++st) {
        const bench::OverlapPassFn fn =
            st == 0 ? bench::kOverlapOneStream[i] : bench::kOverlapTwoStreams[i];
        for (int where = 0; where < 2; ++where) {
          best[st][i][where] = std::max(best[st][i][where], run(fn, where == 1));
        }
      }
      best_calls[i] = std::max(best_calls[i], run_calls(bench::kOverlapOneStream[i]));
    }
  }
  std::printf("memory / compute overlap, %d threads (GB/s over all threads)\n", num_threads);
  std::printf(
      "  | ops per line | L2 rate | DRAM, 1 stream | serial | DRAM, 2 streams | serial | "
      "DRAM, 6.5 MB calls |\n");
  std::printf("  |---:|---:|---:|---:|---:|---:|---:|\n");
  for (int i = 0; i < kN; ++i) {
    auto serial = [&](int st) { return 1.0 / (1.0 / best[st][0][0] + 1.0 / best[st][i][1]); };
    std::printf("  | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", bench::kOverlapOps[i],
                best[0][i][1], best[0][i][0], serial(0), best[1][i][0], serial(1), best_calls[i]);
  }
}

// The decode/prefill crossover: the table's small-n and large-n BF16 kernels called directly on
// one thread for the same n x rows, process CPU time, best of 5 runs of >= 0.2 s. Calls alternate
// between two copies of w (2 x 8 MiB at 2048 x 2048, beyond L2), as a batched decode step reads
// it. The engine switches at the table's float_small_n_max.
void BenchCrossover(Isa isa, int64_t m, int64_t k, std::initializer_list<int64_t> ns) {
  const KernelTable& kt = KernelsFor(isa);
  std::mt19937 rng(9);
  HugeBuffer<bf16_t> w = RandomWeights<bf16_t>(2 * m * k, rng);
  for (int64_t n : ns) {
    std::vector<float> x(n * k, 0.25f), xd(n * k), out(n * m);
    double best[2] = {1e30, 1e30};
    for (int rep = 0; rep < 5; ++rep) {
      for (int which = 0; which < 2; ++which) {
        const double sec = CpuSecondsPerCall(0.2, [&](int call) {
          const bf16_t* wc = w.data() + (call % 2) * m * k;
          if (which == 0) {
            // The small-n kernel's x layout, made once per Gemm as the backend does.
            const float* xs = x.data();
            if (kt.prepare_x_bf16 != nullptr) {
              kt.prepare_x_bf16(x.data(), n, k, xd.data());
              xs = xd.data();
            }
            kt.gemm_small_bf16(xs, n, k, wc, nullptr, out.data(), m, 0, m);
          } else {
            kt.gemm_large_bf16(x.data(), 0, n, k, wc, nullptr, out.data(), m, 0, m);
          }
        });
        best[which] = std::min(best[which], sec);
      }
    }
    std::printf("  crossover BF16 m=%lld k=%lld n=%-3lld small-n %8.1f us (%5.1f GFLOP/s)  "
                "large-n %8.1f us (%5.1f GFLOP/s)%s\n",
                static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(n),
                best[0] * 1e6, 2.0 * n * m * k / best[0] / 1e9, best[1] * 1e6,
                2.0 * n * m * k / best[1] / 1e9, n <= kt.float_small_n_max ? "  (engine: small-n)" : "");
  }
}

// Paged decode attention: n_heads q heads over n_kv kv heads of head_dim (TinyLlama 32/4 and the
// 110m shape's 12/4 at 64, Llama-3-8B's 32/8 at 128), BF16 KV, pages of 16 shuffled (of 64, or in
// order, in the modes above). Calls cycle through kLayers layers' KV pools, as a decode step does,
// so a pool is not still in the cache when its next call comes (one pool of 16 rows x 1024 keys,
// 16.8 MB, would otherwise stay in L3 from call to call), or one pool (mode "attention-hot").
void BenchDecodeAttention(CpuBackend& backend, int n_heads, int n_kv, int hd, int64_t batch,
                          int32_t context) {
  const int kLayers = g_attn_layers;
  const int bs = g_attn_block_size;
  const int64_t pages_per_seq = (context + bs - 1) / bs, num_pages = batch * pages_per_seq;
  std::mt19937 rng(3);
  std::vector<HugeBuffer<bf16_t>> pools;
  const size_t pool_count = num_pages * 2 * n_kv * bs * hd;
  pools.push_back(RandomWeights<bf16_t>(pool_count, rng));
  for (int l = 1; l < kLayers; ++l) {
    pools.emplace_back(pool_count);
    std::memcpy(pools.back().data(), pools[0].data(), pool_count * sizeof(bf16_t));
  }
  std::vector<int32_t> ids(num_pages);
  for (int64_t i = 0; i < num_pages; ++i) ids[i] = static_cast<int32_t>(i);
  if (!g_attn_in_order) std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> row_seq(batch), row_len(batch, context);
  for (int64_t b = 0; b < batch; ++b) row_seq[b] = static_cast<int32_t>(b);
  std::vector<float> q(batch * n_heads * hd, 0.1f), out(batch * n_heads * hd);
  const AttentionParams p{
      .n_heads = n_heads, .n_kv_heads = n_kv, .head_dim = hd, .block_size = bs, .scale = 0.125f};
  int layer = 0;
  auto run = [&] {
    bf16_t* pool = pools[layer].data();
    layer = (layer + 1) % kLayers;
    backend.Attention(p, TensorView(q.data(), DType::kF32, {batch, n_heads, hd}),
                      TensorView(pool, DType::kBF16, {num_pages, 2 * n_kv, bs, hd}),
                      TensorView(ids.data(), DType::kI32, {batch, pages_per_seq}),
                      TensorView(row_seq.data(), DType::kI32, {batch}),
                      TensorView(row_len.data(), DType::kI32, {batch}),
                      TensorView(out.data(), DType::kF32, {batch, n_heads * hd}));
  };
  for (int l = 0; l < kLayers; ++l) run();
  int calls = 0;
  double fastest = 1e30;
  const auto t0 = Clock::now();
  while (Seconds(t0, Clock::now()) < 0.5 || calls < kLayers) {
    const auto c0 = Clock::now();
    run();
    fastest = std::min(fastest, Seconds(c0, Clock::now()));
    ++calls;
  }
  const double sec = Seconds(t0, Clock::now()) / calls;
  const double kv_bytes = 2.0 * batch * context * n_kv * hd * sizeof(bf16_t);
  // The fastest call beside the mean: on a shared machine the mean carries other tenants' time.
  std::printf(
      "  attention decode heads=%d/%d hd=%d batch=%lld ctx=%d  %8.1f us/layer  %6.1f GB/s "
      "of KV  (fastest call %8.1f us, %6.1f GB/s)\n",
      n_heads, n_kv, hd, static_cast<long long>(batch), context, sec * 1e6, kv_bytes / sec / 1e9,
      fastest * 1e6, kv_bytes / fastest / 1e9);
}

// The online-softmax tile of a decode attention call (kernels.h attn_softmax) on one thread, the
// scores in L1: 64 keys (one tile) of H heads in one call, as CpuBackend::AttentionT makes it,
// beside H one-head calls over the same scores. Best of 5 runs of 200,000 calls, ns per head.
void BenchAttentionSoftmax(Isa isa) {
  const KernelTable& kt = KernelsFor(isa);
  constexpr int64_t kKeys = 64;
  std::printf("  | heads | one call, ns a head | a call per head, ns a head |\n");
  std::printf("  |---:|---:|---:|\n");
  for (int64_t heads : {1, 2, 3, 4, 8, 12}) {
    std::vector<float> s(heads * kKeys, 0.0f), m(heads), l(heads), rescale(heads);
    double best[2] = {1e30, 1e30};
    for (int rep = 0; rep < 5; ++rep) {
      for (int per_head = 0; per_head < 2; ++per_head) {
        constexpr int kCalls = 200000;
        const auto t0 = Clock::now();
        for (int c = 0; c < kCalls; ++c) {
          // The running max back at 1 before each call: the scores, e^(s - 1) of the last
          // call's, stay in (0, 1] (the exp has no branches, so every call does the same work).
          for (int64_t h = 0; h < heads; ++h) m[h] = 1.0f, l[h] = 1.0f;
          if (per_head == 0) {
            kt.attn_softmax(s.data(), kKeys, heads, kKeys, m.data(), l.data(), rescale.data());
          } else {
            for (int64_t h = 0; h < heads; ++h) {
              kt.attn_softmax(s.data() + h * kKeys, kKeys, 1, kKeys, &m[h], &l[h], &rescale[h]);
            }
          }
          asm volatile("" : : "r"(s.data()), "r"(l.data()) : "memory");
        }
        best[per_head] = std::min(best[per_head], Seconds(t0, Clock::now()) / kCalls);
      }
    }
    std::printf("  | %lld | %.1f | %.1f |\n", static_cast<long long>(heads), best[0] * 1e9 / heads,
                best[1] * 1e9 / heads);
  }
}

// The benchmarks the third argument may name ("": all of the default set).
constexpr std::string_view kModes[] = {"",
                                       "decode",
                                       "attention",
                                       "attention-4k",
                                       "attention-pages64",
                                       "attention-inorder",
                                       "attention-hot",
                                       "attention-softmax",
                                       "prefill",
                                       "prefill-compute",
                                       "prefill-bf16",
                                       "overlap",
                                       "crossover",
                                       "crossover-shapes",
                                       "quant",
                                       "quant-decode",
                                       "quant-prefill",
                                       "quant-compute",
                                       "quant-pairs",
                                       "isa-rates"};

int Main(int argc, char** argv) {
  const std::string only = argc > 3 ? argv[3] : "";
  if (std::find(std::begin(kModes), std::end(kModes), only) == std::end(kModes)) {
    std::fprintf(stderr, "kernel_bench: unknown benchmark '%s' (see --help)\n", only.c_str());
    return 2;
  }
  CpuBackendOptions options;
  if (argc > 1) options.num_threads = std::atoi(argv[1]);
  if (argc > 2 && std::string(argv[2]) != "" && std::string(argv[2]) != "best") {
    options.isa = IsaFromName(argv[2]);
    if (!options.isa.has_value()) {
      std::fprintf(stderr, "kernel_bench: no kernel table named '%s'\n", argv[2]);
      return 1;
    }
  }
  if (const char* p = std::getenv("MATMUL_PRECISION"); p != nullptr) {
    auto precision = ParseMatmulPrecision(p);
    if (!precision.ok()) {
      std::fprintf(stderr, "kernel_bench: %s\n", precision.status().ToString().c_str());
      return 2;
    }
    options.matmul_precision = *precision;
  }
  auto created = CpuBackend::Create(options);
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", created.status().ToString().c_str());
    return 1;
  }
  CpuBackend& backend = **created;
  const std::string amx =
      CpuHasIsa(Isa::kAmx)
          ? AmxInt8UnavailableReason().empty()
                ? "usable (int8 tiles too)"
                : "usable (int8 tiles not: " + std::string(AmxInt8UnavailableReason()) + ")"
          : "unusable: " + std::string(AmxUnavailableReason());
  std::printf(
      "cpu: %s%s\ncpu backend: isa %s, %d threads, avx512_bf16 %s, amx %s, matmul_precision %s\n",
      bench::CpuModel().c_str(),
      CpuIsAmdFamily1Ah()
          ? " (AMD family 1Ah: the VNNI table's one-row K-quant tiles prefetch into L2)"
          : "",
      std::string(IsaName(backend.isa())).c_str(), backend.num_threads(),
      CpuHasAvx512Bf16() ? "present (BF16 weights as panels without AMX; vdpbf16ps at medium)"
                         : "absent",
      amx.c_str(), std::string(MatmulPrecisionName(options.matmul_precision)).c_str());
  if (only == "isa-rates") {
    // One core, register-only chains and L1 loads (isa_rates.h): the instruction rates the
    // kernels are built around, and each against the ymm FMA's.
    struct Probe {
      const char* name;
      bool usable;
      void (*probe)(int64_t);
    };
    const bool avx512 = CpuHasIsa(Isa::kAvx512), vnni = CpuHasIsa(Isa::kAvx512Vnni);
    const bool bf16 = avx512 && CpuHasAvx512Bf16();
    const Probe probes[] = {
        {"vfmadd231ps ymm", CpuHasIsa(Isa::kAvx2), &bench::RateFmaYmm},
        {"vfmadd231ps zmm", avx512, &bench::RateFmaZmm},
        {"vpmaddubsw ymm", CpuHasIsa(Isa::kAvx2), &bench::RateMaddubsYmm},
        {"vpdpbusd ymm", vnni, &bench::RateDpbusdYmm},
        {"vpdpbusd zmm", vnni, &bench::RateDpbusdZmm},
        {"vdpbf16ps ymm", bf16, &bench::RateDpbf16Ymm},
        {"vdpbf16ps zmm", bf16, &bench::RateDpbf16Zmm},
        {"load zmm (L1)", avx512, &bench::RateLoadZmm},
        {"bcast load (L1)", avx512, &bench::RateLoadBroadcastZmm},
    };
    // Five rounds over all probes, each probe's best round: on a shared host a round can lose
    // the core for part of its time slice even in CPU time (steal shows up as slow cycles).
    constexpr int kProbes = sizeof(probes) / sizeof(probes[0]);
    double rate[kProbes] = {};
    for (int round = 0; round < 5; ++round) {
      for (int i = 0; i < kProbes; ++i) {
        if (!probes[i].usable) continue;
        rate[i] = std::max(rate[i], bench::InstructionsPerNs(probes[i].probe));
      }
    }
    for (int i = 0; i < kProbes; ++i) {
      if (!probes[i].usable) {
        std::printf("  %-16s  not on this CPU\n", probes[i].name);
        continue;
      }
      std::printf("  %-16s %6.2f per ns of one core's CPU time  %5.2fx the ymm FMA's rate\n",
                  probes[i].name, rate[i], rate[i] / rate[0]);
    }
    return 0;
  }
  const double bw = MeasureReadBandwidth(backend.num_threads());
  std::printf("measured read bandwidth (1 GiB sum, %d threads): %.1f GB/s\n", backend.num_threads(),
              bw);
  // Optional third argument: "decode" runs only the BF16 decode Gemm, "attention" only the
  // paged decode attention, "prefill" only the prefill Gemms (quick kernel iteration).
  const char* peak_isa = "none";
  const double peak = bench::MeasureFmaPeakGflops(backend.num_threads(), &peak_isa);
  std::printf(
      "f32 FMA peak probe (register-only FMA chains, the stronger of AVX2's and AVX-512's: "
      "%s, %d threads): %.1f GFLOP/s\n",
      peak_isa, backend.num_threads(), peak);
  if (only == "attention-softmax") {
    std::printf(
        "attention softmax tiles, %s table, one thread, 64 keys in L1 (m and l reset before "
        "each call, in both columns):\n",
        std::string(IsaName(backend.isa())).c_str());
    BenchAttentionSoftmax(backend.isa());
    return 0;
  }
  if (only.rfind("attention", 0) == 0) {
    g_small_pages = only == "attention-4k";
    g_attn_in_order = only == "attention-inorder";
    g_attn_block_size = only == "attention-pages64" ? 64 : 16;
    if (only == "attention-hot") {
      g_attn_layers = 1;
      for (int n_heads : {32, 12}) {
        BenchDecodeAttention(backend, n_heads, 4, 64, 1, 1024);
        BenchDecodeAttention(backend, n_heads, 4, 64, 16, 128);
      }
      return 0;
    }
    for (int n_heads : {32, 12}) {
      // One row at a context of one or two 256-key splits: fewer tasks than threads unless a
      // split is cut by kv heads (CpuBackend::AttentionT).
      for (int32_t context : {128, 256, 512}) {
        BenchDecodeAttention(backend, n_heads, 4, 64, 1, context);
      }
      for (int32_t context : {1024, 4096}) {
        for (int64_t batch : {1, 16}) BenchDecodeAttention(backend, n_heads, 4, 64, batch, context);
      }
      BenchDecodeAttention(backend, n_heads, 4, 64, 64, 1024);
    }
    for (int64_t batch : {1, 16}) BenchDecodeAttention(backend, 32, 8, 128, batch, 1024);
    return 0;
  }
  if (only == "quant-compute") {
    // Every type twice: as the file stores it, then as the engine runs it (the interleaved
    // copies, on tables that read them). QUANT_TYPES picks types, QUANT_ROWS row counts.
    const DType types[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                           DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
    for (bool prepare : {false, true}) {
      for (DType t : types) {
        if (!EnvListHas("QUANT_TYPES", DTypeName(t))) continue;
        for (int64_t n : {1, 2, 4, 8, 16, 64}) {
          if (EnvListHas("QUANT_ROWS", std::to_string(n))) {
            BenchQuantCompute(backend, t, 2048, n, prepare);
          }
        }
      }
    }
    return 0;
  }
  if (only == "quant-pairs") {
    for (DType t : {DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                    DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
      BenchQuantPairs(backend, t);
    }
    return 0;
  }
  if (only.rfind("quant", 0) == 0) {
    const DType types[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                           DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
    const std::pair<int64_t, int64_t> tiny[] = {{2048, 2048}, {5632, 2048}, {2048, 5632}};
    if (only != "quant-prefill") {
      for (DType t : types) {
        for (auto [m, k] : tiny) BenchQuantDecode(backend, t, m, k, bw, "TinyLlama");
      }
      // SmolLM2-135M: Q4_1 layers (d_model 576, d_ff 1536; Q5_0 in llama.cpp's Q4_K_M of it) and
      // the tied Q8_0 LM head.
      for (DType t : {DType::kQ4_1, DType::kQ5_0}) {
        for (auto [m, k] : {std::pair<int64_t, int64_t>{576, 576}, {1536, 576}, {576, 1536}}) {
          BenchQuantDecode(backend, t, m, k, bw, "SmolLM2");
        }
      }
      BenchQuantDecode(backend, DType::kQ8_0, 49152, 576, bw, "SmolLM2 LM head");
    }
    if (only != "quant-decode") {
      for (DType t : types) {
        for (auto [m, k] : tiny) BenchQuantPrefill(backend, t, m, k, 512, peak);
      }
      BenchQuantPrefill(backend, DType::kQ4_1, 1536, 576, 512, peak);
      BenchQuantPrefill(backend, DType::kQ5_0, 1536, 576, 512, peak);
      BenchQuantPrefill(backend, DType::kQ8_0, 49152, 576, 64, peak);
    }
    return 0;
  }
  const bool decode_only = only == "decode";
  const std::pair<int64_t, int64_t> shapes[] = {{2048, 2048}, {5632, 2048}, {2048, 5632}};
  if (only == "crossover") {
    BenchCrossover(backend.isa(), 2048, 2048, {2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128});
    return 0;
  }
  if (only == "crossover-shapes") {
    // The 110m shape's matrices (d_model 768, d_ff 2048), TinyLlama's, and both LM heads (vocab
    // 32000), around the crossover.
    const std::pair<int64_t, int64_t> mk[] = {{768, 768},   {2048, 768},  {768, 2048},
                                              {32000, 768}, {2048, 2048}, {5632, 2048},
                                              {2048, 5632}, {32000, 2048}};
    for (auto [m, k] : mk) BenchCrossover(backend.isa(), m, k, {32, 48, 64, 96, 128});
    return 0;
  }
  if (only == "prefill-compute") {
    const double core_peak = MeasureAndPrintCorePeak();
    for (DType t : {DType::kBF16, DType::kF32, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1,
                    DType::kQ5_0, DType::kQ5_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
      for (auto [m, k] : shapes) BenchPrefillCompute(backend, t, m, k, 512, core_peak);
    }
    return 0;
  }
  if (only == "prefill-bf16") {
    // The BF16 rows of prefill-compute alone (the AMX table's tile Gemm where the unit is usable).
    const double core_peak = MeasureAndPrintCorePeak();
    for (auto [m, k] : shapes) BenchPrefillCompute(backend, DType::kBF16, m, k, 512, core_peak);
    return 0;
  }
  if (only == "overlap") {
    BenchOverlap(backend.num_threads());
    return 0;
  }
  if (only == "prefill") {
    for (auto [m, k] : shapes) {
      BenchPrefillGemm<bf16_t>(backend, DType::kBF16, m, k, peak);
      BenchPrefillGemm<float>(backend, DType::kF32, m, k, peak);
    }
    return 0;
  }
  for (auto [m, k] : shapes) {
    BenchDecodeGemm<bf16_t>(backend, DType::kBF16, m, k, bw);
    if (!decode_only) BenchDecodeGemm<float>(backend, DType::kF32, m, k, bw);
  }
  if (decode_only) return 0;
  for (auto [m, k] : shapes) {
    BenchPrefillGemm<bf16_t>(backend, DType::kBF16, m, k, peak);
    BenchPrefillGemm<float>(backend, DType::kF32, m, k, peak);
  }
  for (int64_t batch : {1, 16}) BenchDecodeAttention(backend, 32, 4, 64, batch, 1024);
  return 0;
}

}  // namespace
}  // namespace modserve::backend::cpu

int main(int argc, char** argv) {
  if (argc > 1 && (std::string_view(argv[1]) == "--help" || std::string_view(argv[1]) == "-h")) {
    std::string modes;
    for (std::string_view m : modserve::backend::cpu::kModes) {
      if (!m.empty()) modes += std::string(modes.empty() ? "" : "|") + std::string(m);
    }
    std::printf(
        "usage: kernel_bench [THREADS (0 = every core)] [best|scalar|avx2|avx512|avx512vnni|amx] "
        "[%s]\n"
        "CPU kernels in isolation: decode and prefill GEMMs (float and block-quantized weights), "
        "paged decode attention; GB/s against the measured read bandwidth. quant-compute: one "
        "core's quantized-GEMM throughput in CPU time, weights in L2. quant-pairs: one-row decode "
        "from DRAM (BF16 and the quantized types, as the engine lays them out) against a "
        "read-only pass, alternating, by the pass's rate.\n",
        modes.c_str());
    return 0;
  }
  return modserve::backend::cpu::Main(argc, argv);
}
