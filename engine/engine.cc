// Engine: model + backend + KV cache + sampler, driven one step at a time.
#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/backend/registry.h"
#include "engine/common/logging.h"
#include "engine/common/status_macros.h"
#include "engine/executor/step_runner.h"
#include "engine/sampler/speculative_sampling.h"
#include "engine/sampler/sum_exp.h"

namespace modserve::engine {

struct Engine::Sequence {
  Sequence(Request r, double tau, SamplingState s, const ModelConfig& cfg, const Tokenizer* tok)
      : request(std::move(r)),
        tokens(request.prompt),
        threshold(tau),
        sampling(std::move(s)),
        stop(request.sampling, cfg.eos_token_ids) {
    if (tok != nullptr) detok.emplace(*tok, /*skip_special_tokens=*/true, request.prompt);
  }

  // Prompt logprobs still to compute: the step feeding the prompt asks for every row's logits.
  bool WantsPromptLogprobs() const {
    return request.prompt_logprobs >= 0 && result.prompt_logprobs.size() < request.prompt.size();
  }

  Request request;
  std::vector<TokenId> tokens;  // prompt, then generated tokens
  int32_t num_fed = 0;          // tokens whose KV entries are in the cache
  double threshold;
  int32_t speculative_tokens = 0;     // drafted per decode step; 0 = no speculation
  double speculative_threshold = 1.0;  // the draft's routing threshold
  SamplingState sampling;
  StopChecker stop;
  std::optional<IncrementalDetokenizer> detok;
  GenerationResult result;
  bool finished = false;  // done: its last token was sampled, or it failed
  // Prefix caching: the key of the last cached block of this sequence's chain (0: none yet),
  // how many of its prompt blocks are in that chain, and whether it stopped caching (another
  // sequence cached the same block first, or the chain's parent was evicted).
  uint64_t prefix_key = 0;
  int32_t num_prefix_blocks = 0;
  bool prefix_stopped = false;
};

absl::StatusOr<FaultInjection> ParseFaultInjection(absl::string_view spec) {
  FaultInjection f;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    const std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(part, '=');
    const auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("fault injection '", part, "': ", why));
    };
    if (kv.first == "sampler" || kv.first == "detokenizer") {
      double rate;
      if (!absl::SimpleAtod(kv.second, &rate) || !(rate >= 0.0 && rate <= 1.0)) {
        return bad("the rate must be a number in [0, 1]");
      }
      (kv.first == "sampler" ? f.sampler_rate : f.detokenizer_rate) = rate;
    } else if (kv.first == "backend_step") {
      if (!absl::SimpleAtoi(kv.second, &f.backend_fault_step) || f.backend_fault_step < 1) {
        return bad("the step must be an integer >= 1");
      }
    } else if (kv.first == "seed") {
      if (!absl::SimpleAtoi(kv.second, &f.seed)) return bad("the seed must be an integer");
    } else {
      return bad("expected sampler=, detokenizer=, backend_step= or seed=");
    }
  }
  return f;
}

absl::StatusOr<std::optional<DType>> ParseKvDtype(absl::string_view name) {
  if (name == "auto") return std::optional<DType>();
  if (name == "f32") return std::optional<DType>(DType::kF32);
  if (name == "f16") return std::optional<DType>(DType::kF16);
  if (name == "bf16") return std::optional<DType>(DType::kBF16);
  return absl::InvalidArgumentError(
      absl::StrCat("KV cache dtype '", name, "' is not one of auto, f32, f16, bf16"));
}

Engine::Engine(EngineOptions options, LoadedModel model)
    : options_(std::move(options)), model_(std::move(model)) {}

Engine::~Engine() = default;

int64_t Engine::kv_bytes_per_token_layer() const {
  return 2 * config().n_kv_heads * config().head_dim * static_cast<int64_t>(DTypeBytes(kv_dtype_));
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  if (options.speculative_tokens < 0 || options.speculative_tokens > kMaxSpeculativeTokens) {
    return absl::InvalidArgumentError(absl::StrCat("speculative_tokens ", options.speculative_tokens,
                                                   " is not in [0, ", kMaxSpeculativeTokens, "]"));
  }
  if (!(options.speculative_threshold > 0.0 && options.speculative_threshold <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "speculative_threshold ", options.speculative_threshold, " is not in (0, 1]"));
  }
  if (options.block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size ", options.block_size, ": a KV page holds at least 1 token"));
  }
  MODSERVE_ASSIGN_OR_RETURN(LoadedModel model, LoadModel(options.model_dir));
  const std::string tokenizer_path = model.tokenizer_path();  // an adapter's is its base's
  std::unique_ptr<Engine> e(new Engine(options, std::move(model)));
  auto tok = LoadTokenizer(tokenizer_path);
  if (tok.ok()) {
    e->tokenizer_ = *std::move(tok);
  } else if (!absl::IsNotFound(tok.status())) {
    return tok.status();
  }
  const DType layer_dtype = e->model_.weights().layers.front().q_proj.dtype;
  e->kv_dtype_ = options.kv_dtype.value_or(
      layer_dtype == DType::kBF16 || layer_dtype == DType::kF16 ? layer_dtype : DType::kF32);
  if (e->kv_dtype_ != DType::kF32 && e->kv_dtype_ != DType::kF16 &&
      e->kv_dtype_ != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("kv_dtype ", std::string(DTypeName(e->kv_dtype_)),
                                                   " is not F32, F16 or BF16"));
  }
  backend::BackendOptions bo;
  bo.num_threads = options.num_threads;
  bo.matmul_precision = options.matmul_precision;
  MODSERVE_ASSIGN_OR_RETURN(e->backend_, backend::CreateBackend(options.backend, bo));
  const ModelConfig& cfg = e->config();
  const int64_t page_bytes = KvCacheManager::BytesPerPage(
      static_cast<int32_t>(cfg.n_kv_heads), options.block_size, static_cast<int32_t>(cfg.head_dim),
      e->kv_dtype_);
  const int64_t num_pages = options.kv_cache_bytes / std::max<int64_t>(1, page_bytes);
  if (num_pages < cfg.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_cache_bytes ", options.kv_cache_bytes, " holds ", num_pages, " pages of ", page_bytes,
        " bytes; at least one page per layer (", cfg.n_layers, ") is needed"));
  }
  if (num_pages > (int64_t{1} << 31) / options.block_size) {
    return absl::InvalidArgumentError(absl::StrCat("kv_cache_bytes ", options.kv_cache_bytes,
                                                   " gives more KV slots than 2^31"));
  }
  MODSERVE_ASSIGN_OR_RETURN(e->kv_, KvCacheManager::Create(static_cast<int32_t>(num_pages),
                                                           options.block_size,
                                                           static_cast<int32_t>(cfg.n_layers),
                                                           page_bytes));
  TransformerOptions to;
  to.max_batch_tokens = options.max_batch_tokens;
  to.max_seqs = options.max_seqs;
  to.block_size = options.block_size;
  to.num_pages = static_cast<int32_t>(num_pages);
  to.kv_dtype = e->kv_dtype_;
  to.device_routing = options.device_routing;
  to.graphs = options.graphs;
  // Weights the backend copies into its own layout are read from the copy only: their file
  // pages are dropped as each copy is made (the peak stays near one model's bytes, not two). A
  // tied lm_head's pages are the Embed table's, which stay.
  Engine* engine = e.get();
  auto drop_file_pages = [engine](const TensorView& f) {
    if (f.data != engine->model_.weights().embed_tokens.data) {
      engine->model_.checkpoint().ReleasePages(f.data, f.bytes());
    }
  };
  to.on_weight_copied = drop_file_pages;
  MODSERVE_ASSIGN_OR_RETURN(e->transformer_, Transformer::Create(cfg, e->model_.weights(),
                                                                 e->backend_.get(), e->kv_.get(),
                                                                 to));
  {
    // The same for weights the transformer holds elsewhere once built (a device backend's
    // uploaded copies): their file pages go now. Pages already dropped above cost nothing here.
    const ModelWeights& file = e->model_.weights();
    const ModelWeights& run = e->transformer_->weights();
    auto release = [&](const TensorView& f, const TensorView& r) {
      if (f.data != r.data) drop_file_pages(f);
    };
    release(file.lm_head, run.lm_head);
    for (size_t l = 0; l < file.layers.size(); ++l) {
      const auto f = GemmWeights(file.layers[l]), r = GemmWeights(run.layers[l]);
      for (size_t i = 0; i < f.size(); ++i) release(*f[i], *r[i]);
    }
  }
  if (options.prefix_caching) e->kv_->EnablePrefixCache();
  {
    const ModelWeights& w = e->model_.weights();
    int64_t rows = options.max_batch_tokens;
    auto bound = [&](const TensorView& t) {
      if (!t.empty()) rows = std::min(rows, e->backend_->MaxRowInvariantRows(t.dtype, t.dim(0)));
    };
    bound(w.lm_head);
    for (const LayerWeights& lw : w.layers) {
      for (const TensorView* t : GemmWeights(lw)) bound(*t);
    }
    e->max_row_invariant_rows_ = static_cast<int32_t>(std::max<int64_t>(1, rows));
  }
  e->sampler_ = std::make_unique<Sampler>(options.seed);
  if (const Tokenizer* tok = e->tokenizer_.get(); tok != nullptr) {
    for (TokenId id = 0; id < cfg.vocab_size; ++id) {
      if (!tok->IdToToken(id).has_value()) e->unnamed_ids_.push_back(id);
    }
    // A mismatch is legal (embeddings are often padded to a multiple of 64) but worth a line.
    if (!e->unnamed_ids_.empty() || tok->vocab_size() > cfg.vocab_size) {
      MODSERVE_LOG(WARNING) << options.model_dir << ": the model's vocabulary has "
                            << cfg.vocab_size << " ids and the tokenizer's " << tok->vocab_size()
                            << "; " << e->unnamed_ids_.size()
                            << " model ids name no token (never sampled, refused in prompts)"
                            << (tok->vocab_size() > cfg.vocab_size
                                    ? "; text that tokenizes past the model's vocabulary is "
                                      "refused"
                                    : "");
    }
  }
  return e;
}

absl::Status Engine::CheckTokenId(absl::string_view what, TokenId id) const {
  const int64_t vocab = config().vocab_size;
  if (id < 0 || id >= vocab) {
    return absl::InvalidArgumentError(absl::StrCat(what, " token id ", id,
                                                   " is outside the vocabulary [0, ", vocab, ")"));
  }
  if (tokenizer_ != nullptr && !tokenizer_->IdToToken(id).has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " token id ", id, " names no token of the tokenizer (the model's embedding has ",
        vocab, " rows, the tokenizer ", tokenizer_->vocab_size(), " ids)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SequenceId> Engine::Add(const Request& request) {
  const ModelConfig& cfg = config();
  MODSERVE_RETURN_IF_ERROR(Validate(request.sampling));
  if (request.prompt.empty()) return absl::InvalidArgumentError("prompt has no tokens");
  for (TokenId t : request.prompt) MODSERVE_RETURN_IF_ERROR(CheckTokenId("prompt", t));
  for (TokenId t : request.sampling.stop_token_ids) {
    MODSERVE_RETURN_IF_ERROR(CheckTokenId("stop", t));
  }
  if (request.prompt_logprobs < -1 || request.prompt_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_logprobs ", request.prompt_logprobs,
                                                   " is not -1 (off) or in [0, ",
                                                   kMaxTopLogprobs, "]"));
  }
  const int64_t total = static_cast<int64_t>(request.prompt.size()) + request.sampling.max_new_tokens;
  if (total > cfg.max_seq_len) {
    return absl::OutOfRangeError(absl::StrCat(
        "prompt (", request.prompt.size(), " tokens) + max_new_tokens (",
        request.sampling.max_new_tokens, ") = ", total, " exceeds the model's max_seq_len ",
        cfg.max_seq_len));
  }
  double tau = cfg.mod ? cfg.mod->threshold : 0.5;
  if (request.threshold.has_value()) {
    if (!(*request.threshold > 0.0 && *request.threshold < 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("threshold ", *request.threshold, " is not in (0, 1)"));
    }
    tau = *request.threshold;
  }
  const int32_t spec_tokens = SpeculativeTokens(request);
  if (spec_tokens < 0 || spec_tokens > kMaxSpeculativeTokens) {
    return absl::InvalidArgumentError(absl::StrCat("speculative_tokens ", spec_tokens,
                                                   " is not in [0, ", kMaxSpeculativeTokens, "]"));
  }
  const double spec_threshold =
      request.speculative_threshold.value_or(options_.speculative_threshold);
  if (!(spec_threshold > 0.0 && spec_threshold <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("speculative_threshold ", spec_threshold, " is not in (0, 1]"));
  }
  const SequenceId id = next_id_++;
  MODSERVE_RETURN_IF_ERROR(kv_->AddSequence(id));
  auto seq = std::make_unique<Sequence>(request, tau,
                                        sampler_->NewState(request.sampling, request.prompt), cfg,
                                        tokenizer_.get());
  seq->result.prompt_tokens = static_cast<int32_t>(request.prompt.size());
  seq->speculative_tokens = spec_tokens;
  seq->speculative_threshold = spec_threshold;
  if (cfg.mod) {
    seq->result.routed_layers = cfg.mod->routed_layers;
    seq->result.routing.resize(cfg.mod->routed_layers.size());
  }
  if (request.prompt_logprobs >= 0) {
    seq->result.prompt_logprobs.push_back({request.prompt.front(), std::nullopt, {}});
  }
  sequences_.emplace(id, std::move(seq));
  return id;
}

int32_t Engine::PendingTokens(SequenceId seq_id) const {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end() || it->second->finished) return 0;
  return static_cast<int32_t>(it->second->tokens.size()) - it->second->num_fed;
}

bool Engine::Finished(SequenceId seq_id) const {
  auto it = sequences_.find(seq_id);
  return it != sequences_.end() && it->second->finished;
}

int32_t Engine::HeldPages(SequenceId seq_id) const {
  absl::StatusOr<SequenceKvUsage> usage = kv_->Usage(seq_id);
  return usage.ok() ? usage->num_pages : 0;
}

bool Engine::InjectFault(double rate, SequenceId seq_id, int64_t index, uint64_t salt) const {
  if (!(rate > 0.0)) return false;
  const uint64_t key = options_.faults.seed ^ (salt * 0x9E3779B97F4A7C15ull) ^
                       (static_cast<uint64_t>(seq_id) * 0xBF58476D1CE4E5B9ull);
  return UniformDraw(key, static_cast<uint64_t>(index)) < rate;
}

namespace {

// log_softmax of one logits row at `id`, and the `top_n` most likely ids (ties to the lower id).
// Internal when the row holds a NaN or +inf (a model/backend bug, reported for this request).
absl::StatusOr<PromptLogprob> RowLogprob(absl::Span<const float> row, TokenId id, int32_t top_n) {
  float max_logit = -INFINITY;
  for (size_t v = 0; v < row.size(); ++v) {
    if (std::isnan(row[v]) || row[v] == INFINITY) {
      return absl::InternalError(absl::StrCat("logit of token ", v, " is ", row[v]));
    }
    max_logit = std::max(max_logit, row[v]);
  }
  if (max_logit == -INFINITY) return absl::InternalError("every logit is -inf");
  const double lse = max_logit + std::log(SumExpShifted(row, max_logit));
  PromptLogprob out{id, static_cast<float>(row[id] - lse), {}};
  if (top_n > 0) {
    std::vector<TokenId> ids(row.size());
    for (size_t v = 0; v < row.size(); ++v) ids[v] = static_cast<TokenId>(v);
    const size_t n = std::min(static_cast<size_t>(top_n), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(n), ids.end(),
                      [&](TokenId a, TokenId b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    for (size_t k = 0; k < n; ++k) {
      out.top.push_back({ids[k], static_cast<float>(row[ids[k]] - lse)});
    }
  }
  return out;
}

}  // namespace

absl::Status Engine::AddPromptLogprobs(Sequence& s, int32_t pos, float* logits,
                                       int32_t num_rows) {
  const int64_t vocab = config().vocab_size;
  const std::vector<TokenId>& prompt = s.request.prompt;
  for (int32_t j = 0; j < num_rows; ++j) {
    // Row j holds the logits after position pos + j: they predict the token at pos + j + 1.
    const size_t next = static_cast<size_t>(pos + j + 1);
    if (next >= prompt.size()) break;
    if (next != s.result.prompt_logprobs.size()) continue;  // recorded before a preemption
    absl::Span<float> row(logits + j * vocab, static_cast<size_t>(vocab));
    for (TokenId id : unnamed_ids_) row[id] = -INFINITY;
    absl::StatusOr<PromptLogprob> lp = RowLogprob(row, prompt[next], s.request.prompt_logprobs);
    if (!lp.ok()) {
      return absl::InternalError(absl::StrCat("prompt logprob of position ", next, ": ",
                                              lp.status().message()));
    }
    s.result.prompt_logprobs.push_back(*std::move(lp));
  }
  return absl::OkStatus();
}

absl::Status Engine::PrepareSample(SequenceId seq_id, absl::Span<float> logits, int64_t index) {
  for (TokenId id : unnamed_ids_) logits[id] = -INFINITY;
  if (InjectFault(options_.faults.sampler_rate, seq_id, index, 1)) {
    return absl::InternalError(absl::StrCat("injected sampler fault at token ", index));
  }
  return absl::OkStatus();
}

absl::StatusOr<TokenEvent> Engine::FinishSample(SequenceId seq_id, Sequence& s,
                                                absl::StatusOr<SampleResult> sample,
                                                int64_t index) {
  if (!sample.ok()) {
    return absl::Status(sample.status().code(),
                        absl::StrCat("sampling token ", index, ": ", sample.status().message()));
  }
  return EmitToken(seq_id, s, *std::move(sample), index);
}

absl::StatusOr<TokenEvent> Engine::NextToken(SequenceId seq_id, Sequence& s,
                                              absl::Span<float> logits) {
  const int64_t index = static_cast<int64_t>(s.result.token_ids.size());
  MODSERVE_RETURN_IF_ERROR(PrepareSample(seq_id, logits, index));
  return FinishSample(seq_id, s, sampler_->Sample(logits, s.request.sampling, &s.sampling), index);
}

absl::StatusOr<TokenEvent> Engine::VerifyToken(SequenceId seq_id, Sequence& s,
                                                absl::Span<float> logits, TokenId draft,
                                                absl::Span<const TokenLogprob> q, bool* accepted) {
  const SamplingParams& params = s.request.sampling;
  if (params.temperature < kGreedyTemperature) {
    // Greedy: the target's own choice, exactly as NextToken makes it; the draft survives when
    // it is that choice.
    absl::StatusOr<TokenEvent> ev = NextToken(seq_id, s, logits);
    *accepted = ev.ok() && ev->token == draft;
    return ev;
  }
  const int64_t index = static_cast<int64_t>(s.result.token_ids.size());
  for (TokenId id : unnamed_ids_) logits[id] = -INFINITY;
  if (InjectFault(options_.faults.sampler_rate, seq_id, index, 1)) {
    return absl::InternalError(absl::StrCat("injected sampler fault at token ", index));
  }
  absl::StatusOr<std::vector<TokenLogprob>> p = sampler_->Distribution(logits, params, s.sampling);
  if (!p.ok()) {
    return absl::Status(p.status().code(),
                        absl::StrCat("sampling token ", index, ": ", p.status().message()));
  }
  const uint64_t n = static_cast<uint64_t>(s.sampling.num_generated());
  const SpeculativeChoice choice =
      AcceptOrResample(*p, q, draft, UniformDraw(s.sampling.seed(), n, kAcceptStream),
                       UniformDraw(s.sampling.seed(), n, kResampleStream));
  *accepted = choice.accepted;
  // Logprobs are the target's, as ordinary sampling reports them.
  SampleResult sample{choice.token, 0.0f, {}};
  for (const TokenLogprob& t : *p) {
    if (t.id == choice.token) sample.logprob = t.logprob;
  }
  if (params.top_logprobs > 0) {
    std::vector<TokenLogprob> top = *std::move(p);
    const size_t num = std::min(top.size(), static_cast<size_t>(params.top_logprobs));
    std::partial_sort(top.begin(), top.begin() + static_cast<ptrdiff_t>(num), top.end(),
                      [](const TokenLogprob& a, const TokenLogprob& b) {
                        return a.logprob > b.logprob || (a.logprob == b.logprob && a.id < b.id);
                      });
    top.resize(num);
    sample.top_logprobs = std::move(top);
  }
  s.sampling.Accept(choice.token);
  return EmitToken(seq_id, s, std::move(sample), index);
}

absl::StatusOr<TokenEvent> Engine::EmitToken(SequenceId seq_id, Sequence& s, SampleResult sample,
                                              int64_t index) {
  TokenEvent ev;
  ev.token = sample.token;
  ev.logprob = sample.logprob;
  ev.top_logprobs = std::move(sample.top_logprobs);
  std::string delta;
  if (s.detok) {
    absl::StatusOr<std::string> text =
        InjectFault(options_.faults.detokenizer_rate, seq_id, index, 2)
            ? absl::InternalError("injected detokenizer fault")
            : s.detok->Add(ev.token);
    // The id was sampled by the engine, so a failure here is ours, not the client's.
    if (!text.ok()) {
      return absl::InternalError(absl::StrCat("detokenizing token ", index, " (id ", ev.token,
                                              "): ", text.status().message()));
    }
    delta = *std::move(text);
  }
  StopCheckResult stop = s.stop.Append(ev.token, delta);
  ev.text = std::move(stop.emit);
  ev.finish_reason = stop.finish_reason;
  if (stop.finish_reason && *stop.finish_reason != FinishReason::kStopString && s.detok) {
    // Bytes the detokenizer still holds (an unfinished character) end the text.
    absl::StatusOr<std::string> tail = s.detok->Flush();
    if (!tail.ok()) {
      return absl::InternalError(absl::StrCat("detokenizing the end of the output: ",
                                              tail.status().message()));
    }
    ev.text += *tail;
  }
  if (s.request.prompt_logprobs >= 0 && s.result.token_ids.empty()) {
    ev.prompt_logprobs = s.result.prompt_logprobs;
  }
  return ev;
}

uint64_t Engine::PrefixSalt(const Sequence& s) const {
  if (!config().mod) return 0;
  // The threshold decides the routing, hence the entries a prefix leaves: its bits key it.
  uint64_t bits = 0;
  static_assert(sizeof(bits) == sizeof(s.threshold));
  std::memcpy(&bits, &s.threshold, sizeof(bits));
  return bits;
}

int32_t Engine::AttachPrefix(SequenceId seq_id, Sequence& s) {
  const int32_t bs = kv_->block_size();
  // The last token is always fed: its logits give the next token.
  const absl::Span<const TokenId> lookup = absl::MakeConstSpan(s.tokens).first(s.tokens.size() - 1);
  absl::StatusOr<std::vector<const PrefixBlock*>> chain =
      kv_->AttachCachedPrefix(seq_id, lookup, PrefixSalt(s));
  if (!chain.ok()) {
    // Only a bookkeeping bug gets here (the sequence holds entries already); compute instead.
    MODSERVE_LOG(ERROR) << "prefix cache: sequence " << seq_id << ": " << chain.status();
    return 0;
  }
  if (chain->empty()) return 0;
  for (const PrefixBlock* b : *chain) {
    for (size_t k = 0; k < s.result.routing.size(); ++k) {
      const auto first = b->payload.begin() + static_cast<ptrdiff_t>(k) * bs;
      s.result.routing[k].insert(s.result.routing[k].end(), first, first + bs);
    }
  }
  s.prefix_key = chain->back()->key;
  s.num_prefix_blocks = static_cast<int32_t>(chain->size());
  s.prefix_stopped = false;
  s.num_fed = s.num_prefix_blocks * bs;
  return s.num_fed;
}

void Engine::DetachPrefix(SequenceId seq_id, Sequence& s) {
  MODSERVE_CHECK(kv_->Free(seq_id).ok());
  MODSERVE_CHECK(kv_->AddSequence(seq_id).ok());
  s.num_fed = 0;
  for (auto& layer : s.result.routing) layer.clear();
  s.prefix_key = 0;
  s.num_prefix_blocks = 0;
  s.prefix_stopped = false;
}

void Engine::CachePrefixBlocks(SequenceId seq_id, Sequence& s) {
  if (!kv_->prefix_cache_enabled() || s.prefix_stopped) return;
  const ModelConfig& cfg = config();
  const int32_t bs = kv_->block_size();
  // Prompt blocks only: generated tokens were fed one per step, and a later prompt holding them
  // is computed by prefill, whose floating-point results may differ in the last bits.
  const int32_t limit = std::min(s.num_fed, static_cast<int32_t>(s.request.prompt.size()));
  const absl::Span<const TokenId> tokens(s.tokens);
  while ((s.num_prefix_blocks + 1) * bs <= limit) {
    const int32_t j = s.num_prefix_blocks;
    const int32_t end = (j + 1) * bs;
    std::vector<int32_t> counts(static_cast<size_t>(cfg.n_layers), end);
    std::vector<uint8_t> payload;
    payload.reserve(s.result.routing.size() * static_cast<size_t>(bs));
    for (size_t k = 0; k < s.result.routing.size(); ++k) {
      const std::vector<uint8_t>& decisions = s.result.routing[k];
      counts[static_cast<size_t>(cfg.mod->routed_layers[k])] =
          static_cast<int32_t>(std::count(decisions.begin(), decisions.begin() + end, uint8_t{1}));
      payload.insert(payload.end(), decisions.begin() + j * bs, decisions.begin() + end);
    }
    absl::StatusOr<uint64_t> key = kv_->CacheBlock(seq_id, s.prefix_key, tokens.subspan(j * bs, bs),
                                                   PrefixSalt(s), counts, std::move(payload));
    if (!key.ok()) MODSERVE_LOG(ERROR) << "prefix cache: sequence " << seq_id << ": " << key.status();
    if (!key.ok() || *key == 0) {
      s.prefix_stopped = true;
      return;
    }
    s.prefix_key = *key;
    ++s.num_prefix_blocks;
  }
}

PrefixCacheStats Engine::prefix_cache_stats() const {
  PrefixCacheStats p;
  p.enabled = kv_->prefix_cache_enabled();
  p.queries = prefix_queries_;
  p.hits = prefix_hits_;
  // Not GetStats(): that also counts reclaimable pages, a scan of every cached page.
  if (const PrefixCache* cache = kv_->prefix_cache(); cache != nullptr) {
    p.num_blocks = cache->num_blocks();
    p.num_pages = cache->num_pages();
  }
  return p;
}

absl::Status Engine::Draft(absl::Span<const StepEntry> entries, absl::Span<Sequence* const> seqs,
                           std::vector<int32_t>& num_draft,
                           std::vector<std::vector<TokenId>>* drafts,
                           std::vector<std::vector<std::vector<TokenLogprob>>>* dists) {
  const int64_t V = config().vocab_size;
  // The drafting sequences, their KV counts before drafting (the rollback point) and their
  // sampling states advanced over the drafted tokens (penalties see them, as they would).
  std::vector<size_t> who;
  std::vector<std::vector<int32_t>> base;
  std::vector<SamplingState> states;
  int32_t max_draft = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (num_draft[i] == 0) continue;
    MODSERVE_ASSIGN_OR_RETURN(SequenceKvUsage usage, kv_->Usage(entries[i].seq_id));
    who.push_back(i);
    base.push_back(std::move(usage.tokens_per_layer));
    states.push_back(seqs[i]->sampling);
    max_draft = std::max(max_draft, num_draft[i]);
  }
  auto rollback = [&] {
    for (size_t w = 0; w < who.size(); ++w) {
      MODSERVE_CHECK(kv_->Truncate(entries[who[w]].seq_id, base[w]).ok());
    }
  };
  std::vector<TokenId> feed(who.size());
  std::vector<StepSequence> plan;
  std::vector<size_t> rows;  // index into `who` of each plan row
  for (int32_t j = 0; j < max_draft; ++j) {
    plan.clear();
    rows.clear();
    for (size_t w = 0; w < who.size(); ++w) {
      const size_t i = who[w];
      if (num_draft[i] <= j) continue;
      Sequence* s = seqs[i];
      feed[w] = j == 0 ? s->tokens.back() : (*drafts)[i].back();
      plan.push_back({entries[i].seq_id, absl::MakeConstSpan(&feed[w], 1), s->num_fed + j,
                      s->speculative_threshold, false});
      rows.push_back(w);
    }
    if (plan.empty()) break;
    absl::StatusOr<StepOutput> out = transformer_->Step(plan);
    if (!out.ok()) {
      rollback();
      return out.status();
    }
    for (size_t r = 0; r < rows.size(); ++r) {
      const size_t w = rows[r];
      const size_t i = who[w];
      Sequence* s = seqs[i];
      absl::Span<float> row(out->logits.data() + static_cast<size_t>(out->logit_offsets[r]) * V,
                            static_cast<size_t>(V));
      for (TokenId id : unnamed_ids_) row[id] = -INFINITY;
      absl::StatusOr<std::vector<TokenLogprob>> q =
          sampler_->Distribution(row, s->request.sampling, states[w]);
      if (!q.ok()) {
        // The draft model cannot continue here; verify what it drafted so far.
        num_draft[i] = j;
        continue;
      }
      const bool greedy = s->request.sampling.temperature < kGreedyTemperature;
      const TokenId token =
          greedy ? q->front().id
                 : DrawToken(*q, UniformDraw(states[w].seed(),
                                             static_cast<uint64_t>(states[w].num_generated()),
                                             kDraftStream));
      states[w].Accept(token);
      (*drafts)[i].push_back(token);
      if (!greedy) (*dists)[i].push_back(*std::move(q));
    }
  }
  rollback();
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Engine::Step(absl::Span<const StepEntry> entries) {
  std::vector<Sequence*> seqs;
  seqs.reserve(entries.size());
  int32_t num_rows = 0;
  for (const StepEntry& e : entries) {
    auto it = sequences_.find(e.seq_id);
    if (it == sequences_.end()) return absl::NotFoundError(absl::StrCat("no sequence ", e.seq_id));
    Sequence* s = it->second.get();
    const int32_t pending = static_cast<int32_t>(s->tokens.size()) - s->num_fed;
    if (s->finished || pending == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("sequence ", e.seq_id, " has nothing to feed"));
    }
    if (e.num_tokens < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", e.seq_id, ": num_tokens ", e.num_tokens, " < 1"));
    }
    num_rows += std::min(e.num_tokens, pending);
    seqs.push_back(s);
  }
  // Speculation: decoding sequences draft tokens that the step then verifies, within the rows
  // left in the step and the tokens they may still generate. The whole step stays within the
  // backend's row-invariant range, where each verified row gets the bits of a one-row decode
  // step (a step whose plain rows already leave it drafts nothing): that is what makes the
  // output equal decoding without speculation.
  std::vector<int32_t> num_draft(entries.size(), 0);
  bool speculate = false;
  int32_t spare_rows = std::max(
      0, std::min(options_.max_batch_tokens, max_row_invariant_rows_) - num_rows);
  for (size_t i = 0; i < entries.size(); ++i) {
    const Sequence* s = seqs[i];
    if (entries[i].num_draft <= 0 || s->speculative_tokens == 0 || s->num_fed == 0 ||
        static_cast<int32_t>(s->tokens.size()) - s->num_fed != 1) {
      continue;
    }
    const int32_t left = s->request.sampling.max_new_tokens -
                         static_cast<int32_t>(s->result.token_ids.size()) - 1;
    num_draft[i] = std::max(
        0, std::min({entries[i].num_draft, s->speculative_tokens, left, spare_rows}));
    spare_rows -= num_draft[i];
    speculate = speculate || num_draft[i] > 0;
  }
  // A step that runs out of KV pages while speculating runs again without speculation, so that
  // speculation never preempts a sequence that decoding alone would not.
  auto without_speculation = [&]() {
    std::vector<StepEntry> plain(entries.begin(), entries.end());
    for (StepEntry& e : plain) e.num_draft = 0;
    return Step(plain);
  };
  // A sequence that holds nothing yet starts from its longest cached prefix. Undone if the step
  // fails, so that a failed step changes nothing.
  std::vector<int32_t> num_cached(entries.size(), 0);
  int64_t queries = 0;
  int64_t hits = 0;
  if (kv_->prefix_cache_enabled()) {
    for (size_t i = 0; i < entries.size(); ++i) {
      Sequence* s = seqs[i];
      if (s->num_fed != 0 || s->WantsPromptLogprobs()) continue;
      queries += static_cast<int64_t>(s->tokens.size());
      num_cached[i] = AttachPrefix(entries[i].seq_id, *s);
      hits += num_cached[i];
    }
  }
  auto undo = [&](absl::Status st) {
    for (size_t i = 0; i < entries.size(); ++i) {
      if (num_cached[i] > 0) DetachPrefix(entries[i].seq_id, *seqs[i]);
    }
    return st;
  };
  std::vector<std::vector<TokenId>> drafts(entries.size());
  std::vector<std::vector<std::vector<TokenLogprob>>> dists(entries.size());
  if (speculate) {
    const absl::Status drafted = Draft(entries, seqs, num_draft, &drafts, &dists);
    if (!drafted.ok()) {
      undo(drafted).IgnoreError();
      if (absl::IsResourceExhausted(drafted)) return without_speculation();
      return drafted;
    }
  }
  // The verified rows: the pending token, then the drafts.
  std::vector<std::vector<TokenId>> verify(entries.size());
  std::vector<StepSequence> plan;
  plan.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    Sequence* s = seqs[i];
    if (num_draft[i] > 0) {
      verify[i].push_back(s->tokens.back());
      verify[i].insert(verify[i].end(), drafts[i].begin(), drafts[i].end());
      plan.push_back({entries[i].seq_id, verify[i], s->num_fed, s->threshold, true});
      continue;
    }
    const int32_t pending = static_cast<int32_t>(s->tokens.size()) - s->num_fed;
    const int32_t n = std::min(entries[i].num_tokens, pending);
    plan.push_back({entries[i].seq_id, absl::MakeConstSpan(s->tokens).subspan(s->num_fed, n),
                    s->num_fed, s->threshold, s->WantsPromptLogprobs(),
                    static_cast<int32_t>(s->request.prompt.size())});
  }
  ++num_steps_;
  if (options_.faults.backend_fault_step > 0 && num_steps_ >= options_.faults.backend_fault_step) {
    if (options_.faults.on_backend_fault) options_.faults.on_backend_fault();
    return undo(absl::InternalError(absl::StrCat("injected backend fault at step ", num_steps_)));
  }
  absl::StatusOr<StepOutput> stepped = transformer_->Step(plan);
  if (!stepped.ok()) {
    if (speculate && absl::IsResourceExhausted(stepped.status())) {
      undo(stepped.status()).IgnoreError();
      --num_steps_;
      return without_speculation();
    }
    return undo(stepped.status());
  }
  StepOutput& out = *stepped;
  prefix_queries_ += queries;
  prefix_hits_ += hits;

  // The forward pass committed every sequence's KV entries; from here each sequence advances
  // or fails on its own.
  StepResult result;
  result.prefix_cache_queries = queries;
  result.prefix_cache_hits = hits;
  result.num_tokens = out.row_offsets.back();
  result.num_layer_skips = out.num_layer_skips;
  for (const auto& sel : out.selected) {
    result.routed_rows.push_back(
        static_cast<int32_t>(std::count(sel.begin(), sel.end(), uint8_t{1})));
  }
  const int64_t V = config().vocab_size;
  auto record = [](Sequence* s, const TokenEvent& ev) {
    s->tokens.push_back(ev.token);
    s->result.text += ev.text;
    s->result.token_ids.push_back(ev.token);
    s->result.logprobs.push_back(ev.logprob);
    s->result.top_logprobs.push_back(ev.top_logprobs);
    if (ev.finish_reason) {
      s->finished = true;
      s->result.finish_reason = *ev.finish_reason;
    }
  };
  // Sequences whose next token is sampled after the loop, all rows at once.
  struct PendingSample {
    size_t seq;     // index into entries / seqs
    size_t result;  // index into result.sequences
    absl::Span<float> logits;
    int64_t index;  // the token's index in the output
    absl::StatusOr<SampleResult> sample = absl::UnknownError("not sampled");
    bool prepared = true;  // false: PrepareSample failed, and `sample` holds why
  };
  std::vector<PendingSample> pending;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Sequence* s = seqs[i];
    const SequenceId seq_id = entries[i].seq_id;
    float* rows = out.logits.data() + static_cast<size_t>(out.logit_offsets[i]) * V;
    const int32_t num_rows_i = out.logit_offsets[i + 1] - out.logit_offsets[i];
    // Rows of this sequence that stay fed: all of them, or for a speculative sequence the
    // pending token and the accepted drafts.
    int32_t kept = static_cast<int32_t>(plan[i].tokens.size());
    SequenceStepResult r{seq_id, kept, std::nullopt, absl::OkStatus(), {}, num_cached[i]};
    if (num_draft[i] > 0) {
      const int32_t k = num_draft[i];
      r.num_drafted = k;
      ++result.num_drafts;
      result.num_draft_tokens += k;
      if (static_cast<int32_t>(result.accepted_per_position.size()) < k) {
        result.accepted_per_position.resize(static_cast<size_t>(k), 0);
      }
      std::vector<TokenEvent> events;
      kept = 0;
      for (int32_t j = 0; j <= k; ++j) {
        absl::Span<float> row(rows + static_cast<size_t>(j) * V, static_cast<size_t>(V));
        bool accepted = false;
        absl::StatusOr<TokenEvent> ev =
            j < k ? VerifyToken(seq_id, *s, row, drafts[i][j],
                                dists[i].empty() ? absl::Span<const TokenLogprob>()
                                                 : absl::MakeConstSpan(dists[i][j]),
                                &accepted)
                  : NextToken(seq_id, *s, row);
        kept = j + 1;  // row j's input token is part of the sequence either way
        if (!ev.ok()) {
          r.status = ev.status();
          break;
        }
        record(s, *ev);
        const bool finished = ev->finish_reason.has_value();
        events.push_back(*std::move(ev));
        if (j == k || !accepted) break;
        ++r.num_accepted;
        ++result.accepted_per_position[static_cast<size_t>(j)];
        if (finished) break;
      }
      result.num_accepted_tokens += r.num_accepted;
      // Roll back the rows past `kept` at every layer: all of them at a dense layer, the
      // routed-in ones at a routed layer.
      std::vector<int32_t> keep(static_cast<size_t>(config().n_layers));
      for (int l = 0; l < config().n_layers; ++l) keep[l] = *kv_->NumTokens(seq_id, l);
      const int32_t dropped = k + 1 - kept;
      for (int l = 0; l < config().n_layers; ++l) {
        if (!config().IsRouted(l)) keep[l] -= dropped;
      }
      for (size_t ki = 0; ki < out.selected.size(); ++ki) {
        const auto first = out.selected[ki].begin() + out.row_offsets[i] + kept;
        const auto last = out.selected[ki].begin() + out.row_offsets[i + 1];
        keep[static_cast<size_t>(config().mod->routed_layers[ki])] -=
            static_cast<int32_t>(std::count(first, last, uint8_t{1}));
      }
      MODSERVE_CHECK(kv_->Truncate(seq_id, keep).ok());
      r.num_fed = kept;
      if (!events.empty()) {
        r.event = std::move(events.front());
        r.more_events.assign(std::make_move_iterator(events.begin() + 1),
                             std::make_move_iterator(events.end()));
      }
    }
    for (size_t ki = 0; ki < out.selected.size(); ++ki) {
      auto first = out.selected[ki].begin() + out.row_offsets[i];
      auto last = first + kept;
      s->result.routing[ki].insert(s->result.routing[ki].end(), first, last);
      r.routed_rows.push_back(static_cast<int32_t>(std::count(first, last, uint8_t{1})));
    }
    const int32_t start_pos = s->num_fed;
    s->num_fed += kept;
    CachePrefixBlocks(seq_id, *s);
    if (num_draft[i] == 0) {
      if (plan[i].all_logits) r.status = AddPromptLogprobs(*s, start_pos, rows, num_rows_i);
      if (r.status.ok() && s->num_fed == static_cast<int32_t>(s->tokens.size())) {
        // All input is in the cache: the next token comes from the last row's logits.
        const absl::Span<float> row(rows + static_cast<size_t>(num_rows_i - 1) * V, V);
        const auto index = static_cast<int64_t>(s->result.token_ids.size());
        PendingSample p{i, result.sequences.size(), row, index};
        if (absl::Status st = PrepareSample(seq_id, row, index); !st.ok()) {
          p.sample = st;
          p.prepared = false;
        }
        pending.push_back(std::move(p));
      }
    }
    if (!r.status.ok()) s->finished = true;
    result.sequences.push_back(std::move(r));
  }
  // Sampled in parallel on the backend's host threads: each sequence has its own state, and its
  // draw depends on its own seed and token count only, so the tokens are those of sampling the
  // rows one by one. Detokenizing and stop checks follow in sequence order.
  backend_->HostParallelFor(static_cast<int64_t>(pending.size()), [&](int64_t j) {
    PendingSample& p = pending[static_cast<size_t>(j)];
    if (p.prepared) {
      Sequence* s = seqs[p.seq];
      p.sample = sampler_->Sample(p.logits, s->request.sampling, &s->sampling);
    }
  });
  for (PendingSample& p : pending) {
    Sequence* s = seqs[p.seq];
    SequenceStepResult& r = result.sequences[p.result];
    absl::StatusOr<TokenEvent> ev =
        FinishSample(entries[p.seq].seq_id, *s, std::move(p.sample), p.index);
    if (ev.ok()) {
      record(s, *ev);
      r.event = *std::move(ev);
    } else {
      r.status = ev.status();
      s->finished = true;
    }
  }
  return result;
}

absl::Status Engine::Release(SequenceId seq_id) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return absl::NotFoundError(absl::StrCat("no sequence ", seq_id));
  sequences_.erase(it);
  return kv_->Free(seq_id);
}

absl::Status Engine::Preempt(SequenceId seq_id) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return absl::NotFoundError(absl::StrCat("no sequence ", seq_id));
  MODSERVE_RETURN_IF_ERROR(kv_->Free(seq_id));
  MODSERVE_RETURN_IF_ERROR(kv_->AddSequence(seq_id));
  Sequence& s = *it->second;
  s.num_fed = 0;
  for (auto& layer : s.result.routing) layer.clear();  // recomputed identically on refeed
  s.prefix_key = 0;
  s.num_prefix_blocks = 0;
  s.prefix_stopped = false;
  return absl::OkStatus();
}

absl::StatusOr<GenerationResult> Engine::Result(SequenceId seq_id) const {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return absl::NotFoundError(absl::StrCat("no sequence ", seq_id));
  const Sequence& s = *it->second;
  GenerationResult r = s.result;
  MODSERVE_ASSIGN_OR_RETURN(SequenceKvUsage usage, kv_->Usage(seq_id));
  int64_t entries = 0;
  for (int32_t t : usage.tokens_per_layer) entries += t;
  r.kv_bytes = entries * kv_bytes_per_token_layer();
  r.kv_bytes_dense = int64_t{s.num_fed} * config().n_layers * kv_bytes_per_token_layer();
  r.kv_pages = usage.num_pages;
  return r;
}

absl::StatusOr<std::vector<GenerationResult>> Engine::Generate(absl::Span<const Request> requests) {
  SchedulerOptions so;
  so.max_num_seqs = options_.max_seqs;
  so.max_batch_tokens = options_.max_batch_tokens;
  so.max_queue = std::max<int32_t>(1, static_cast<int32_t>(requests.size()));
  so.num_pages = kv_->GetStats().num_pages;
  so.max_speculative_step_rows = max_row_invariant_rows_;
  Scheduler scheduler(so, KvPageEstimator::ForModel(config(), kv_->block_size()));
  EngineExecutor executor(this);
  StepRunner runner(&executor, &scheduler);

  std::vector<SequenceId> ids;
  auto release_all = [&] {
    for (SequenceId id : ids) (void)Release(id).ok();
  };
  for (const Request& r : requests) {
    absl::StatusOr<SequenceId> id = Add(r);
    if (!id.ok()) {
      release_all();
      return id.status();
    }
    ids.push_back(*id);
    const absl::Status queued = scheduler.Enqueue({*id, static_cast<int32_t>(r.prompt.size()),
                                                   r.sampling.max_new_tokens, 0, r.threshold,
                                                   SpeculativeTokens(r)});
    if (!queued.ok()) {
      release_all();
      return queued;
    }
  }
  std::vector<GenerationResult> results(requests.size());
  size_t num_done = 0;
  while (num_done < ids.size()) {
    IterationResult it = runner.RunOnce();
    if (!it.engine_error.ok()) {
      release_all();
      return it.engine_error;
    }
    if (!it.failed.empty()) {
      release_all();
      return it.failed.front().second;
    }
    if (it.plan.empty() && it.finished.empty()) {
      release_all();
      return absl::InternalError("generate: the scheduler has nothing to run");
    }
    for (SequenceId id : it.finished) {
      const size_t k = static_cast<size_t>(std::find(ids.begin(), ids.end(), id) - ids.begin());
      absl::StatusOr<GenerationResult> r = Result(id);
      if (!r.ok()) {
        release_all();
        return r.status();
      }
      results[k] = *std::move(r);
      scheduler.Remove(id);
      (void)Release(id).ok();
      ++num_done;
    }
  }
  release_all();
  return results;
}

}  // namespace modserve::engine
