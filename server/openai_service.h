// The OpenAI-compatible HTTP API over the step loop: POST /v1/completions and
// /v1/chat/completions (unary, or server-sent events ending in `data: [DONE]`), GET /v1/models,
// GET /health, and vLLM's /tokenize, /detokenize and /tokenizer_info (which evaluation harnesses
// use to tokenize with the server's own tokenizer). The same token, call limit, request rules
// and metrics as the gRPC service. Engine events reach it through sinks that only queue them and
// post to the connection; JSON is written on the HTTP threads, never the engine thread.
#ifndef MODSERVE_SERVER_OPENAI_SERVICE_H_
#define MODSERVE_SERVER_OPENAI_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "engine/executor/step_loop.h"
#include "server/call_gate.h"
#include "server/chat_template.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_request.h"

namespace modserve::server {

// Thread contract: Handle runs on the HTTP threads (one connection's requests in order); every
// pointer must outlive the service and every request in flight. `gate` and `chat_template` may
// be null (no token, no limits; chat refused with a 400).
class OpenAiService {
 public:
  // `chat_template_status`: why `chat_template` is null although the model has one (or OK).
  OpenAiService(const engine::Engine* engine, engine::StepLoop* loop, Metrics* metrics,
                CallGate* gate, const ChatTemplate* chat_template, std::string model_name,
                absl::Status chat_template_status = absl::OkStatus());

  // The HttpHandler.
  void Handle(HttpRequest& request, std::shared_ptr<HttpExchange> exchange);

  // Completion requests admitted and not yet over (every choice ended in the engine).
  int32_t num_requests_in_flight() const { return num_in_flight_.load(); }
  const std::string& model_name() const { return model_.name; }

  class Job;

 private:
  void Generate(OpenAiEndpoint endpoint, HttpRequest& request,
                std::shared_ptr<HttpExchange> exchange);
  void Tokenize(HttpRequest& request, HttpExchange& exchange);
  void Detokenize(HttpRequest& request, HttpExchange& exchange);
  void TokenizerInfo(HttpExchange& exchange);
  void Models(const HttpRequest& request, HttpExchange& exchange);
  void Health(HttpExchange& exchange);
  void Fail(HttpExchange& exchange, const absl::Status& status, absl::string_view request_id);

  const engine::Engine* engine_;
  engine::StepLoop* loop_;
  Metrics* metrics_;
  CallGate* gate_;
  OpenAiModel model_;
  const int64_t created_;  // unix seconds of start-up, the models' "created"
  std::atomic<int32_t> num_in_flight_{0};
};

}  // namespace modserve::server

#endif  // MODSERVE_SERVER_OPENAI_SERVICE_H_
