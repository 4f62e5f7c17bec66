// modserve-perplexity: held-out perplexity and routed fractions of a model as the engine serves
// it. Every window is one request (its tokens are the prompt; one token is generated and
// ignored); the engine's prompt log-probabilities give the negative log-likelihood of each window
// token but the first, and its routing decisions the fraction of tokens each routed layer ran.
// Prints one JSON object per request threshold.
//
//   modserve-perplexity --model models/smollm2-mod --windows /tmp/w.json --thresholds 0.3,0.5
//   (--windows: a JSON object {"windows": [[id, ...], ...]}, e.g. from tools/mod_eval.py)
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/engine.h"
#include "nlohmann/json.hpp"
#include "tools/cli_usage.h"

ABSL_FLAG(std::string, model, "", "checkpoint directory, MoD adapter directory or .gguf file");
ABSL_FLAG(std::string, windows, "", "JSON file {\"windows\": [[token ids], ...]}");
ABSL_FLAG(std::string, thresholds, "",
          "request thresholds to run, comma separated; empty = the model's default");
ABSL_FLAG(int32_t, threads, 0, "CPU threads; 0 = every core");
ABSL_FLAG(int32_t, max_seqs, 8, "sequences in one forward pass");
ABSL_FLAG(int32_t, max_batch_tokens, 512, "rows of one forward pass");
ABSL_FLAG(std::string, logprobs_out, "",
          "also write each window's per-token log-probabilities here, as JSON "
          "{\"logprobs\": [[...], ...]} (one list per window and threshold, in run order)");
ABSL_FLAG(std::string, matmul_precision, "highest",
          "how BF16-weight Gemms on AMX tiles may round activations: highest (f32 precision), "
          "high (two bf16 terms, ~2^-16) or medium (bf16, ~2^-8; faster, less accurate)");

namespace {

int Fail(const std::string& what) {
  std::cerr << "modserve-perplexity: " << what << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  modserve::cli::SetUsage("modserve-perplexity --model DIR --windows FILE.json", __FILE__);
  absl::ParseCommandLine(argc, argv);
  using modserve::engine::Engine;
  modserve::engine::EngineOptions opts;
  opts.model_dir = absl::GetFlag(FLAGS_model);
  if (opts.model_dir.empty()) return Fail("--model is required");
  opts.num_threads = absl::GetFlag(FLAGS_threads);
  opts.max_seqs = absl::GetFlag(FLAGS_max_seqs);
  opts.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  absl::StatusOr<modserve::backend::MatmulPrecision> precision =
      modserve::backend::ParseMatmulPrecision(absl::GetFlag(FLAGS_matmul_precision));
  if (!precision.ok())
    return Fail("--matmul_precision: " + std::string(precision.status().message()));
  opts.matmul_precision = *precision;

  std::vector<std::vector<int32_t>> windows;
  {
    const std::string path = absl::GetFlag(FLAGS_windows);
    std::ifstream in(path);
    if (!in) return Fail("--windows: cannot open '" + path + "'");
    std::stringstream text;
    text << in.rdbuf();
    try {
      const nlohmann::json j = nlohmann::json::parse(text.str());
      windows = j.at("windows").get<std::vector<std::vector<int32_t>>>();
    } catch (const nlohmann::json::exception& e) {
      return Fail(path + ": expected {\"windows\": [[token ids], ...]}: " + e.what());
    }
    if (windows.empty()) return Fail(path + ": no windows");
    for (const auto& w : windows) {
      if (w.size() < 2) return Fail(path + ": a window needs at least two tokens");
    }
  }
  std::vector<std::optional<double>> thresholds;
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_thresholds), ',', absl::SkipWhitespace())) {
    double t;
    if (!absl::SimpleAtod(part, &t)) {
      return Fail("--thresholds: '" + std::string(part) + "' is not a number");
    }
    thresholds.push_back(t);
  }
  if (thresholds.empty()) thresholds.push_back(std::nullopt);

  size_t longest = 0;
  for (const auto& w : windows) longest = std::max(longest, w.size());
  auto engine = Engine::Create(opts);
  if (!engine.ok()) return Fail(engine.status().ToString());
  // Room for every sequence of one pass at once, dense layout, with headroom for page rounding.
  const int64_t need = static_cast<int64_t>(longest + 64) * opts.max_seqs *
                       (*engine)->kv_bytes_per_token_layer() * (*engine)->config().n_layers;
  if (need > opts.kv_cache_bytes) {
    opts.kv_cache_bytes = need;
    engine = Engine::Create(opts);
    if (!engine.ok()) return Fail(engine.status().ToString());
  }
  Engine& e = **engine;
  const int n_layers = static_cast<int>(e.config().n_layers);

  nlohmann::json all_logprobs = nlohmann::json::array();
  for (const std::optional<double>& tau : thresholds) {
    std::vector<modserve::engine::Request> reqs;
    for (const auto& w : windows) {
      modserve::engine::Request r;
      r.prompt = w;
      r.sampling.max_new_tokens = 1;
      r.sampling.temperature = 0.0f;
      r.sampling.ignore_eos = true;
      r.prompt_logprobs = 0;
      if (tau && e.config().mod) r.threshold = *tau;
      reqs.push_back(std::move(r));
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto results = e.Generate(reqs);
    if (!results.ok()) return Fail(results.status().ToString());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double nll = 0.0;
    int64_t predicted = 0, fed = 0;
    std::map<int, int64_t> routed;
    for (const auto& res : *results) {
      nlohmann::json window_logprobs = nlohmann::json::array();
      for (const auto& p : res.prompt_logprobs) {
        if (!p.logprob) continue;
        nll -= static_cast<double>(*p.logprob);
        window_logprobs.push_back(*p.logprob);
        ++predicted;
      }
      all_logprobs.push_back(std::move(window_logprobs));
      for (size_t k = 0; k < res.routed_layers.size(); ++k) {
        for (uint8_t d : res.routing[k]) routed[res.routed_layers[k]] += d;
      }
      fed += res.prompt_tokens;
    }
    nlohmann::json out;
    out["model"] = opts.model_dir;
    out["threshold"] = tau ? nlohmann::json(*tau) : nlohmann::json(nullptr);
    out["windows"] = windows.size();
    out["predicted_tokens"] = predicted;
    out["nll"] = nll / static_cast<double>(predicted);
    out["ppl"] = std::exp(nll / static_cast<double>(predicted));
    out["seconds"] = seconds;
    nlohmann::json frac = nlohmann::json::object();
    double skipped = 0.0;
    for (const auto& [layer, count] : routed) {
      const double f = static_cast<double>(count) / static_cast<double>(fed);
      frac[std::to_string(layer)] = f;
      skipped += 1.0 - f;
    }
    out["routed_fraction"] = frac;
    // Block computations skipped, over all layers (dense layers skip none).
    out["skipped_fraction"] = skipped / n_layers;
    std::cout << out.dump() << std::endl;
  }
  if (const std::string path = absl::GetFlag(FLAGS_logprobs_out); !path.empty()) {
    std::ofstream f(path);
    f << nlohmann::json{{"logprobs", all_logprobs}}.dump() << std::endl;
    if (!f) return Fail("--logprobs_out: cannot write '" + path + "'");
  }
  return 0;
}
