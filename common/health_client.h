// Client side of grpc.health.v1.Health/Check without generated code: the request for the
// whole server (service "") is empty, and the answer is one varint field.
#ifndef DPTRAIN_COMMON_HEALTH_CLIENT_H_
#define DPTRAIN_COMMON_HEALTH_CLIENT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/credentials.h"

namespace dptrain {

enum class ServingStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

// Asks the server at `address` for its overall health, over a channel with `credentials`
// (a TLS server with a job token wants both). Returns the gRPC error (e.g. Unavailable,
// DeadlineExceeded, Unauthenticated) if the call fails, DataLoss for an undecodable answer.
absl::StatusOr<ServingStatus> CheckHealth(const std::string& address, absl::Duration timeout,
                                          const Credentials& credentials);
// The same in plaintext without a token.
absl::StatusOr<ServingStatus> CheckHealth(const std::string& address, absl::Duration timeout);

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_HEALTH_CLIENT_H_
