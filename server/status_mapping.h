// The one place absl::Status becomes grpc::Status (the codes are numerically equal). Internal
// errors are logged with the request id and replaced by a generic message; nothing else here.
#ifndef MODSERVE_SERVER_STATUS_MAPPING_H_
#define MODSERVE_SERVER_STATUS_MAPPING_H_

#include <string_view>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace modserve::server {

grpc::Status ToGrpcStatus(const absl::Status& status, std::string_view request_id);

}  // namespace modserve::server

#endif  // MODSERVE_SERVER_STATUS_MAPPING_H_
