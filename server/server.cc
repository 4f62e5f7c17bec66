// Server: construction order is engine -> metrics -> loop -> gRPC -> health; teardown reverses
// it so nothing calls into a destroyed part.
#include "server/server.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/common/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace modserve::server {

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options,
                                                      engine::EngineOptions engine_options) {
  std::unique_ptr<Server> s(new Server());
  s->options_ = options;
  engine_options.max_seqs = std::max(engine_options.max_seqs, options.loop.scheduler.max_num_seqs);
  engine_options.max_batch_tokens =
      std::max(engine_options.max_batch_tokens, options.loop.scheduler.max_batch_tokens);
  MODSERVE_ASSIGN_OR_RETURN(s->engine_, engine::Engine::Create(engine_options));
  s->metrics_ = std::make_unique<Metrics>(static_cast<int32_t>(s->engine_->config().n_layers));
  if (options.metrics_port >= 0) {
    MODSERVE_RETURN_IF_ERROR(s->metrics_->Serve(options.host, options.metrics_port));
  }
  MODSERVE_ASSIGN_OR_RETURN(
      s->loop_, engine::StepLoop::Create(s->engine_.get(), options.loop, s->metrics_.get()));
  s->service_ =
      std::make_unique<GenerateService>(s->engine_.get(), s->loop_.get(), s->metrics_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(absl::StrCat(options.host, ":", options.port),
                           grpc::InsecureServerCredentials(), &s->port_);
  builder.RegisterService(s->service_.get());
  s->grpc_server_ = builder.BuildAndStart();
  if (s->grpc_server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.host, ":", options.port));
  }
  grpc::HealthCheckServiceInterface* health = s->grpc_server_->GetHealthCheckService();
  if (health == nullptr) return absl::InternalError("gRPC built no health check service");
  Metrics* metrics = s->metrics_.get();
  const engine::StepLoop* loop = s->loop_.get();
  s->health_ =
      std::make_unique<HealthMonitor>(health, loop, options.stall_limit, options.health_period,
                                      [metrics, loop] { metrics->Refresh(*loop); });
  return s;
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
  // The objects stay until the destructor (members go in reverse order: gRPC before the loop,
  // the loop before the engine), so accessors keep working after a drain.
  health_.reset();
}

}  // namespace modserve::server
