// modserve-bench: decode and prefill throughput of the real Engine (CPU or CUDA backend, one
// Transformer for both) on synthetic checkpoints of real shapes (~110M Llama, TinyLlama-1.1B and
// Llama-3-8B, each dense and MoD), set beside the machine's measured read bandwidth (CPU) or the
// device's measured copy bandwidth (--backend cuda). A benchmark, not a test: it prints tables and asserts
// nothing; the random weights make the generated text meaningless.
//
//   modserve-bench --shapes 110m,tinyllama --batches 1,4,16 --contexts 128,1024 --steps 32
//   modserve-bench --model models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --batches 1
//                  (any checkpoint directories or .gguf files, comma separated)
//   modserve-bench --backend cuda --shapes tinyllama,8b --batches 1,8,64 --contexts 128,1024
//                  (exits 1 with the registry's reason when no CUDA device is usable)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/backend/backend.h"
#include "engine/backend/cpu/kernels.h"
#include "engine/backend/cpu/thread_pool.h"
#include "engine/backend/registry.h"
#include "engine/common/dtype.h"
#include "engine/common/status_macros.h"
#include "engine/engine.h"
#include "nlohmann/json.hpp"
#include "tests/bench/matmul_peak.h"
#include "tools/cli_usage.h"
#include "tests/bench/cpu_model.h"

ABSL_FLAG(std::string, workdir, "/tmp/modserve-bench",
          "where the synthetic checkpoints are written (and reused when already there)");
ABSL_FLAG(std::string, shapes, "110m,tinyllama", "model shapes to run: 110m, tinyllama, 8b");
ABSL_FLAG(std::string, backend, "cpu",
          "backend the engine runs on: cpu, or cuda (device 0; the bandwidth beside the numbers is "
          "then the device's copy bandwidth)");
ABSL_FLAG(std::string, batches, "1,4,16", "decode batch sizes (sequences per step)");
ABSL_FLAG(std::string, contexts, "128,1024", "prompt tokens prefilled before decode is timed");
ABSL_FLAG(int32_t, steps, 32, "timed decode steps per (batch, context)");
ABSL_FLAG(int32_t, threads, 0, "CPU backend threads; 0 = every core");
ABSL_FLAG(std::string, device_routing, "auto",
          "auto, on or off: routing, routed rows and KV slots decided on the device (the device "
          "step of docs/DESIGN.md 5.2); auto = on for every backend but the CPU");
ABSL_FLAG(std::string, graphs, "auto",
          "auto, on or off: decode steps captured once per shape and replayed; auto = on for "
          "every backend but the CPU");
ABSL_FLAG(std::string, kv_dtype, "bf16", "KV cache storage: f32, f16 or bf16");
ABSL_FLAG(
    std::string, matmul_precision, "highest",
    "highest, high or medium: bf16 terms of x (3, 2, 1) in the AMX BF16 Gemm "
    "(EngineOptions::matmul_precision); the AMX ceilings below divide the tile probe by them");
ABSL_FLAG(int32_t, kv_block_size, 16, "tokens per KV cache page");
ABSL_FLAG(double, temperature, 0.0,
          "sampling temperature of the decode requests (0 = greedy; otherwise no truncation and "
          "a fixed seed per request, as an OpenAI client's default request samples)");
ABSL_FLAG(int32_t, prefill_tokens, 512, "prompt length of the prefill measurement");
ABSL_FLAG(int32_t, prefill_reps, 2, "prefill measurements per model (best is reported)");
ABSL_FLAG(int32_t, max_batch_tokens, 512, "engine max_batch_tokens (the prefill chunk)");
ABSL_FLAG(std::string, variants, "dense,mod", "which checkpoints of each shape to run");
ABSL_FLAG(int32_t, paired_steps, 0,
          "after the decode points, time this many more steps at each (context, batch), one at "
          "a time, each right after one pass of every read-bandwidth probe kind, and compare "
          "each step with its own pass (the memory's state can change within seconds); 0 = off");
ABSL_FLAG(std::string, model, "",
          "benchmark these checkpoints (directories or .gguf files, comma separated) instead of "
          "the synthetic --shapes / --variants; bytes read per step come from the file's tensors");

namespace modserve::bench {
namespace {

using modserve::DType;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// ---- shapes and synthetic checkpoints ---------------------------------------------------------

struct Shape {
  std::string name;
  int64_t d_model, n_layers, n_heads, n_kv_heads, head_dim, d_ff, vocab_size, max_seq_len;
  double rms_norm_eps, rope_theta;
};

const std::vector<Shape>& KnownShapes() {
  static const std::vector<Shape> shapes = {
      {"110m", 768, 12, 12, 4, 64, 2048, 32000, 8192, 1e-5, 10000.0},
      {"tinyllama", 2048, 22, 32, 4, 64, 5632, 32000, 2048, 1e-5, 10000.0},
      // Llama-3-8B: 16 GB of BF16 weights per checkpoint, meant for --backend cuda.
      {"8b", 4096, 32, 32, 8, 128, 14336, 128256, 8192, 1e-5, 500000.0},
  };
  return shapes;
}

// FLOPs of a dense prefill of one `tokens`-token prompt: every layer's matrices for every token
// (2 per multiply-add) plus causal attention (scores and values, 2 * 2 * head_dim per query head
// and visible key), and the LM head for the last token only (the prompt's other logits are not
// computed unless asked for).
// Multiply-adds of one token through one layer's matrices (q, k, v, o, gate, up, down).
double LayerMatrixMacs(const Shape& s) {
  const double q = static_cast<double>(s.n_heads * s.head_dim);
  const double kv = static_cast<double>(s.n_kv_heads * s.head_dim);
  const double d = static_cast<double>(s.d_model);
  return d * q + 2 * d * kv + q * d + 3 * d * static_cast<double>(s.d_ff);
}

double DensePrefillFlops(const Shape& s, int64_t tokens) {
  const double q = static_cast<double>(s.n_heads * s.head_dim);
  const double d = static_cast<double>(s.d_model);
  const double matrices = LayerMatrixMacs(s);
  const double t = static_cast<double>(tokens);
  const double attention = 4.0 * q * t * (t + 1) / 2;
  return static_cast<double>(s.n_layers) * (2 * matrices * t + attention) +
         2 * d * static_cast<double>(s.vocab_size);
}

// The matmul-peak probe of this run (tests/bench/matmul_peak.h), set once in Main.
double g_fma_peak_gflops = 0;
// The AMX tile probe's bf16 products (0 where the kernels are not the AMX table).
double g_amx_peak_gflops = 0;
// The vdpbf16ps probe's bf16 products (0 unless the BF16 Gemms of more than kDpBf16SmallNMax
// rows run on vdpbf16ps: --matmul_precision medium, AVX512_BF16 and no AMX table).
double g_dpbf16_peak_gflops = 0;
// --matmul_precision (set once in Main); the tile Gemm's ceilings divide by its terms of x.
backend::MatmulPrecision g_precision = backend::MatmulPrecision::kHighest;

// The attention FLOPs of one decode token at an average context of `ctx`: q . k and p . v over
// the keys each layer holds (a routed layer's only at the routed fraction of the steps, over the
// routed share of the context).
double DecodeTokenAttentionFlops(const Shape& s, double ctx, int routed_layers,
                                 double routed_frac) {
  const double q = static_cast<double>(s.n_heads * s.head_dim);
  return static_cast<double>(s.n_layers - routed_layers) * 4 * q * ctx +
         static_cast<double>(routed_layers) * routed_frac * 4 * q * ctx * routed_frac;
}

// FLOPs of one decode token at an average context of `ctx`: every layer's matrices and attention
// for a dense model; for MoD, the routed layers at the measured routed fraction (their attention
// over the routed share of the context), and the LM head.
double DecodeTokenFlops(const Shape& s, double ctx, int routed_layers, double routed_frac) {
  const double d = static_cast<double>(s.d_model);
  const double matrices = 2 * LayerMatrixMacs(s);
  return static_cast<double>(s.n_layers - routed_layers) * matrices +
         static_cast<double>(routed_layers) * routed_frac * matrices +
         2 * d * static_cast<double>(s.vocab_size) +
         DecodeTokenAttentionFlops(s, ctx, routed_layers, routed_frac);
}

// The Gemm probe of each shape this run measured (MeasureLayerGemms), by shape name.
std::map<std::string, double> g_gemm_probe_gflops;

// "X GFLOP/s (Y% of the probe)" for a dense prefill at `tps` tokens/s.
std::string PrefillGflops(const Shape& s, int tokens, double tps) {
  const double gflops = DensePrefillFlops(s, tokens) / (tokens / tps) / 1e9;
  if (g_fma_peak_gflops <= 0) return absl::StrFormat("%.1f GFLOP/s", gflops);
  std::string text = absl::StrFormat("%.1f GFLOP/s", gflops);
  if (auto it = g_gemm_probe_gflops.find(s.name); it != g_gemm_probe_gflops.end()) {
    absl::StrAppendFormat(&text, ", %.0f%% of the Gemm probe", 100 * gflops / it->second);
  }
  absl::StrAppendFormat(&text, ", %.0f%% of the FMA probe", 100 * gflops / g_fma_peak_gflops);
  if (g_dpbf16_peak_gflops > 0) {
    absl::StrAppendFormat(&text, ", %.0f%% of the vdpbf16ps probe",
                          100 * gflops / g_dpbf16_peak_gflops);
  }
  if (g_amx_peak_gflops > 0) {
    const int terms = backend::Bf16TermsOf(g_precision);
    absl::StrAppendFormat(&text, ", %.0f%% of 1/%d of the AMX probe",
                          100 * terms * gflops / g_amx_peak_gflops, terms);
  }
  return text;
}

// MoD: every other layer routed (1, 3, 5, ...).
std::vector<int> RoutedLayers(const Shape& s) {
  std::vector<int> layers;
  for (int l = 1; l < s.n_layers; l += 2) layers.push_back(l);
  return layers;
}

// Router bias b with P(N(0, 1) + b > 0) = 12.5%: the router input is RMSNorm_in(x) (unit RMS, norm
// weight 1) and the router weight ~ N(0, 1 / d_model), so w . u ~ N(0, 1).
constexpr float kRouterBias = -1.15f;

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  enum Fill { kRandom, kOnes, kRouterWeight, kRouterBias } fill;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t bytes() const { return numel() * static_cast<int64_t>(modserve::DTypeBytes(dtype)); }
};

// Tensors in file order: the large BF16 matrices first, then the norms and F32 routers, with the
// 4-byte router biases last, so every matrix starts 64-byte aligned in the mapped file.
std::vector<TensorSpec> TensorsOf(const Shape& s, bool mod) {
  const int64_t d = s.d_model, hd = s.head_dim;
  std::vector<TensorSpec> t;
  t.push_back({"model.embed_tokens.weight", DType::kBF16, {s.vocab_size, d}, TensorSpec::kRandom});
  for (int64_t l = 0; l < s.n_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    t.push_back(
        {p + "self_attn.q_proj.weight", DType::kBF16, {s.n_heads * hd, d}, TensorSpec::kRandom});
    t.push_back(
        {p + "self_attn.k_proj.weight", DType::kBF16, {s.n_kv_heads * hd, d}, TensorSpec::kRandom});
    t.push_back(
        {p + "self_attn.v_proj.weight", DType::kBF16, {s.n_kv_heads * hd, d}, TensorSpec::kRandom});
    t.push_back(
        {p + "self_attn.o_proj.weight", DType::kBF16, {d, s.n_heads * hd}, TensorSpec::kRandom});
    t.push_back({p + "mlp.gate_proj.weight", DType::kBF16, {s.d_ff, d}, TensorSpec::kRandom});
    t.push_back({p + "mlp.up_proj.weight", DType::kBF16, {s.d_ff, d}, TensorSpec::kRandom});
    t.push_back({p + "mlp.down_proj.weight", DType::kBF16, {d, s.d_ff}, TensorSpec::kRandom});
  }
  t.push_back({"lm_head.weight", DType::kBF16, {s.vocab_size, d}, TensorSpec::kRandom});
  for (int64_t l = 0; l < s.n_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    t.push_back({p + "input_layernorm.weight", DType::kBF16, {d}, TensorSpec::kOnes});
    t.push_back({p + "post_attention_layernorm.weight", DType::kBF16, {d}, TensorSpec::kOnes});
  }
  t.push_back({"model.norm.weight", DType::kBF16, {d}, TensorSpec::kOnes});
  if (mod) {
    for (int l : RoutedLayers(s)) {
      t.push_back({absl::StrCat("model.layers.", l, ".router.weight"),
                   DType::kF32,
                   {1, d},
                   TensorSpec::kRouterWeight});
    }
    for (int l : RoutedLayers(s)) {
      t.push_back({absl::StrCat("model.layers.", l, ".router.bias"),
                   DType::kF32,
                   {1},
                   TensorSpec::kRouterBias});
    }
  }
  return t;
}

json ConfigJson(const Shape& s, bool mod) {
  json c = {
      {"model_type", "llama"},
      {"architectures", {mod ? "LlamaMoDForCausalLM" : "LlamaForCausalLM"}},
      {"hidden_size", s.d_model},
      {"intermediate_size", s.d_ff},
      {"num_hidden_layers", s.n_layers},
      {"num_attention_heads", s.n_heads},
      {"num_key_value_heads", s.n_kv_heads},
      {"head_dim", s.head_dim},
      {"rms_norm_eps", s.rms_norm_eps},
      {"rope_theta", s.rope_theta},
      {"vocab_size", s.vocab_size},
      {"max_position_embeddings", s.max_seq_len},
      {"tie_word_embeddings", false},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
      {"torch_dtype", "bfloat16"},
  };
  if (mod) {
    c["mod"] = {
        {"format_version", 1},
        {"routed_layers", RoutedLayers(s)},
        {"capacity", 0.125},
        {"router", {{"bias", true}, {"input", "input_layernorm"}}},
        {"weight_fn", "sigmoid"},
        {"scale_target", "update"},
        {"inference_routing", "router_threshold"},
        {"threshold", 0.5},
    };
  }
  return c;
}

// SplitMix64: a fast counter-based generator, so any chunk of a tensor can be filled on its own.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// N(0, 0.02) approximated by the sum of four 16-bit uniforms (Irwin-Hall, 4 terms), rounded to
// BF16 by truncation: statistically close enough for a throughput benchmark, and ~1 ns a value.
void FillRandomBf16(uint64_t seed, int64_t begin, int64_t end, uint16_t* out) {
  constexpr double kMean = 4 * 32767.5;
  const double kStd = std::sqrt(4 * (65536.0 * 65536.0 - 1) / 12.0);
  const float scale = static_cast<float>(0.02 / kStd);
  for (int64_t i = begin; i < end; ++i) {
    const uint64_t r = SplitMix64(seed ^ (static_cast<uint64_t>(i) * 0xd1342543de82ef95ULL));
    const uint32_t sum = static_cast<uint32_t>(r & 0xffff) +
                         static_cast<uint32_t>((r >> 16) & 0xffff) +
                         static_cast<uint32_t>((r >> 32) & 0xffff) + static_cast<uint32_t>(r >> 48);
    const float v = static_cast<float>(static_cast<double>(sum) - kMean) * scale;
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    out[i] = static_cast<uint16_t>(bits >> 16);
  }
}

std::string ShapeSignature(const Shape& s, bool mod) {
  return absl::StrCat("modserve-bench v1 ", ConfigJson(s, mod).dump());
}

// Writes config.json + model.safetensors under `dir` unless a complete copy of the same shape is
// already there (bench_signature.txt is written last, so a partial write is never reused).
absl::Status EnsureCheckpoint(const Shape& s, bool mod, const std::string& dir, int threads) {
  namespace fs = std::filesystem;
  const std::string sig_path = dir + "/bench_signature.txt";
  const std::string signature = ShapeSignature(s, mod);
  {
    std::ifstream in(sig_path);
    std::stringstream ss;
    ss << in.rdbuf();
    if (in && ss.str() == signature) return absl::OkStatus();
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  fs::remove(sig_path, ec);
  const auto t0 = Clock::now();

  const std::vector<TensorSpec> tensors = TensorsOf(s, mod);
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  int64_t offset = 0;
  for (const TensorSpec& t : tensors) {
    header[t.name] = {{"dtype", t.dtype == DType::kF32 ? "F32" : "BF16"},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes()}}};
    offset += t.bytes();
  }
  std::string text = header.dump();
  // Pad the header with spaces (valid JSON) so the data starts 64-byte aligned.
  while ((8 + text.size()) % 64 != 0) text.push_back(' ');

  const std::string st_path = dir + "/model.safetensors";
  std::FILE* f = std::fopen(st_path.c_str(), "wb");
  if (f == nullptr) return absl::InternalError(absl::StrCat("cannot write ", st_path));
  uint64_t header_len = text.size();  // little-endian on every target we build for
  bool ok = std::fwrite(&header_len, 8, 1, f) == 1 &&
            std::fwrite(text.data(), 1, text.size(), f) == text.size();
  std::vector<uint8_t> buf;
  std::mt19937_64 router_rng(mod ? 1234 : 0);
  for (size_t ti = 0; ok && ti < tensors.size(); ++ti) {
    const TensorSpec& t = tensors[ti];
    const int64_t n = t.numel();
    buf.resize(static_cast<size_t>(t.bytes()));
    switch (t.fill) {
      case TensorSpec::kRandom: {
        // Seeded by the tensor's name, so the dense and MoD files share every matrix.
        const uint64_t seed = SplitMix64(std::hash<std::string>{}(t.name));
        uint16_t* out = reinterpret_cast<uint16_t*>(buf.data());
        const int nt = std::max(1, threads);
        std::vector<std::thread> pool;
        for (int w = 0; w < nt; ++w) {
          pool.emplace_back([=] { FillRandomBf16(seed, n * w / nt, n * (w + 1) / nt, out); });
        }
        for (std::thread& th : pool) th.join();
        break;
      }
      case TensorSpec::kOnes: {
        const uint16_t one = modserve::F32ToBf16(1.0f).bits;
        uint16_t* out = reinterpret_cast<uint16_t*>(buf.data());
        std::fill(out, out + n, one);
        break;
      }
      case TensorSpec::kRouterWeight: {
        std::normal_distribution<float> dist(0.0f, 1.0f / std::sqrt(static_cast<float>(s.d_model)));
        float* out = reinterpret_cast<float*>(buf.data());
        for (int64_t i = 0; i < n; ++i) out[i] = dist(router_rng);
        break;
      }
      case TensorSpec::kRouterBias: {
        float* out = reinterpret_cast<float*>(buf.data());
        std::fill(out, out + n, kRouterBias);
        break;
      }
    }
    ok = std::fwrite(buf.data(), 1, buf.size(), f) == buf.size();
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) return absl::InternalError(absl::StrCat("short write to ", st_path));
  {
    std::ofstream cfg(dir + "/config.json");
    cfg << ConfigJson(s, mod).dump(2) << "\n";
    if (!cfg) return absl::InternalError(absl::StrCat("cannot write ", dir, "/config.json"));
  }
  std::ofstream sig(sig_path);
  sig << signature;
  if (!sig) return absl::InternalError(absl::StrCat("cannot write ", sig_path));
  std::printf("wrote %s (%.2f GB) in %.1f s\n", st_path.c_str(), offset / 1e9,
              Seconds(t0, Clock::now()));
  return absl::OkStatus();
}

// ---- machine read bandwidth ---------------------------------------------------------------------

#if defined(__x86_64__)
__attribute__((target("avx512f"))) uint64_t SumAvx512(const uint64_t* p, int64_t n) {
  __m512i a[8];
  for (__m512i& v : a) v = _mm512_set1_epi64(0);
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    for (int j = 0; j < 8; ++j) a[j] = _mm512_add_epi64(a[j], _mm512_load_si512(p + i + 8 * j));
  }
  __m512i s = a[0];
  for (int j = 1; j < 8; ++j) s = _mm512_add_epi64(s, a[j]);
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, s);
  uint64_t total = 0;
  for (uint64_t v : lanes) total += v;
  for (; i < n; ++i) total += p[i];
  return total;
}

__attribute__((target("avx2"))) uint64_t SumAvx2(const uint64_t* p, int64_t n) {
  __m256i a[4];
  for (__m256i& v : a) v = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 4; ++j) {
      a[j] = _mm256_add_epi64(a[j],
                              _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 4 * j)));
    }
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a[0], a[1]), _mm256_add_epi64(a[2], a[3])));
  uint64_t total = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (; i < n; ++i) total += p[i];
  return total;
}
#endif

#if defined(__x86_64__)
// The same sum as kStreams interleaved sequential streams (the range cut into kStreams equal
// parts, one 64-byte line of each in turn), optionally with a software prefetch 2 KiB ahead in
// each: more independent misses in flight than one stream and the hardware prefetcher keep,
// which is what a decode GEMV over several weight rows (or with prefetching) can reach.
template <int kStreams, bool kPrefetch>
__attribute__((target("avx2"))) uint64_t SumStreamsAvx2(const uint64_t* p, int64_t n) {
  const int64_t part = n / kStreams / 8 * 8;  // whole 64-byte lines per stream
  __m256i a[kStreams];
  for (__m256i& v : a) v = _mm256_setzero_si256();
  for (int64_t i = 0; i < part; i += 8) {
    for (int s = 0; s < kStreams; ++s) {
      const uint64_t* q = p + s * part + i;
      if constexpr (kPrefetch) __builtin_prefetch(q + 256, 0, 0);
      const __m256i lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(q));
      const __m256i hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(q + 4));
      a[s] = _mm256_add_epi64(a[s], _mm256_add_epi64(lo, hi));
    }
  }
  __m256i t = a[0];
  for (int s = 1; s < kStreams; ++s) t = _mm256_add_epi64(t, a[s]);
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), t);
  uint64_t total = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (int64_t i = kStreams * part; i < n; ++i) total += p[i];
  return total;
}
#endif

// The read-bandwidth probes: kind 0 is one plain sequential stream per thread (widest vectors
// the CPU has); kinds 1-3 (AVX2 CPUs) are 8 interleaved streams, 8 streams with prefetch, and
// one stream with prefetch.
constexpr int kNumProbeKinds = 4;
constexpr const char* kProbeKindNames[kNumProbeKinds] = {
    "1 stream", "8 streams", "8 streams + prefetch", "1 stream + prefetch"};

uint64_t Sum(const uint64_t* p, int64_t n);

uint64_t SumKind(int kind, const uint64_t* p, int64_t n) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) {
    switch (kind) {
      case 1:
        return SumStreamsAvx2<8, false>(p, n);
      case 2:
        return SumStreamsAvx2<8, true>(p, n);
      case 3:
        return SumStreamsAvx2<1, true>(p, n);
      default:
        break;
    }
  }
#endif
  return Sum(p, n);
}

uint64_t Sum(const uint64_t* p, int64_t n) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) return SumAvx512(p, n);
  if (__builtin_cpu_supports("avx2")) return SumAvx2(p, n);
#endif
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += p[i];
    s1 += p[i + 1];
    s2 += p[i + 2];
    s3 += p[i + 3];
  }
  for (; i < n; ++i) s0 += p[i];
  return s0 + s1 + s2 + s3;
}

// --threads, with 0 resolved to every core.
int BenchThreads() {
  const int threads = absl::GetFlag(FLAGS_threads);
  return threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
}

// One pass of probe `kind` over buf[0, words), one contiguous share per thread: GB/s.
double ProbePass(int kind, const uint64_t* buf, int64_t words, int threads) {
  std::vector<uint64_t> sums(threads);
  std::vector<std::thread> pool;
  const auto t0 = Clock::now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      const int64_t b = words * t / threads, e = words * (t + 1) / threads;
      sums[t] = SumKind(kind, buf + b, e - b);
    });
  }
  for (std::thread& th : pool) th.join();
  const double sec = Seconds(t0, Clock::now());
  uint64_t keep = 0;
  for (uint64_t v : sums) keep += v;
  if (keep == 42) std::printf(" ");  // keeps the sums alive
  return static_cast<double>(words) * 8 / sec / 1e9;
}

// A probe's buffer of `words` uint64, 2 MiB-aligned, madvise'd for 2 MiB pages or against them,
// written (one share per thread) so that every page is backed before a pass reads it.
using ProbeBuffer = std::unique_ptr<uint64_t, decltype(&std::free)>;
ProbeBuffer MakeProbeBuffer(int64_t words, bool huge_pages, int threads) {
  const int64_t bytes = words * 8;
  ProbeBuffer buf(static_cast<uint64_t*>(std::aligned_alloc(int64_t{2} << 20, bytes)), &std::free);
  MODSERVE_CHECK(buf != nullptr);
  ::madvise(buf.get(), bytes, huge_pages ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([p = buf.get(), words, threads, t] {
      for (int64_t i = words * t / threads; i < words * (t + 1) / threads; ++i) {
        p[i] = static_cast<uint64_t>(i);
      }
    });
  }
  for (std::thread& th : pool) th.join();
  return buf;
}

// Multi-threaded sum over a 2 GiB buffer (far beyond the caches), best of 7 passes of each
// probe kind (the strongest kind is the result; kinds_out gets every kind's GB/s), one
// contiguous share per thread. huge_pages: the buffer is madvise'd for 2 MiB transparent huge
// pages. On this kind of VM (nested paging) 4 KiB pages cost about a third of the bandwidth in
// TLB walks, so the two numbers differ a lot; the weights' file mapping gets 2 MiB pages when
// the checkpoint was read into the page cache by faults (see EvictFromPageCache).
double MeasureReadBandwidth(int threads, bool huge_pages, std::string* kinds_out = nullptr) {
  const int64_t words = (int64_t{2} << 30) / 8;
  const ProbeBuffer owned = MakeProbeBuffer(words, huge_pages, threads);
  const uint64_t* buf = owned.get();
  double best[kNumProbeKinds] = {};
  // The kinds take turns within each repetition, so a load spike hits them alike.
  for (int rep = 0; rep < 7; ++rep) {
    for (int kind = 0; kind < kNumProbeKinds; ++kind) {
      best[kind] = std::max(best[kind], ProbePass(kind, buf, words, threads));
    }
  }
  if (kinds_out != nullptr) {
    std::string line;
    for (int kind = 0; kind < kNumProbeKinds; ++kind) {
      absl::StrAppendFormat(&line, "%s%s %.2f", kind == 0 ? "" : ", ", kProbeKindNames[kind],
                            best[kind]);
    }
    *kinds_out = line;
  }
  return *std::max_element(best, best + kNumProbeKinds);
}

// Device copy bandwidth of a non-CPU backend through the Backend interface itself: a 2 GiB
// buffer viewed as 16 pages of 128 MiB, the first 8 copied onto the last 8 (CopyKvPages, one
// device-to-device copy each), 5 rounds per timing, best of 7. Counts bytes read plus bytes
// written, as STREAM's copy does; a decode step mostly reads, so its GB/s is set beside this.
absl::StatusOr<double> MeasureDeviceCopyBandwidth(backend::Backend& be) {
  constexpr int64_t kPages = 16, kPageFloats = int64_t{32} << 20;  // 128 MiB of f32 per page
  MODSERVE_ASSIGN_OR_RETURN(backend::DeviceBuffer buf,
                            be.Allocate(static_cast<size_t>(kPages * kPageFloats * 4)));
  // [pages, 2 * kv_heads, block_size, head_dim] as CopyKvPages takes it: 2 x 16 x 1 Mi floats.
  const TensorView pool = buf.View(DType::kF32, {kPages, 2, 16, kPageFloats / 32});
  std::vector<std::pair<int32_t, int32_t>> copies;
  for (int32_t p = 0; p < kPages / 2; ++p) copies.emplace_back(p, p + kPages / 2);
  be.CopyKvPages(pool, copies);  // warm-up (first touch of the pages)
  MODSERVE_RETURN_IF_ERROR(be.Synchronize());
  constexpr int kRounds = 5;
  double best = 0;
  for (int rep = 0; rep < 7; ++rep) {
    const auto t0 = Clock::now();
    for (int r = 0; r < kRounds; ++r) be.CopyKvPages(pool, copies);
    MODSERVE_RETURN_IF_ERROR(be.Synchronize());
    const double sec = Seconds(t0, Clock::now());
    best = std::max(best, 2.0 * kRounds * (kPages / 2) * kPageFloats * 4 / sec / 1e9);
  }
  return best;
}

// Drops the checkpoint file from the page cache (fdatasync first, so the pages are clean), so
// the engine's first touches read it back the way a real checkpoint load from disk does:
// readahead fills large folios, which the kernel maps with 2 MiB pages. A file still cached from
// the bench's own fwrite() is mostly in small folios and runs ~25% slower on this VM.
void EvictFromPageCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  (void)::fdatasync(fd);
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// ---- engine measurements ----------------------------------------------------------------------

// Bytes a decode step reads, by part of the model (weights of one layer include its norms).
struct ModelBytes {
  int64_t dense_layer = 0;    // attention + MLP matrices and both norms of one layer
  int64_t router = 0;         // router weight + bias (read for every row of a routed layer)
  int64_t lm_head = 0;        // lm_head + final norm
  int64_t embed_row = 0;      // one row of embed_tokens
  int64_t total_weights = 0;  // whole checkpoint
};

ModelBytes BytesOf(const Shape& s, bool mod) {
  ModelBytes b;
  for (const TensorSpec& t : TensorsOf(s, mod)) {
    b.total_weights += t.bytes();
    if (t.name == "model.layers.0.router.weight" || t.name == "model.layers.1.router.weight") {
      b.router += t.bytes() + 4;
    }
    if (t.name.rfind("model.layers.0.", 0) == 0) b.dense_layer += t.bytes();
  }
  b.lm_head = s.vocab_size * s.d_model * 2 + s.d_model * 2;
  b.embed_row = s.d_model * 2;
  return b;
}

struct DecodeRun {
  int batch = 0, context = 0, steps = 0;
  double seconds = 0;             // timed steps only
  double weight_bytes = 0;        // over the timed steps
  double kv_bytes = 0;            // KV entries attended over the timed steps (all layers)
  int64_t routed_rows = 0;        // rows that entered a routed layer (summed over layers, steps)
  int64_t routed_candidates = 0;  // rows offered to routed layers
  int64_t layer_skips = 0;        // routed layers no row entered
  int64_t routed_layer_steps = 0;
  // KV held at the end (all sequences): exact entries, pages, and what a dense model would hold.
  int64_t kv_entry_bytes = 0, kv_entry_bytes_dense = 0, kv_page_bytes = 0, kv_page_bytes_dense = 0;
  // Ideal MoD/dense KV ratio from the measured per-layer routed fractions of the fed tokens.
  double kv_ideal_ratio = 1.0;
  // Per routed layer (config order): fraction of all fed tokens routed in.
  std::vector<double> layer_fractions;
  // For the per-layer bound (PerLayerBoundSeconds): whether each layer is routed, the rows each
  // routed layer ran in each timed step (config order), the KV bytes each layer attended over
  // the timed steps, and the bytes of one KV entry of one layer.
  std::vector<bool> layer_routed;
  std::vector<std::vector<int32_t>> step_routed_rows;
  std::vector<double> layer_kv_bytes;
  int64_t kv_entry_bytes_per_layer = 0;
  // Each timed step's seconds and weight bytes, in order.
  std::vector<double> step_seconds, step_weight_bytes;

  double tokens_per_s() const { return batch * steps / seconds; }
  double gb_per_s() const { return (weight_bytes + kv_bytes) / seconds / 1e9; }
  double routed_fraction() const {
    return routed_candidates == 0 ? 1.0 : static_cast<double>(routed_rows) / routed_candidates;
  }
  double skip_fraction() const {
    return routed_layer_steps == 0 ? 0.0 : static_cast<double>(layer_skips) / routed_layer_steps;
  }
};

std::vector<engine::TokenId> RandomPrompt(int64_t len, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> dist(3, static_cast<int32_t>(vocab - 1));
  std::vector<engine::TokenId> p(static_cast<size_t>(len));
  p[0] = 1;  // BOS
  for (size_t i = 1; i < p.size(); ++i) p[i] = dist(rng);
  return p;
}

engine::Request MakeRequest(std::vector<engine::TokenId> prompt, int32_t max_new_tokens) {
  engine::Request r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  r.sampling.seed = 1234;
  r.sampling.ignore_eos = true;
  r.sampling.max_new_tokens = max_new_tokens;
  return r;
}

// Feeds the whole prompt of each of `ids` (`prompt_len` tokens each, none fed yet), chunked into
// steps of at most max_batch_tokens rows.
absl::Status Prefill(engine::Engine& e, const std::vector<engine::SequenceId>& ids,
                     int32_t prompt_len) {
  std::vector<int32_t> left(ids.size(), prompt_len);
  for (;;) {
    std::vector<engine::StepEntry> entries;
    std::vector<size_t> which;
    int32_t budget = e.options().max_batch_tokens;
    for (size_t i = 0; i < ids.size() && budget > 0; ++i) {
      if (left[i] == 0) continue;
      const int32_t n = std::min(left[i], budget);
      entries.push_back({ids[i], n});
      which.push_back(i);
      budget -= n;
    }
    if (entries.empty()) return absl::OkStatus();
    MODSERVE_ASSIGN_OR_RETURN(engine::StepResult r, e.Step(entries));
    for (size_t j = 0; j < which.size(); ++j) left[which[j]] -= r.sequences[j].num_fed;
  }
}

// before_step, when set, runs before each timed step, outside its time, followed by one untimed
// step (the first step after a pause wakes the pool's workers and refills the caches with what
// a step reuses; back-to-back steps do not pay that). The KV bytes are then those of all the
// steps run, scaled to the timed ones.
absl::StatusOr<DecodeRun> MeasureDecode(engine::Engine& e, const Shape& s, const ModelBytes& mb,
                                        int batch, int context, int steps,
                                        const std::function<void()>& before_step = nullptr) {
  const int steps_run = before_step == nullptr ? steps : 2 * steps;
  const engine::ModelConfig& cfg = e.config();
  std::vector<engine::SequenceId> ids;
  for (int b = 0; b < batch; ++b) {
    MODSERVE_ASSIGN_OR_RETURN(
        engine::SequenceId id,
        e.Add(MakeRequest(RandomPrompt(context, s.vocab_size, 1000 + b), steps_run + 4)));
    ids.push_back(id);
  }
  MODSERVE_RETURN_IF_ERROR(Prefill(e, ids, context));
  std::vector<engine::StepEntry> entries;
  for (engine::SequenceId id : ids) entries.push_back({id, 1});
  MODSERVE_RETURN_IF_ERROR(e.Step(entries).status());  // warm-up (untimed)

  std::vector<engine::StepResult> results;
  results.reserve(steps);
  DecodeRun run;
  if (before_step == nullptr) {
    const auto t0 = Clock::now();
    for (int i = 0; i < steps; ++i) {
      MODSERVE_ASSIGN_OR_RETURN(engine::StepResult r, e.Step(entries));
      results.push_back(std::move(r));
    }
    run.seconds = Seconds(t0, Clock::now());
  } else {
    for (int i = 0; i < steps; ++i) {
      before_step();
      MODSERVE_RETURN_IF_ERROR(e.Step(entries).status());
      const auto t0 = Clock::now();
      MODSERVE_ASSIGN_OR_RETURN(engine::StepResult r, e.Step(entries));
      run.step_seconds.push_back(Seconds(t0, Clock::now()));
      results.push_back(std::move(r));
    }
    run.seconds = std::accumulate(run.step_seconds.begin(), run.step_seconds.end(), 0.0);
  }
  run.batch = batch;
  run.context = context;
  run.steps = steps;

  const int64_t L = cfg.n_layers;
  const int64_t num_routed = cfg.mod ? static_cast<int64_t>(cfg.mod->routed_layers.size()) : 0;
  const int64_t bptl = e.kv_bytes_per_token_layer();
  for (int64_t l = 0; l < L; ++l) run.layer_routed.push_back(cfg.IsRouted(static_cast<int>(l)));
  run.layer_kv_bytes.assign(L, 0.0);
  run.kv_entry_bytes_per_layer = bptl;
  for (const engine::StepResult& r : results) {
    run.step_routed_rows.push_back(r.routed_rows);
    double bytes = static_cast<double>(mb.lm_head) + static_cast<double>(batch) * mb.embed_row;
    bytes += static_cast<double>(L - num_routed) * mb.dense_layer;
    for (int32_t rows : r.routed_rows) {
      bytes += mb.router;
      if (rows > 0) bytes += mb.dense_layer;
      run.routed_rows += rows;
      run.routed_candidates += r.num_tokens;
    }
    run.layer_skips += r.num_layer_skips;
    run.routed_layer_steps += num_routed;
    run.weight_bytes += bytes;
    run.step_weight_bytes.push_back(bytes);
  }

  // KV attended by the rows run (positions context + 1 .. context + steps_run), reconstructed from
  // the routing decisions: a dense layer's row at position p reads p + 1 entries; a routed layer's
  // row reads only when it was routed in, the entries stored so far (itself included).
  std::vector<int64_t> layer_tokens(L, 0), layer_fed(L, 0);
  for (engine::SequenceId id : ids) {
    MODSERVE_ASSIGN_OR_RETURN(engine::GenerationResult g, e.Result(id));
    const int64_t first = context + 1, last = context + steps_run;  // inclusive
    int64_t fed = 0;
    for (int64_t l = 0, k = 0; l < L; ++l) {
      if (!cfg.IsRouted(static_cast<int>(l))) {
        for (int64_t p = first; p <= last; ++p) {
          run.layer_kv_bytes[l] += static_cast<double>((p + 1) * bptl);
        }
        continue;
      }
      const std::vector<uint8_t>& dec = g.routing[k++];
      fed = static_cast<int64_t>(dec.size());
      int64_t stored = 0;
      for (int64_t p = 0; p < fed; ++p) {
        stored += dec[p];
        if (p >= first && p <= last && dec[p]) {
          run.layer_kv_bytes[l] += static_cast<double>(stored * bptl);
        }
      }
      layer_tokens[l] += stored;
      layer_fed[l] += fed;
    }
    run.kv_entry_bytes += g.kv_bytes;
    run.kv_entry_bytes_dense += g.kv_bytes_dense;
    run.kv_page_bytes += g.kv_pages * e.kv_stats().bytes_per_page;
    const int64_t tokens = g.prompt_tokens + static_cast<int64_t>(g.token_ids.size()) - 1;
    const int64_t bs = e.options().block_size;
    run.kv_page_bytes_dense += L * ((tokens + bs - 1) / bs) * e.kv_stats().bytes_per_page;
  }
  if (steps_run != steps) {
    for (double& b : run.layer_kv_bytes) b *= static_cast<double>(steps) / steps_run;
  }
  run.kv_bytes = std::accumulate(run.layer_kv_bytes.begin(), run.layer_kv_bytes.end(), 0.0);
  // Ideal ratio: (dense layers + sum over routed layers of their measured fraction) / n_layers.
  double ideal = 0;
  for (int64_t l = 0; l < L; ++l) {
    ideal += cfg.IsRouted(static_cast<int>(l))
                 ? static_cast<double>(layer_tokens[l]) / std::max<int64_t>(1, layer_fed[l])
                 : 1.0;
  }
  run.kv_ideal_ratio = ideal / static_cast<double>(L);
  for (int64_t l = 0; l < L; ++l) {
    if (cfg.IsRouted(static_cast<int>(l))) {
      run.layer_fractions.push_back(static_cast<double>(layer_tokens[l]) /
                                    std::max<int64_t>(1, layer_fed[l]));
    }
  }
  for (engine::SequenceId id : ids) MODSERVE_RETURN_IF_ERROR(e.Release(id));
  return run;
}

// One prompt of `tokens`, fed in chunks of max_batch_tokens; best of `reps` fresh sequences.
absl::StatusOr<double> MeasurePrefill(engine::Engine& e, const Shape& s, int tokens, int reps) {
  double best = 0;
  for (int rep = 0; rep < reps; ++rep) {
    MODSERVE_ASSIGN_OR_RETURN(engine::SequenceId id,
                              e.Add(MakeRequest(RandomPrompt(tokens, s.vocab_size, 77 + rep), 1)));
    const auto t0 = Clock::now();
    MODSERVE_RETURN_IF_ERROR(Prefill(e, {id}, tokens));
    best = std::max(best, tokens / Seconds(t0, Clock::now()));
    MODSERVE_RETURN_IF_ERROR(e.Release(id));
  }
  return best;
}

struct ModelResult {
  bool mod = false;
  double prefill_tps = 0;
  std::map<std::pair<int, int>, DecodeRun> decode;  // (context, batch) -> run
};

absl::StatusOr<engine::DeviceRouting> ParseDeviceRouting(absl::string_view v) {
  if (v == "auto") return engine::DeviceRouting::kAuto;
  if (v == "on") return engine::DeviceRouting::kOn;
  if (v == "off") return engine::DeviceRouting::kOff;
  return absl::InvalidArgumentError(absl::StrCat("'", v, "' is not auto, on or off"));
}

absl::StatusOr<std::unique_ptr<engine::Engine>> CreateEngine(const Shape& s, const std::string& dir,
                                                             const std::vector<int>& batches,
                                                             const std::vector<int>& contexts,
                                                             int steps, DType kv_dtype) {
  // --paired_steps runs an untimed step before each timed one.
  steps = std::max(steps, 2 * absl::GetFlag(FLAGS_paired_steps));
  engine::EngineOptions opt;
  opt.model_dir = dir;
  opt.backend = absl::GetFlag(FLAGS_backend);
  opt.num_threads = absl::GetFlag(FLAGS_threads);
  // Both flags were checked before any run.
  opt.device_routing = *ParseDeviceRouting(absl::GetFlag(FLAGS_device_routing));
  opt.graphs = *ParseDeviceRouting(absl::GetFlag(FLAGS_graphs));
  opt.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  opt.max_seqs = batches.back();
  opt.kv_dtype = kv_dtype;
  opt.matmul_precision = g_precision;
  opt.block_size = absl::GetFlag(FLAGS_kv_block_size);
  const int max_ctx = std::max(contexts.back(), absl::GetFlag(FLAGS_prefill_tokens));
  // Every sequence of the largest batch at the longest context, plus one step's reservation.
  const int64_t page_bytes = 2 * s.n_kv_heads * opt.block_size * s.head_dim *
                             static_cast<int64_t>(modserve::DTypeBytes(kv_dtype));
  const int64_t pages_per_seq = s.n_layers * ((max_ctx + steps + 8) / opt.block_size + 2);
  const int64_t step_pages = s.n_layers * (opt.max_batch_tokens / opt.block_size + opt.max_seqs);
  opt.kv_cache_bytes = (opt.max_seqs * pages_per_seq + step_pages) * page_bytes;
  return engine::Engine::Create(opt);
}

// The matmul peak that a prefill of `tokens` rows can reach on this backend: its own Gemm groups of
// one layer of `s` as the Transformer calls them (q/k/v and gate/up fused, o and down alone), on
// `tokens` rows of random x, BF16 weights as the synthetic checkpoints hold them, the run's threads
// and matmul precision. Two copies of the layer alternate, so the weights come from memory as
// they do layer after layer. GFLOP/s of the best of 5 layer passes after one warm-up pass.
absl::StatusOr<double> MeasureLayerGemms(const Shape& s, int64_t tokens, int threads) {
  backend::BackendOptions opt;
  opt.num_threads = threads;
  opt.matmul_precision = g_precision;
  MODSERVE_ASSIGN_OR_RETURN(std::unique_ptr<backend::Backend> be,
                            backend::CreateBackend("cpu", opt));
  const int64_t d = s.d_model, q = s.n_heads * s.head_dim, kv = s.n_kv_heads * s.head_dim,
                ff = s.d_ff;
  // Each copy: q, k, v, o, gate, up, down.
  const std::vector<std::pair<int64_t, int64_t>> mats = {{q, d},  {kv, d}, {kv, d}, {d, q},
                                                         {ff, d}, {ff, d}, {d, ff}};
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<std::vector<std::vector<bf16_t>>> w(2);
  for (auto& copy : w) {
    for (auto [m, k] : mats) {
      copy.emplace_back(m * k);
      for (bf16_t& v : copy.back()) v = F32ToBf16(dist(rng));
    }
  }
  std::normal_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> x(tokens * std::max(d, std::max(q, ff)));
  for (float& v : x) v = unit(rng);
  std::vector<float> out_q(tokens * q), out_k(tokens * kv), out_v(tokens * kv), out_d(tokens * d),
      out_g(tokens * ff), out_u(tokens * ff);
  auto view = [](auto& vec, DType t, int64_t rows, int64_t cols) {
    return TensorView(vec.data(), t, {rows, cols});
  };
  auto layer = [&](int c) {
    auto& m = w[c];
    const TensorView xd = view(x, DType::kF32, tokens, d);
    const backend::GemmOperand qkv[] = {
        {view(m[0], DType::kBF16, q, d), TensorView(), view(out_q, DType::kF32, tokens, q)},
        {view(m[1], DType::kBF16, kv, d), TensorView(), view(out_k, DType::kF32, tokens, kv)},
        {view(m[2], DType::kBF16, kv, d), TensorView(), view(out_v, DType::kF32, tokens, kv)}};
    be->GemmGroup(xd, qkv);
    be->Gemm(view(x, DType::kF32, tokens, q), view(m[3], DType::kBF16, d, q), TensorView(),
             view(out_d, DType::kF32, tokens, d));
    const backend::GemmOperand gate_up[] = {
        {view(m[4], DType::kBF16, ff, d), TensorView(), view(out_g, DType::kF32, tokens, ff)},
        {view(m[5], DType::kBF16, ff, d), TensorView(), view(out_u, DType::kF32, tokens, ff)}};
    be->GemmGroup(xd, gate_up);
    be->Gemm(view(x, DType::kF32, tokens, ff), view(m[6], DType::kBF16, d, ff), TensorView(),
             view(out_d, DType::kF32, tokens, d));
  };
  layer(0);
  layer(1);
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    layer(rep % 2);
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  return 2.0 * static_cast<double>(tokens) * LayerMatrixMacs(s) / best / 1e9;
}

absl::Status PrintPairedSteps(engine::Engine& e, const Shape& s, const ModelBytes& mb,
                              const std::string& label, const std::vector<int>& batches,
                              const std::vector<int>& contexts, int pairs);

// Runs every (context, batch) on each variant in turn, the variants interleaved per point so a
// slow drift of the machine's load hits dense and MoD alike.
absl::StatusOr<std::vector<ModelResult>> RunShape(const Shape& s, const std::vector<bool>& variants,
                                                  const std::vector<int>& batches,
                                                  const std::vector<int>& contexts, int steps,
                                                  DType kv_dtype, int threads) {
  std::vector<std::unique_ptr<engine::Engine>> engines;
  std::vector<ModelResult> results;
  for (bool mod : variants) {
    const std::string dir =
        absl::StrCat(absl::GetFlag(FLAGS_workdir), "/", s.name, mod ? "-mod" : "-dense");
    MODSERVE_RETURN_IF_ERROR(EnsureCheckpoint(s, mod, dir, threads));
    EvictFromPageCache(dir + "/model.safetensors");
    MODSERVE_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> e,
                              CreateEngine(s, dir, batches, contexts, steps, kv_dtype));
    engines.push_back(std::move(e));
    results.emplace_back();
    results.back().mod = mod;
  }
  for (int ctx : contexts) {
    for (int b : batches) {
      for (size_t v = 0; v < variants.size(); ++v) {
        const bool mod = variants[v];
        MODSERVE_ASSIGN_OR_RETURN(DecodeRun run,
                                  MeasureDecode(*engines[v], s, BytesOf(s, mod), b, ctx, steps));
        std::printf("  [%s %-5s] ctx %5d batch %3d: %8.2f tok/s  %6.1f GB/s  routed %.3f\n",
                    s.name.c_str(), mod ? "mod" : "dense", ctx, b, run.tokens_per_s(),
                    run.gb_per_s(), run.routed_fraction());
        std::fflush(stdout);
        results[v].decode[{ctx, b}] = run;
      }
    }
  }
  if (const int pairs = absl::GetFlag(FLAGS_paired_steps); pairs > 0) {
    for (size_t v = 0; v < variants.size(); ++v) {
      MODSERVE_RETURN_IF_ERROR(PrintPairedSteps(*engines[v], s, BytesOf(s, variants[v]),
                                                s.name + (variants[v] ? " MoD" : " dense"), batches,
                                                contexts, pairs));
    }
  }
  if (absl::GetFlag(FLAGS_backend) == "cpu" && absl::GetFlag(FLAGS_prefill_reps) > 0) {
    MODSERVE_ASSIGN_OR_RETURN(const double gemm,
                              MeasureLayerGemms(s, absl::GetFlag(FLAGS_prefill_tokens), threads));
    g_gemm_probe_gflops[s.name] = gemm;
    std::printf(
        "  [%s] Gemm probe (the backend's Gemm groups of one layer, %d rows, BF16, best of "
        "5): %.1f GFLOP/s\n",
        s.name.c_str(), absl::GetFlag(FLAGS_prefill_tokens), gemm);
  }
  for (size_t v = 0; v < variants.size(); ++v) {
    MODSERVE_ASSIGN_OR_RETURN(results[v].prefill_tps,
                              MeasurePrefill(*engines[v], s, absl::GetFlag(FLAGS_prefill_tokens),
                                             absl::GetFlag(FLAGS_prefill_reps)));
    std::printf("  [%s %-5s] prefill %d tokens: %.1f tok/s\n", s.name.c_str(),
                variants[v] ? "mod" : "dense", absl::GetFlag(FLAGS_prefill_tokens),
                results[v].prefill_tps);
  }
  return results;
}

// ---- reporting --------------------------------------------------------------------------------

// The compute ceiling of a BF16 Gemm of `rows` x rows, as the roofline takes it: the AMX tile
// probe over the bf16 terms of x above the AMX table's crossover, the vdpbf16ps probe where
// medium moves such Gemms onto vdpbf16ps, the f32 FMA probe otherwise (GFLOP/s; 0 if unmeasured).
double GemmPeakGflops(int64_t rows) {
  if (g_amx_peak_gflops > 0 &&
      rows > backend::cpu::KernelsFor(backend::cpu::Isa::kAmx).SmallNMax(DType::kBF16)) {
    return g_amx_peak_gflops / backend::Bf16TermsOf(g_precision);
  }
  if (g_dpbf16_peak_gflops > 0 && rows > backend::cpu::kDpBf16SmallNMax) {
    return g_dpbf16_peak_gflops;
  }
  return g_fma_peak_gflops;
}

// The per-layer bound of a decode run, in seconds over its timed steps. A layer's Gemms cannot
// start before the previous layer's output, nor its attention before its own q, k and v, so the
// run takes at least the sum of each phase's own bound:
// - each layer's Gemms in each step: its weight bytes over the read bandwidth, or their FLOPs at
//   the rows that ran it that step over the Gemm ceiling of that many rows (GemmPeakGflops),
//   whichever is longer; a routed layer that no row entered reads only its router;
// - each layer's attention over the run: the KV bytes it attended over the bandwidth, or their
//   FLOPs (4 per query head, head dim and key) over the FMA probe;
// - the LM head (and the embedding rows) in each step, as one more Gemm of `batch` rows.
// For a dense model this is the two-phase bound with the LM head as a phase of its own. A MoD
// step mixes layers bound by different things (at batch 16, dense layers by their FLOPs and
// routed layers of a row or two by their bytes), which no bound over the whole step sees.
double PerLayerBoundSeconds(const Shape& s, const ModelBytes& mb, const DecodeRun& r, double bw) {
  const double bytes_per_s = bw * 1e9;
  const double layer_flops_per_row = 2 * LayerMatrixMacs(s);
  auto gemm = [&](double bytes, double flops, int64_t rows) {
    const double peak = GemmPeakGflops(rows);
    return std::max(bytes / bytes_per_s, peak > 0 ? flops / (peak * 1e9) : 0.0);
  };
  double seconds = 0;
  for (const std::vector<int32_t>& routed : r.step_routed_rows) {
    size_t k = 0;
    for (bool is_routed : r.layer_routed) {
      const int64_t rows = is_routed ? routed[k++] : r.batch;
      seconds += rows == 0 ? (mb.router / bytes_per_s)
                           : gemm(static_cast<double>(mb.dense_layer + (is_routed ? mb.router : 0)),
                                  layer_flops_per_row * static_cast<double>(rows), rows);
    }
    seconds += gemm(static_cast<double>(mb.lm_head + r.batch * mb.embed_row),
                    2.0 * static_cast<double>(s.d_model * s.vocab_size * r.batch), r.batch);
  }
  const double flops_per_entry_byte = 4.0 * static_cast<double>(s.n_heads * s.head_dim) /
                                      static_cast<double>(r.kv_entry_bytes_per_layer);
  for (double kv : r.layer_kv_bytes) {
    seconds += std::max(
        kv / bytes_per_s,
        g_fma_peak_gflops > 0 ? kv * flops_per_entry_byte / (g_fma_peak_gflops * 1e9) : 0.0);
  }
  return seconds;
}

double PerLayerBoundTps(const Shape& s, const ModelBytes& mb, const DecodeRun& r, double bw) {
  return r.batch * r.steps / PerLayerBoundSeconds(s, mb, r, bw);
}

// One line of the summary table: one shape at one context.
struct SummaryRow {
  std::string shape;
  int context = 0;
  double dense_bw_fraction_b1 = 0;    // dense, smallest batch: achieved GB/s / read bandwidth
  double mod_bw_fraction_b1 = 0;      // the same for MoD
  double speedup_b1 = 0;              // MoD / dense tok/s at the smallest batch
  double ideal_speedup_b1 = 0;        // dense / MoD bytes read per step
  double kv_ratio = 0, kv_ideal = 0;  // MoD/dense KV entries per token at the largest batch
};

void PrintShape(const Shape& s, const std::vector<ModelResult>& models, double bw,
                const std::vector<int>& batches, const std::vector<int>& contexts,
                std::vector<SummaryRow>* summary) {
  const ModelBytes dense_b = BytesOf(s, false), mod_b = BytesOf(s, true);
  const std::vector<int> mod_layers = RoutedLayers(s);
  std::printf(
      "\n### %s: d_model %lld, %lld layers, %lld heads / %lld KV heads, d_ff %lld, "
      "vocab %lld; %.2f GB of BF16 weights\n\n",
      s.name.c_str(), static_cast<long long>(s.d_model), static_cast<long long>(s.n_layers),
      static_cast<long long>(s.n_heads), static_cast<long long>(s.n_kv_heads),
      static_cast<long long>(s.d_ff), static_cast<long long>(s.vocab_size),
      dense_b.total_weights / 1e9);
  // Roofline: the lower of the bandwidth bound (batch sequences per step time at the measured
  // read bandwidth) and the compute bound (the matmul-peak probe over the FLOPs per token; a
  // third of the AMX tile probe where the batch's Gemms run on the tiles).
  // Two-phase bound: a step's Gemms and its attention take turns (a layer's attention needs its
  // q, k and v; its output projection needs attention's output), so its time is at least the
  // Gemms' own bound (weight bytes over the bandwidth, or their FLOPs over the probe) plus
  // attention's (KV bytes over the bandwidth, or its FLOPs over the FMA probe). The roofline
  // takes the larger of the step's two sums as if the phases overlapped; this one does not. (Per
  // layer the bound is tighter still where layers differ, as a MoD step's dense and routed
  // layers do.)
  std::printf(
      "| model | ctx | batch | tok/s | ms/step | MB read/step | GB/s | %% of read bw "
      "| routed frac | skipped frac | roofline tok/s (bw / compute bound) | %% of roofline "
      "| two-phase bound tok/s | %% of it | per-layer bound tok/s | %% of it |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int ctx : contexts) {
    for (const ModelResult& m : models) {
      for (int b : batches) {
        const DecodeRun& r = m.decode.at({ctx, b});
        const double per_step = (r.weight_bytes + r.kv_bytes) / r.steps;
        const double bw_bound = b / (per_step / (bw * 1e9));
        const double flops = DecodeTokenFlops(s, ctx + r.steps / 2.0,
                                              m.mod ? static_cast<int>(mod_layers.size()) : 0,
                                              m.mod ? r.routed_fraction() : 1.0);
        // A batch above the AMX table's crossover runs its BF16 Gemms on the tiles: there the
        // compute bound is the tile probe over the bf16 terms of x (three per f32-accurate
        // product at --matmul_precision highest); likewise the vdpbf16ps probe where medium
        // moves them onto vdpbf16ps (GemmPeakGflops).
        const double peak = GemmPeakGflops(b);
        const double compute_bound = peak > 0 ? peak * 1e9 / flops : bw_bound;
        const double roofline = std::min(bw_bound, compute_bound);
        const double attn_flops = DecodeTokenAttentionFlops(
            s, ctx + r.steps / 2.0, m.mod ? static_cast<int>(mod_layers.size()) : 0,
            m.mod ? r.routed_fraction() : 1.0);
        const double gemm_s = std::max(r.weight_bytes / r.steps / (bw * 1e9),
                                       peak > 0 ? b * (flops - attn_flops) / (peak * 1e9) : 0.0);
        const double attn_s =
            std::max(r.kv_bytes / r.steps / (bw * 1e9),
                     g_fma_peak_gflops > 0 ? b * attn_flops / (g_fma_peak_gflops * 1e9) : 0.0);
        const double two_phase = b / (gemm_s + attn_s);
        const double per_layer = PerLayerBoundTps(s, m.mod ? mod_b : dense_b, r, bw);
        std::printf(
            "| %s | %d | %d | %.1f | %.1f | %.0f | %.1f | %.0f%% | %s | %s | %.1f (%.1f / %.1f) "
            "| %.0f%% | %.1f | %.0f%% | %.1f | %.0f%% |\n",
            m.mod ? "MoD" : "dense", ctx, b, r.tokens_per_s(), 1e3 * r.seconds / r.steps,
            per_step / 1e6, r.gb_per_s(), 100 * r.gb_per_s() / bw,
            m.mod ? absl::StrFormat("%.3f", r.routed_fraction()).c_str() : "-",
            m.mod ? absl::StrFormat("%.3f", r.skip_fraction()).c_str() : "-", roofline, bw_bound,
            compute_bound, 100 * r.tokens_per_s() / roofline, two_phase,
            100 * r.tokens_per_s() / two_phase, per_layer, 100 * r.tokens_per_s() / per_layer);
      }
    }
  }
  const ModelResult* dense = nullptr;
  const ModelResult* mod = nullptr;
  for (const ModelResult& m : models) (m.mod ? mod : dense) = &m;
  std::printf("\nPrefill (one %d-token prompt, chunk %d):", absl::GetFlag(FLAGS_prefill_tokens),
              absl::GetFlag(FLAGS_max_batch_tokens));
  for (const ModelResult& m : models) {
    // MoD computes fewer FLOPs; its figure is dense-equivalent (what dense would need per second).
    std::printf(" %s %.1f tok/s (%s%s);", m.mod ? "MoD" : "dense", m.prefill_tps,
                m.mod ? "dense-equivalent " : "",
                PrefillGflops(s, absl::GetFlag(FLAGS_prefill_tokens), m.prefill_tps).c_str());
  }
  std::printf("\n");
  for (int ctx : contexts) {
    SummaryRow row;
    row.shape = s.name;
    row.context = ctx;
    if (dense != nullptr) {
      row.dense_bw_fraction_b1 = dense->decode.at({ctx, batches.front()}).gb_per_s() / bw;
    }
    if (mod != nullptr) {
      row.mod_bw_fraction_b1 = mod->decode.at({ctx, batches.front()}).gb_per_s() / bw;
    }
    if (dense != nullptr && mod != nullptr) {
      const DecodeRun& d = dense->decode.at({ctx, batches.front()});
      const DecodeRun& m = mod->decode.at({ctx, batches.front()});
      row.speedup_b1 = m.tokens_per_s() / d.tokens_per_s();
      row.ideal_speedup_b1 = (d.weight_bytes + d.kv_bytes) / (m.weight_bytes + m.kv_bytes);
      const DecodeRun& mb = mod->decode.at({ctx, batches.back()});
      row.kv_ratio = static_cast<double>(mb.kv_entry_bytes) / mb.kv_entry_bytes_dense;
      row.kv_ideal = mb.kv_ideal_ratio;
    }
    summary->push_back(row);
  }
  if (dense == nullptr || mod == nullptr) return;
  std::printf(
      "\n| ctx | batch | MoD/dense decode speed-up | bytes ideal (dense/MoD bytes per step) "
      "| routed frac | skipped frac | KV/token MoD/dense: entries | pages "
      "| ideal from routed fracs | entries vs ideal | pages vs ideal "
      "| per-layer bounds' ratio |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int ctx : contexts) {
    for (int b : batches) {
      const DecodeRun& d = dense->decode.at({ctx, b});
      const DecodeRun& m = mod->decode.at({ctx, b});
      const double speedup = m.tokens_per_s() / d.tokens_per_s();
      const double ideal = (d.weight_bytes + d.kv_bytes) / (m.weight_bytes + m.kv_bytes);
      const double kv_entries = static_cast<double>(m.kv_entry_bytes) / m.kv_entry_bytes_dense;
      const double kv_pages = static_cast<double>(m.kv_page_bytes) / m.kv_page_bytes_dense;
      // What MoD could gain over dense on this machine at this point: the MoD run's per-layer
      // bound over the dense run's.
      const double bound_ratio =
          PerLayerBoundTps(s, mod_b, m, bw) / PerLayerBoundTps(s, dense_b, d, bw);
      std::printf(
          "| %d | %d | %.2fx | %.2fx | %.3f | %.3f | %.3f | %.3f | %.3f | %+.1f%% | %+.1f%% "
          "| %.2fx |\n",
          ctx, b, speedup, ideal, m.routed_fraction(), m.skip_fraction(), kv_entries, kv_pages,
          m.kv_ideal_ratio, 100 * (kv_entries / m.kv_ideal_ratio - 1),
          100 * (kv_pages / m.kv_ideal_ratio - 1), bound_ratio);
    }
  }
  std::printf(
      "\nMoD routed fraction per routed layer (all fed tokens: prompt + decode), largest "
      "batch:\n\n");
  for (int ctx : contexts) {
    const DecodeRun& m = mod->decode.at({ctx, batches.back()});
    const std::vector<int>& layers = mod_layers;
    std::printf("- ctx %d, batch %d:", ctx, batches.back());
    for (size_t k = 0; k < m.layer_fractions.size() && k < layers.size(); ++k) {
      std::printf(" L%d %.3f", layers[k], m.layer_fractions[k]);
    }
    std::printf("\n");
  }
}

absl::StatusOr<std::vector<int>> ParseInts(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", part, "' is not a positive integer"));
    }
    out.push_back(v);
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty"));
  return out;
}


// ---- given model files (--model) ------------------------------------------------------------

// The shape of a checkpoint on disk and the bytes its views hold (dense_layer: the average layer,
// so a file that mixes quantized types per layer still sums right).
absl::StatusOr<std::pair<Shape, ModelBytes>> DescribeModel(const std::string& path) {
  MODSERVE_ASSIGN_OR_RETURN(engine::LoadedModel m, engine::LoadModel(path));
  const engine::ModelConfig& c = m.config();
  const engine::ModelWeights& w = m.weights();
  Shape s{std::filesystem::path(path).lexically_normal().filename().string(),
          c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.d_ff, c.vocab_size,
          c.max_seq_len, c.rms_norm_eps, c.rope_theta};
  ModelBytes b;
  int64_t layers_bytes = 0;
  for (const engine::LayerWeights& l : w.layers) {
    for (const TensorView* v : {&l.input_layernorm, &l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj,
                                &l.post_attention_layernorm, &l.gate_proj, &l.up_proj,
                                &l.down_proj}) {
      layers_bytes += static_cast<int64_t>(v->bytes());
    }
    if (l.routed && b.router == 0) {
      for (const TensorView* v : {&l.router_weight, &l.router_bias, &l.predictor_hidden_weight,
                                  &l.predictor_hidden_bias, &l.predictor_out_weight,
                                  &l.predictor_out_bias}) {
        if (!v->empty()) b.router += static_cast<int64_t>(v->bytes());
      }
    }
  }
  b.dense_layer = layers_bytes / std::max<int64_t>(1, c.n_layers);
  b.lm_head = static_cast<int64_t>(w.lm_head.bytes() + w.norm.bytes());
  b.embed_row = static_cast<int64_t>(w.embed_tokens.bytes()) / std::max<int64_t>(1, c.vocab_size);
  b.total_weights = static_cast<int64_t>(m.checkpoint().total_bytes());
  return std::make_pair(s, b);
}

// --paired_steps: `pairs` decode steps at each (context, batch), each timed right after one pass
// of every probe kind over a 1 GiB buffer (2 MiB pages, as the weights get). A step's share is
// its GB/s over the strongest of those passes, the rate the memory gave a moment before, so that
// a run whose memory changes state during it (some hosts switch between two bandwidth states
// within seconds) still compares each step with the state it ran in. The pairs are grouped by
// that rate in bands of 10 GB/s. A step's bytes: its weight bytes, plus the run's KV bytes per
// step.
absl::Status PrintPairedSteps(engine::Engine& e, const Shape& s, const ModelBytes& mb,
                              const std::string& label, const std::vector<int>& batches,
                              const std::vector<int>& contexts, int pairs) {
  const int threads = BenchThreads();
  const int64_t words = (int64_t{1} << 30) / 8;
  const ProbeBuffer owned = MakeProbeBuffer(words, /*huge_pages=*/true, threads);
  const uint64_t* buf = owned.get();
  std::printf(
      "\n%s: decode steps against the read pass just before each (%d pairs per point; pass: "
      "every probe kind once over 1 GiB, %d threads, the strongest counts; share: the step's GB/s "
      "over it):\n\n",
      label.c_str(), pairs, threads);
  std::printf(
      "| model | ctx | batch | pass band GB/s | pairs | pass GB/s, median | step GB/s, median | "
      "share, median | share, quartiles |\n");
  std::printf("|---|---:|---:|---|---:|---:|---:|---:|---|\n");
  auto quantile = [](std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
  };
  for (int ctx : contexts) {
    for (int b : batches) {
      std::vector<double> pass_rate;
      auto before = [&] {
        double best = 0;
        for (int kind = 0; kind < kNumProbeKinds; ++kind) {
          best = std::max(best, ProbePass(kind, buf, words, threads));
        }
        pass_rate.push_back(best);
        // A short pause between the pass (its threads joined) and the untimed step.
        std::this_thread::sleep_for(std::chrono::microseconds(300));
      };
      MODSERVE_ASSIGN_OR_RETURN(DecodeRun run, MeasureDecode(e, s, mb, b, ctx, pairs, before));
      const double kv_per_step = run.kv_bytes / run.steps;
      std::map<int, std::vector<std::pair<double, double>>> bands;  // band -> (pass, step)
      for (int i = 0; i < run.steps; ++i) {
        const double step_rate =
            (run.step_weight_bytes[i] + kv_per_step) / run.step_seconds[i] / 1e9;
        bands[static_cast<int>(pass_rate[i] / 10)].push_back({pass_rate[i], step_rate});
      }
      for (const auto& [band, v] : bands) {
        std::vector<double> pass, step, share;
        for (const auto& [p, r] : v) {
          pass.push_back(p);
          step.push_back(r);
          share.push_back(r / p);
        }
        std::printf("| %s | %d | %d | %d-%d | %zu | %.1f | %.1f | %.0f%% | %.0f-%.0f%% |\n",
                    label.c_str(), ctx, b, 10 * band, 10 * band + 10, v.size(), quantile(pass, 0.5),
                    quantile(step, 0.5), 100 * quantile(share, 0.5), 100 * quantile(share, 0.25),
                    100 * quantile(share, 0.75));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status RunModelFile(const std::string& path, const std::vector<int>& batches,
                          const std::vector<int>& contexts, int steps, DType kv_dtype, double bw) {
  MODSERVE_ASSIGN_OR_RETURN(auto described, DescribeModel(path));
  const auto& [s, mb] = described;
  std::error_code ec;
  EvictFromPageCache(std::filesystem::is_directory(path, ec) ? path + "/model.safetensors" : path);
  MODSERVE_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> e,
                            CreateEngine(s, path, batches, contexts, steps, kv_dtype));
  const bool mod = e->config().mod.has_value();
  std::printf(
      "\n### %s (%s): d_model %lld, %lld layers, %lld heads / %lld KV heads, d_ff %lld, vocab "
      "%lld; %.1f MB of weights\n\n",
      s.name.c_str(), mod ? "MoD" : "dense", static_cast<long long>(s.d_model),
      static_cast<long long>(s.n_layers), static_cast<long long>(s.n_heads),
      static_cast<long long>(s.n_kv_heads), static_cast<long long>(s.d_ff),
      static_cast<long long>(s.vocab_size), mb.total_weights / 1e6);
  std::vector<DecodeRun> runs;
  for (int ctx : contexts) {
    for (int b : batches) {
      MODSERVE_ASSIGN_OR_RETURN(DecodeRun run, MeasureDecode(*e, s, mb, b, ctx, steps));
      runs.push_back(run);
    }
  }
  std::printf("| model | ctx | batch | tok/s | ms/step | MB read/step | GB/s | %% of read bw "
              "| routed frac |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const DecodeRun& r : runs) {
    std::printf("| %s | %d | %d | %.1f | %.2f | %.1f | %.1f | %.0f%% | %s |\n", s.name.c_str(),
                r.context, r.batch, r.tokens_per_s(), 1e3 * r.seconds / r.steps,
                (r.weight_bytes + r.kv_bytes) / r.steps / 1e6, r.gb_per_s(),
                100 * r.gb_per_s() / bw,
                mod ? absl::StrFormat("%.3f", r.routed_fraction()).c_str() : "-");
  }
  if (const int pairs = absl::GetFlag(FLAGS_paired_steps); pairs > 0) {
    MODSERVE_RETURN_IF_ERROR(PrintPairedSteps(*e, s, mb, s.name, batches, contexts, pairs));
  }
  MODSERVE_ASSIGN_OR_RETURN(const double prefill,
                            MeasurePrefill(*e, s, absl::GetFlag(FLAGS_prefill_tokens),
                                           absl::GetFlag(FLAGS_prefill_reps)));
  std::printf("\nPrefill (one %d-token prompt, chunk %d): %.1f tok/s (%s%s)\n",
              absl::GetFlag(FLAGS_prefill_tokens), absl::GetFlag(FLAGS_max_batch_tokens), prefill,
              mod ? "dense-equivalent " : "",
              PrefillGflops(s, absl::GetFlag(FLAGS_prefill_tokens), prefill).c_str());
  return absl::OkStatus();
}

absl::Status Main() {
  MODSERVE_ASSIGN_OR_RETURN(std::vector<int> batches,
                            ParseInts("batches", absl::GetFlag(FLAGS_batches)));
  MODSERVE_ASSIGN_OR_RETURN(std::vector<int> contexts,
                            ParseInts("contexts", absl::GetFlag(FLAGS_contexts)));
  const int steps = absl::GetFlag(FLAGS_steps);
  if (steps < 1) return absl::InvalidArgumentError("--steps must be >= 1");
  if (const int pairs = absl::GetFlag(FLAGS_paired_steps); pairs < 0) {
    return absl::InvalidArgumentError("--paired_steps must be >= 0");
  } else if (pairs > 0 && absl::GetFlag(FLAGS_backend) != "cpu") {
    return absl::InvalidArgumentError(
        "--paired_steps: the read pass measures the CPU's memory only");
  }
  std::sort(batches.begin(), batches.end());
  std::sort(contexts.begin(), contexts.end());
  const std::string kv = absl::GetFlag(FLAGS_kv_dtype);
  DType kv_dtype;
  if (kv == "f32") {
    kv_dtype = DType::kF32;
  } else if (kv == "f16") {
    kv_dtype = DType::kF16;
  } else if (kv == "bf16") {
    kv_dtype = DType::kBF16;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_dtype '", kv, "' is not one of f32, f16, bf16"));
  }
  {
    absl::StatusOr<backend::MatmulPrecision> p =
        backend::ParseMatmulPrecision(absl::GetFlag(FLAGS_matmul_precision));
    if (!p.ok()) return p.status();
    g_precision = *p;
  }
  std::vector<Shape> shapes;
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',', absl::SkipEmpty())) {
    bool found = false;
    for (const Shape& s : KnownShapes()) {
      if (s.name == name) {
        shapes.push_back(s);
        found = true;
      }
    }
    if (!found) {
      return absl::InvalidArgumentError(
          absl::StrCat("--shapes: unknown shape '", name, "' (known: 110m, tinyllama, 8b)"));
    }
  }
  std::vector<bool> variants;
  for (absl::string_view v :
       absl::StrSplit(absl::GetFlag(FLAGS_variants), ',', absl::SkipEmpty())) {
    if (v != "dense" && v != "mod") {
      return absl::InvalidArgumentError(absl::StrCat("--variants: '", v, "' is not dense or mod"));
    }
    variants.push_back(v == "mod");
  }
  const int threads = BenchThreads();

  for (const auto& [name, value] :
       {std::pair{"--device_routing", absl::GetFlag(FLAGS_device_routing)},
        {"--graphs", absl::GetFlag(FLAGS_graphs)}}) {
    if (absl::StatusOr<engine::DeviceRouting> r = ParseDeviceRouting(value); !r.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", r.status().message()));
    }
  }
  const std::string backend_name = absl::GetFlag(FLAGS_backend);
  double bw = 0;
  if (backend_name == "cpu") {
    const backend::cpu::Isa isa = backend::cpu::BestIsa();
    const std::string amx =
        isa != backend::cpu::Isa::kAmx
            ? " (AMX: " + std::string(backend::cpu::AmxUnavailableReason()) + ")"
        : backend::cpu::AmxInt8UnavailableReason().empty()
            ? " (int8 tiles too)"
            : " (int8 tiles not: " + std::string(backend::cpu::AmxInt8UnavailableReason()) + ")";
    std::printf(
        "modserve-bench: %s, kernels %s%s, %d threads, KV %s, matmul precision %s, %d timed "
        "decode steps\n",
        CpuModel("unknown").c_str(), std::string(backend::cpu::IsaName(isa)).c_str(), amx.c_str(),
        threads, kv.c_str(), std::string(backend::MatmulPrecisionName(g_precision)).c_str(), steps);
    std::string kinds;
    bw = MeasureReadBandwidth(threads, /*huge_pages=*/true, &kinds);
    const double bw_4k = MeasureReadBandwidth(threads, /*huge_pages=*/false);
    const char* fma_isa = "none";
    g_fma_peak_gflops = bench::MeasureFmaPeakGflops(threads, &fma_isa);
    std::printf(
        "matmul-peak probe (f32 FMA chains on registers, the stronger of AVX2's and "
        "AVX-512's: %s, %d threads, best of 5): %.1f GFLOP/s\n",
        fma_isa, threads, g_fma_peak_gflops);
    if (isa == backend::cpu::Isa::kAmx) {
      g_amx_peak_gflops = bench::MeasureAmxTilePeakGflops(threads);
      const int terms = backend::Bf16TermsOf(g_precision);
      std::printf(
          "AMX tile probe (TDPBF16PS on registers, %d threads, best of 5): %.1f GFLOP/s of "
          "bf16 products; the tile Gemm splits x into %d bf16 terms, so 1/%d of it (%.1f) is "
          "its ceiling\n",
          threads, g_amx_peak_gflops, terms, terms, g_amx_peak_gflops / terms);
    }
    const backend::cpu::KernelTable& table = backend::cpu::KernelsFor(isa);
    if (g_precision == backend::MatmulPrecision::kMedium && table.gemm_dpbf16 != nullptr &&
        table.gemm_amx_bf16 == nullptr) {
      g_dpbf16_peak_gflops = bench::MeasureDpBf16PeakGflops(threads);
      std::printf(
          "vdpbf16ps probe (chains on registers, %d threads, best of 5): %.1f GFLOP/s of bf16 "
          "products, the ceiling of the BF16 Gemms of more than %d rows at this precision\n",
          threads, g_dpbf16_peak_gflops, static_cast<int>(backend::cpu::kDpBf16SmallNMax));
    }
    std::printf(
        "measured read bandwidth (2 GiB sum, %d threads, best of 7, strongest probe): %.2f GB/s "
        "with 2 MiB pages (used below), %.2f GB/s with 4 KiB pages\n"
        "read-bandwidth probes, GB/s with 2 MiB pages: %s\n",
        threads, bw, bw_4k, kinds.c_str());
  } else {
    // Before anything slow: a build without the backend or a machine without its device ends
    // here with the registry's reason (Unavailable / NotFound), not midway through a run.
    absl::StatusOr<std::unique_ptr<backend::Backend>> probe =
        backend::CreateBackend(backend_name);
    if (!probe.ok()) {
      return absl::Status(probe.status().code(),
                          absl::StrCat("--backend ", backend_name, ": ", probe.status().message()));
    }
    std::printf("modserve-bench: backend %s (host %s), KV %s, %d timed decode steps, device "
                "routing %s, graphs %s\n",
                backend_name.c_str(), CpuModel("unknown").c_str(), kv.c_str(), steps,
                absl::GetFlag(FLAGS_device_routing).c_str(), absl::GetFlag(FLAGS_graphs).c_str());
    MODSERVE_ASSIGN_OR_RETURN(bw, MeasureDeviceCopyBandwidth(**probe));
    std::printf("measured device copy bandwidth (1 GiB read + 1 GiB written per round, best of "
                "7): %.1f GB/s (the %% of bw columns below use it)\n",
                bw);
  }

  if (const std::string models = absl::GetFlag(FLAGS_model); !models.empty()) {
    for (absl::string_view path : absl::StrSplit(models, ',', absl::SkipEmpty())) {
      MODSERVE_RETURN_IF_ERROR(
          RunModelFile(std::string(path), batches, contexts, steps, kv_dtype, bw));
    }
    return absl::OkStatus();
  }
  std::vector<SummaryRow> summary;
  for (const Shape& s : shapes) {
    MODSERVE_ASSIGN_OR_RETURN(std::vector<ModelResult> models,
                              RunShape(s, variants, batches, contexts, steps, kv_dtype, threads));
    PrintShape(s, models, bw, batches, contexts, &summary);
  }

  if (backend_name == "cpu") {
    const double bw_end = MeasureReadBandwidth(threads, /*huge_pages=*/true);
    std::printf(
        "\nread bandwidth at the end: %.2f GB/s (start %.2f GB/s; a large gap means the "
        "machine was not quiet)\n",
        bw_end, bw);
  }
  std::printf("\n## Summary (read bandwidth %.2f GB/s)\n\n", bw);
  std::printf(
      "| shape | ctx | batch-%d decode, %% of read bw: dense | MoD | MoD/dense batch-%d "
      "speed-up | bytes ideal | KV/token MoD/dense, batch %d | ideal | diff |\n",
      batches.front(), batches.front(), batches.back());
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const SummaryRow& r : summary) {
    std::printf("| %s | %d | %.0f%% | %.0f%% | %.2fx | %.2fx | %.3f | %.3f | %+.1f%% |\n",
                r.shape.c_str(), r.context, 100 * r.dense_bw_fraction_b1,
                100 * r.mod_bw_fraction_b1, r.speedup_b1, r.ideal_speedup_b1, r.kv_ratio,
                r.kv_ideal, r.kv_ideal > 0 ? 100 * (r.kv_ratio / r.kv_ideal - 1) : 0.0);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace modserve::bench

int main(int argc, char** argv) {
  modserve::cli::SetUsage(
      "modserve-bench: decode/prefill throughput of the engine (--backend cpu or cuda) on "
      "synthetic checkpoints (or on --model files)",
      __FILE__);
  absl::ParseCommandLine(argc, argv);
  const absl::Status st = modserve::bench::Main();
  if (!st.ok()) {
    std::fprintf(stderr, "modserve-bench: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
