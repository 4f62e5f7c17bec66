// GenerateService. A sink (engine side) and a reactor (gRPC side) meet in one mutex-guarded
// pending message: the engine thread appends tokens and posts a pump to the reply thread, the
// pump or OnWriteDone starts the next write, and whoever sees "done and nothing in flight" calls
// Finish, exactly once.
#include "server/generate_service.h"

#include <pthread.h>

#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/sampler/stop_checker.h"
#include "server/request_validation.h"
#include "server/status_mapping.h"

namespace modserve::server {
namespace {

v1::FinishReason ToProto(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case engine::FinishReason::kStopToken:
      return v1::FINISH_REASON_STOP_TOKEN;
    case engine::FinishReason::kStopString:
      return v1::FINISH_REASON_STOP_STRING;
    case engine::FinishReason::kCancelled:
    case engine::FinishReason::kError:
      return v1::FINISH_REASON_UNSPECIFIED;  // these end in a non-OK status, never a response
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

double Seconds(absl::Time from, absl::Time to) { return absl::ToDoubleSeconds(to - from); }

void AppendPromptLogprobs(absl::Span<const engine::PromptLogprob> prompt,
                          google::protobuf::RepeatedPtrField<v1::PromptLogprob>* out) {
  for (const engine::PromptLogprob& p : prompt) {
    v1::PromptLogprob* lp = out->Add();
    lp->set_token_id(p.token);
    if (p.logprob) lp->set_logprob(*p.logprob);
    for (const engine::TokenLogprob& t : p.top) {
      v1::TopLogprob* alt = lp->add_top();
      alt->set_token_id(t.id);
      alt->set_logprob(t.logprob);
    }
  }
}

void AppendLogprob(int32_t token, float logprob, absl::Span<const engine::TokenLogprob> top,
                   int32_t top_logprobs,
                   google::protobuf::RepeatedPtrField<v1::TokenLogprob>* out) {
  v1::TokenLogprob* lp = out->Add();
  lp->set_token_id(token);
  lp->set_logprob(logprob);
  for (size_t i = 0; i < top.size() && static_cast<int32_t>(i) < top_logprobs; ++i) {
    v1::TopLogprob* t = lp->add_top();
    t->set_token_id(top[i].id);
    t->set_logprob(top[i].logprob);
  }
}

template <typename Response>
void FillSummary(const engine::FinishedRequest& done, bool return_decisions, Response* out) {
  const engine::GenerationResult& r = done.result;
  out->set_finish_reason(ToProto(r.finish_reason));
  out->mutable_usage()->set_prompt_tokens(r.prompt_tokens);
  out->mutable_usage()->set_completion_tokens(static_cast<int32_t>(r.token_ids.size()));
  const engine::RequestTimings& t = done.timings;
  v1::Timings* timings = out->mutable_timings();
  timings->set_queue_seconds(Seconds(t.accepted, t.scheduled));
  timings->set_first_token_seconds(Seconds(t.accepted, t.first_token));
  timings->set_total_seconds(Seconds(t.accepted, t.finished));
  timings->set_prefill_seconds(Seconds(t.scheduled, t.first_token));
  timings->set_decode_seconds(Seconds(t.first_token, t.finished));
  v1::RoutingSummary* routing = out->mutable_routing();
  routing->set_kv_bytes(r.kv_bytes);
  routing->set_kv_bytes_dense(r.kv_bytes_dense);
  routing->set_threshold(done.threshold);
  for (size_t k = 0; k < r.routed_layers.size() && k < r.routing.size(); ++k) {
    const std::vector<uint8_t>& d = r.routing[k];
    int64_t computed = 0;
    for (uint8_t x : d) computed += x;
    v1::LayerRouting* layer = routing->add_layers();
    layer->set_layer(r.routed_layers[k]);
    layer->set_tokens_total(static_cast<int64_t>(d.size()));
    layer->set_tokens_computed(computed);
    layer->set_computed_fraction(d.empty() ? 0.0 : static_cast<double>(computed) / d.size());
    if (return_decisions) layer->set_decisions(std::string(d.begin(), d.end()));
  }
}

absl::Time ToAbslDeadline(std::chrono::system_clock::time_point deadline) {
  // gRPC reports "no deadline" as a far-future time point; anything a century out is that.
  if (deadline >= std::chrono::system_clock::now() + std::chrono::hours(24 * 365 * 100)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

}  // namespace

// Runs the gRPC side of engine events (starting stream writes, filling and finishing unary
// responses) on its own thread. The engine thread only appends to a sink and posts a task, so
// serialising and sending replies never lengthen a step; with spare cores they overlap it.
class ReplyExecutor {
 public:
  ReplyExecutor() : thread_([this] { Run(); }) {
    pthread_setname_np(thread_.native_handle(), "modserve-reply");
  }
  // Runs every task already posted, then joins. Nothing may post after destruction starts.
  ~ReplyExecutor() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  void Post(std::function<void()> task) {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
  }

 private:
  void Run() {
    std::vector<std::function<void()>> batch;
    for (;;) {
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](ReplyExecutor* e) { return e->stop_ || !e->tasks_.empty(); }, this));
        if (tasks_.empty()) return;  // stopping, and nothing left
        batch.swap(tasks_);
      }
      for (std::function<void()>& task : batch) task();
      batch.clear();
    }
  }

  absl::Mutex mu_;
  std::vector<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Counts a reactor from construction to destruction (after OnDone), so that shutdown can wait
// for every call to be completely over. Only admitted calls build one, so its end also gives
// the call's CallGate slot back.
class CallCounter {
 public:
  explicit CallCounter(GenerateService* service) : service_(service) { ++service_->num_calls_; }
  ~CallCounter() {
    --service_->num_calls_;
    if (service_->gate_ != nullptr) service_->gate_->ReleaseGeneration();
  }

 private:
  GenerateService* service_;
};

namespace {

class UnaryGenerate final : public grpc::ServerUnaryReactor {
 public:
  explicit UnaryGenerate(GenerateService* service) : counter_(service) {}
  void OnCancel() override {
    if (handle_ != nullptr) handle_->Cancel();
  }
  void OnDone() override { delete this; }

  CallCounter counter_;
  std::shared_ptr<engine::RequestHandle> handle_;  // set before the handler returns
};

// Fills the unary response from the final result; tokens need no streaming here. The filling
// and the Finish run on the reply thread.
class UnarySink final : public engine::GenerationSink,
                        public std::enable_shared_from_this<UnarySink> {
 public:
  UnarySink(UnaryGenerate* reactor, v1::GenerateResponse* response, const v1::GenerateRequest& r,
            ReplyExecutor* replies)
      : reactor_(reactor),
        response_(response),
        replies_(replies),
        request_id_(r.request_id()),
        top_logprobs_(r.top_logprobs()),
        return_decisions_(r.routing().return_decisions()) {}

  void OnToken(const engine::TokenEvent&) override {}

  void OnDone(absl::StatusOr<engine::FinishedRequest> done) override {
    auto result = std::make_shared<absl::StatusOr<engine::FinishedRequest>>(std::move(done));
    replies_->Post([self = shared_from_this(), result] { self->Reply(*result); });
  }

 private:
  void Reply(const absl::StatusOr<engine::FinishedRequest>& done) {
    if (!done.ok()) {
      reactor_->Finish(ToGrpcStatus(done.status(), request_id_));
      return;
    }
    const engine::GenerationResult& r = done->result;
    response_->set_request_id(request_id_);
    response_->mutable_token_ids()->Add(r.token_ids.begin(), r.token_ids.end());
    response_->set_text(r.text);
    for (size_t i = 0; i < r.token_ids.size(); ++i) {
      AppendLogprob(r.token_ids[i], r.logprobs[i],
                    i < r.top_logprobs.size() ? absl::MakeConstSpan(r.top_logprobs[i])
                                              : absl::Span<const engine::TokenLogprob>(),
                    top_logprobs_, response_->mutable_logprobs());
    }
    AppendPromptLogprobs(r.prompt_logprobs, response_->mutable_prompt_logprobs());
    FillFinal(*done, return_decisions_, response_);
    reactor_->Finish(grpc::Status::OK);
  }

  UnaryGenerate* reactor_;  // valid until Finish
  v1::GenerateResponse* response_;
  ReplyExecutor* replies_;
  std::string request_id_;
  int32_t top_logprobs_;
  bool return_decisions_;
};

class StreamSink;

class StreamGenerate final : public grpc::ServerWriteReactor<v1::GenerateStreamResponse> {
 public:
  explicit StreamGenerate(GenerateService* service) : counter_(service) {}
  void OnWriteDone(bool ok) override;
  void OnCancel() override {
    if (handle_ != nullptr) handle_->Cancel();
  }
  void OnDone() override { delete this; }

  CallCounter counter_;
  std::shared_ptr<StreamSink> sink_;
  std::shared_ptr<engine::RequestHandle> handle_;  // set before the handler returns
};

class StreamSink final : public engine::GenerationSink,
                         public std::enable_shared_from_this<StreamSink> {
 public:
  StreamSink(StreamGenerate* reactor, const v1::GenerateRequest& r, ReplyExecutor* replies,
             int32_t stream_interval)
      : reactor_(reactor),
        replies_(replies),
        stream_interval_(stream_interval),
        request_id_(r.request_id()),
        top_logprobs_(r.top_logprobs()),
        return_decisions_(r.routing().return_decisions()) {}

  // Engine thread: append, and hand the write to the reply thread unless one is in flight (its
  // OnWriteDone sends what accumulated) or a pump is already posted.
  void OnToken(const engine::TokenEvent& event) override {
    bool post;
    {
      absl::MutexLock lock(&mu_);
      if (write_failed_) return;
      AppendToken(event, top_logprobs_, Pending());
      post = PostPumpLocked();
    }
    if (post) PostPump();
  }

  void OnDone(absl::StatusOr<engine::FinishedRequest> done) override {
    bool post;
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      if (done.ok()) {
        FillFinal(*done, return_decisions_, Pending());
        final_status_ = grpc::Status::OK;
      } else {
        has_pending_ = false;  // an error ends the stream now; partial output has been sent
        final_status_ = ToGrpcStatus(done.status(), request_id_);
      }
      post = PostPumpLocked();
    }
    if (post) PostPump();
  }

  void WriteDone(bool ok) {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {
        write_failed_ = true;
        has_pending_ = false;
      }
    }
    Pump();
  }

 private:
  // Starts the next write or the Finish when nothing is in flight; acts outside the lock, since
  // gRPC may run the next reaction inline.
  void Pump() {
    enum class Action { kNone, kWrite, kFinish } action = Action::kNone;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      pump_posted_ = false;
      if (finished_ || writing_) return;
      if (ReadyLocked()) {
        in_flight_.Swap(&pending_);
        has_pending_ = false;
        sent_first_ = true;
        writing_ = true;
        action = Action::kWrite;
      } else if (done_ && !has_pending_) {
        finished_ = true;
        status = final_status_;
        action = Action::kFinish;
      }
    }
    if (action == Action::kWrite) reactor_->StartWrite(&in_flight_);
    if (action == Action::kFinish) reactor_->Finish(status);
  }

  // The pending message goes out when it is the first (time to first token is never held back),
  // the last, or holds --stream_interval tokens.
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return has_pending_ &&
           (done_ || !sent_first_ || pending_.token_ids_size() >= stream_interval_);
  }

  bool PostPumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || writing_ || pump_posted_) return false;
    if (!done_ && !ReadyLocked()) return false;
    pump_posted_ = true;
    return true;
  }
  void PostPump() { replies_->Post([self = shared_from_this()] { self->Pump(); }); }

  StreamGenerate* reactor_;  // valid until Finish
  ReplyExecutor* const replies_;
  const int32_t stream_interval_;  // >= 1
  const std::string request_id_;
  const int32_t top_logprobs_;
  const bool return_decisions_;

  // The message that waits behind the one in flight; tokens merge into it until it is sent.
  v1::GenerateStreamResponse* Pending() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!has_pending_) {
      pending_.Clear();
      pending_.set_request_id(request_id_);
      has_pending_ = true;
    }
    return &pending_;
  }

  absl::Mutex mu_;
  v1::GenerateStreamResponse pending_ ABSL_GUARDED_BY(mu_);
  bool has_pending_ ABSL_GUARDED_BY(mu_) = false;
  v1::GenerateStreamResponse in_flight_;  // owned by gRPC between StartWrite and OnWriteDone
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool pump_posted_ ABSL_GUARDED_BY(mu_) = false;
  bool sent_first_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
};

void StreamGenerate::OnWriteDone(bool ok) {
  if (!ok && handle_ != nullptr) handle_->Cancel();
  sink_->WriteDone(ok);
}

}  // namespace

void AppendToken(const engine::TokenEvent& event, int32_t top_logprobs,
                 v1::GenerateStreamResponse* out) {
  AppendPromptLogprobs(event.prompt_logprobs, out->mutable_prompt_logprobs());
  out->add_token_ids(event.token);
  out->mutable_text()->append(event.text);
  AppendLogprob(event.token, event.logprob, event.top_logprobs, top_logprobs,
                out->mutable_logprobs());
}

void FillFinal(const engine::FinishedRequest& done, bool return_decisions,
               v1::GenerateResponse* out) {
  FillSummary(done, return_decisions, out);
}

void FillFinal(const engine::FinishedRequest& done, bool return_decisions,
               v1::GenerateStreamResponse* out) {
  FillSummary(done, return_decisions, out);
}

GenerateService::GenerateService(const engine::Engine* engine, engine::StepLoop* loop,
                                 Metrics* metrics, CallGate* gate, int32_t stream_interval)
    : engine_(engine),
      loop_(loop),
      metrics_(metrics),
      gate_(gate),
      stream_interval_(stream_interval < 1 ? 1 : stream_interval),
      replies_(std::make_unique<ReplyExecutor>()) {}

GenerateService::~GenerateService() = default;

absl::StatusOr<std::shared_ptr<engine::RequestHandle>> GenerateService::Submit(
    grpc::CallbackServerContext* context, const v1::GenerateRequest& request,
    std::shared_ptr<engine::GenerationSink> sink) {
  absl::StatusOr<engine::LoopRequest> r =
      ToLoopRequest(request, engine_->config(), engine_->tokenizer(),
                    ToAbslDeadline(context->deadline()),
                    gate_ != nullptr ? gate_->request_limits() : RequestLimits{});
  absl::StatusOr<std::shared_ptr<engine::RequestHandle>> handle =
      r.ok() ? loop_->Submit(*std::move(r), std::move(sink)) : r.status();
  if (!handle.ok() && metrics_ != nullptr) metrics_->CountFailure(handle.status().code());
  return handle;
}

grpc::ServerUnaryReactor* GenerateService::Generate(grpc::CallbackServerContext* context,
                                                    const v1::GenerateRequest* request,
                                                    v1::GenerateResponse* response) {
  if (grpc::Status s = AdmitGeneration(gate_, *context); !s.ok()) return RefuseUnary(context, s);
  auto* reactor = new UnaryGenerate(this);
  auto handle = Submit(context, *request,
                       std::make_shared<UnarySink>(reactor, response, *request, replies_.get()));
  if (!handle.ok()) {
    reactor->Finish(ToGrpcStatus(handle.status(), request->request_id()));
    return reactor;
  }
  reactor->handle_ = *std::move(handle);
  return reactor;
}

grpc::ServerWriteReactor<v1::GenerateStreamResponse>* GenerateService::GenerateStream(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  if (grpc::Status s = AdmitGeneration(gate_, *context); !s.ok()) return RefuseStream(s);
  auto* reactor = new StreamGenerate(this);
  reactor->sink_ =
      std::make_shared<StreamSink>(reactor, *request, replies_.get(), stream_interval_);
  auto handle = Submit(context, *request, reactor->sink_);
  if (!handle.ok()) {
    reactor->Finish(ToGrpcStatus(handle.status(), request->request_id()));
    return reactor;
  }
  reactor->handle_ = *std::move(handle);
  return reactor;
}

grpc::ServerUnaryReactor* GenerateService::Tokenize(grpc::CallbackServerContext* context,
                                                    const v1::TokenizeRequest* request,
                                                    v1::TokenizeResponse* response) {
  if (grpc::Status s = Authenticate(gate_, *context); !s.ok()) return RefuseUnary(context, s);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const engine::Tokenizer* tok = engine_->tokenizer();
  if (tok == nullptr) {
    reactor->Finish(ToGrpcStatus(
        absl::FailedPreconditionError("the model has no tokenizer (no tokenizer.json or "
                                      "tokenizer.model in the checkpoint)"),
        ""));
    return reactor;
  }
  absl::StatusOr<std::vector<int32_t>> ids =
      tok->Encode(request->text(), request->add_special_tokens());
  if (!ids.ok()) {
    reactor->Finish(ToGrpcStatus(ids.status(), ""));
    return reactor;
  }
  response->mutable_token_ids()->Add(ids->begin(), ids->end());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* GenerateService::Detokenize(grpc::CallbackServerContext* context,
                                                      const v1::DetokenizeRequest* request,
                                                      v1::DetokenizeResponse* response) {
  if (grpc::Status s = Authenticate(gate_, *context); !s.ok()) return RefuseUnary(context, s);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const engine::Tokenizer* tok = engine_->tokenizer();
  if (tok == nullptr) {
    reactor->Finish(ToGrpcStatus(absl::FailedPreconditionError("the model has no tokenizer"), ""));
    return reactor;
  }
  std::vector<int32_t> ids(request->token_ids().begin(), request->token_ids().end());
  absl::StatusOr<std::string> text = tok->Decode(ids, request->skip_special_tokens());
  if (!text.ok()) {
    reactor->Finish(ToGrpcStatus(text.status(), ""));
    return reactor;
  }
  response->set_text(*std::move(text));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* GenerateService::GetModelInfo(grpc::CallbackServerContext* context,
                                                        const v1::GetModelInfoRequest*,
                                                        v1::GetModelInfoResponse* response) {
  if (grpc::Status s = Authenticate(gate_, *context); !s.ok()) return RefuseUnary(context, s);
  const engine::ModelConfig& c = engine_->config();
  const engine::EngineOptions& o = engine_->options();
  response->set_model_dir(o.model_dir);
  response->set_vocab_size(c.vocab_size);
  response->set_max_seq_len(c.max_seq_len);
  response->set_n_layers(c.n_layers);
  response->set_d_model(c.d_model);
  if (c.mod) {
    response->mutable_routed_layers()->Add(c.mod->routed_layers.begin(),
                                           c.mod->routed_layers.end());
    response->set_default_threshold(c.mod->threshold);
    response->set_capacity(c.mod->capacity);
  }
  response->set_has_tokenizer(engine_->tokenizer() != nullptr);
  response->mutable_eos_token_ids()->Add(c.eos_token_ids.begin(), c.eos_token_ids.end());
  response->set_backend(o.backend);
  response->set_max_num_seqs(o.max_seqs);
  response->set_max_batch_tokens(o.max_batch_tokens);
  response->set_kv_cache_bytes(o.kv_cache_bytes);
  response->set_kv_cache_dtype(std::string(DTypeName(engine_->kv_dtype())));
  response->set_kv_bytes_per_token_dense(c.n_layers * engine_->kv_bytes_per_token_layer());
  response->set_prefix_caching(o.prefix_caching);
  response->set_matmul_precision(std::string(backend::MatmulPrecisionName(o.matmul_precision)));
  response->set_prefix_cache_queries(loop_->prefix_cache_queries());
  response->set_prefix_cache_hits(loop_->prefix_cache_hits());
  response->set_prefix_cache_blocks(loop_->prefix_cache_blocks());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace modserve::server
