// ModelWeights: typed views of every tensor a config implies (DESIGN.md section 3), bound from a
// Checkpoint with exact shape checks. It copies, converts and uploads nothing: views point into
// the checkpoint's mapping, in the dtype the file stores (BF16/F16/F32, and in a GGUF file the
// block-quantized types; mixed per tensor).
#ifndef MODSERVE_ENGINE_MODEL_WEIGHTS_H_
#define MODSERVE_ENGINE_MODEL_WEIGHTS_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/common/tensor_view.h"
#include "engine/model/checkpoint.h"
#include "engine/model/config.h"

namespace modserve::engine {

// One transformer block. Linear weights are [out, in] row-major (HF / torch.nn.Linear), so
// y = W x computes y[o] = sum_i W[o, i] * x[i]. Dtype: whatever the file holds (F32/F16/BF16, or
// a block-quantized type from a GGUF file, whose blocks run along each row).
// An empty() view means "absent" (see each field).
struct LayerWeights {
  TensorView input_layernorm;           // [d_model]
  TensorView q_proj;                    // [n_heads * head_dim, d_model]
  TensorView k_proj;                    // [n_kv_heads * head_dim, d_model]
  TensorView v_proj;                    // [n_kv_heads * head_dim, d_model]
  TensorView o_proj;                    // [d_model, n_heads * head_dim]
  TensorView post_attention_layernorm;  // [d_model]
  TensorView gate_proj;                 // [d_ff, d_model]
  TensorView up_proj;                   // [d_ff, d_model]
  TensorView down_proj;                 // [d_model, d_ff]

  // Routed layers only (config.IsRouted(l)); empty otherwise.
  bool routed = false;
  TensorView router_weight;  // [1, d_model]   model.layers.{l}.router.weight
  TensorView router_bias;    // [1]            router.bias; empty unless mod.router.bias

  // Predictor P_l, routed layers of a config with mod.predictor only; empty otherwise.
  // Written as up to two Linear layers so one code path serves both types:
  //   kMlp:    a = act(predictor_hidden_weight x + predictor_hidden_bias)   [p]
  //            z = predictor_out_weight a + predictor_out_bias              [1]
  //   kLinear: z = predictor_out_weight x + predictor_out_bias              [1]
  TensorView predictor_hidden_weight;  // [p, d_model]  aux_router.0.weight; kMlp only
  TensorView predictor_hidden_bias;    // [p]           aux_router.0.bias; kMlp and bias only
  TensorView predictor_out_weight;     // [1, p] aux_router.2.weight (kMlp) or
                                       // [1, d_model] aux_router.weight (kLinear)
  TensorView predictor_out_bias;       // [1]  aux_router.2.bias / aux_router.bias; bias only
};

// A layer's Gemm weights (pointers to its views; const for a const layer), in one order for every
// caller: the seven matrices, then the router and predictor (empty views where it has none).
template <class Layer>
auto GemmWeights(Layer& lw) {
  return std::array{&lw.q_proj,   &lw.k_proj,        &lw.v_proj,
                    &lw.o_proj,   &lw.gate_proj,     &lw.up_proj,
                    &lw.down_proj, &lw.router_weight, &lw.predictor_hidden_weight,
                    &lw.predictor_out_weight};
}

struct ModelWeights {
  TensorView embed_tokens;           // [vocab_size, d_model]
  std::vector<LayerWeights> layers;  // n_layers entries, index = layer l
  TensorView norm;                   // [d_model]  model.norm.weight (RMSNorm_final)
  TensorView lm_head;                // [vocab_size, d_model]; the same view as embed_tokens when
                       // tie_word_embeddings (a stored lm_head.weight is then ignored)
};

// How a checkpoint names its tensors: Hugging Face names in a model directory (DESIGN.md
// section 3: model.layers.{l}.self_attn.q_proj.weight, ...) or llama.cpp's names in a GGUF file
// (section 3.1: blk.{l}.attn_q.weight, ...).
enum class TensorNaming : uint8_t { kHuggingFace, kGguf };

// Binds every tensor `config` implies to a view into `checkpoint`, whose tensors are named as
// `naming` says. The views are valid while `checkpoint` lives (moving it keeps them valid).
// Checks, all returning DataLoss:
//   - every expected tensor exists, with exactly the expected shape (the message names the
//     tensor, the shape found and the shape expected, both outer to inner);
//   - no tensor is left over (the first unexpected name is reported), except, with Hugging Face
//     names, lm_head.weight in a tied model and rotary `*.rotary_emb.inv_freq` buffers, which
//     are ignored;
//   - every router and predictor value is finite (the message names the tensor and the element).
//     The large matrices are not scanned: that would touch every page of the mapping.
absl::StatusOr<ModelWeights> BindWeights(const ModelConfig& config, const Checkpoint& checkpoint,
                                         TensorNaming naming = TensorNaming::kHuggingFace);

// The tensor names a config implies, sorted (lm_head.weight / output.weight only when untied).
// For tools and error messages; BindWeights uses the same list.
std::vector<std::string> ExpectedTensorNames(const ModelConfig& config,
                                             TensorNaming naming = TensorNaming::kHuggingFace);

// One tensor a config implies, under both namings, with its shape (outer to inner). For
// converters between the two layouts.
struct TensorNamePair {
  std::string hf_name;
  std::string gguf_name;
  std::vector<int64_t> shape;
};
// Every tensor `config` implies, sorted by Hugging Face name.
std::vector<TensorNamePair> TensorNameTable(const ModelConfig& config);

// The file a MoD adapter's router and predictor tensors live in, inside the adapter directory.
inline constexpr char kAdapterTensorFile[] = "adapter.safetensors";

// A model (directory, GGUF file or MoD adapter) loaded in one piece: config, mapped checkpoint(s)
// and the weights bound to them.
// Move-only. Moving keeps `weights()` valid because the mapped bytes never move, and the
// accessors are const so a caller cannot swap the checkpoint out from under the views.
// Threads: immutable after LoadModel(); safe to read from any thread.
class LoadedModel {
 public:
  LoadedModel(LoadedModel&&) noexcept = default;
  LoadedModel& operator=(LoadedModel&&) noexcept = default;
  LoadedModel(const LoadedModel&) = delete;
  LoadedModel& operator=(const LoadedModel&) = delete;

  const ModelConfig& config() const { return config_; }
  // The model's tensors; for an adapter, the base model's (the routers are in adapter()).
  const Checkpoint& checkpoint() const { return checkpoint_; }
  const ModelWeights& weights() const { return weights_; }
  // An adapter's adapter.safetensors; nullptr for any other model.
  const Checkpoint* adapter() const { return adapter_ ? &*adapter_ : nullptr; }
  // Where the tokenizer is: the loaded path, or an adapter's base model.
  const std::string& tokenizer_path() const { return tokenizer_path_; }

 private:
  friend absl::StatusOr<LoadedModel> LoadModel(const std::string& path);
  LoadedModel(ModelConfig config, Checkpoint checkpoint, ModelWeights weights,
              std::string tokenizer_path)
      : config_(std::move(config)),
        checkpoint_(std::move(checkpoint)),
        weights_(std::move(weights)),
        tokenizer_path_(std::move(tokenizer_path)) {}

  ModelConfig config_;
  Checkpoint checkpoint_;
  std::optional<Checkpoint> adapter_;
  ModelWeights weights_;
  std::string tokenizer_path_;
};

// Loads a model directory (LoadConfig + Checkpoint::Open + BindWeights) or, when `path` names a
// file (or ends in ".gguf"), a GGUF file (OpenGgufModel + BindWeights with GGUF names), with
// their status codes (InvalidArgument for a bad config.json or GGUF metadata or an unsupported
// tensor type, NotFound for missing files, DataLoss for corrupt or mismatched weights). Every
// message names the file or tensor at fault.
//
// A directory whose config.json has `base_model` is a MoD adapter (DESIGN.md section 3.2): the
// dense base model (a directory or GGUF file, relative to the adapter directory unless absolute)
// is loaded as above, the adapter's `mod` object is validated against it (ApplyAdapter), and the
// router and predictor tensors come from kAdapterTensorFile, every other weight from the base.
// Errors name both files: NotFound when the base model or adapter.safetensors does not exist,
// InvalidArgument for a base that is not dense or a mod object that does not fit it, DataLoss
// for a missing, misshapen (for the base's d_model), non-finite or unexpected adapter tensor.
absl::StatusOr<LoadedModel> LoadModel(const std::string& path);

}  // namespace modserve::engine

#endif  // MODSERVE_ENGINE_MODEL_WEIGHTS_H_
