// Status propagation macros (the pinned Abseil has no public ABSL_RETURN_IF_ERROR).
// They only forward statuses; they never log or add context by themselves.
#ifndef MODSERVE_ENGINE_COMMON_STATUS_MACROS_H_
#define MODSERVE_ENGINE_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define MODSERVE_STATUS_CONCAT_INNER(a, b) a##b
#define MODSERVE_STATUS_CONCAT(a, b) MODSERVE_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define MODSERVE_RETURN_IF_ERROR(expr)                      \
  do {                                                      \
    ::absl::Status modserve_status_ = (expr);               \
    if (!modserve_status_.ok()) return modserve_status_;    \
  } while (0)

// `lhs = value of rexpr` (an absl::StatusOr<T>), or returns its status.
#define MODSERVE_ASSIGN_OR_RETURN(lhs, rexpr) \
  MODSERVE_ASSIGN_OR_RETURN_IMPL(MODSERVE_STATUS_CONCAT(modserve_statusor_, __LINE__), lhs, rexpr)

#define MODSERVE_ASSIGN_OR_RETURN_IMPL(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();   \
  lhs = std::move(statusor).value()

#endif  // MODSERVE_ENGINE_COMMON_STATUS_MACROS_H_
