// llama_quantize: writes a GGUF file with llama.cpp's own quantizer (llama_model_quantize), so that
// modserve can be checked and timed on the tensor mixes llama.cpp users download (Q4_K_M, Q5_K_M:
// most matrices Q4_K / Q5_K, some Q6_K) with blocks that modserve's quantizer did not write. Built
// against /tmp/llamacpp's libllama by check_same_tokens.sh and compare.sh (as greedy_ids is), not
// by the modserve build.
//
//   llama_quantize IN.gguf OUT.gguf q5_k_m [threads]
//   (types: q4_k_m, q4_k_s, q5_k_m, q5_k_s, q6_k, q8_0, q4_0, q4_1, q5_0, q5_1; IN is an
//   F32/F16/BF16 GGUF file, such as modserve-quantize --type f16 writes, or an already quantized
//   one, which llama.cpp dequantizes first: tools/fetch_models.sh's SmolLM2 Q4_1 file as a
//   Q4_K_M, whose 576-wide rows take Q5_0 where the K-quants need multiples of 256)
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s IN.gguf OUT.gguf TYPE [threads]\n", argv[0]);
    return 2;
  }
  struct {
    const char* name;
    llama_ftype ftype;
  } const kTypes[] = {{"q4_k_m", LLAMA_FTYPE_MOSTLY_Q4_K_M}, {"q4_k_s", LLAMA_FTYPE_MOSTLY_Q4_K_S},
                      {"q5_k_m", LLAMA_FTYPE_MOSTLY_Q5_K_M}, {"q5_k_s", LLAMA_FTYPE_MOSTLY_Q5_K_S},
                      {"q6_k", LLAMA_FTYPE_MOSTLY_Q6_K},     {"q8_0", LLAMA_FTYPE_MOSTLY_Q8_0},
                      {"q4_0", LLAMA_FTYPE_MOSTLY_Q4_0},     {"q4_1", LLAMA_FTYPE_MOSTLY_Q4_1},
                      {"q5_0", LLAMA_FTYPE_MOSTLY_Q5_0},     {"q5_1", LLAMA_FTYPE_MOSTLY_Q5_1}};
  llama_model_quantize_params params = llama_model_quantize_default_params();
  bool found = false;
  for (const auto& t : kTypes) {
    if (std::strcmp(argv[3], t.name) == 0) {
      params.ftype = t.ftype;
      found = true;
    }
  }
  if (!found) {
    std::fprintf(stderr, "llama_quantize: unknown type '%s'\n", argv[3]);
    return 2;
  }
  params.nthread = argc > 4 ? std::atoi(argv[4]) : 2;
  params.allow_requantize = true;
  llama_backend_init();
  const uint32_t rc = llama_model_quantize(argv[1], argv[2], &params);
  llama_backend_free();
  if (rc != 0) {
    std::fprintf(stderr, "llama_quantize: llama_model_quantize failed (%u)\n", rc);
    return 1;
  }
  return 0;
}
