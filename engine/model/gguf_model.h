// A Llama (dense or MoD) model stored as one GGUF file (DESIGN.md section 3.1): its metadata
// mapped to a ModelConfig under config.json's rules, and its tensors served as a Checkpoint under
// their GGUF names, with llama.cpp's interleaved Q/K rows put back in rotate-half order. It binds
// nothing to ModelWeights (weights.h does) and reads no tokenizer (the tokenizer unit does).
#ifndef MODSERVE_ENGINE_MODEL_GGUF_MODEL_H_
#define MODSERVE_ENGINE_MODEL_GGUF_MODEL_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/model/checkpoint.h"
#include "engine/model/config.h"
#include "engine/model/gguf.h"

namespace modserve::engine {

// The one architecture served; general.architecture must name it.
inline constexpr std::string_view kGgufArchitecture = "llama";
// Prefix of the MoD metadata keys (modserve.mod.format_version, ...; DESIGN.md section 3.1).
inline constexpr std::string_view kGgufModPrefix = "modserve.mod.";

// One metadata key that maps onto a config.json key (both spelled out, for the converter and
// for messages): "llama.block_count" <-> "num_hidden_layers", "modserve.mod.weight_fn" <->
// "mod.weight_fn", ...
struct GgufConfigKey {
  std::string_view gguf_key;
  std::string_view json_key;
};
// Every such key, in DESIGN.md's order.
absl::Span<const GgufConfigKey> GgufConfigKeys();

// Maps `file`'s metadata to a ModelConfig and validates it exactly as ParseConfig validates
// config.json (the same ranges, routed-layer and predictor rules). InvalidArgument, naming the
// metadata key, for: a missing or non-"llama" general.architecture, a missing required key
// (llama.block_count, embedding_length, feed_forward_length, attention.head_count,
// attention.layer_norm_rms_epsilon, context_length; a vocabulary size from llama.vocab_size or
// tokenizer.ggml.tokens), a value of the wrong type or out of range, features the engine does not
// run (RoPE scaling, partial rotary, experts, value length != key length), and any unknown
// `modserve.` key. tie_word_embeddings is true exactly when the file has no output.weight.
absl::StatusOr<ModelConfig> ConfigFromGguf(const GgufFile& file);

// A GGUF model opened for binding: the config and its tensors under their GGUF names.
struct GgufModel {
  ModelConfig config;
  // Tensors by GGUF name ("blk.3.attn_q.weight"), shapes outer to inner (ggml's ne reversed), in
  // the file's dtypes. attn_q/attn_k are copies with their rows un-permuted (GgufRowOfHfRow);
  // everything else points into the mapping.
  Checkpoint checkpoint;
};

// Opens `path`: GgufFile::Open's codes, ConfigFromGguf's, and InvalidArgument naming the tensor
// and the type for a tensor of a ggml type the engine does not hold (anything but F32, F16,
// BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K).
absl::StatusOr<GgufModel> OpenGgufModel(const std::string& path);

// llama.cpp's converter reorders the rows of each head of q_proj and k_proj for its interleaved
// RoPE: row 2i + j of a GGUF head is row j * head_dim / 2 + i of the Hugging Face head (j = 0, 1;
// i < head_dim / 2). This is the GGUF row that holds Hugging Face row `hf_row`.
int64_t GgufRowOfHfRow(int64_t hf_row, int64_t head_dim);

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_MODEL_GGUF_MODEL_H_
