// Assembles a running modserve: engine, step loop, gRPC server (ModServe, health, reflection),
// the optional health-only gRPC server, the optional OpenAI-compatible HTTP server on the same
// loop, metrics endpoint, health monitor, TLS, token and limits; and the SIGTERM drain. Flags
// live in main.cc, not here.
#ifndef MODSERVE_SERVER_SERVER_H_
#define MODSERVE_SERVER_SERVER_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/engine.h"
#include "engine/executor/step_loop.h"
#include "grpcpp/grpcpp.h"
#include "server/call_gate.h"
#include "server/chat_template.h"
#include "server/generate_service.h"
#include "server/health.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_service.h"
#include "server/request_validation.h"
#include "server/security.h"

namespace modserve::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;              // 0 picks a free port
  std::string metrics_host;  // empty = host
  int metrics_port = -1;     // -1 = no /metrics endpoint; 0 picks a free port
  // A second, plaintext gRPC server with grpc.health.v1 only (and reflection), no token and no
  // TLS, so probes (Kubernetes grpc probes speak neither) need no secrets. The main port serves
  // health as well.
  std::string health_host;  // empty = host
  int health_port = -1;     // -1 = none; 0 picks a free port

  TlsOptions tls;                // cert_file empty = plaintext
  std::string auth_token_file;   // empty = no token needed
  RequestLimits request_limits;  // prompt tokens, stopping.max_new_tokens
  // Generate + GenerateStream calls in flight; past it RESOURCE_EXHAUSTED. 0 = no limit.
  int32_t max_concurrent_streams = 0;
  // gRPC's limit on a received message; larger ones get RESOURCE_EXHAUSTED from gRPC.
  int32_t max_message_bytes = 4 << 20;
  // Tokens a stream message carries after the first (which goes out at once): 1 sends each token
  // as it is sampled; more cut the per-token gRPC work, at the price of burstier streams.
  int32_t stream_interval = 1;
  // The OpenAI-compatible HTTP API (openai_service.h) on the same loop, limits, token, TLS
  // certificate and metrics. http_port -1 = off; 0 picks a free port. http.host/port/tls are
  // taken from the fields here and above; the rest (threads, body limit, timeouts) from `http`.
  std::string http_host;  // empty = host
  int http_port = -1;
  HttpServerOptions http;
  std::string served_model_name;  // the API's model name; empty = the model's file name
  // A Jinja chat template file used instead of the model's own (tokenizer_config.json or GGUF).
  std::string chat_template_file;
  engine::StepLoopOptions loop;
  absl::Duration drain_timeout = absl::Seconds(30);
  // Health turns NOT_SERVING when the engine thread has not gone round its loop for this long.
  absl::Duration stall_limit = absl::Seconds(30);
  absl::Duration health_period = absl::Milliseconds(100);
};

// Thread contract: Start, Drain and Shutdown from one controlling thread (main or a test).
class Server {
 public:
  // Reads the TLS and token files first (InvalidArgument naming the flag and file), then loads
  // the model (engine errors pass through), then serves. Unavailable when a port cannot be
  // bound. The engine's max_seqs / max_batch_tokens are raised to the loop's when smaller.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options,
                                                       engine::EngineOptions engine_options);
  ~Server();  // Shutdown()

  int port() const { return port_; }
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  int health_port() const { return health_port_; }  // 0 when there is no health-only server
  int http_port() const { return http_ ? http_->port() : 0; }  // 0 when HTTP is off
  int32_t http_num_connections() const { return http_ ? http_->num_connections() : 0; }
  // HTTP completions not yet answered and released (0 when HTTP is off).
  int32_t http_requests_in_flight() const {
    return openai_ ? openai_->num_requests_in_flight() : 0;
  }
  const std::string& served_model_name() const { return served_model_name_; }
  const CallGate& call_gate() const { return *gate_; }
  engine::StepLoop& loop() { return *loop_; }
  Metrics& metrics() { return *metrics_; }

  // SIGTERM: NOT_SERVING, no new requests, in-flight ones run up to drain_timeout (then end with
  // UNAVAILABLE), then the gRPC server shuts down. Returns whether everything finished in time.
  bool Drain();
  // Stops at once: in-flight requests end with UNAVAILABLE. loop() stays readable.
  void Shutdown();

 private:
  Server() = default;
  absl::Status StartHttp(const ServerOptions& options);

  ServerOptions options_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<engine::StepLoop> loop_;
  std::unique_ptr<CallGate> gate_;
  std::unique_ptr<GenerateService> service_;
  std::optional<ChatTemplate> chat_template_;
  std::unique_ptr<OpenAiService> openai_;
  std::unique_ptr<HttpServer> http_;  // destroyed before the loop it submits to
  std::string served_model_name_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<grpc::Server> health_server_;
  std::unique_ptr<grpc::HealthCheckServiceInterface> health_fan_out_;
  std::unique_ptr<HealthMonitor> health_;
  int port_ = 0;
  int health_port_ = 0;
  bool shut_down_ = false;
};

}  // namespace modserve::server

#endif  // MODSERVE_SERVER_SERVER_H_
