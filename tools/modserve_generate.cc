// modserve-generate: offline generation with the engine, one prompt, printed as text or JSON.
// It is the engine's command-line face for scripts and tests; it starts no server.
//
//   modserve-generate --model models/demo --prompt "The trouble with computers is" --json
//   modserve-generate --model DIR --prompt_ids 1,17,42 --max_new_tokens 8 --temperature 0
#include <cstdio>
#include <iostream>
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

ABSL_FLAG(std::string, model, "",
          "checkpoint directory (config.json, safetensors, tokenizer) or a .gguf file");
ABSL_FLAG(std::string, prompt, "", "prompt text (needs a tokenizer in the checkpoint)");
ABSL_FLAG(std::string, prompt_ids, "", "prompt token ids, comma separated (instead of --prompt)");
ABSL_FLAG(int32_t, max_new_tokens, 32, "tokens to generate at most");
ABSL_FLAG(double, temperature, 0.0, "0 = greedy");
ABSL_FLAG(int32_t, top_k, 0, "0 = off");
ABSL_FLAG(double, top_p, 1.0, "1 = off");
ABSL_FLAG(double, min_p, 0.0, "0 = off");
ABSL_FLAG(double, repetition_penalty, 1.0, "1 = off");
ABSL_FLAG(int64_t, seed, -1, "sampling seed; -1 = drawn by the engine");
ABSL_FLAG(double, threshold, -1.0, "override the routing threshold tau (the compute knob); -1 = "
                                   "the checkpoint's mod.threshold");
ABSL_FLAG(int32_t, threads, 0, "CPU threads; 0 = every core");
ABSL_FLAG(std::string, backend, "cpu", "cpu or cuda");
ABSL_FLAG(std::string, matmul_precision, "highest",
          "how BF16-weight Gemms on AMX tiles may round activations: highest (f32 precision), "
          "high (two bf16 terms, ~2^-16) or medium (bf16, ~2^-8; faster, less accurate)");
ABSL_FLAG(bool, ignore_eos, false, "keep generating after EOS");
ABSL_FLAG(int32_t, top_logprobs, 0, "alternatives per token to report in --json (0..20)");
ABSL_FLAG(int32_t, prompt_logprobs, -1,
          "with --json: every prompt token's logprob under the model (raw logits: no penalties or "
          "temperature) and this many alternatives (0..20), as prompt_logprobs; -1 = off");
ABSL_FLAG(bool, echo, false,
          "with --json: an `echo` object as OpenAI's echo gives it: the prompt's tokens, text and "
          "logprobs (the first null) followed by the generated ones (implies --prompt_logprobs "
          ">= 0)");
ABSL_FLAG(bool, json, false, "print one JSON object instead of text");
ABSL_FLAG(std::string, kv_cache_dtype, "f32",
          "KV cache storage: auto (the layer weights' 16-bit type, else f32; modserve's default), "
          "f32, f16 or bf16; give the server's to reproduce its numbers");

ABSL_FLAG(int32_t, speculative_tokens, 0,
          "self-speculative decoding: tokens drafted per decode step (0 = off, at most 16)");
ABSL_FLAG(double, speculative_threshold, 1.0,
          "the draft's routing threshold in (0, 1]; 1 skips every routed layer");

namespace {

int Fail(const std::string& what) {
  std::cerr << "modserve-generate: " << what << std::endl;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  modserve::cli::SetUsage("modserve-generate --model DIR (--prompt TEXT | --prompt_ids IDS)",
                          __FILE__);
  absl::ParseCommandLine(argc, argv);
  using modserve::engine::Engine;
  modserve::engine::EngineOptions opts;
  opts.model_dir = absl::GetFlag(FLAGS_model);
  if (opts.model_dir.empty()) return Fail("--model is required");
  opts.backend = absl::GetFlag(FLAGS_backend);
  opts.num_threads = absl::GetFlag(FLAGS_threads);
  opts.max_seqs = 1;
  absl::StatusOr<std::optional<modserve::DType>> kv_dtype =
      modserve::engine::ParseKvDtype(absl::GetFlag(FLAGS_kv_cache_dtype));
  if (!kv_dtype.ok()) return Fail("--kv_cache_dtype: " + std::string(kv_dtype.status().message()));
  opts.kv_dtype = *kv_dtype;
  absl::StatusOr<modserve::backend::MatmulPrecision> precision =
      modserve::backend::ParseMatmulPrecision(absl::GetFlag(FLAGS_matmul_precision));
  if (!precision.ok())
    return Fail("--matmul_precision: " + std::string(precision.status().message()));
  opts.matmul_precision = *precision;
  opts.speculative_tokens = absl::GetFlag(FLAGS_speculative_tokens);
  opts.speculative_threshold = absl::GetFlag(FLAGS_speculative_threshold);
  auto engine = Engine::Create(opts);
  if (!engine.ok()) return Fail(engine.status().ToString());
  Engine& e = **engine;

  modserve::engine::Request req;
  const std::string text = absl::GetFlag(FLAGS_prompt);
  const std::string ids = absl::GetFlag(FLAGS_prompt_ids);
  if (text.empty() == ids.empty()) return Fail("give exactly one of --prompt and --prompt_ids");
  if (!ids.empty()) {
    for (absl::string_view part : absl::StrSplit(ids, ',', absl::SkipWhitespace())) {
      int32_t id;
      if (!absl::SimpleAtoi(part, &id)) return Fail("--prompt_ids: '" + std::string(part) +
                                                    "' is not a token id");
      req.prompt.push_back(id);
    }
  } else {
    if (e.tokenizer() == nullptr) {
      return Fail("--prompt needs tokenizer.json or tokenizer.model in " + opts.model_dir +
                  "; use --prompt_ids");
    }
    auto enc = e.tokenizer()->Encode(text, /*add_special_tokens=*/true);
    if (!enc.ok()) return Fail(enc.status().ToString());
    req.prompt = *std::move(enc);
  }
  auto& sp = req.sampling;
  sp.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  sp.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  sp.top_k = absl::GetFlag(FLAGS_top_k);
  sp.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  sp.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
  sp.repetition_penalty = static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty));
  sp.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  sp.top_logprobs = absl::GetFlag(FLAGS_top_logprobs);
  if (absl::GetFlag(FLAGS_seed) >= 0) sp.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  if (absl::GetFlag(FLAGS_threshold) != -1.0) req.threshold = absl::GetFlag(FLAGS_threshold);
  const bool echo = absl::GetFlag(FLAGS_echo);
  req.prompt_logprobs = absl::GetFlag(FLAGS_prompt_logprobs);
  if (req.prompt_logprobs < -1 || req.prompt_logprobs > modserve::engine::kMaxTopLogprobs) {
    return Fail("--prompt_logprobs " + std::to_string(req.prompt_logprobs) +
                " is not in [-1, 20]");
  }
  if (echo && req.prompt_logprobs < 0) req.prompt_logprobs = 0;

  auto results = e.Generate({req});
  if (!results.ok()) return Fail(results.status().ToString());
  const modserve::engine::GenerationResult& r = (*results)[0];
  if (!absl::GetFlag(FLAGS_json)) {
    std::cout << (text.empty() ? "" : text) << r.text << std::endl;
    return 0;
  }
  nlohmann::json j;
  j["prompt_ids"] = req.prompt;
  j["token_ids"] = r.token_ids;
  j["logprobs"] = r.logprobs;
  if (sp.top_logprobs > 0) {
    nlohmann::json tops = nlohmann::json::array();
    for (const auto& alts : r.top_logprobs) {
      nlohmann::json row = nlohmann::json::array();
      for (const auto& a : alts) row.push_back({{"id", a.id}, {"logprob", a.logprob}});
      tops.push_back(row);
    }
    j["top_logprobs"] = tops;
  }
  if (e.tokenizer() != nullptr) j["text"] = r.text;
  j["finish_reason"] = std::string(modserve::engine::FinishReasonName(r.finish_reason));
  nlohmann::json routing = nlohmann::json::object();
  for (size_t k = 0; k < r.routed_layers.size(); ++k) {
    std::vector<int> d(r.routing[k].begin(), r.routing[k].end());
    routing[std::to_string(r.routed_layers[k])] = d;
  }
  j["routing"] = routing;
  j["kv_bytes"] = r.kv_bytes;
  j["kv_bytes_dense"] = r.kv_bytes_dense;
  j["usage"] = {{"prompt_tokens", r.prompt_tokens},
                {"completion_tokens", static_cast<int>(r.token_ids.size())}};
  if (req.prompt_logprobs >= 0) {
    nlohmann::json prompt = nlohmann::json::array();
    for (const auto& p : r.prompt_logprobs) {
      nlohmann::json top = nlohmann::json::array();
      for (const auto& a : p.top) top.push_back({{"id", a.id}, {"logprob", a.logprob}});
      prompt.push_back({{"token_id", p.token},
                        {"logprob", p.logprob ? nlohmann::json(*p.logprob) : nlohmann::json()},
                        {"top", top}});
    }
    j["prompt_logprobs"] = prompt;
  }
  if (echo) {
    nlohmann::json ids = nlohmann::json::array(), lps = nlohmann::json::array();
    for (const auto& p : r.prompt_logprobs) {
      ids.push_back(p.token);
      lps.push_back(p.logprob ? nlohmann::json(*p.logprob) : nlohmann::json());
    }
    for (size_t i = 0; i < r.token_ids.size(); ++i) {
      ids.push_back(r.token_ids[i]);
      lps.push_back(r.logprobs[i]);
    }
    nlohmann::json out = {{"token_ids", ids}, {"logprobs", lps}};
    if (e.tokenizer() != nullptr) {
      auto prompt_text = text.empty() ? e.tokenizer()->Decode(req.prompt, false)
                                      : absl::StatusOr<std::string>(text);
      if (prompt_text.ok()) out["text"] = *prompt_text + r.text;
    }
    j["echo"] = out;
  }
  std::cout << j.dump() << std::endl;
  return 0;
}
