// The two Status macros every layer uses (Abseil has none public): return a failed Status
// early, or take a StatusOr's value.
#ifndef DPTRAIN_COMMON_STATUS_MACROS_H_
#define DPTRAIN_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

// Any Status-returning expression.
#define DPTRAIN_RETURN_IF_ERROR(expr)                    \
  do {                                                   \
    if (::absl::Status _s = (expr); !_s.ok()) return _s; \
  } while (0)

// For StatusOr-returning expressions: `lhs` = value or return its status.
#define DPTRAIN_ASSIGN_OR_RETURN(lhs, expr)                   \
  auto DPTRAIN_CONCAT(_statusor_, __LINE__) = (expr);         \
  if (!DPTRAIN_CONCAT(_statusor_, __LINE__).ok())             \
    return DPTRAIN_CONCAT(_statusor_, __LINE__).status();     \
  lhs = *std::move(DPTRAIN_CONCAT(_statusor_, __LINE__))
#define DPTRAIN_CONCAT_INNER(a, b) a##b
#define DPTRAIN_CONCAT(a, b) DPTRAIN_CONCAT_INNER(a, b)

#endif  // DPTRAIN_COMMON_STATUS_MACROS_H_
