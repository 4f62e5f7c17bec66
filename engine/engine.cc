// Engine: model + backend + KV cache + sampler, driven one step at a time.
#include "engine/engine.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/backend/registry.h"
#include "engine/common/status_macros.h"

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

  Request request;
  std::vector<TokenId> tokens;  // prompt, then generated tokens
  int32_t num_fed = 0;          // tokens whose KV entries are in the cache
  double threshold;
  SamplingState sampling;
  StopChecker stop;
  std::optional<IncrementalDetokenizer> detok;
  GenerationResult result;
  bool finished = false;
};

Engine::Engine(EngineOptions options, LoadedModel model)
    : options_(std::move(options)), model_(std::move(model)) {}

Engine::~Engine() = default;

int64_t Engine::kv_bytes_per_token_layer() const {
  return 2 * config().n_kv_heads * config().head_dim * static_cast<int64_t>(DTypeBytes(options_.kv_dtype));
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  MODSERVE_ASSIGN_OR_RETURN(LoadedModel model, LoadModel(options.model_dir));
  std::unique_ptr<Engine> e(new Engine(options, std::move(model)));
  auto tok = LoadTokenizer(options.model_dir);
  if (tok.ok()) {
    e->tokenizer_ = *std::move(tok);
  } else if (!absl::IsNotFound(tok.status())) {
    return tok.status();
  }
  backend::BackendOptions bo;
  bo.num_threads = options.num_threads;
  MODSERVE_ASSIGN_OR_RETURN(e->backend_, backend::CreateBackend(options.backend, bo));
  const ModelConfig& cfg = e->config();
  const int64_t page_bytes = KvCacheManager::BytesPerPage(
      static_cast<int32_t>(cfg.n_kv_heads), options.block_size, static_cast<int32_t>(cfg.head_dim),
      options.kv_dtype);
  const int64_t num_pages = options.kv_cache_bytes / std::max<int64_t>(1, page_bytes);
  if (num_pages < cfg.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv_cache_bytes ", options.kv_cache_bytes, " holds ", num_pages, " pages of ", page_bytes,
        " bytes; at least one page per layer (", cfg.n_layers, ") is needed"));
  }
  if (num_pages > (int64_t{1} << 31) / std::max(1, options.block_size)) {
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
  to.kv_dtype = options.kv_dtype;
  MODSERVE_ASSIGN_OR_RETURN(e->transformer_, Transformer::Create(cfg, e->model_.weights(),
                                                                 e->backend_.get(), e->kv_.get(),
                                                                 to));
  e->sampler_ = std::make_unique<Sampler>(options.seed);
  return e;
}

absl::StatusOr<SequenceId> Engine::Add(const Request& request) {
  const ModelConfig& cfg = config();
  MODSERVE_RETURN_IF_ERROR(Validate(request.sampling));
  if (request.prompt.empty()) return absl::InvalidArgumentError("prompt has no tokens");
  for (TokenId t : request.prompt) {
    if (t < 0 || t >= cfg.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token id ", t,
                                                     " is outside the vocabulary [0, ",
                                                     cfg.vocab_size, ")"));
    }
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
  const SequenceId id = next_id_++;
  MODSERVE_RETURN_IF_ERROR(kv_->AddSequence(id));
  auto seq = std::make_unique<Sequence>(request, tau,
                                        sampler_->NewState(request.sampling, request.prompt), cfg,
                                        tokenizer_.get());
  seq->result.prompt_tokens = static_cast<int32_t>(request.prompt.size());
  if (cfg.mod) {
    seq->result.routed_layers = cfg.mod->routed_layers;
    seq->result.routing.resize(cfg.mod->routed_layers.size());
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

absl::StatusOr<StepResult> Engine::Step(absl::Span<const StepEntry> entries) {
  std::vector<Sequence*> seqs;
  std::vector<StepSequence> plan;
  seqs.reserve(entries.size());
  plan.reserve(entries.size());
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
    const int32_t n = std::min(e.num_tokens, pending);
    seqs.push_back(s);
    plan.push_back({e.seq_id, absl::MakeConstSpan(s->tokens).subspan(s->num_fed, n), s->num_fed,
                    s->threshold, false});
  }
  MODSERVE_ASSIGN_OR_RETURN(StepOutput out, transformer_->Step(plan));

  StepResult result;
  result.num_tokens = out.row_offsets.back();
  result.num_layer_skips = out.num_layer_skips;
  for (const auto& sel : out.selected) {
    result.routed_rows.push_back(
        static_cast<int32_t>(std::count(sel.begin(), sel.end(), uint8_t{1})));
  }
  const int64_t V = config().vocab_size;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Sequence* s = seqs[i];
    const int32_t n = static_cast<int32_t>(plan[i].tokens.size());
    for (size_t k = 0; k < out.selected.size(); ++k) {
      auto& dst = s->result.routing[k];
      dst.insert(dst.end(), out.selected[k].begin() + out.row_offsets[i],
                 out.selected[k].begin() + out.row_offsets[i + 1]);
    }
    s->num_fed += n;
    SequenceStepResult r{entries[i].seq_id, n, std::nullopt};
    if (s->num_fed == static_cast<int32_t>(s->tokens.size())) {
      // All input is in the cache: sample the next token from the last row's logits.
      const float* row = out.logits.data() + static_cast<size_t>(out.logit_offsets[i]) * V;
      MODSERVE_ASSIGN_OR_RETURN(SampleResult sample,
                                sampler_->Sample(absl::MakeConstSpan(row, V),
                                                 s->request.sampling, &s->sampling));
      TokenEvent ev;
      ev.token = sample.token;
      ev.logprob = sample.logprob;
      ev.top_logprobs = std::move(sample.top_logprobs);
      std::string delta;
      if (s->detok) {
        MODSERVE_ASSIGN_OR_RETURN(delta, s->detok->Add(sample.token));
      }
      StopCheckResult stop = s->stop.Append(sample.token, delta);
      ev.text = std::move(stop.emit);
      ev.finish_reason = stop.finish_reason;
      if (stop.finish_reason && *stop.finish_reason != FinishReason::kStopString && s->detok) {
        // Bytes the detokenizer still holds (an unfinished character) end the text.
        MODSERVE_ASSIGN_OR_RETURN(std::string tail, s->detok->Flush());
        ev.text += tail;
      }
      s->result.text += ev.text;
      s->tokens.push_back(sample.token);
      s->result.token_ids.push_back(sample.token);
      s->result.logprobs.push_back(ev.logprob);
      s->result.top_logprobs.push_back(ev.top_logprobs);
      if (ev.finish_reason) {
        s->finished = true;
        s->result.finish_reason = *ev.finish_reason;
      }
      r.event = std::move(ev);
    }
    result.sequences.push_back(std::move(r));
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
  const int32_t L = static_cast<int32_t>(config().n_layers);
  std::vector<SequenceId> ids;
  std::vector<int32_t> worst;  // pages a sequence could need if every token entered every layer
  const int64_t total_pages = kv_->GetStats().num_pages;
  for (const Request& r : requests) {
    MODSERVE_ASSIGN_OR_RETURN(SequenceId id, Add(r));
    ids.push_back(id);
    const int32_t len = static_cast<int32_t>(r.prompt.size()) + r.sampling.max_new_tokens;
    MODSERVE_ASSIGN_OR_RETURN(int32_t pages,
                              kv_->PagesNeededForNew(std::vector<int32_t>(L, len)));
    if (pages > total_pages) {
      for (SequenceId s : ids) (void)Release(s).ok();
      return absl::ResourceExhaustedError(absl::StrCat(
          "a request of ", len, " tokens may need ", pages, " KV pages; the cache has ",
          total_pages, " (raise kv_cache_bytes)"));
    }
    worst.push_back(pages);
  }
  std::vector<GenerationResult> results(requests.size());
  std::vector<size_t> running;
  size_t next = 0;
  int64_t promised = 0;
  while (next < ids.size() || !running.empty()) {
    // Admit in order while the worst case of everything admitted still fits.
    while (next < ids.size() && static_cast<int32_t>(running.size()) < options_.max_seqs &&
           promised + worst[next] <= total_pages) {
      promised += worst[next];
      running.push_back(next++);
    }
    // Decode tokens first, then prefill chunks with what is left of the token budget.
    std::vector<StepEntry> entries;
    int32_t budget = options_.max_batch_tokens;
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t k : running) {
        const int32_t pending = PendingTokens(ids[k]);
        const bool decode = pending == 1;
        if (budget == 0 || pending == 0 || decode != (pass == 0)) continue;
        const int32_t n = std::min(pending, budget);
        entries.push_back({ids[k], n});
        budget -= n;
      }
    }
    auto step = Step(entries);
    if (!step.ok()) {
      for (size_t k = 0; k < ids.size(); ++k) (void)Release(ids[k]).ok();
      return step.status();
    }
    std::vector<size_t> still;
    for (size_t k : running) {
      if (!Finished(ids[k])) {
        still.push_back(k);
        continue;
      }
      MODSERVE_ASSIGN_OR_RETURN(results[k], Result(ids[k]));
      MODSERVE_RETURN_IF_ERROR(Release(ids[k]));
      promised -= worst[k];
    }
    running = std::move(still);
  }
  return results;
}

}  // namespace modserve::engine
