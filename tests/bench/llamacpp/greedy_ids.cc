// greedy_ids: greedy decoding with llama.cpp from prompt token ids, printing each generated id
// with its top-1/top-2 logit margin. A correctness probe for to_gguf.py, not a benchmark; it is
// built against /tmp/llamacpp's libllama by check_same_tokens.sh, not by the modserve build.
//
//   greedy_ids MODEL.gguf 1,17,42 16 [threads]
//   -> one line per token: "<step> <id> <top2 id> <margin>", then "ids: a,b,c"
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s MODEL.gguf ID,ID,... N_NEW [THREADS]\n", argv[0]);
    return 2;
  }
  std::vector<llama_token> prompt;
  {
    std::stringstream ss(argv[2]);
    std::string part;
    while (std::getline(ss, part, ',')) prompt.push_back(std::atoi(part.c_str()));
  }
  const int n_new = std::atoi(argv[3]);
  const int threads = argc > 4 ? std::atoi(argv[4]) : 2;

  llama_log_set([](ggml_log_level level, const char* text, void*) {
    if (level >= GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
  }, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  // No repacked (AMX / interleaved) weight buffers: on this VM the AMX Q8_0 path dies with SIGILL
  // on multi-token batches, and BF16/F16 weights are never repacked anyway.
  mp.use_extra_bufts = false;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (model == nullptr) return 1;
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(prompt.size() + n_new + 16);
  cp.n_batch = cp.n_ctx;
  cp.n_ubatch = cp.n_ctx;
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  // F32 KV cache: the probe should add as little rounding of its own as it can.
  cp.type_k = GGML_TYPE_F32;
  cp.type_v = GGML_TYPE_F32;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) return 1;
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

  std::vector<llama_token> out;
  std::vector<llama_token> feed = prompt;
  for (int step = 0; step < n_new; ++step) {
    llama_batch batch = llama_batch_get_one(feed.data(), static_cast<int32_t>(feed.size()));
    if (llama_decode(ctx, batch) != 0) {
      std::fprintf(stderr, "llama_decode failed at step %d\n", step);
      return 1;
    }
    const float* logits = llama_get_logits_ith(ctx, -1);
    int best = 0, second = -1;
    for (int i = 1; i < n_vocab; ++i) {
      if (logits[i] > logits[best]) {
        second = best;
        best = i;
      } else if (second < 0 || logits[i] > logits[second]) {
        second = i;
      }
    }
    std::printf("%d %d %d %.5f\n", step, best, second, logits[best] - logits[second]);
    out.push_back(best);
    feed.assign(1, best);
  }
  std::printf("ids:");
  for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : " ", out[i]);
  std::printf("\n");
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
