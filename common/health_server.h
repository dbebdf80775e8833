// A gRPC server that only answers grpc.health.v1.Health (SERVING while it runs), for
// processes that serve nothing else to probes (e.g. a gpu_worker under Kubernetes).
#ifndef DPTRAIN_COMMON_HEALTH_SERVER_H_
#define DPTRAIN_COMMON_HEALTH_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/credentials.h"
#include "grpcpp/server.h"

namespace dptrain {

struct HealthServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

// Listens on `host`:`port` (0: a free port) with `credentials` (TLS and the job token
// when on), `service` (gRPC needs at least one of its own; it must outlive the server) and
// the health service. Unavailable if it cannot bind.
absl::StatusOr<HealthServer> StartHealthServer(int port, grpc::Service* service,
                                               const std::string& host,
                                               const Credentials& credentials);

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_HEALTH_SERVER_H_
