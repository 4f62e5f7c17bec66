// CallGate: the stream bound is a compare-and-swap on one counter, so concurrent arrivals at the
// limit never admit more than the limit and never refuse one that fits.
#include "server/call_gate.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace modserve::server {
namespace {

// A stream refused before any message: Finish at once, free on OnDone.
class RefusedStream final : public grpc::ServerWriteReactor<v1::GenerateStreamResponse> {
 public:
  explicit RefusedStream(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

CallGate::CallGate(std::unique_ptr<TokenAuthenticator> auth, int32_t max_concurrent_streams,
                   RequestLimits request_limits, Metrics* metrics)
    : auth_(std::move(auth)),
      max_concurrent_streams_(max_concurrent_streams),
      request_limits_(request_limits),
      metrics_(metrics) {}

grpc::Status CallGate::Authenticate(const grpc::CallbackServerContext& context) const {
  if (auth_ == nullptr) return grpc::Status::OK;
  return auth_->Check(context.client_metadata());
}

absl::Status CallGate::CheckToken(absl::Span<const absl::string_view> authorization) const {
  if (auth_ == nullptr) return absl::OkStatus();
  absl::Status s = auth_->CheckAuthorization(authorization);
  if (!s.ok() && metrics_ != nullptr) metrics_->CountFailure(s.code());
  return s;
}

absl::Status CallGate::AcquireGeneration() {
  int32_t n = num_generations_.load();
  do {
    if (max_concurrent_streams_ > 0 && n >= max_concurrent_streams_) {
      if (metrics_ != nullptr) metrics_->CountFailure(absl::StatusCode::kResourceExhausted);
      return absl::ResourceExhaustedError(
          absl::StrCat(n, " generation requests in flight (gRPC and HTTP); at most "
                          "--max_concurrent_streams=",
                       max_concurrent_streams_));
    }
  } while (!num_generations_.compare_exchange_weak(n, n + 1));
  return absl::OkStatus();
}

grpc::Status CallGate::AdmitGeneration(const grpc::CallbackServerContext& context) {
  grpc::Status status = Authenticate(context);
  if (!status.ok()) {
    if (metrics_ != nullptr) {
      metrics_->CountFailure(static_cast<absl::StatusCode>(status.error_code()));
    }
    return status;
  }
  const absl::Status slot = AcquireGeneration();  // counts its own refusal
  if (!slot.ok()) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, std::string(slot.message()));
  }
  return grpc::Status::OK;
}

void CallGate::ReleaseGeneration() { --num_generations_; }

grpc::Status Authenticate(const CallGate* gate, const grpc::CallbackServerContext& context) {
  return gate == nullptr ? grpc::Status::OK : gate->Authenticate(context);
}

grpc::Status AdmitGeneration(CallGate* gate, const grpc::CallbackServerContext& context) {
  return gate == nullptr ? grpc::Status::OK : gate->AdmitGeneration(context);
}

grpc::ServerUnaryReactor* RefuseUnary(grpc::CallbackServerContext* context,
                                      const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

grpc::ServerWriteReactor<v1::GenerateStreamResponse>* RefuseStream(const grpc::Status& status) {
  return new RefusedStream(status);
}

}  // namespace modserve::server
