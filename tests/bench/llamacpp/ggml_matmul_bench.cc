// ggml_matmul_bench: llama.cpp's own CPU matrix-multiply kernels (ggml MUL_MAT, as llama-bench
// runs them) on the shapes kernel_bench uses, so the two can be compared kernel for kernel on one
// machine: decode (x of n = 1, 4, 16 rows) against weights streamed from DRAM, and prefill
// (n = 512). Weights are quantized by ggml's own quantizer from N(0, 0.02) values; with repack on
// they live in the CPU backend's extra (repacking) buffer type, as llama.cpp places model weights
// by default. Built against a llama.cpp build by tests/bench/llamacpp/kernels.sh; prints numbers
// in kernel_bench's format and asserts nothing.
//
//   ggml_matmul_bench THREADS REPACK(0|1) [decode|prefill|all|compute]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Bench {
  ggml_backend_t backend = nullptr;
  ggml_backend_buffer_type_t weight_buft = nullptr;  // repacking extra buffer or plain CPU
  int threads = 1;
};

// The extra buffer type that repacks weights for the CPU kernels (null when there is none).
ggml_backend_buffer_type_t RepackBufferType() {
  ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
  auto get = reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(ggml_backend_reg_get_proc_address(
      ggml_backend_dev_backend_reg(dev), "ggml_backend_dev_get_extra_bufts"));
  if (get == nullptr) return nullptr;
  for (ggml_backend_buffer_type_t* b = get(dev); b != nullptr && *b != nullptr; ++b) {
    if (std::strstr(ggml_backend_buft_name(*b), "REPACK") != nullptr) return *b;
  }
  return nullptr;
}

// Runs `copies` MUL_MATs out_c = w_c x (x [k, n] f32; w_c [k, m] of `type`, all copies of one
// quantized matrix) `reps` times and returns seconds per MUL_MAT.
// Whether the repacking buffer type has a layout for (type, m): its init_tensor leaves the
// tensor's extra null otherwise, and llama.cpp then keeps the weight in the plain CPU buffer.
bool Repacks(ggml_backend_buffer_type_t buft, ggml_type type, int64_t m, int64_t k) {
  ggml_init_params params = {ggml_tensor_overhead() * 2, nullptr, true};
  ggml_context* ctx = ggml_init(params);
  ggml_tensor* t = ggml_new_tensor_2d(ctx, type, k, m);
  ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft);
  const bool repacks = t->extra != nullptr;
  ggml_backend_buffer_free(buf);
  ggml_free(ctx);
  return repacks;
}

double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// With cpu_time, the clock is the process's CPU time (one thread: the kernel's own cost,
// barely changed by other processes on the machine); otherwise wall-clock time.
double TimeMulMat(Bench& b, ggml_type type, int64_t m, int64_t k, int64_t n, int copies,
                  double min_seconds, bool cpu_time = false) {
  ggml_init_params wparams = {ggml_tensor_overhead() * (copies + 1), nullptr, true};
  ggml_context* wctx = ggml_init(wparams);
  std::vector<ggml_tensor*> w(copies);
  for (int c = 0; c < copies; ++c) w[c] = ggml_new_tensor_2d(wctx, type, k, m);
  ggml_backend_buffer_type_t buft = b.weight_buft;
  if (buft != ggml_backend_cpu_buffer_type() && !Repacks(buft, type, m, k)) {
    buft = ggml_backend_cpu_buffer_type();
  }
  ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, buft);
  ggml_backend_buffer_set_usage(wbuf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);

  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> f(m * k);
  for (float& v : f) v = dist(rng);
  std::vector<uint8_t> q(ggml_row_size(type, k) * m);
  ggml_quantize_chunk(type, f.data(), q.data(), 0, m, k, nullptr);
  for (int c = 0; c < copies; ++c) ggml_backend_tensor_set(w[c], q.data(), 0, q.size());

  ggml_init_params gparams = {ggml_tensor_overhead() * (2 * copies + 8) + ggml_graph_overhead(),
                              nullptr, true};
  ggml_context* gctx = ggml_init(gparams);
  ggml_tensor* x = ggml_new_tensor_2d(gctx, GGML_TYPE_F32, k, n);
  ggml_set_input(x);
  ggml_cgraph* graph = ggml_new_graph_custom(gctx, 2 * copies + 8, false);
  for (int c = 0; c < copies; ++c) {
    ggml_tensor* out = ggml_mul_mat(gctx, w[c], x);
    ggml_set_output(out);
    ggml_build_forward_expand(graph, out);
  }
  ggml_gallocr_t galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(b.backend));
  ggml_gallocr_alloc_graph(galloc, graph);
  std::vector<float> xv(k * n);
  std::normal_distribution<float> xdist(0.0f, 1.0f);
  for (float& v : xv) v = xdist(rng);
  ggml_backend_tensor_set(x, xv.data(), 0, xv.size() * sizeof(float));

  ggml_backend_graph_compute(b.backend, graph);  // warm-up: pages in every copy
  int reps = 0;
  double sec = 0.0;
  if (cpu_time) {
    const double t0 = CpuSeconds();
    while (CpuSeconds() - t0 < min_seconds || reps < 2) {
      ggml_backend_graph_compute(b.backend, graph);
      ++reps;
    }
    sec = (CpuSeconds() - t0) / reps / copies;
  } else {
    const auto t0 = Clock::now();
    while (Seconds(t0, Clock::now()) < min_seconds || reps < 2) {
      ggml_backend_graph_compute(b.backend, graph);
      ++reps;
    }
    sec = Seconds(t0, Clock::now()) / reps / copies;
  }
  ggml_gallocr_free(galloc);
  ggml_free(gctx);
  ggml_backend_buffer_free(wbuf);
  ggml_free(wctx);
  return sec;
}

int Main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: ggml_matmul_bench THREADS REPACK(0|1) [decode|prefill|all|compute]\n");
    return 2;
  }
  Bench b;
  b.threads = std::atoi(argv[1]);
  const bool repack = std::atoi(argv[2]) != 0;
  const std::string only = argc > 3 ? argv[3] : "all";
  // ggml logs every repacked tensor; keep warnings and errors only.
  ggml_log_set(
      [](ggml_log_level level, const char* text, void*) {
        if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) {
          std::fputs(text, stderr);
        }
      },
      nullptr);
  ggml_backend_load_all();
  b.backend = ggml_backend_init_by_type(GGML_BACKEND_DEVICE_TYPE_CPU, nullptr);
  ggml_backend_cpu_set_n_threads(b.backend, b.threads);
  b.weight_buft = repack ? RepackBufferType() : nullptr;
  if (repack && b.weight_buft == nullptr) std::printf("no repacking buffer type; plain CPU\n");
  if (b.weight_buft == nullptr) b.weight_buft = ggml_backend_cpu_buffer_type();
  std::printf("ggml %s, %d threads, weights in %s\n", ggml_backend_name(b.backend), b.threads,
              ggml_backend_buft_name(b.weight_buft));

  struct Shape {
    ggml_type type;
    int64_t m, k;
    const char* label;
  };
  std::vector<Shape> shapes;
  for (ggml_type t :
       {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K}) {
    for (auto [m, k] : {std::pair<int64_t, int64_t>{2048, 2048}, {5632, 2048}, {2048, 5632}}) {
      shapes.push_back({t, m, k, "TinyLlama"});
    }
  }
  const size_t num_tiny = shapes.size();
  for (auto [m, k] : {std::pair<int64_t, int64_t>{576, 576}, {1536, 576}, {576, 1536}}) {
    shapes.push_back({GGML_TYPE_Q4_1, m, k, "SmolLM2"});
  }
  shapes.push_back({GGML_TYPE_Q8_0, 49152, 576, "SmolLM2 LM head"});

  if (only == "compute") {
    // kernel_bench's quant-compute: w of ~256 KiB (L2-resident), one thread, CPU time.
    for (ggml_type t :
         {GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q4_K, GGML_TYPE_Q6_K}) {
      const int64_t k = 2048;
      const int64_t m = std::max<int64_t>(16, (int64_t{256} << 10) / ggml_row_size(t, k)) / 8 * 8;
      for (int64_t n : {1, 4, 16, 64}) {
        const double sec = TimeMulMat(b, t, m, k, n, 1, 0.3, true);
        const double w_bytes = static_cast<double>(ggml_row_size(t, k) * m);
        std::printf(
            "  compute %-4s k=%-5lld n=%-3lld m=%-5lld %7.2f GB/s of w per core-second  "
            "%6.2f ns per row per 256 elements\n",
            ggml_type_name(t), static_cast<long long>(k), static_cast<long long>(n),
            static_cast<long long>(m), w_bytes / sec / 1e9, sec * 1e9 / m / (k / 256.0));
      }
    }
    ggml_backend_free(b.backend);
    return 0;
  }
  if (only != "prefill") {
    for (const Shape& s : shapes) {
      const double w_bytes = static_cast<double>(ggml_row_size(s.type, s.k) * s.m);
      // >= 1 GiB of copies, so every MUL_MAT streams its weights from DRAM.
      const int copies = static_cast<int>(std::max(2.0, (1 << 30) / w_bytes));
      for (int64_t n : {1, 4, 16}) {
        const double sec = TimeMulMat(b, s.type, s.m, s.k, n, copies, 0.5);
        std::printf(
            "  decode %-4s m=%-5lld k=%-5lld n=%-3lld %8.1f us  %7.2f MB  %6.1f GB/s  %s%s\n",
            ggml_type_name(s.type), static_cast<long long>(s.m), static_cast<long long>(s.k),
            static_cast<long long>(n), sec * 1e6, w_bytes / 1e6, w_bytes / sec / 1e9, s.label,
            b.weight_buft != ggml_backend_cpu_buffer_type() &&
                    Repacks(b.weight_buft, s.type, s.m, s.k)
                ? " (repacked)"
                : "");
      }
    }
  }
  if (only != "decode") {
    for (size_t i = 0; i < num_tiny; ++i) {
      const Shape& s = shapes[i];
      const double sec = TimeMulMat(b, s.type, s.m, s.k, 512, 1, 1.0);
      std::printf("  prefill %-4s m=%-5lld k=%-5lld n=512  %8.2f ms  %6.1f GFLOP/s\n",
                  ggml_type_name(s.type), static_cast<long long>(s.m), static_cast<long long>(s.k),
                  sec * 1e3, 2.0 * 512 * s.m * s.k / sec / 1e9);
    }
    const double sec = TimeMulMat(b, GGML_TYPE_Q4_1, 1536, 576, 512, 1, 1.0);
    std::printf("  prefill Q4_1 m=1536  k=576   n=512  %8.2f ms  %6.1f GFLOP/s\n", sec * 1e3,
                2.0 * 512 * 1536 * 576 / sec / 1e9);
  }
  ggml_backend_free(b.backend);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Main(argc, argv); }
