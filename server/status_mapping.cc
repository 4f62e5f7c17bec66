// absl -> gRPC status: same code numbers; Internal details stay in the server log.
#include "server/status_mapping.h"

#include <string>

#include "engine/common/logging.h"

namespace modserve::server {

grpc::Status ToGrpcStatus(const absl::Status& status, std::string_view request_id) {
  if (status.ok()) return grpc::Status::OK;
  if (status.code() == absl::StatusCode::kInternal || status.code() == absl::StatusCode::kUnknown) {
    MODSERVE_LOG(ERROR) << "request '" << request_id << "': " << status;
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        "internal server error (details are in the server log)");
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace modserve::server
