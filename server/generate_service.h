// The ModServe gRPC service (callback API): validates requests, submits them to the step loop
// and turns engine events into responses. Streams use one ServerWriteReactor each, with one
// write in flight and one message waiting behind it, into which new tokens merge: a slow reader
// (or a busy machine) gets fewer, larger messages, never a queue. No reaction blocks or waits
// for the engine.
#ifndef MODSERVE_SERVER_GENERATE_SERVICE_H_
#define MODSERVE_SERVER_GENERATE_SERVICE_H_

#include <atomic>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "engine/executor/step_loop.h"
#include "grpcpp/grpcpp.h"
#include "modserve/v1/modserve.grpc.pb.h"
#include "server/call_gate.h"
#include "server/metrics.h"

namespace modserve::server {

// Engine events -> proto (the only conversion in that direction).
void AppendToken(const engine::TokenEvent& event, int32_t top_logprobs,
                 v1::GenerateStreamResponse* out);
void FillFinal(const engine::FinishedRequest& done, bool return_decisions,
               v1::GenerateResponse* out);
void FillFinal(const engine::FinishedRequest& done, bool return_decisions,
               v1::GenerateStreamResponse* out);

class ReplyExecutor;

// Thread contract: gRPC calls the methods on its threads. `engine` is read only through its
// immutable accessors (config, tokenizer, options); `loop` takes the requests. Both, and
// `metrics` (may be null), must outlive the service and every call in flight. So must `gate` (may
// be null: no token, no call limit, no request limits), which every method consults first.
// `stream_interval`: tokens per stream message after the first (values below 1 mean 1).
class GenerateService final : public v1::ModServe::CallbackService {
 public:
  GenerateService(const engine::Engine* engine, engine::StepLoop* loop, Metrics* metrics,
                  CallGate* gate = nullptr, int32_t stream_interval = 1);
  ~GenerateService() override;  // after the calls' Finish: runs the replies still queued

  grpc::ServerUnaryReactor* Generate(grpc::CallbackServerContext* context,
                                     const v1::GenerateRequest* request,
                                     v1::GenerateResponse* response) override;
  grpc::ServerWriteReactor<v1::GenerateStreamResponse>* GenerateStream(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::GetModelInfoResponse* response) override;

  // Generate and GenerateStream calls whose reactor has not seen OnDone yet.
  int32_t num_calls_in_flight() const { return num_calls_.load(); }

 private:
  friend class CallCounter;
  // Validates and submits; on failure counts it and returns the gRPC status to finish with.
  absl::StatusOr<std::shared_ptr<engine::RequestHandle>> Submit(
      grpc::CallbackServerContext* context, const v1::GenerateRequest& request,
      std::shared_ptr<engine::GenerationSink> sink);

  const engine::Engine* engine_;
  engine::StepLoop* loop_;
  Metrics* metrics_;
  CallGate* gate_;
  const int32_t stream_interval_;
  std::atomic<int32_t> num_calls_{0};
  // Last, so it is destroyed first, while the counters its tasks touch still exist.
  std::unique_ptr<ReplyExecutor> replies_;
};

}  // namespace modserve::server

#endif  // MODSERVE_SERVER_GENERATE_SERVICE_H_
