// The one place where absl::Status and grpc::Status are converted. Codes map 1:1.
#ifndef DPTRAIN_COMMON_GRPC_STATUS_H_
#define DPTRAIN_COMMON_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace dptrain {

grpc::Status ToGrpcStatus(const absl::Status& status);

// `context` (e.g. "PushPull to shard 1 at 127.0.0.1:4000") prefixes the message.
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view context = "");

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_GRPC_STATUS_H_
