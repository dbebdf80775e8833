#include "common/health_server.h"

#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_builder.h"

namespace dptrain {

absl::StatusOr<HealthServer> StartHealthServer(int port, grpc::Service* service,
                                               const std::string& host,
                                               const Credentials& credentials) {
  grpc::EnableDefaultHealthCheckService(true);
  HealthServer out;
  grpc::ServerBuilder builder;
  if (auto s = CheckCanListen(absl::StrCat(host, ":", port)); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("health port: ", s.message()));
  }
  builder.AddListeningPort(absl::StrCat(host, ":", port), credentials.ServerCredentials(),
                           &out.port);
  builder.RegisterService(service);
  out.server = builder.BuildAndStart();
  if (out.server == nullptr || out.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on health port ", host, ":", port));
  }
  out.server->GetHealthCheckService()->SetServingStatus(true);
  return out;
}

}  // namespace dptrain
