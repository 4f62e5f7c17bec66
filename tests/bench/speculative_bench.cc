// modserve-spec-bench: self-speculative decoding against plain decoding on the same engine, in
// the same run: draft acceptance, tokens per verification pass and decode tokens/s for each
// (K drafted tokens, draft threshold T), at batch 1 and batch 4, greedy; each speculative run is
// timed right after a plain one and compared with it. It also checks that
// every speculative run produced the tokens of the plain one (the "same" column).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "tests/bench/cpu_model.h"
#include "tools/cli_usage.h"

ABSL_FLAG(std::string, model, "models/demo,models/smollm2-mod", "model directories, comma separated");
ABSL_FLAG(std::string, prompt, "The history of the city begins with a small settlement on the river,",
          "prompt text (each batch row appends its index)");
ABSL_FLAG(int32_t, new_tokens, 64, "tokens generated per request");
ABSL_FLAG(std::string, tokens, "2,3,4,6,8", "K values, comma separated");
ABSL_FLAG(std::string, thresholds, "1.0,0.9,0.7", "draft thresholds T, comma separated");
ABSL_FLAG(std::string, batches, "1,4", "batch sizes, comma separated");
ABSL_FLAG(int32_t, threads, 0, "CPU threads; 0 = every core");

namespace {

using modserve::engine::Engine;
using modserve::engine::GenerationResult;
using modserve::engine::Request;
using modserve::engine::StepEntry;

struct Run {
  std::vector<std::vector<int32_t>> tokens;
  double decode_seconds = 0.0;  // steps after each request's first token
  int64_t decode_tokens = 0;
  int64_t drafted = 0, accepted = 0, verify_passes = 0;
};

// Runs `requests` together with Engine::Step (prompts in one step each, then decode steps
// asking for `k` drafts), timing the steps that only decode.
Run RunBatch(Engine& engine, const std::vector<Request>& requests, int32_t k) {
  std::vector<modserve::engine::SequenceId> ids;
  for (const Request& r : requests) ids.push_back(*engine.Add(r));
  Run run;
  for (;;) {
    std::vector<StepEntry> entries;
    bool decode_only = true;
    for (auto id : ids) {
      if (engine.Finished(id)) continue;
      const int32_t pending = engine.PendingTokens(id);
      if (pending > 1 || engine.Result(id)->token_ids.empty()) decode_only = false;
      entries.push_back({id, pending, k});
    }
    if (entries.empty()) break;
    const absl::Time start = absl::Now();
    auto step = engine.Step(entries);
    const absl::Duration took = absl::Now() - start;
    if (!step.ok()) {
      std::fprintf(stderr, "step failed: %s\n", step.status().ToString().c_str());
      std::exit(1);
    }
    if (decode_only) {
      run.decode_seconds += absl::ToDoubleSeconds(took);
      for (const auto& s : step->sequences) {
        run.decode_tokens += (s.event.has_value() ? 1 : 0) + static_cast<int64_t>(s.more_events.size());
      }
    }
    for (const auto& s : step->sequences) {
      run.drafted += s.num_drafted;
      run.accepted += s.num_accepted;
      run.verify_passes += s.num_drafted > 0 ? 1 : 0;
    }
  }
  for (auto id : ids) {
    run.tokens.push_back(engine.Result(id)->token_ids);
    (void)engine.Release(id);
  }
  return run;
}

std::vector<std::string> Split(const std::string& s) {
  return absl::StrSplit(s, ',', absl::SkipEmpty());
}

}  // namespace

int main(int argc, char** argv) {
  modserve::cli::SetUsage(
      "modserve-spec-bench [--model M1,M2] [--tokens 2,4,8] [--thresholds 1.0,0.9] [--batches 1,4]",
      __FILE__);
  absl::ParseCommandLine(argc, argv);
  std::printf("CPU: %s, %d threads (0 = all)\n", modserve::bench::CpuModel().c_str(), absl::GetFlag(FLAGS_threads));
  for (const std::string& model : Split(absl::GetFlag(FLAGS_model))) {
    modserve::engine::EngineOptions eo;
    eo.model_dir = model;
    eo.num_threads = absl::GetFlag(FLAGS_threads);
    eo.kv_cache_bytes = int64_t{64} << 20;
    eo.kv_dtype = std::nullopt;  // the server's default
    auto engine = Engine::Create(eo);
    if (!engine.ok()) {
      std::fprintf(stderr, "%s: %s\n", model.c_str(), engine.status().ToString().c_str());
      return 1;
    }
    std::printf("\n%s, %d new tokens per request, greedy\n", model.c_str(),
                absl::GetFlag(FLAGS_new_tokens));
    std::printf("| batch | K | T | accepted / drafted | tokens / pass | decode tok/s | speed-up | same |\n");
    std::printf("|---|---|---|---|---|---|---|---|\n");
    for (const std::string& b : Split(absl::GetFlag(FLAGS_batches))) {
      int32_t batch = 1;
      if (!absl::SimpleAtoi(b, &batch) || batch < 1) return 1;
      std::vector<Request> requests;
      for (int32_t i = 0; i < batch; ++i) {
        Request r;
        const std::string text = absl::GetFlag(FLAGS_prompt) + " " + std::to_string(i);
        if ((*engine)->tokenizer() != nullptr) {
          r.prompt = (*engine)->tokenizer()->Encode(text, true).value();
        } else {
          // A checkpoint without a tokenizer (modserve-bench's synthetic shapes): the text's
          // bytes as token ids, which every vocabulary of 256 or more holds.
          for (unsigned char c : text) r.prompt.push_back(c);
        }
        r.sampling.temperature = 0.0f;
        r.sampling.max_new_tokens = absl::GetFlag(FLAGS_new_tokens);
        r.sampling.ignore_eos = true;
        requests.push_back(std::move(r));
      }
      const Run base = RunBatch(**engine, requests, 0);
      const double base_tps = base.decode_tokens / base.decode_seconds;
      std::printf("| %d | 0 | - | - | 1.00 | %.1f | 1.00x | - |\n", batch, base_tps);
      for (const std::string& t : Split(absl::GetFlag(FLAGS_thresholds))) {
        double threshold = 1.0;
        if (!absl::SimpleAtod(t, &threshold)) return 1;
        for (const std::string& ks : Split(absl::GetFlag(FLAGS_tokens))) {
          int32_t k = 0;
          if (!absl::SimpleAtoi(ks, &k)) return 1;
          std::vector<Request> spec = requests;
          for (Request& r : spec) {
            r.speculative_tokens = k;
            r.speculative_threshold = threshold;
          }
          // The machine may be shared: each speculative run is paired with a plain run just
          // before it, and the speed-up is against that one.
          const Run paired = RunBatch(**engine, requests, 0);
          const double paired_tps = paired.decode_tokens / paired.decode_seconds;
          const Run run = RunBatch(**engine, spec, k);
          const double tps = run.decode_tokens / run.decode_seconds;
          std::printf("| %d | %d | %.2f | %.3f | %.2f | %.1f | %.2fx | %s |\n", batch, k, threshold,
                      run.drafted > 0 ? static_cast<double>(run.accepted) / run.drafted : 0.0,
                      run.verify_passes > 0
                          ? static_cast<double>(run.accepted + run.verify_passes) / run.verify_passes
                          : 0.0,
                      tps, tps / paired_tps, run.tokens == base.tokens ? "yes" : "NO");
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}
