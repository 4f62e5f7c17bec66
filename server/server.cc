// Server: construction order is credentials -> engine -> metrics -> loop -> gRPC -> health;
// teardown reverses it so nothing calls into a destroyed part. Credential files are read before
// the model so a typo fails in milliseconds, not after a model load.
#include "server/server.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/common/logging.h"
#include "engine/common/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace modserve::server {
namespace {

// The health monitor sets one status; with a health-only server there are two services to set.
class HealthFanOut final : public grpc::HealthCheckServiceInterface {
 public:
  HealthFanOut(grpc::HealthCheckServiceInterface* a, grpc::HealthCheckServiceInterface* b)
      : a_(a), b_(b) {}
  void SetServingStatus(const std::string& service_name, bool serving) override {
    a_->SetServingStatus(service_name, serving);
    b_->SetServingStatus(service_name, serving);
  }
  void SetServingStatus(bool serving) override {
    a_->SetServingStatus(serving);
    b_->SetServingStatus(serving);
  }
  void Shutdown() override {
    a_->Shutdown();
    b_->Shutdown();
  }

 private:
  grpc::HealthCheckServiceInterface* a_;
  grpc::HealthCheckServiceInterface* b_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options,
                                                      engine::EngineOptions engine_options) {
  std::unique_ptr<Server> s(new Server());
  s->options_ = options;
  // A request may lower the server's speculation, never raise it.
  s->options_.request_limits.max_speculative_tokens = engine_options.speculative_tokens;
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_message_bytes: ", options.max_message_bytes, " is not > 0"));
  }
  for (const auto& [flag, value] :
       {std::pair<const char*, int32_t>{"--max_prompt_tokens",
                                        options.request_limits.max_prompt_tokens},
        {"--max_new_tokens", options.request_limits.max_new_tokens},
        {"--max_concurrent_streams", options.max_concurrent_streams}}) {
    if (value < 0) return absl::InvalidArgumentError(absl::StrCat(flag, ": ", value, " is < 0"));
  }
  MODSERVE_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                            MakeServerCredentials(options.tls));
  std::unique_ptr<TokenAuthenticator> auth;
  if (!options.auth_token_file.empty()) {
    MODSERVE_ASSIGN_OR_RETURN(auth, TokenAuthenticator::FromFile(options.auth_token_file));
  }
  engine_options.max_seqs = std::max(engine_options.max_seqs, options.loop.scheduler.max_num_seqs);
  engine_options.max_batch_tokens =
      std::max(engine_options.max_batch_tokens, options.loop.scheduler.max_batch_tokens);
  MODSERVE_ASSIGN_OR_RETURN(s->engine_, engine::Engine::Create(engine_options));
  s->metrics_ = std::make_unique<Metrics>(static_cast<int32_t>(s->engine_->config().n_layers));
  if (options.metrics_port >= 0) {
    MODSERVE_RETURN_IF_ERROR(s->metrics_->Serve(
        options.metrics_host.empty() ? options.host : options.metrics_host, options.metrics_port));
  }
  MODSERVE_ASSIGN_OR_RETURN(
      s->loop_, engine::StepLoop::Create(s->engine_.get(), options.loop, s->metrics_.get()));
  s->gate_ = std::make_unique<CallGate>(std::move(auth), options.max_concurrent_streams,
                                        s->options_.request_limits, s->metrics_.get());
  s->service_ = std::make_unique<GenerateService>(s->engine_.get(), s->loop_.get(),
                                                  s->metrics_.get(), s->gate_.get(),
                                                  options.stream_interval);

  if (options.http_port >= 0) {
    MODSERVE_RETURN_IF_ERROR(s->StartHttp(options));
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(options.host, ":", options.port), credentials, &s->port_);
  // gRPC refuses a larger message itself: RESOURCE_EXHAUSTED "Received message larger than max
  // (N vs. LIMIT)", before any handler runs.
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.RegisterService(s->service_.get());
  s->grpc_server_ = builder.BuildAndStart();
  if (s->grpc_server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.host, ":", options.port));
  }
  grpc::HealthCheckServiceInterface* health = s->grpc_server_->GetHealthCheckService();
  if (health == nullptr) return absl::InternalError("gRPC built no health check service");
  if (options.health_port >= 0) {
    const std::string host = options.health_host.empty() ? options.host : options.health_host;
    grpc::ServerBuilder health_builder;  // the default health service is its only service
    health_builder.AddListeningPort(absl::StrCat(host, ":", options.health_port),
                                    grpc::InsecureServerCredentials(), &s->health_port_);
    s->health_server_ = health_builder.BuildAndStart();
    if (s->health_server_ == nullptr || s->health_port_ == 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", host, ":", options.health_port, " (health)"));
    }
    grpc::HealthCheckServiceInterface* second = s->health_server_->GetHealthCheckService();
    if (second == nullptr) return absl::InternalError("gRPC built no health check service");
    s->health_fan_out_ = std::make_unique<HealthFanOut>(health, second);
    health = s->health_fan_out_.get();
  }
  Metrics* metrics = s->metrics_.get();
  const engine::StepLoop* loop = s->loop_.get();
  s->health_ =
      std::make_unique<HealthMonitor>(health, loop, options.stall_limit, options.health_period,
                                      [metrics, loop] { metrics->Refresh(*loop); });
  return s;
}

namespace {

// The text of a special token of the model (config.json's id wins over the tokenizer's).
std::optional<std::string> SpecialText(const engine::Tokenizer& tok, std::optional<int32_t> id) {
  if (!id) return std::nullopt;
  absl::StatusOr<std::string> text = tok.Decode({*id}, /*skip_special_tokens=*/false);
  if (!text.ok()) return std::nullopt;
  return *std::move(text);
}

// "models/demo" -> "demo"; "models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" ->
// "SmolLM2-135M-Instruct.Q4_1".
std::string DefaultModelName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (absl::EndsWith(name, ".gguf")) name.resize(name.size() - 5);
  return name.empty() ? "model" : name;
}

}  // namespace

absl::Status Server::StartHttp(const ServerOptions& options) {
  served_model_name_ = options.served_model_name.empty()
                           ? DefaultModelName(engine_->options().model_dir)
                           : options.served_model_name;
  // The chat template: --chat_template's file (which must parse), else the model's own (which
  // only disables chat when it does not parse: completions still work).
  absl::Status template_status;
  const engine::Tokenizer* tok = engine_->tokenizer();
  std::string source;
  if (!options.chat_template_file.empty()) {
    MODSERVE_ASSIGN_OR_RETURN(source,
                              ReadCredentialFile("--chat_template", options.chat_template_file));
  } else if (tok != nullptr) {
    source = tok->chat_template();
  }
  if (!source.empty() && tok != nullptr) {
    const engine::ModelConfig& c = engine_->config();
    std::optional<int32_t> bos = c.bos_token_id ? c.bos_token_id : tok->bos_id();
    std::optional<int32_t> eos =
        c.eos_token_ids.empty() ? tok->eos_id() : std::optional<int32_t>(c.eos_token_ids[0]);
    absl::StatusOr<ChatTemplate> t =
        ChatTemplate::Create(source, SpecialText(*tok, bos), SpecialText(*tok, eos));
    if (t.ok()) {
      chat_template_.emplace(*std::move(t));
    } else if (!options.chat_template_file.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--chat_template '", options.chat_template_file, "': ", t.status().message()));
    } else {
      template_status = t.status();
      MODSERVE_LOG(WARNING) << "the model's chat template does not parse; /v1/chat/completions "
                               "will refuse requests: "
                            << t.status();
    }
  }
  openai_ = std::make_unique<OpenAiService>(
      engine_.get(), loop_.get(), metrics_.get(), gate_.get(),
      chat_template_ ? &*chat_template_ : nullptr, served_model_name_, template_status);
  HttpServerOptions http = options.http;
  http.host = options.http_host.empty() ? options.host : options.http_host;
  http.port = options.http_port;
  http.tls = options.tls;
  OpenAiService* api = openai_.get();
  MODSERVE_ASSIGN_OR_RETURN(
      http_, HttpServer::Start(http, [api](HttpRequest& r, std::shared_ptr<HttpExchange> x) {
        api->Handle(r, std::move(x));
      }));
  return absl::OkStatus();
}

Server::~Server() { Shutdown(); }

bool Server::Drain() {
  loop_->StartDrain(options_.drain_timeout);
  health_->SetNotServing();
  // The loop ends what is left at the drain deadline; the extra second covers that last step.
  const bool finished = loop_->WaitIdle(options_.drain_timeout + absl::Seconds(1));
  Shutdown();
  return finished;
}

void Server::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (health_) health_->SetNotServing();
  // The loop stops first so every call in flight gets its Finish, which gRPC's Shutdown awaits.
  if (loop_) loop_->Stop();
  if (http_) {
    // Every HTTP request has had its OnDone; let the HTTP threads write those last replies.
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (openai_->num_requests_in_flight() > 0 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    http_->Stop();
  }
  if (grpc_server_) {
    // Every Generate call has its Finish now; wait until gRPC has delivered them (OnDone), then
    // shut down without waiting for idle client connections to close, which gRPC would
    // otherwise await until the deadline.
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (service_->num_calls_in_flight() > 0 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
  }
  if (health_server_) {
    health_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
  }
  // The objects stay until the destructor (members go in reverse order: gRPC before the loop,
  // the loop before the engine), so accessors keep working after a drain.
  health_.reset();
}

}  // namespace modserve::server
