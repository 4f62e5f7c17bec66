// The forward pass: model order, one op call per line, for every backend.
#include "engine/model/transformer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"

namespace modserve::engine {
namespace {

backend::WeightFn ToBackend(WeightFn w) {
  switch (w) {
    case WeightFn::kIdentity:
      return backend::WeightFn::kIdentity;
    case WeightFn::kSigmoid:
      return backend::WeightFn::kSigmoid;
    case WeightFn::kOne:
      return backend::WeightFn::kOne;
  }
  return backend::WeightFn::kIdentity;
}

backend::ScaleTarget ToBackend(ScaleTarget t) {
  switch (t) {
    case ScaleTarget::kUpdate:
      return backend::ScaleTarget::kUpdate;
    case ScaleTarget::kBlockOutput:
      return backend::ScaleTarget::kBlockOutput;
  }
  return backend::ScaleTarget::kUpdate;
}

backend::ActivationKind ToBackend(Activation a) {
  switch (a) {
    case Activation::kSilu:
      return backend::ActivationKind::kSilu;
    case Activation::kGelu:
      return backend::ActivationKind::kGelu;
    case Activation::kRelu:
      return backend::ActivationKind::kRelu;
  }
  return backend::ActivationKind::kSilu;
}

// Host vector -> the first v.size() elements of an I32/F32 device buffer.
template <typename T>
absl::Status Upload(backend::Backend* be, const std::vector<T>& host, size_t count,
                    const backend::DeviceBuffer& dst, DType dtype) {
  if (count == 0) return absl::OkStatus();
  TensorView src(const_cast<T*>(host.data()), dtype, {static_cast<int64_t>(count)});
  return be->CopyToDevice(src, dst.View(dtype, {static_cast<int64_t>(count)}));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transformer>> Transformer::Create(
    const ModelConfig& config, const ModelWeights& weights, backend::Backend* backend,
    KvCacheManager* kv, const TransformerOptions& options) {
  if (options.max_batch_tokens < 1 || options.max_seqs < 1 || options.block_size < 1 ||
      options.num_pages < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transformer options must be positive: max_batch_tokens=", options.max_batch_tokens,
        " max_seqs=", options.max_seqs, " block_size=", options.block_size,
        " num_pages=", options.num_pages));
  }
  if (!backend->Supports(backend::OpKind::kAttention, options.kv_dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("backend '", std::string(backend->name()),
                                                   "' does not support KV dtype ",
                                                   std::string(DTypeName(options.kv_dtype))));
  }
  // Every weight must be of a dtype the backend runs. A bias may have any float dtype
  // (DESIGN.md allows mixed dtypes): one that differs from its weight's is widened to F32 below.
  auto check = [&](const TensorView& w, const TensorView& b, backend::OpKind op,
                   const std::string& name) -> absl::Status {
    if (!backend->Supports(op, w.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("backend '", std::string(backend->name()),
                                                     "' cannot run ", name, " stored as ",
                                                     std::string(DTypeName(w.dtype))));
    }
    if (!b.empty() && (DTypeIsQuantized(b.dtype) || b.dtype == DType::kI32)) {
      return absl::DataLossError(absl::StrCat(name, ": bias is ", std::string(DTypeName(b.dtype)),
                                              "; a bias must be F32, F16 or BF16"));
    }
    return absl::OkStatus();
  };
  MODSERVE_RETURN_IF_ERROR(
      check(weights.embed_tokens, {}, backend::OpKind::kEmbed, "model.embed_tokens.weight"));
  MODSERVE_RETURN_IF_ERROR(check(weights.lm_head, {}, backend::OpKind::kGemm, "lm_head.weight"));
  MODSERVE_RETURN_IF_ERROR(check(weights.norm, {}, backend::OpKind::kRmsNorm, "model.norm.weight"));
  for (int l = 0; l < config.n_layers; ++l) {
    const LayerWeights& lw = weights.layers[l];
    const std::string p = absl::StrCat("model.layers.", l, ".");
    for (const auto& [w, name] : {std::pair{lw.q_proj, "self_attn.q_proj"},
                                  {lw.k_proj, "self_attn.k_proj"},
                                  {lw.v_proj, "self_attn.v_proj"},
                                  {lw.o_proj, "self_attn.o_proj"},
                                  {lw.gate_proj, "mlp.gate_proj"},
                                  {lw.up_proj, "mlp.up_proj"},
                                  {lw.down_proj, "mlp.down_proj"}}) {
      MODSERVE_RETURN_IF_ERROR(check(w, {}, backend::OpKind::kGemm, p + name + ".weight"));
    }
    MODSERVE_RETURN_IF_ERROR(
        check(lw.input_layernorm, {}, backend::OpKind::kRmsNorm, p + "input_layernorm.weight"));
    MODSERVE_RETURN_IF_ERROR(check(lw.post_attention_layernorm, {}, backend::OpKind::kRmsNorm,
                                   p + "post_attention_layernorm.weight"));
    if (!lw.routed) continue;
    MODSERVE_RETURN_IF_ERROR(
        check(lw.router_weight, lw.router_bias, backend::OpKind::kGemm, p + "router.weight"));
    if (!lw.predictor_hidden_weight.empty()) {
      MODSERVE_RETURN_IF_ERROR(check(lw.predictor_hidden_weight, lw.predictor_hidden_bias,
                                     backend::OpKind::kGemm, p + "aux_router.0.weight"));
    }
    if (!lw.predictor_out_weight.empty()) {
      MODSERVE_RETURN_IF_ERROR(check(lw.predictor_out_weight, lw.predictor_out_bias,
                                     backend::OpKind::kGemm, p + "aux_router (output).weight"));
    }
  }
  std::unique_ptr<Transformer> t(new Transformer(config, weights, backend, kv, options));
  MODSERVE_RETURN_IF_ERROR(t->PrepareGemmWeights());
  MODSERVE_RETURN_IF_ERROR(t->AllocateBuffers());
  MODSERVE_RETURN_IF_ERROR(t->PrepareBiases());
  MODSERVE_RETURN_IF_ERROR(t->UploadWeights());
  return t;
}

absl::Status Transformer::UploadWeights() {
  if (backend_->device() == Device::kCpu) return absl::OkStatus();
  std::map<std::pair<const void*, size_t>, void*> copies;  // (host data, bytes) -> device data
  auto upload = [&](TensorView& v) -> absl::Status {
    if (v.empty() || v.device != Device::kCpu) return absl::OkStatus();
    auto it = copies.find({v.data, v.bytes()});
    if (it == copies.end()) {
      MODSERVE_ASSIGN_OR_RETURN(const TensorView dst, CopyToOwnedBuffer(v));
      it = copies.emplace(std::pair{v.data, v.bytes()}, dst.data).first;
    }
    v.data = it->second;
    v.device = backend_->device();
    return absl::OkStatus();
  };
  MODSERVE_RETURN_IF_ERROR(upload(weights_.embed_tokens));
  MODSERVE_RETURN_IF_ERROR(upload(weights_.lm_head));
  MODSERVE_RETURN_IF_ERROR(upload(weights_.norm));
  for (LayerWeights& lw : weights_.layers) {
    for (TensorView* v : {&lw.input_layernorm, &lw.post_attention_layernorm, &lw.router_bias,
                          &lw.predictor_hidden_bias, &lw.predictor_out_bias}) {
      MODSERVE_RETURN_IF_ERROR(upload(*v));
    }
    for (TensorView* v : GemmWeights(lw)) MODSERVE_RETURN_IF_ERROR(upload(*v));
  }
  for (Biases& b : biases_) {
    for (TensorView* v : {&b.router, &b.predictor_hidden, &b.predictor_out}) {
      MODSERVE_RETURN_IF_ERROR(upload(*v));
    }
  }
  // The copies read the mapped file: finish them before the engine releases its pages.
  return backend_->Synchronize();
}

absl::StatusOr<TensorView> Transformer::PrepareBias(const TensorView& w, const TensorView& b) {
  if (b.empty() || b.dtype == w.dtype || b.dtype == DType::kF32) return b;
  const int64_t m = b.numel();
  std::vector<float> host(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) {
    host[i] = b.dtype == DType::kF16 ? F16ToF32(static_cast<const f16_t*>(b.data)[i])
                                     : Bf16ToF32(static_cast<const bf16_t*>(b.data)[i]);
  }
  return CopyToOwnedBuffer(TensorView(host.data(), DType::kF32, {m}));
}

absl::StatusOr<TensorView> Transformer::CopyToOwnedBuffer(const TensorView& host) {
  MODSERVE_ASSIGN_OR_RETURN(backend::DeviceBuffer buf, backend_->Allocate(host.bytes()));
  TensorView dst = host;
  dst.data = buf.data();
  dst.device = buf.device();
  MODSERVE_RETURN_IF_ERROR(backend_->CopyToDevice(host, dst));
  owned_buffers_.push_back(std::move(buf));
  return dst;
}

absl::Status Transformer::PrepareGemmWeights() {
  auto prepare = [&](TensorView& w) -> absl::Status {
    if (w.empty()) return absl::OkStatus();
    const TensorView held = w;
    MODSERVE_ASSIGN_OR_RETURN(w, backend_->PrepareGemmWeight(w));
    if (w.data != held.data && options_.on_weight_copied) options_.on_weight_copied(held);
    return absl::OkStatus();
  };
  MODSERVE_RETURN_IF_ERROR(prepare(weights_.lm_head));
  for (LayerWeights& lw : weights_.layers) {
    for (TensorView* w : GemmWeights(lw)) MODSERVE_RETURN_IF_ERROR(prepare(*w));
  }
  return absl::OkStatus();
}

absl::Status Transformer::PrepareBiases() {
  biases_.resize(static_cast<size_t>(config_.n_layers));
  for (int l = 0; l < config_.n_layers; ++l) {
    const LayerWeights& lw = weights_.layers[l];
    if (!lw.routed) continue;
    MODSERVE_ASSIGN_OR_RETURN(biases_[l].router, PrepareBias(lw.router_weight, lw.router_bias));
    MODSERVE_ASSIGN_OR_RETURN(biases_[l].predictor_hidden,
                              PrepareBias(lw.predictor_hidden_weight, lw.predictor_hidden_bias));
    MODSERVE_ASSIGN_OR_RETURN(biases_[l].predictor_out,
                              PrepareBias(lw.predictor_out_weight, lw.predictor_out_bias));
  }
  return absl::OkStatus();
}

absl::Status Transformer::AllocateBuffers() {
  const int64_t T = options_.max_batch_tokens;
  const int64_t d = config_.d_model, hd = config_.head_dim;
  const int64_t p = config_.mod && config_.mod->predictor
                        ? std::max<int64_t>(1, config_.mod->predictor->hidden_size)
                        : 1;
  // A sequence holds at most what fits its positions, and never more pages than the pool has:
  // a huge max_seq_len must not size the page table beyond the cache.
  max_pages_per_seq_ =
      std::min<int64_t>((config_.max_seq_len + options_.block_size - 1) / options_.block_size + 1,
                        options_.num_pages);
  auto alloc = [&](backend::DeviceBuffer& buf, int64_t elems, size_t elem_bytes) -> absl::Status {
    MODSERVE_ASSIGN_OR_RETURN(buf, backend_->Allocate(static_cast<size_t>(elems) * elem_bytes));
    return absl::OkStatus();
  };
  const int64_t pool_elems =
      int64_t{options_.num_pages} * 2 * config_.n_kv_heads * options_.block_size * hd;
  MODSERVE_RETURN_IF_ERROR(alloc(kv_pool_, pool_elems, DTypeBytes(options_.kv_dtype)));
  MODSERVE_RETURN_IF_ERROR(alloc(x_, T * d, 4));
  MODSERVE_RETURN_IF_ERROR(alloc(xs_, T * d, 4));
  MODSERVE_RETURN_IF_ERROR(alloc(a_, T * d, 4));
  MODSERVE_RETURN_IF_ERROR(alloc(q_, T * config_.n_heads * hd, 4));
  MODSERVE_RETURN_IF_ERROR(alloc(k_, T * config_.n_kv_heads * hd, 4));
  MODSERVE_RETURN_IF_ERROR(alloc(v_, T * config_.n_kv_heads * hd, 4));
  MODSERVE_RETURN_IF_ERROR(alloc(att_, T * config_.n_heads * hd, 4));
  MODSERVE_RETURN_IF_ERROR(alloc(o_, T * d, 4));
  MODSERVE_RETURN_IF_ERROR(alloc(gate_, T * config_.d_ff, 4));
  MODSERVE_RETURN_IF_ERROR(alloc(up_, T * config_.d_ff, 4));
  MODSERVE_RETURN_IF_ERROR(alloc(s_, T, 4));
  MODSERVE_RETURN_IF_ERROR(alloc(z_, T, 4));
  MODSERVE_RETURN_IF_ERROR(alloc(ph_, T * p, 4));
  MODSERVE_RETURN_IF_ERROR(alloc(s_sel_, T, 4));
  const int64_t num_routed =
      config_.mod ? static_cast<int64_t>(config_.mod->routed_layers.size()) : 0;
  MODSERVE_RETURN_IF_ERROR(alloc(zcut_, T, 4));
  MODSERVE_RETURN_IF_ERROR(alloc(route_, 1 + T, 4));
  MODSERVE_RETURN_IF_ERROR(alloc(probs_, std::max<int64_t>(1, num_routed) * T, 4));
  h_zcut_.resize(T);
  h_route_.resize(1 + T);
  h_probs_.resize(static_cast<size_t>(std::max<int64_t>(1, num_routed) * T));
  // Logits are asked for one row per sequence, except by prompt logprobs and speculative
  // verification: start at max_seqs rows and grow to what a step asks for (EnsureLogitRows).
  logit_rows_ = std::min<int64_t>(T, options_.max_seqs);
  MODSERVE_RETURN_IF_ERROR(alloc(logits_, logit_rows_ * config_.vocab_size, 4));
  for (backend::DeviceBuffer* b : {&ids_, &idx_, &pos_, &slots_, &row_seq_, &row_kv_len_}) {
    MODSERVE_RETURN_IF_ERROR(alloc(*b, T, 4));
  }
  MODSERVE_RETURN_IF_ERROR(alloc(page_table_, int64_t{options_.max_seqs} * max_pages_per_seq_, 4));
  for (auto* v : {&h_ids_, &h_idx_, &h_pos_, &h_slots_, &h_row_seq_, &h_row_kv_len_}) {
    v->resize(T);
  }
  h_page_table_.resize(static_cast<size_t>(options_.max_seqs) * max_pages_per_seq_);
  h_pages_.resize(static_cast<size_t>(options_.max_seqs));
  return absl::OkStatus();
}

absl::Status Transformer::EnsureLogitRows(int64_t rows) {
  if (rows <= logit_rows_) return absl::OkStatus();
  // Doubling bounds the reallocations to a few over the server's life; never past max_batch_tokens.
  const int64_t grown =
      std::min<int64_t>(options_.max_batch_tokens, std::max(rows, 2 * logit_rows_));
  const size_t bytes = static_cast<size_t>(grown * config_.vocab_size) * 4;
  absl::StatusOr<backend::DeviceBuffer> buf = backend_->Allocate(bytes);
  if (!buf.ok()) {
    return absl::Status(buf.status().code(),
                        absl::StrCat("logits of ", rows, " rows: ", buf.status().message()));
  }
  DropGraphs();  // they name the old buffer
  logits_ = *std::move(buf);
  logit_rows_ = grown;
  return absl::OkStatus();
}

void Transformer::RouteScores(int layer, int64_t n) {
  const LayerWeights& lw = weights_.layers[layer];
  const ModConfig& mod = *config_.mod;
  const int64_t d = config_.d_model;
  const TensorView x = x_.View(DType::kF32, {n, d});
  const TensorView s = s_.View(DType::kF32, {n, 1});
  // s = w . u + b, u = x or RMSNorm_in(x)
  TensorView u = x;
  if (mod.router.input == RouterInput::kInputLayernorm) {
    u = a_.View(DType::kF32, {n, d});
    backend_->RmsNorm({static_cast<float>(config_.rms_norm_eps)}, x, lw.input_layernorm, u);
  }
  const Biases& bias = biases_[layer];
  const backend::GemmOperand router{lw.router_weight, bias.router, s};
  TensorView z = s;
  if (mod.inference_routing == InferenceRouting::kPredictorThreshold) {
    // z = P(x): Linear -> act -> Linear, or one Linear. Its first Linear reads x, as the router
    // does when it takes the residual stream: one group then.
    z = z_.View(DType::kF32, {n, 1});
    const bool mlp = mod.predictor->type == PredictorType::kMlp;
    const TensorView ph =
        mlp ? ph_.View(DType::kF32, {n, mod.predictor->hidden_size}) : TensorView();
    const backend::GemmOperand first =
        mlp ? backend::GemmOperand{lw.predictor_hidden_weight, bias.predictor_hidden, ph}
            : backend::GemmOperand{lw.predictor_out_weight, bias.predictor_out, z};
    if (u.data == x.data) {
      backend_->GemmGroup(x, {router, first});
    } else {
      backend_->Gemm(u, router.w, router.bias, router.out);
      backend_->Gemm(x, first.w, first.bias, first.out);
    }
    if (mlp) {
      backend_->Activation({ToBackend(mod.predictor->activation)}, ph);
      backend_->Gemm(ph, lw.predictor_out_weight, bias.predictor_out, z);
    }
  } else {
    backend_->Gemm(u, router.w, router.bias, router.out);
  }
}

void Transformer::RunBlock(int layer, const TensorView& rows, int64_t m, const BlockIndex& ix) {
  const LayerWeights& lw = weights_.layers[layer];
  const int64_t d = config_.d_model, hd = config_.head_dim;
  const int64_t H = config_.n_heads, KV = config_.n_kv_heads, f = config_.d_ff;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const TensorView a = a_.View(DType::kF32, {m, d});
  const TensorView q2 = q_.View(DType::kF32, {m, H * hd});
  const TensorView k2 = k_.View(DType::kF32, {m, KV * hd});
  const TensorView v2 = v_.View(DType::kF32, {m, KV * hd});
  const TensorView att = att_.View(DType::kF32, {m, H * hd});
  const TensorView o = o_.View(DType::kF32, {m, d});
  const TensorView gate = gate_.View(DType::kF32, {m, f});
  const TensorView up = up_.View(DType::kF32, {m, f});
  const TensorView pool =
      kv_pool_.View(options_.kv_dtype, {options_.num_pages, 2 * KV, options_.block_size, hd});
  const backend::RopeParams rope{static_cast<int>(H), static_cast<int>(KV), static_cast<int>(hd),
                                 config_.rope_theta, options_.block_size};
  const backend::AttentionParams attn{static_cast<int>(H), static_cast<int>(KV),
                                      static_cast<int>(hd), options_.block_size,
                                      1.0f / std::sqrt(static_cast<float>(hd))};

  // h = x + Attn(RMSNorm_in(x))
  backend_->RmsNorm({eps}, rows, lw.input_layernorm, a);
  backend_->GemmGroup(a, {{lw.q_proj, {}, q2}, {lw.k_proj, {}, k2}, {lw.v_proj, {}, v2}});
  backend_->RopeAndAppendKv(rope, q_.View(DType::kF32, {m, H, hd}),
                            k_.View(DType::kF32, {m, KV, hd}), v_.View(DType::kF32, {m, KV, hd}),
                            ix.pos, ix.slots, pool);
  const TensorView q3 = q_.View(DType::kF32, {m, H, hd});
  if (ix.segments.empty()) {
    backend_->Attention(attn, q3, pool, ix.page_table, ix.row_seq, ix.row_kv_len, att);
  }
  for (const AttnSegment& g : ix.segments) {
    backend::AttentionParams seg = attn;
    seg.prompt = g.prompt;
    const int64_t rows_n = g.end - g.begin;
    backend_->Attention(seg, q3.rows(g.begin, rows_n), pool, ix.page_table,
                        ix.row_seq.rows(g.begin, rows_n), ix.row_kv_len.rows(g.begin, rows_n),
                        att.rows(g.begin, rows_n));
  }
  backend_->Gemm(att, lw.o_proj, {}, o);
  backend_->Add(rows, o, rows);
  // y = h + MLP(RMSNorm_post(h)), MLP(z) = down(silu(gate(z)) * up(z))
  backend_->RmsNorm({eps}, rows, lw.post_attention_layernorm, a);
  backend_->GemmGroup(a, {{lw.gate_proj, {}, gate}, {lw.up_proj, {}, up}});
  backend_->SwiGlu(gate, up, gate);
  backend_->Gemm(gate, lw.down_proj, {}, o);
  backend_->Add(rows, o, rows);
}

absl::StatusOr<StepOutput> Transformer::Step(absl::Span<const StepSequence> seqs) {
  const int64_t num_seqs = static_cast<int64_t>(seqs.size());
  const int L = static_cast<int>(config_.n_layers);
  const int64_t d = config_.d_model;
  if (num_seqs == 0) return absl::InvalidArgumentError("step has no sequences");
  if (num_seqs > options_.max_seqs) {
    return absl::InvalidArgumentError(
        absl::StrCat("step has ", num_seqs, " sequences, more than max_seqs ", options_.max_seqs));
  }
  StepOutput out;
  out.row_offsets.push_back(0);
  h_prompt_row_.clear();
  for (const StepSequence& s : seqs) {
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    if (n == 0)
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s.seq_id, " has no tokens"));
    if (s.start_pos < 0 || s.start_pos + n > config_.max_seq_len) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s.seq_id, ": positions up to ",
                                                     s.start_pos + n, " exceed max_seq_len ",
                                                     config_.max_seq_len));
    }
    // 1 is allowed: nothing is selected (a speculative draft that skips every routed layer).
    if (!(s.threshold > 0.0 && s.threshold <= 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", s.seq_id, ": threshold ", s.threshold, " is not in (0, 1]"));
    }
    for (int32_t t : s.tokens) {
      if (t < 0 || t >= config_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", s.seq_id, ": token id ", t,
                                                       " outside the vocabulary [0, ",
                                                       config_.vocab_size, ")"));
      }
    }
    out.row_offsets.push_back(out.row_offsets.back() + static_cast<int32_t>(n));
    for (int64_t t = 0; t < n; ++t) {
      h_prompt_row_.push_back(s.start_pos + t < s.prompt_len ? 1 : 0);
    }
  }
  const int64_t N = out.row_offsets.back();
  if (N > options_.max_batch_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step has ", N, " tokens, more than max_batch_tokens ", options_.max_batch_tokens));
  }
  for (int64_t i = 0; i < num_seqs; ++i) {
    for (int64_t j = 0; j < i; ++j) {
      if (seqs[i].seq_id == seqs[j].seq_id) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", seqs[i].seq_id, " appears twice in one step"));
      }
    }
  }

  if (UseDeviceStep()) {
    MODSERVE_ASSIGN_OR_RETURN(std::optional<StepOutput> done, DeviceStep(seqs, out));
    if (done.has_value()) return *std::move(done);
  }

  // Dense layers store every new token: reserve their room before computing anything. A routed
  // layer's room is reserved once its routing is known (below), so a MoD step never holds pages
  // for tokens that skip the layer. If that later reservation fails, everything reserved in this
  // step goes back and the step fails whole (nothing committed), as it would up front.
  std::vector<ReservedSlots> reserved;
  std::vector<std::vector<int32_t>> base;
  MODSERVE_RETURN_IF_ERROR(ReserveStep(seqs, /*routed_layers=*/false, &reserved, &base));
  std::vector<std::vector<int32_t>> used(num_seqs, std::vector<int32_t>(L, 0));
  auto fail = [&](absl::Status st) {
    ReleaseReservations(seqs, num_seqs);
    return st;
  };
  // Slots of one routed layer, per sequence: reserved when that layer's routing is known, with
  // counts naming that layer alone.
  std::vector<ReservedSlots> routed_reserved(num_seqs);
  std::vector<int32_t> counts(L, 0);

  // x = embed_tokens[ids]
  for (int64_t i = 0, r = 0; i < num_seqs; ++i) {
    for (int32_t t : seqs[i].tokens) h_ids_[r++] = t;
  }
  if (auto st = Upload(backend_, h_ids_, N, ids_, DType::kI32); !st.ok()) return fail(st);
  const TensorView x = x_.View(DType::kF32, {N, d});
  backend_->Embed(ids_.View(DType::kI32, {N}), weights_.embed_tokens, x);

  const int num_routed = config_.mod ? static_cast<int>(config_.mod->routed_layers.size()) : 0;
  out.selected.assign(num_routed, std::vector<uint8_t>(N));
  out.probs.assign(num_routed, std::vector<float>(N));
  int routed_idx = 0;
  for (int l = 0; l < L; ++l) {
    const bool routed = config_.IsRouted(l);
    // Rows that run the block: all of them, or those routed in.
    int64_t m = 0;
    if (routed) {
      // Decided where z lives; the cut makes RouteSelect's f32 comparison the reference's f64
      // rule on every backend (section 5.1).
      RouteScores(l, N);
      for (int64_t i = 0; i < num_seqs; ++i) {
        const float cut = ZCut(routed_idx, seqs[i].threshold);
        std::fill(h_zcut_.begin() + out.row_offsets[i], h_zcut_.begin() + out.row_offsets[i + 1],
                  cut);
      }
      if (auto st = Upload(backend_, h_zcut_, N, zcut_, DType::kF32); !st.ok()) return fail(st);
      const bool z_is_s = config_.mod->inference_routing != InferenceRouting::kPredictorThreshold;
      backend_->RouteSelect((z_is_s ? s_ : z_).View(DType::kF32, {N}), zcut_.View(DType::kF32, {N}),
                            s_.View(DType::kF32, {N}),
                            probs_.View(DType::kF32, {N}, static_cast<size_t>(routed_idx * N) * 4),
                            route_.View(DType::kI32, {N}, 4), s_sel_.View(DType::kF32, {N}),
                            route_.View(DType::kI32, {1}));
      // The one download this layer needs: the count and the routed rows, for the KV
      // reservation and the slots below.
      if (auto st = backend_->CopyToHost(route_.View(DType::kI32, {1 + N}),
                                         TensorView(h_route_.data(), DType::kI32, {1 + N}));
          !st.ok()) {
        return fail(st);
      }
      m = h_route_[0];
      MODSERVE_CHECK(m >= 0 && m <= N) << "RouteSelect count " << m << " of " << N << " rows";
      for (int64_t j = 0; j < m; ++j) {
        h_idx_[j] = h_route_[1 + j];
        out.selected[routed_idx][h_idx_[j]] = 1;
      }
    }
    if (routed) {
      ++routed_idx;
      if (m == 0) {  // no row entered: the layer's weights are not read at all
        ++out.num_layer_skips;
        continue;
      }
      // Room for the routed-in tokens of each sequence at this layer only.
      std::fill(counts.begin(), counts.end(), 0);
      for (int64_t i = 0; i < num_seqs; ++i) {
        counts[l] = static_cast<int32_t>(
            std::count(out.selected[routed_idx - 1].begin() + out.row_offsets[i],
                       out.selected[routed_idx - 1].begin() + out.row_offsets[i + 1], uint8_t{1}));
        if (counts[l] == 0) {
          routed_reserved[i] = ReservedSlots{};
          continue;
        }
        auto r = kv_->ReserveCapacity(seqs[i].seq_id, counts);
        if (!r.ok()) return fail(r.status());
        CopyPagesOnWrite(*r);
        routed_reserved[i] = *std::move(r);
      }
    } else {
      for (int64_t r = 0; r < N; ++r) h_idx_[r] = static_cast<int32_t>(r);
      m = N;
    }
    // Positions, KV slots and visible-key counts of the rows that run the block.
    for (int64_t j = 0, i = 0; j < m; ++j) {
      const int32_t r = h_idx_[j];
      while (r >= out.row_offsets[i + 1]) ++i;
      const int32_t rank = used[i][l]++;
      h_pos_[j] = seqs[i].start_pos + (r - out.row_offsets[i]);
      h_slots_[j] =
          static_cast<int32_t>((routed ? routed_reserved[i] : reserved[i]).ForLayer(l)[rank]);
      h_row_seq_[j] = static_cast<int32_t>(i);
      h_row_kv_len_[j] = base[i][l] + rank + 1;
    }
    // This layer's page table: each sequence's pages, padded with page 0 to the longest list
    // of the step (attention reads no entry past a row's kv length), so what is built and
    // uploaded follows the step's context, not max_seq_len.
    int64_t page_stride = 1;
    for (int64_t i = 0; i < num_seqs; ++i) {
      auto pages = kv_->PageTable(seqs[i].seq_id, l);
      if (!pages.ok()) return fail(pages.status());
      MODSERVE_CHECK_LE(static_cast<int64_t>(pages->size()), max_pages_per_seq_);
      h_pages_[i] = *pages;
      page_stride = std::max(page_stride, static_cast<int64_t>(pages->size()));
    }
    for (int64_t i = 0; i < num_seqs; ++i) {
      int32_t* row = h_page_table_.data() + i * page_stride;
      std::copy(h_pages_[i].begin(), h_pages_[i].end(), row);
      std::fill(row + h_pages_[i].size(), row + page_stride, 0);
    }
    for (auto st :
         {Upload(backend_, h_pos_, m, pos_, DType::kI32),
          Upload(backend_, h_slots_, m, slots_, DType::kI32),
          Upload(backend_, h_row_seq_, m, row_seq_, DType::kI32),
          Upload(backend_, h_row_kv_len_, m, row_kv_len_, DType::kI32),
          Upload(backend_, h_page_table_, num_seqs * page_stride, page_table_, DType::kI32)}) {
      if (!st.ok()) return fail(st);
    }
    // Attention's calls: runs of prompt rows and of other rows, each kind in calls of its own.
    h_segments_.clear();
    for (int64_t j = 0; j < m; ++j) {
      const bool prompt = h_prompt_row_[h_idx_[j]] != 0;
      if (h_segments_.empty() || h_segments_.back().prompt != prompt) {
        h_segments_.push_back({j, j + 1, prompt});
      } else {
        h_segments_.back().end = j + 1;
      }
    }
    const BlockIndex ix{pos_.View(DType::kI32, {m}),
                        slots_.View(DType::kI32, {m}),
                        row_seq_.View(DType::kI32, {m}),
                        row_kv_len_.View(DType::kI32, {m}),
                        page_table_.View(DType::kI32, {num_seqs, page_stride}),
                        h_segments_};
    if (!routed) {
      RunBlock(l, x, N, ix);  // x' = the dense block
      continue;
    }
    // Gather the selected rows, run the block on that compact batch, scatter the weighted
    // update back: x' = x + g(s) (y - x) or g(s) y.
    // RouteSelect left the rows and their scores on the device already.
    const TensorView xs = xs_.View(DType::kF32, {m, d});
    const TensorView idx = route_.View(DType::kI32, {m}, 4);
    backend_->GatherRows(x, idx, xs);
    RunBlock(l, xs, m, ix);
    backend_->ScatterCombine(
        {ToBackend(config_.mod->weight_fn), ToBackend(config_.mod->scale_target)}, x, xs, idx,
        s_sel_.View(DType::kF32, {m}));
  }

  // sigmoid(z) of every routed layer: one download for the whole step.
  if (num_routed > 0) {
    const int64_t count = int64_t{num_routed} * N;
    if (auto st = backend_->CopyToHost(probs_.View(DType::kF32, {count}),
                                       TensorView(h_probs_.data(), DType::kF32, {count}));
        !st.ok()) {
      return fail(st);
    }
    for (int k = 0; k < num_routed; ++k) {
      std::copy(h_probs_.begin() + k * N, h_probs_.begin() + (k + 1) * N, out.probs[k].begin());
    }
  }

  // logits = lm_head(RMSNorm_final(x)) for the rows asked for
  const std::vector<int32_t> logit_rows = LogitRows(seqs, out);
  const int64_t R = static_cast<int64_t>(logit_rows.size());
  if (auto st = Upload(backend_, logit_rows, R, idx_, DType::kI32); !st.ok()) return fail(st);
  if (auto st = EnsureLogitRows(R); !st.ok()) return fail(st);
  EnqueueLogits(idx_.View(DType::kI32, {R}));
  if (auto st = DownloadLogits(R, out); !st.ok()) return fail(st);
  if (auto st = backend_->Synchronize(); !st.ok()) return fail(st);

  for (int64_t i = 0; i < num_seqs; ++i) {
    // Commit cannot fail here: the counts fit the capacity reserved above.
    MODSERVE_CHECK(kv_->Commit(seqs[i].seq_id, used[i]).ok());
  }
  return out;
}

void Transformer::ReleaseReservations(absl::Span<const StepSequence> seqs, int64_t upto) {
  const std::vector<int32_t> none(static_cast<size_t>(config_.n_layers), 0);
  for (int64_t i = 0; i < upto; ++i) (void)kv_->Commit(seqs[i].seq_id, none).ok();
}

void Transformer::CopyPagesOnWrite(const ReservedSlots& r) {
  if (r.copies.empty()) return;
  page_copies_.clear();
  for (const PageCopy& c : r.copies) page_copies_.emplace_back(c.src, c.dst);
  const int64_t KV = config_.n_kv_heads, hd = config_.head_dim;
  backend_->CopyKvPages(
      kv_pool_.View(options_.kv_dtype, {options_.num_pages, 2 * KV, options_.block_size, hd}),
      page_copies_);
}

absl::Status Transformer::ReserveStep(absl::Span<const StepSequence> seqs, bool routed_layers,
                                      std::vector<ReservedSlots>* reserved,
                                      std::vector<std::vector<int32_t>>* base) {
  const int L = static_cast<int>(config_.n_layers);
  const int64_t S = static_cast<int64_t>(seqs.size());
  reserved->assign(S, ReservedSlots{});
  base->assign(S, std::vector<int32_t>(L));
  std::vector<int32_t> counts(L, 0);
  for (int64_t i = 0; i < S; ++i) {
    const int32_t n = static_cast<int32_t>(seqs[i].tokens.size());
    for (int l = 0; l < L; ++l) {
      absl::StatusOr<int32_t> count = kv_->NumTokens(seqs[i].seq_id, l);
      if (!count.ok()) {
        ReleaseReservations(seqs, i);
        return count.status();
      }
      (*base)[i][l] = *count;
      counts[l] = routed_layers || !config_.IsRouted(l) ? n : 0;
    }
    absl::StatusOr<ReservedSlots> r = kv_->ReserveCapacity(seqs[i].seq_id, counts);
    if (!r.ok()) {
      ReleaseReservations(seqs, i);
      return r.status();
    }
    CopyPagesOnWrite(*r);
    (*reserved)[i] = *std::move(r);
  }
  return absl::OkStatus();
}

std::vector<int32_t> Transformer::LogitRows(absl::Span<const StepSequence> seqs,
                                            StepOutput& out) const {
  std::vector<int32_t> rows;
  out.logit_offsets.assign(1, 0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int32_t first = seqs[i].all_logits ? out.row_offsets[i] : out.row_offsets[i + 1] - 1;
    for (int32_t r = first; r < out.row_offsets[i + 1]; ++r) rows.push_back(r);
    out.logit_offsets.push_back(static_cast<int32_t>(rows.size()));
  }
  return rows;
}

void Transformer::EnqueueLogits(const TensorView& rows_idx) {
  const int64_t R = rows_idx.dim(0), d = config_.d_model;
  const TensorView x = x_.View(DType::kF32, {options_.max_batch_tokens, d});
  const TensorView rows = xs_.View(DType::kF32, {R, d});
  backend_->GatherRows(x, rows_idx, rows);
  backend_->RmsNorm({static_cast<float>(config_.rms_norm_eps)}, rows, weights_.norm, rows);
  backend_->Gemm(rows, weights_.lm_head, {}, logits_.View(DType::kF32, {R, config_.vocab_size}));
}

absl::Status Transformer::DownloadLogits(int64_t rows, StepOutput& out) {
  out.logits.resize(static_cast<size_t>(rows * config_.vocab_size));
  return backend_->CopyToHost(
      logits_.View(DType::kF32, {rows, config_.vocab_size}),
      TensorView(out.logits.data(), DType::kF32, {rows, config_.vocab_size}));
}

absl::Status Transformer::EnsureBytes(backend::DeviceBuffer& buf, size_t bytes) {
  if (buf.data() != nullptr && buf.bytes() >= bytes) return absl::OkStatus();
  MODSERVE_ASSIGN_OR_RETURN(backend::DeviceBuffer grown,
                            backend_->Allocate(std::max(bytes, 2 * buf.bytes())));
  DropGraphs();  // they name the old buffer
  buf = std::move(grown);
  return absl::OkStatus();
}

bool Transformer::Enabled(DeviceRouting mode) const {
  switch (mode) {
    case DeviceRouting::kOff:
      return false;
    case DeviceRouting::kAuto:
      return backend_->device() != Device::kCpu;
    case DeviceRouting::kOn:
      return true;
  }
  return false;
}

bool Transformer::UseDeviceStep() const {
  return Enabled(options_.device_routing) && backend_->SupportsDeviceRowCount() &&
         backend_->Supports(backend::OpKind::kRouteRows, DType::kI32);
}

float Transformer::ZCut(int k, double request_threshold) {
  const std::pair<int, double> key{k, request_threshold};
  if (auto it = zcuts_.find(key); it != zcuts_.end()) return it->second;
  // Requests may bring any threshold: keep the table small.
  if (zcuts_.size() >= 4096) zcuts_.clear();
  const float cut =
      RouterZCut(LayerThreshold(*config_.mod, static_cast<size_t>(k), request_threshold));
  zcuts_.emplace(key, cut);
  return cut;
}

Transformer::DeviceLayout Transformer::MakeDeviceLayout(int64_t n, int64_t seqs, int64_t stride,
                                                        int64_t logit_rows) const {
  const int64_t L = config_.n_layers;
  const int64_t K = config_.mod ? static_cast<int64_t>(config_.mod->routed_layers.size()) : 0;
  DeviceLayout lay;
  lay.n = n;
  lay.seqs = seqs;
  lay.stride = stride;
  lay.logit_rows = logit_rows;
  lay.ids = 0;
  lay.row_seq = n;
  lay.row_pos = 2 * n;
  lay.first_row = 3 * n;
  lay.logit_idx = lay.first_row + seqs;
  lay.step_rows = lay.logit_idx + logit_rows;
  lay.layers = lay.step_rows + 1;
  lay.zcut = lay.layers + L * 2 * n;
  lay.pages = lay.zcut + K * n;
  lay.words = lay.pages + L * seqs * stride;
  lay.out_words = K * (1 + 2 * n);
  return lay;
}

void Transformer::EnqueueDeviceForward(const DeviceLayout& lay, bool counted) {
  const int L = static_cast<int>(config_.n_layers);
  const int K = config_.mod ? static_cast<int>(config_.mod->routed_layers.size()) : 0;
  const int64_t N = lay.n, S = lay.seqs, P = lay.stride, d = config_.d_model;
  auto in_view = [&](int64_t offset, std::initializer_list<int64_t> dims, DType dt = DType::kI32) {
    return step_in_.View(dt, dims, static_cast<size_t>(offset) * 4);
  };
  auto out_view = [&](int64_t offset, int64_t n, DType dt = DType::kI32) {
    return step_out_.View(dt, {n}, static_cast<size_t>(offset) * 4);
  };
  // The step's own rows: all N, or (a graph of a bucket) the count in the upload.
  const TensorView step_rows = counted ? in_view(lay.step_rows, {1}) : TensorView();
  backend_->SetDeviceRowCount(step_rows);
  const TensorView x = x_.View(DType::kF32, {N, d});
  backend_->Embed(in_view(lay.ids, {N}), weights_.embed_tokens, x);
  const TensorView row_seq = in_view(lay.row_seq, {N}), row_pos = in_view(lay.row_pos, {N});
  for (int l = 0, k = 0; l < L; ++l) {
    const int64_t layer_off = lay.layers + int64_t{l} * 2 * N;
    const TensorView page_table = in_view(lay.pages + int64_t{l} * S * P, {S, P});
    if (!config_.IsRouted(l)) {
      RunBlock(
          l, x, N,
          {row_pos, in_view(layer_off, {N}), row_seq, in_view(layer_off + N, {N}), page_table});
      continue;
    }
    RouteScores(l, N);
    const bool z_is_s = config_.mod->inference_routing != InferenceRouting::kPredictorThreshold;
    const TensorView count = out_view(int64_t{k} * (1 + N), 1);
    const TensorView idx = out_view(int64_t{k} * (1 + N) + 1, N);
    const TensorView s_sel = s_sel_.View(DType::kF32, {N});
    backend_->RouteSelect(
        (z_is_s ? s_ : z_).View(DType::kF32, {N}),
        in_view(lay.zcut + int64_t{k} * N, {N}, DType::kF32), s_.View(DType::kF32, {N}),
        out_view(int64_t{K} * (1 + N) + int64_t{k} * N, N, DType::kF32), idx, s_sel, count);
    // The routed rows, however many there are: every op below runs on count[0] of its N rows.
    backend_->SetDeviceRowCount(count);
    const TensorView xs = xs_.View(DType::kF32, {N, d});
    const BlockIndex ix{pos_.View(DType::kI32, {N}), slots_.View(DType::kI32, {N}),
                        row_seq_.View(DType::kI32, {N}), row_kv_len_.View(DType::kI32, {N}),
                        page_table};
    backend_->RouteRows(idx, row_seq, row_pos, in_view(layer_off, {N}), in_view(lay.first_row, {S}),
                        in_view(layer_off + N, {S}), ix.pos, ix.slots, ix.row_seq, ix.row_kv_len);
    backend_->GatherRows(x, idx, xs);
    RunBlock(l, xs, N, ix);
    backend_->ScatterCombine(
        {ToBackend(config_.mod->weight_fn), ToBackend(config_.mod->scale_target)}, x, xs, idx,
        s_sel);
    backend_->SetDeviceRowCount(step_rows);
    ++k;
  }
  EnqueueLogits(in_view(lay.logit_idx, {lay.logit_rows}));
  backend_->SetDeviceRowCount({});
}

void Transformer::DropGraphs() {
  if (graphs_.empty()) return;
  backend_->ReleaseGraphs();
  graphs_.clear();
}

Transformer::~Transformer() { DropGraphs(); }

bool Transformer::UseGraph(absl::Span<const StepSequence> seqs) const {
  if (!Enabled(options_.graphs) || !backend_->SupportsGraphs()) return false;
  // Decode steps only: one token per sequence, the logits of that token, none of the prompt (a
  // graph replays its calls' parameters, and a prompt row's attention call is another).
  for (const StepSequence& q : seqs) {
    if (q.tokens.size() != 1 || q.start_pos < q.prompt_len) return false;
  }
  return static_cast<int64_t>(seqs.size()) <= kMaxGraphBucket;
}

int64_t Transformer::GraphBucket(int64_t n) const {
  const int64_t b = static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(n)));
  // A step never has more than max_seqs sequences (nor rows than max_batch_tokens): the last
  // bucket is that many.
  return std::max(n, std::min<int64_t>(b, std::min(options_.max_seqs, options_.max_batch_tokens)));
}

absl::StatusOr<std::optional<StepOutput>> Transformer::DeviceStep(
    absl::Span<const StepSequence> seqs, StepOutput out) {
  const int64_t S = static_cast<int64_t>(seqs.size());
  const int L = static_cast<int>(config_.n_layers);
  const int64_t N = out.row_offsets.back();
  const int K = config_.mod ? static_cast<int>(config_.mod->routed_layers.size()) : 0;

  // Room for every new token at every layer, routed or not; the base entry counts. A
  // reservation that does not fit goes back whole: the host step may still fit.
  std::vector<ReservedSlots> reserved;
  std::vector<std::vector<int32_t>> base;
  if (absl::Status st = ReserveStep(seqs, /*routed_layers=*/true, &reserved, &base); !st.ok()) {
    if (st.code() == absl::StatusCode::kResourceExhausted) return std::nullopt;
    return st;
  }
  auto fail = [&](absl::Status st) -> absl::StatusOr<std::optional<StepOutput>> {
    ReleaseReservations(seqs, S);
    return st;
  };

  // Page tables of every layer, padded to the longest list of the step.
  int64_t P = 1;
  std::vector<std::vector<absl::Span<const PageId>>> pages(
      L, std::vector<absl::Span<const PageId>>(S));
  for (int l = 0; l < L; ++l) {
    for (int64_t i = 0; i < S; ++i) {
      absl::StatusOr<absl::Span<const PageId>> list = kv_->PageTable(seqs[i].seq_id, l);
      if (!list.ok()) return fail(list.status());
      MODSERVE_CHECK_LE(static_cast<int64_t>(list->size()), max_pages_per_seq_);
      pages[l][i] = *list;
      P = std::max(P, static_cast<int64_t>(list->size()));
    }
  }
  const std::vector<int32_t> logit_rows = LogitRows(seqs, out);
  const int64_t R = static_cast<int64_t>(logit_rows.size());

  // A decode step of a graph bucket runs with the bucket's capacity (rows = sequences = logit
  // rows = B, the page-table stride rounded up to a power of two) and its real row count in the
  // upload, so one capture serves every step of that shape.
  const bool graph = UseGraph(seqs);
  DeviceLayout lay;
  if (graph) {
    const int64_t B = GraphBucket(S);
    const int64_t stride = static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(P)));
    lay = MakeDeviceLayout(B, B, std::min(stride, max_pages_per_seq_), B);
  } else {
    lay = MakeDeviceLayout(N, S, P, R);
  }

  // The upload, in i32 words (DeviceLayout): ids, row_seq and row_pos [n], seq_first_row
  // [seqs], logit rows, the step's row count; per layer its slots [n] (row r's: the j-th
  // candidate of its sequence, j its place there) and [n] more: kv lengths per row (dense layer)
  // or base entry counts per sequence (routed); per routed layer z cuts [n] (f32 bits); per layer
  // its page table [seqs, stride]. Capacity beyond the step holds zeros and is never read.
  h_step_in_.assign(static_cast<size_t>(lay.words), 0);
  int32_t* in = h_step_in_.data();
  const int64_t n = lay.n;
  for (int64_t i = 0; i < S; ++i) {
    in[lay.first_row + i] = out.row_offsets[i];
    for (int32_t r = out.row_offsets[i], t = 0; r < out.row_offsets[i + 1]; ++r, ++t) {
      in[lay.ids + r] = seqs[i].tokens[t];
      in[lay.row_seq + r] = static_cast<int32_t>(i);
      in[lay.row_pos + r] = seqs[i].start_pos + t;
    }
  }
  std::copy(logit_rows.begin(), logit_rows.end(), in + lay.logit_idx);
  in[lay.step_rows] = static_cast<int32_t>(N);
  for (int l = 0, k = 0; l < L; ++l) {
    const bool routed = config_.IsRouted(l);
    int32_t* slots = in + lay.layers + int64_t{l} * 2 * n;
    int32_t* kv = slots + n;
    for (int64_t i = 0; i < S; ++i) {
      const absl::Span<const int64_t> mine = reserved[i].ForLayer(l);
      for (int32_t r = out.row_offsets[i], t = 0; r < out.row_offsets[i + 1]; ++r, ++t) {
        slots[r] = static_cast<int32_t>(mine[t]);
        if (!routed) kv[r] = base[i][l] + t + 1;
      }
      if (routed) kv[i] = base[i][l];
    }
    if (routed) {
      int32_t* cuts = in + lay.zcut + int64_t{k} * n;  // f32 bits
      for (int64_t i = 0; i < S; ++i) {
        const float cut = ZCut(k, seqs[i].threshold);
        int32_t bits;
        std::memcpy(&bits, &cut, sizeof bits);
        std::fill(cuts + out.row_offsets[i], cuts + out.row_offsets[i + 1], bits);
      }
      ++k;
    }
    for (int64_t i = 0; i < S; ++i) {
      std::copy(pages[l][i].begin(), pages[l][i].end(),
                in + lay.pages + (int64_t{l} * lay.seqs + i) * lay.stride);
    }
  }
  // A graph names these buffers: one that grows drops every graph (EnsureBytes, EnsureLogitRows).
  const size_t out_bytes = static_cast<size_t>(std::max<int64_t>(1, lay.out_words)) * 4;
  for (auto st : {EnsureBytes(step_in_, static_cast<size_t>(lay.words) * 4),
                  EnsureBytes(step_out_, out_bytes), EnsureLogitRows(lay.logit_rows)}) {
    if (!st.ok()) return fail(st);
  }
  if (auto st = backend_->CopyToDevice(TensorView(in, DType::kI32, {lay.words}),
                                       step_in_.View(DType::kI32, {lay.words}));
      !st.ok()) {
    return fail(st);
  }

  if (!graph) {
    EnqueueDeviceForward(lay, /*counted=*/false);
  } else {
    const std::pair<int64_t, int64_t> key{lay.n, lay.stride};
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      // The first step of a shape runs eagerly: whatever its kernels and libraries set up on
      // first use (module loading, library handles) happens outside a capture.
      graphs_.emplace(key, kGraphWarmup);
      EnqueueDeviceForward(lay, /*counted=*/true);
      ++num_graph_warmups_;
    } else {
      if (it->second == kGraphWarmup) {
        // Captured once per shape; a backend that refuses leaves this shape to eager launches.
        it->second = kGraphRefused;
        if (backend_->BeginCapture().ok()) {
          EnqueueDeviceForward(lay, /*counted=*/true);
          absl::StatusOr<int> captured = backend_->EndCapture();
          if (captured.ok()) {
            it->second = *captured;
            ++num_graph_captures_;
          }
        }
      }
      if (it->second == kGraphRefused) {
        EnqueueDeviceForward(lay, /*counted=*/true);
      } else {
        if (auto st = backend_->Replay(it->second); !st.ok()) return fail(st);
        ++num_graph_replays_;
      }
    }
  }
  if (auto st = DownloadLogits(R, out); !st.ok()) return fail(st);
  h_step_out_.resize(static_cast<size_t>(lay.out_words));
  if (K > 0) {
    if (auto st =
            backend_->CopyToHost(step_out_.View(DType::kI32, {lay.out_words}),
                                 TensorView(h_step_out_.data(), DType::kI32, {lay.out_words}));
        !st.ok()) {
      return fail(st);
    }
  }
  if (auto st = backend_->Synchronize(); !st.ok()) return fail(st);

  // What each routed layer chose, and the entries each sequence stored there.
  std::vector<std::vector<int32_t>> used(S, std::vector<int32_t>(L));
  for (int64_t i = 0; i < S; ++i) {
    for (int l = 0; l < L; ++l) {
      used[i][l] = config_.IsRouted(l) ? 0 : out.row_offsets[i + 1] - out.row_offsets[i];
    }
  }
  out.selected.assign(K, std::vector<uint8_t>(N));
  out.probs.assign(K, std::vector<float>(N));
  for (int k = 0; k < K; ++k) {
    const int l = config_.mod->routed_layers[k];
    const int32_t* route = h_step_out_.data() + int64_t{k} * (1 + n);
    const int32_t m = route[0];
    MODSERVE_CHECK(m >= 0 && m <= N) << "RouteSelect count " << m << " of " << N << " rows";
    for (int32_t j = 0, i = 0; j < m; ++j) {
      const int32_t r = route[1 + j];
      MODSERVE_CHECK(r >= 0 && r < N && (j == 0 || route[j] < r)) << "routed row " << r;
      while (r >= out.row_offsets[i + 1]) ++i;
      out.selected[k][r] = 1;
      ++used[i][l];
    }
    if (m == 0) ++out.num_layer_skips;
    std::memcpy(out.probs[k].data(), h_step_out_.data() + int64_t{K} * (1 + n) + int64_t{k} * n,
                static_cast<size_t>(N) * 4);
  }
  for (int64_t i = 0; i < S; ++i) {
    // Commit cannot fail: every count fits the capacity reserved above.
    MODSERVE_CHECK(kv_->Commit(seqs[i].seq_id, used[i]).ok());
  }
  ++num_device_steps_;
  return std::optional<StepOutput>(std::move(out));
}

}  // namespace modserve::engine
