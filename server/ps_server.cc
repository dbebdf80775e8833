#include "server/ps_server.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_builder.h"

namespace dptrain {

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Start(const PsServerOptions& options) {
  auto shard = ParameterShard::Create(options.shard);
  if (!shard.ok()) return shard.status();
  std::unique_ptr<PsServer> server(new PsServer());
  server->shard_ = *std::move(shard);
  server->service_ = std::make_unique<PsService>(server->shard_.get());
  server->stream_service_ =
      std::make_unique<TensorStreamService>(server->shard_.get(), options.stream);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  ConfigureServerBuilder(builder);
  builder.SetMaxReceiveMessageSize(
      std::max(1, std::min(options.max_receive_message_bytes, kMaxMessageBytes)));
  builder.AddListeningPort(options.listen_address, options.credentials->ServerCredentials(),
                           &server->port_);
  builder.RegisterService(server->service_.get());
  builder.RegisterCallbackGenericService(server->stream_service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen_address));
  }
  server->server_->GetHealthCheckService()->SetServingStatus(true);
  return server;
}

void PsServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  server_->GetHealthCheckService()->SetServingStatus(false);
  shard_->Shutdown();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
}

PsServer::~PsServer() {
  if (server_ != nullptr) Shutdown();
}

}  // namespace dptrain
