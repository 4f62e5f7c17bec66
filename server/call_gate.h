// Per-call admission for the ModServe service and the HTTP API: the bearer token (when one is
// configured) on every method, and the --max_concurrent_streams bound on generation requests in
// flight (gRPC Generate and GenerateStream calls and HTTP completions together). It never reads
// the request body (request_validation.h does) and does not guard health checks.
#ifndef MODSERVE_SERVER_CALL_GATE_H_
#define MODSERVE_SERVER_CALL_GATE_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "grpcpp/grpcpp.h"
#include "modserve/v1/modserve.grpc.pb.h"
#include "server/metrics.h"
#include "server/request_validation.h"
#include "server/security.h"

namespace modserve::server {

// Thread contract: every method is safe from any gRPC thread and never blocks. `metrics` (may be
// null) must outlive the gate.
class CallGate {
 public:
  // `auth` null = no token needed; max_concurrent_streams 0 = no limit. `request_limits` are
  // carried for the service's request validation.
  CallGate(std::unique_ptr<TokenAuthenticator> auth, int32_t max_concurrent_streams,
           RequestLimits request_limits, Metrics* metrics);

  // Tokenize, Detokenize, GetModelInfo: OK or UNAUTHENTICATED.
  grpc::Status Authenticate(const grpc::CallbackServerContext& context) const;
  // Generate, GenerateStream: UNAUTHENTICATED, or RESOURCE_EXHAUSTED naming
  // --max_concurrent_streams when that many are in flight, else OK and the call holds a slot that
  // ReleaseGeneration gives back once the call is completely over. Refusals are counted in
  // modserve_request_failure_total.
  grpc::Status AdmitGeneration(const grpc::CallbackServerContext& context);
  void ReleaseGeneration();

  // The HTTP API's halves of the same: the token in the Authorization header values (OK when no
  // token is configured; Unauthenticated otherwise), and a generation slot (ResourceExhausted
  // naming --max_concurrent_streams; OK holds a slot for ReleaseGeneration). Refusals are
  // counted in modserve_request_failure_total.
  absl::Status CheckToken(absl::Span<const absl::string_view> authorization) const;
  absl::Status AcquireGeneration();

  // Generate and GenerateStream calls admitted and not yet released.
  int32_t num_generations() const { return num_generations_.load(); }
  const RequestLimits& request_limits() const { return request_limits_; }

 private:
  const std::unique_ptr<TokenAuthenticator> auth_;
  const int32_t max_concurrent_streams_;
  const RequestLimits request_limits_;
  Metrics* const metrics_;
  std::atomic<int32_t> num_generations_{0};
};

// OK when `gate` is null (a service without a gate admits everything).
grpc::Status Authenticate(const CallGate* gate, const grpc::CallbackServerContext& context);
grpc::Status AdmitGeneration(CallGate* gate, const grpc::CallbackServerContext& context);

// Reactors that end a refused call with `status` (never OK) and free themselves.
grpc::ServerUnaryReactor* RefuseUnary(grpc::CallbackServerContext* context,
                                      const grpc::Status& status);
grpc::ServerWriteReactor<v1::GenerateStreamResponse>* RefuseStream(const grpc::Status& status);

}  // namespace modserve::server

#endif  // MODSERVE_SERVER_CALL_GATE_H_
