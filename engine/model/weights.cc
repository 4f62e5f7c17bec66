// Binds checkpoint tensors to ModelWeights. One table (the plan) lists every expected tensor with
// its shape and destination, so the expected-name list and the binding cannot drift apart.
#include "engine/model/weights.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <set>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "engine/common/quant.h"
#include "engine/common/status_macros.h"
#include "engine/model/gguf_model.h"

namespace modserve::engine {
namespace {

struct Slot {
  std::string name;       // under the naming in use
  std::string hf_name;    // Hugging Face name
  std::string gguf_name;  // GGUF name
  std::vector<int64_t> shape;
  TensorView* view;
  bool check_finite;  // routers and predictors: small, and a NaN there silently misroutes (the
                      // norms are checked too, by their shape; an adapter holds only these)
};

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Every tensor `c` implies, pointing into `w` (whose layers are sized here), named as `naming`
// says and sorted by that name.
std::vector<Slot> Plan(const ModelConfig& c, ModelWeights* w, TensorNaming naming) {
  std::vector<Slot> plan;
  auto add = [&](std::string hf, std::string gguf, std::vector<int64_t> shape, TensorView* view,
                 bool check_finite = false) {
    std::string name = naming == TensorNaming::kHuggingFace ? hf : gguf;
    plan.push_back(Slot{std::move(name), std::move(hf), std::move(gguf), std::move(shape), view,
                        check_finite});
  };
  const int64_t d = c.d_model;
  const int64_t q_rows = c.n_heads * c.head_dim;
  const int64_t kv_rows = c.n_kv_heads * c.head_dim;
  add("model.embed_tokens.weight", "token_embd.weight", {c.vocab_size, d}, &w->embed_tokens);
  add("model.norm.weight", "output_norm.weight", {d}, &w->norm);
  if (!c.tie_word_embeddings) {
    add("lm_head.weight", "output.weight", {c.vocab_size, d}, &w->lm_head);
  }
  w->layers.assign(static_cast<size_t>(c.n_layers), LayerWeights{});
  for (int l = 0; l < static_cast<int>(c.n_layers); ++l) {
    LayerWeights& lw = w->layers[static_cast<size_t>(l)];
    const std::string p = absl::StrCat("model.layers.", l, ".");
    const std::string g = absl::StrCat("blk.", l, ".");
    add(p + "input_layernorm.weight", g + "attn_norm.weight", {d}, &lw.input_layernorm);
    add(p + "self_attn.q_proj.weight", g + "attn_q.weight", {q_rows, d}, &lw.q_proj);
    add(p + "self_attn.k_proj.weight", g + "attn_k.weight", {kv_rows, d}, &lw.k_proj);
    add(p + "self_attn.v_proj.weight", g + "attn_v.weight", {kv_rows, d}, &lw.v_proj);
    add(p + "self_attn.o_proj.weight", g + "attn_output.weight", {d, q_rows}, &lw.o_proj);
    add(p + "post_attention_layernorm.weight", g + "ffn_norm.weight", {d},
        &lw.post_attention_layernorm);
    add(p + "mlp.gate_proj.weight", g + "ffn_gate.weight", {c.d_ff, d}, &lw.gate_proj);
    add(p + "mlp.up_proj.weight", g + "ffn_up.weight", {c.d_ff, d}, &lw.up_proj);
    add(p + "mlp.down_proj.weight", g + "ffn_down.weight", {d, c.d_ff}, &lw.down_proj);
    if (!c.IsRouted(l)) continue;
    lw.routed = true;
    const ModConfig& m = *c.mod;
    add(p + "router.weight", g + "mod_router.weight", {1, d}, &lw.router_weight, true);
    if (m.router.bias) {
      add(p + "router.bias", g + "mod_router.bias", {1}, &lw.router_bias, true);
    }
    if (!m.predictor) continue;
    const PredictorConfig& pc = *m.predictor;
    switch (pc.type) {
      case PredictorType::kMlp:
        add(p + "aux_router.0.weight", g + "mod_pred_hidden.weight", {pc.hidden_size, d},
            &lw.predictor_hidden_weight, true);
        add(p + "aux_router.2.weight", g + "mod_pred_out.weight", {1, pc.hidden_size},
            &lw.predictor_out_weight, true);
        if (pc.bias) {
          add(p + "aux_router.0.bias", g + "mod_pred_hidden.bias", {pc.hidden_size},
              &lw.predictor_hidden_bias, true);
          add(p + "aux_router.2.bias", g + "mod_pred_out.bias", {1}, &lw.predictor_out_bias,
              true);
        }
        break;
      case PredictorType::kLinear:
        add(p + "aux_router.weight", g + "mod_pred_out.weight", {1, d}, &lw.predictor_out_weight,
            true);
        if (pc.bias) {
          add(p + "aux_router.bias", g + "mod_pred_out.bias", {1}, &lw.predictor_out_bias, true);
        }
        break;
    }
  }
  // Sorted like the reference loader's checks, so both report the same first problem.
  std::sort(plan.begin(), plan.end(), [](const Slot& a, const Slot& b) { return a.name < b.name; });
  return plan;
}

template <typename T, typename ToFloat>
absl::Status CheckFiniteAs(const TensorView& v, absl::string_view name, ToFloat to_float) {
  const T* data = static_cast<const T*>(v.data);
  const int64_t n = v.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float x = to_float(data[i]);
    if (!std::isfinite(x)) {
      return absl::DataLossError(absl::StrCat("tensor '", name, "' has a non-finite value (", x,
                                              ") at element ", i, " of ", n));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckFinite(const TensorView& v, absl::string_view name) {
  switch (v.dtype) {
    case DType::kF32:
      return CheckFiniteAs<float>(v, name, [](float x) { return x; });
    case DType::kF16:
      return CheckFiniteAs<f16_t>(v, name, F16ToF32);
    case DType::kBF16:
      return CheckFiniteAs<bf16_t>(v, name, Bf16ToF32);
    case DType::kI32:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ4_K:
    case DType::kQ6_K:
    case DType::kQ5_K:
    case DType::kQ5_0:
    case DType::kQ5_1:
      break;
  }
  const std::string_view dtype_name = DTypeName(v.dtype);
  return absl::DataLossError(absl::StrCat("tensor '", name, "' has dtype ",
                                          absl::string_view(dtype_name.data(), dtype_name.size()),
                                          ", not a floating-point type"));
}

// The f16 factors of a quantized type's blocks: where each block holds them, and their names.
struct BlockScales {
  size_t offsets[2];
  const char* names[2];
  int count;
};

BlockScales ScalesOf(DType t) {
  switch (t) {
    case DType::kQ8_0:
      return {{offsetof(quant::BlockQ8_0, d)}, {"scale d"}, 1};
    case DType::kQ4_0:
      return {{offsetof(quant::BlockQ4_0, d)}, {"scale d"}, 1};
    case DType::kQ5_0:
      return {{offsetof(quant::BlockQ5_0, d)}, {"scale d"}, 1};
    case DType::kQ4_1:
      return {{offsetof(quant::BlockQ4_1, d), offsetof(quant::BlockQ4_1, m)},
              {"scale d", "minimum m"},
              2};
    case DType::kQ5_1:
      return {{offsetof(quant::BlockQ5_1, d), offsetof(quant::BlockQ5_1, m)},
              {"scale d", "minimum m"},
              2};
    case DType::kQ4_K:
      return {{offsetof(quant::BlockQ4_K, d), offsetof(quant::BlockQ4_K, dmin)},
              {"scale d", "scale dmin"},
              2};
    case DType::kQ5_K:
      return {{offsetof(quant::BlockQ5_K, d), offsetof(quant::BlockQ5_K, dmin)},
              {"scale d", "scale dmin"},
              2};
    case DType::kQ6_K:
      return {{offsetof(quant::BlockQ6_K, d)}, {"scale d"}, 1};
    default:
      return {{}, {}, 0};
  }
}

// A quantized tensor's block factors. A NaN or an infinity there makes every output of its rows
// NaN, which would otherwise surface only at a request's first token (the sampler's "logit of
// token 0 is nan"); the scan reads 2-4 bytes of each block, not its levels. Float matrices are not
// scanned: that would read every weight at load.
absl::Status CheckScalesFinite(const TensorView& v, absl::string_view name) {
  const BlockScales scales = ScalesOf(v.dtype);
  if (scales.count == 0) return absl::OkStatus();
  const size_t block_bytes = DTypeBlockBytes(v.dtype);
  const int64_t blocks = v.numel() / DTypeBlockElems(v.dtype);
  const uint8_t* data = static_cast<const uint8_t*>(v.data);
  for (int64_t b = 0; b < blocks; ++b) {
    for (int f = 0; f < scales.count; ++f) {
      f16_t h;
      std::memcpy(&h, data + b * block_bytes + scales.offsets[f], sizeof(h));
      if ((h.bits & 0x7c00) == 0x7c00) {  // exponent all ones: an infinity or a NaN
        const float x = F16ToF32(h);
        const std::string_view dtype_name = DTypeName(v.dtype);
        return absl::DataLossError(absl::StrCat(
            "tensor '", name, "' (", absl::string_view(dtype_name.data(), dtype_name.size()),
            ") has a non-finite ", scales.names[f], " (", x, ") in block ", b, " of ", blocks,
            " (elements ", b * DTypeBlockElems(v.dtype), " to ",
            (b + 1) * DTypeBlockElems(v.dtype) - 1, ")"));
      }
    }
  }
  return absl::OkStatus();
}

bool IsIgnored(const ModelConfig& c, TensorNaming naming, absl::string_view name) {
  if (naming == TensorNaming::kGguf) return false;
  return (c.tie_word_embeddings && name == "lm_head.weight") ||
         absl::EndsWith(name, ".rotary_emb.inv_freq");
}

}  // namespace

std::vector<std::string> ExpectedTensorNames(const ModelConfig& config, TensorNaming naming) {
  ModelWeights scratch;
  std::vector<std::string> names;
  for (Slot& s : Plan(config, &scratch, naming)) names.push_back(std::move(s.name));
  return names;
}

std::vector<TensorNamePair> TensorNameTable(const ModelConfig& config) {
  ModelWeights scratch;
  std::vector<TensorNamePair> table;
  for (Slot& s : Plan(config, &scratch, TensorNaming::kHuggingFace)) {
    table.push_back({std::move(s.hf_name), std::move(s.gguf_name), std::move(s.shape)});
  }
  return table;
}

absl::StatusOr<ModelWeights> BindWeights(const ModelConfig& config, const Checkpoint& checkpoint,
                                         TensorNaming naming) {
  // Each layer has 9 tensors: a config whose layer count the file cannot back is refused before
  // anything is sized from it (a hostile num_hidden_layers would otherwise allocate terabytes).
  const int64_t min_tensors = 9 * config.n_layers + 2;
  if (checkpoint.num_tensors() < min_tensors) {
    const bool hf = naming == TensorNaming::kHuggingFace;
    return absl::DataLossError(absl::StrCat(
        hf ? "config.json" : "the GGUF metadata (llama.block_count)", " has ", config.n_layers,
        " layers (", hf ? "model.layers." : "blk.", "0 to ", hf ? "model.layers." : "blk.",
        config.n_layers - 1, ", at least ", min_tensors, " tensors), but the checkpoint holds only ",
        checkpoint.num_tensors(), " tensors"));
  }
  ModelWeights w;
  const std::vector<Slot> plan = Plan(config, &w, naming);
  std::set<std::string_view> expected;
  for (const Slot& s : plan) {
    const TensorInfo* info = checkpoint.Find(s.name);
    if (info == nullptr) {
      return absl::DataLossError(absl::StrCat("checkpoint is missing tensor '", s.name,
                                              "' (expected shape ", ShapeString(s.shape), ")"));
    }
    // Errors about one tensor's content name its file (one of several shards, perhaps).
    if (info->shape != s.shape) {
      return absl::DataLossError(absl::StrCat(info->file, ": tensor '", s.name, "' has shape ",
                                              ShapeString(info->shape), ", expected ",
                                              ShapeString(s.shape)));
    }
    MODSERVE_ASSIGN_OR_RETURN(*s.view, checkpoint.Get(s.name));
    // Routers and predictors, and the 1-D tensors (the norms' weights: d values each), are read
    // in full; the matrices only in their quantized blocks' factors.
    absl::Status st = s.check_finite || s.shape.size() == 1 ? CheckFinite(*s.view, s.name)
                                                            : CheckScalesFinite(*s.view, s.name);
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat(info->file, ": ", st.message()));
    expected.insert(s.name);
  }
  std::vector<std::string> unexpected;
  for (const std::string& name : checkpoint.Names()) {
    if (expected.count(name) == 0 && !IsIgnored(config, naming, name)) {
      unexpected.push_back(name);
    }
  }
  if (!unexpected.empty()) {
    return absl::DataLossError(absl::StrCat(
        "unexpected tensor '", unexpected.front(), "'",
        unexpected.size() > 1 ? absl::StrCat(" (and ", unexpected.size() - 1, " more)") : ""));
  }
  if (config.tie_word_embeddings) w.lm_head = w.embed_tokens;
  return w;
}

namespace {

bool IsGgufPath(const std::string& path) {
  std::error_code ec;
  return absl::EndsWith(path, ".gguf") ||
         (std::filesystem::exists(path, ec) && !std::filesystem::is_directory(path, ec));
}

// A model directory or a GGUF file (not an adapter): its config, checkpoint and weights.
struct Parts {
  ModelConfig config;
  Checkpoint checkpoint;
  ModelWeights weights;
  TensorNaming naming;
};

absl::StatusOr<Parts> LoadParts(const std::string& path) {
  if (IsGgufPath(path)) {
    MODSERVE_ASSIGN_OR_RETURN(GgufModel m, OpenGgufModel(path));
    absl::StatusOr<ModelWeights> weights = BindWeights(m.config, m.checkpoint, TensorNaming::kGguf);
    if (!weights.ok()) {
      // Messages about one tensor start with the file's name: the path replaces it.
      const std::string name = std::filesystem::path(path).filename().string() + ": ";
      absl::string_view msg = weights.status().message();
      if (absl::StartsWith(msg, name)) msg.remove_prefix(name.size());
      return absl::Status(weights.status().code(), absl::StrCat(path, ": ", msg));
    }
    return Parts{std::move(m.config), std::move(m.checkpoint), *std::move(weights),
                 TensorNaming::kGguf};
  }
  const std::string& model_dir = path;
  MODSERVE_ASSIGN_OR_RETURN(ModelConfig config, LoadConfig(model_dir));
  MODSERVE_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::Open(model_dir));
  absl::StatusOr<ModelWeights> weights = BindWeights(config, checkpoint);
  if (!weights.ok()) {
    return absl::Status(weights.status().code(),
                        absl::StrCat(model_dir, ": ", weights.status().message()));
  }
  return Parts{std::move(config), std::move(checkpoint), *std::move(weights),
               TensorNaming::kHuggingFace};
}

// The weights of adapter `config` (the base's config plus the adapter's mod object): the base's
// views, with every router and predictor tensor bound from `adapter` (Hugging Face names).
absl::StatusOr<ModelWeights> BindAdapterWeights(const ModelConfig& config, const Parts& base,
                                                const Checkpoint& adapter,
                                                const std::string& adapter_file,
                                                const std::string& base_path) {
  ModelWeights w;
  const std::vector<Slot> plan = Plan(config, &w, TensorNaming::kHuggingFace);
  std::set<std::string_view> expected;
  for (const Slot& s : plan) {
    if (!s.check_finite) {
      // A dense tensor: the base's view, bound (and checked) when the base was loaded.
      const std::string& name = base.naming == TensorNaming::kGguf ? s.gguf_name : s.hf_name;
      MODSERVE_ASSIGN_OR_RETURN(*s.view, base.checkpoint.Get(name));
      continue;
    }
    const TensorInfo* info = adapter.Find(s.hf_name);
    if (info == nullptr) {
      return absl::DataLossError(absl::StrCat(adapter_file, ": missing tensor '", s.hf_name,
                                              "' (expected shape ", ShapeString(s.shape),
                                              " for the base model ", base_path, ")"));
    }
    if (info->shape != s.shape) {
      return absl::DataLossError(absl::StrCat(
          adapter_file, ": tensor '", s.hf_name, "' has shape ", ShapeString(info->shape),
          ", but the base model ", base_path, " needs ", ShapeString(s.shape)));
    }
    MODSERVE_ASSIGN_OR_RETURN(*s.view, adapter.Get(s.hf_name));
    if (absl::Status st = CheckFinite(*s.view, s.hf_name); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat(adapter_file, ": ", st.message()));
    }
    expected.insert(s.hf_name);
  }
  for (const std::string& name : adapter.Names()) {
    if (expected.count(name) == 0) {
      return absl::DataLossError(absl::StrCat(adapter_file, ": unexpected tensor '", name,
                                              "' (an adapter holds only router and predictor "
                                              "tensors of its routed layers)"));
    }
  }
  if (config.tie_word_embeddings) w.lm_head = w.embed_tokens;
  return w;
}

}  // namespace

absl::StatusOr<LoadedModel> LoadModel(const std::string& path) {
  if (IsGgufPath(path) || !IsAdapterDir(path)) {
    MODSERVE_ASSIGN_OR_RETURN(Parts p, LoadParts(path));
    return LoadedModel(std::move(p.config), std::move(p.checkpoint), std::move(p.weights), path);
  }
  // A MoD adapter: the dense base model plus the routers.
  MODSERVE_ASSIGN_OR_RETURN(const AdapterConfig a, LoadAdapterConfig(path));
  const std::string config_file = path + "/config.json";
  std::error_code ec;
  if (!std::filesystem::exists(a.base_path, ec)) {
    return absl::NotFoundError(absl::StrCat(config_file, ": base model '", a.base_model, "' (",
                                            a.base_path, ") does not exist"));
  }
  if (!IsGgufPath(a.base_path) && IsAdapterDir(a.base_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        config_file, ": base model ", a.base_path, " is itself an adapter; an adapter's base "
        "must be a dense checkpoint directory or GGUF file"));
  }
  absl::StatusOr<Parts> base = LoadParts(a.base_path);
  if (!base.ok()) {
    return absl::Status(base.status().code(),
                        absl::StrCat(config_file, ": base model: ", base.status().message()));
  }
  MODSERVE_ASSIGN_OR_RETURN(ModelConfig config, ApplyAdapter(base->config, a, path));
  const std::string adapter_file = path + "/" + kAdapterTensorFile;
  if (!std::filesystem::exists(adapter_file, ec)) {
    return absl::NotFoundError(absl::StrCat(adapter_file, ": no such file (the routers of the "
                                            "adapter for ", a.base_path, ")"));
  }
  MODSERVE_ASSIGN_OR_RETURN(Checkpoint adapter, Checkpoint::OpenFile(adapter_file));
  MODSERVE_ASSIGN_OR_RETURN(ModelWeights weights,
                            BindAdapterWeights(config, *base, adapter, adapter_file, a.base_path));
  LoadedModel m(std::move(config), std::move(base->checkpoint), std::move(weights), a.base_path);
  m.adapter_ = std::move(adapter);
  return m;
}

}  // namespace modserve::engine
