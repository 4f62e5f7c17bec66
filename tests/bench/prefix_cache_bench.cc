// modserve-prefix-bench: time to first token of a request whose long prefix is in the prefix
// cache, against the same request cold (nothing cached) and with prefix caching off, on the
// checkpoints given. Prints one table row per model; numbers are engine-side (no RPC).
//
//   modserve-prefix-bench --model models/demo,models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "engine/engine.h"
#include "tools/cli_usage.h"
#include "tests/bench/cpu_model.h"

ABSL_FLAG(std::string, model, "models/demo", "comma-separated checkpoint directories or .gguf files");
ABSL_FLAG(int32_t, prefix_tokens, 1000, "tokens of the shared prefix");
ABSL_FLAG(int32_t, suffix_tokens, 16, "tokens after the prefix, different in every request");
ABSL_FLAG(int32_t, reps, 3, "measurements per cell (the median is reported)");
ABSL_FLAG(int32_t, threads, 0, "CPU backend threads; 0 = every core");
ABSL_FLAG(int32_t, max_batch_tokens, 512, "engine max_batch_tokens (the prefill chunk)");
ABSL_FLAG(int64_t, kv_cache_bytes, int64_t{512} << 20, "bytes of the KV cache");

namespace modserve::engine {
namespace {


std::vector<TokenId> RandomTokens(std::mt19937& rng, const Engine& e, int32_t n) {
  // Ids past the first few (specials) that name a token.
  std::vector<TokenId> t;
  const int64_t vocab = e.config().vocab_size;
  while (static_cast<int32_t>(t.size()) < n) {
    const TokenId id = static_cast<TokenId>(16 + rng() % static_cast<uint32_t>(vocab - 16));
    if (e.tokenizer() == nullptr || e.tokenizer()->IdToToken(id).has_value()) t.push_back(id);
  }
  return t;
}

std::unique_ptr<Engine> MakeEngine(const std::string& model, bool prefix_caching) {
  EngineOptions eo;
  eo.model_dir = model;
  eo.num_threads = absl::GetFlag(FLAGS_threads);
  eo.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  eo.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_bytes);
  eo.kv_dtype = std::nullopt;
  eo.prefix_caching = prefix_caching;
  auto e = Engine::Create(eo);
  if (!e.ok()) {
    std::fprintf(stderr, "modserve-prefix-bench: %s: %s\n", model.c_str(),
                 std::string(e.status().message()).c_str());
    std::exit(1);
  }
  return *std::move(e);
}

// Seconds until the first token of `prompt` (prefill of what is not cached, plus one sample).
double Ttft(Engine& e, const std::vector<TokenId>& prompt) {
  Request r;
  r.prompt = prompt;
  r.sampling.temperature = 0.0f;
  r.sampling.max_new_tokens = 1;
  r.sampling.ignore_eos = true;
  const auto t0 = std::chrono::steady_clock::now();
  auto out = e.Generate({r});
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!out.ok()) {
    std::fprintf(stderr, "modserve-prefix-bench: %s\n", std::string(out.status().message()).c_str());
    std::exit(1);
  }
  return s;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Run(const std::string& model) {
  const int32_t P = absl::GetFlag(FLAGS_prefix_tokens), S = absl::GetFlag(FLAGS_suffix_tokens);
  const int32_t reps = std::max(1, absl::GetFlag(FLAGS_reps));
  auto off = MakeEngine(model, false);
  auto on = MakeEngine(model, true);
  std::mt19937 rng(1);
  std::vector<double> t_off, t_cold, t_warm;
  (void)Ttft(*on, RandomTokens(rng, *on, 32));  // first-call costs out of the way
  (void)Ttft(*off, RandomTokens(rng, *off, 32));
  for (int32_t i = 0; i < reps; ++i) {
    const std::vector<TokenId> prefix = RandomTokens(rng, *on, P);
    auto with_suffix = [&](void) {
      std::vector<TokenId> p = prefix;
      const std::vector<TokenId> s = RandomTokens(rng, *on, S);
      p.insert(p.end(), s.begin(), s.end());
      return p;
    };
    t_off.push_back(Ttft(*off, with_suffix()));
    t_cold.push_back(Ttft(*on, with_suffix()));  // nothing of this prefix is cached yet
    t_warm.push_back(Ttft(*on, with_suffix()));  // the prefix's whole blocks are
  }
  const PrefixCacheStats st = on->prefix_cache_stats();
  const double off_ms = 1e3 * Median(t_off), cold_ms = 1e3 * Median(t_cold);
  const double warm_ms = 1e3 * Median(t_warm);
  std::printf("| %s | %s | %d+%d | %.1f | %.1f | %.1f | %.1fx | %.0f%% |\n", model.c_str(),
              on->config().mod ? "MoD" : "dense", P, S, off_ms, cold_ms, warm_ms,
              cold_ms / warm_ms, st.queries > 0 ? 100.0 * st.hits / st.queries : 0.0);
  std::fflush(stdout);
}

}  // namespace
}  // namespace modserve::engine

int main(int argc, char** argv) {
  modserve::cli::SetUsage("modserve-prefix-bench [--model M1,M2] [--prefix_tokens N]", __FILE__);
  absl::ParseCommandLine(argc, argv);
  std::printf("modserve-prefix-bench: %s, %d threads, TTFT median of %d, engine-side\n\n",
              modserve::bench::CpuModel().c_str(), absl::GetFlag(FLAGS_threads),
              absl::GetFlag(FLAGS_reps));
  std::printf("| model | kind | prompt (prefix+suffix) | TTFT cache off (ms) | TTFT cold (ms) | "
              "TTFT prefix cached (ms) | cold / cached | tokens hit |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  const std::vector<std::string> models =
      absl::StrSplit(absl::GetFlag(FLAGS_model), ',', absl::SkipEmpty());
  for (const std::string& m : models) modserve::engine::Run(m);
  return 0;
}
