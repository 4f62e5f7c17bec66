// llamacpp_probe: llama.cpp's outputs on a GGUF model for the SmolLM2 goldens (make_goldens.py
// builds it against a llama.cpp build's libllama; it is not part of the modserve build).
//
//   llamacpp_probe greedy   MODEL.gguf ID,ID,... N_NEW THREADS
//     -> per generated token: "<step> <id> <second id> <top-1 logit - top-2 logit>"
//   llamacpp_probe logprobs MODEL.gguf ID,ID,... THREADS
//     -> per position i >= 1: "<i> <log p(id_i | ids before i)> <argmax> <top-2 margin>"
//        from one batch with the logits of every position (teacher forcing)
// Settings: F32 KV cache, no flash attention, no repacked weights, so that llama.cpp adds as
// little rounding of its own as it can; its CPU matrix kernels still quantize activations to
// 8 bits for quantized weights, as they always do.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

namespace {

void TopTwo(const float* logits, int n, int* best, int* second) {
  *best = 0;
  *second = -1;
  for (int i = 1; i < n; ++i) {
    if (logits[i] > logits[*best]) {
      *second = *best;
      *best = i;
    } else if (*second < 0 || logits[i] > logits[*second]) {
      *second = i;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s greedy|logprobs MODEL.gguf IDS [N_NEW] THREADS\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  std::vector<llama_token> prompt;
  {
    std::stringstream ss(argv[3]);
    std::string part;
    while (std::getline(ss, part, ',')) prompt.push_back(std::atoi(part.c_str()));
  }
  const bool greedy = mode == "greedy";
  const int n_new = greedy ? std::atoi(argv[4]) : 0;
  const int threads = std::atoi(argv[greedy ? 5 : 4]);

  llama_log_set(
      [](ggml_log_level level, const char* text, void*) {
        if (level >= GGML_LOG_LEVEL_WARN) std::fputs(text, stderr);
      },
      nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.use_extra_bufts = false;
  llama_model* model = llama_model_load_from_file(argv[2], mp);
  if (model == nullptr) return 1;
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = static_cast<uint32_t>(prompt.size() + n_new + 16);
  cp.n_batch = cp.n_ctx;
  cp.n_ubatch = cp.n_ctx;
  cp.n_threads = threads;
  cp.n_threads_batch = threads;
  cp.type_k = GGML_TYPE_F32;
  cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) return 1;
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

  if (greedy) {
    std::vector<llama_token> feed = prompt;
    for (int step = 0; step < n_new; ++step) {
      llama_batch batch = llama_batch_get_one(feed.data(), static_cast<int32_t>(feed.size()));
      if (llama_decode(ctx, batch) != 0) return 1;
      const float* logits = llama_get_logits_ith(ctx, -1);
      int best, second;
      TopTwo(logits, n_vocab, &best, &second);
      std::printf("%d %d %d %.6f\n", step, best, second, logits[best] - logits[second]);
      feed.assign(1, best);
    }
  } else {
    const int n = static_cast<int>(prompt.size());
    llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; ++i) {
      batch.token[i] = prompt[i];
      batch.pos[i] = i;
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = 0;
      batch.logits[i] = 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch) != 0) return 1;
    for (int i = 1; i < n; ++i) {
      const float* logits = llama_get_logits_ith(ctx, i - 1);
      int best, second;
      TopTwo(logits, n_vocab, &best, &second);
      double sum = 0;
      for (int v = 0; v < n_vocab; ++v) sum += std::exp(double(logits[v]) - logits[best]);
      const double logprob = double(logits[prompt[i]]) - logits[best] - std::log(sum);
      std::printf("%d %.9f %d %.6f\n", i, logprob, best, logits[best] - logits[second]);
    }
    llama_batch_free(batch);
  }
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
