#include "server/ps_server.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/net.h"
#include "common/tensor_frame.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/server_builder.h"

namespace dptrain {

int64_t ReceiveMemoryFor(int num_workers, int64_t message_bytes) {
  constexpr int64_t kBase = int64_t{64} << 20;
  return kBase + 2 * (static_cast<int64_t>(num_workers) + 1) * message_bytes;
}

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Start(const PsServerOptions& options) {
  if (options.max_receive_memory_bytes < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("receive memory must be -1 (no bound), 0 (automatic) or a size in bytes, got ",
                     options.max_receive_memory_bytes));
  }
  std::unique_ptr<PsServer> server(new PsServer());
  ParameterShardOptions shard_options = options.shard;
  if (options.metrics != nullptr || options.trace != nullptr) {
    server->telemetry_ =
        std::make_unique<ShardTelemetry>(options.metrics, options.trace, options.shard.num_workers);
    shard_options.observer = server->telemetry_.get();
  }
  auto shard = ParameterShard::Create(shard_options);
  if (!shard.ok()) return shard.status();
  server->shard_ = *std::move(shard);
  PsServer* self = server.get();
  server->service_ = std::make_unique<PsService>(server->shard_.get(), server->telemetry_.get(),
                                                 [self] { self->SizeReceiveMemory(); });
  server->stream_service_ = std::make_unique<TensorStreamService>(
      server->shard_.get(), options.stream, server->telemetry_.get());
  auto sparse = SparseService::Create(server->shard_->options(), options.metrics);
  if (!sparse.ok()) return sparse.status();
  server->sparse_service_ = *std::move(sparse);
  if (options.metrics != nullptr) server->RegisterGauges(*options.metrics);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  ConfigureServerBuilder(builder);
  server->max_receive_message_bytes_ =
      std::max(1, std::min(options.max_receive_message_bytes, kMaxMessageBytes));
  builder.SetMaxReceiveMessageSize(server->max_receive_message_bytes_);
  if (options.max_receive_memory_bytes != -1) {
    server->auto_quota_ = options.max_receive_memory_bytes == 0;
    if (server->auto_quota_) {
      server->SizeReceiveMemory();  // A shard restored from a checkpoint knows its model.
    } else {
      server->quota_.Resize(static_cast<size_t>(options.max_receive_memory_bytes));
      server->receive_memory_bytes_ = options.max_receive_memory_bytes;
    }
    builder.SetResourceQuota(server->quota_);
  }
  if (auto s = CheckCanListen(options.listen_address); !s.ok()) return s;
  builder.AddListeningPort(options.listen_address, options.credentials->ServerCredentials(),
                           &server->port_);
  builder.RegisterService(server->service_.get());
  builder.RegisterService(server->sparse_service_.get());
  // Raw-byte methods: a worker has one push in flight per step; a few more allow retries.
  server->sparse_rows_ = std::make_unique<SparseRowsMethods>(
      server->sparse_service_.get(), 4 * std::max(1, options.shard.num_workers));
  server->sparse_rows_->AddTo(server->generic_methods_);
  TensorStreamService* streams = server->stream_service_.get();
  server->generic_methods_.Add(kTensorStreamMethod,
                               [streams](grpc::GenericCallbackServerContext* context) {
                                 return streams->CreateReactor(context);
                               });
  builder.RegisterCallbackGenericService(&server->generic_methods_);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen_address));
  }
  server->server_->GetHealthCheckService()->SetServingStatus(true);
  return server;
}

void PsServer::SizeReceiveMemory() {
  if (!auto_quota_) return;
  const int64_t model_bytes = shard_->GetInfo().weight_bytes;
  // One message carries at most the shard's chunks plus framing.
  const int64_t message_bytes =
      model_bytes > 0
          ? std::min<int64_t>(model_bytes + (int64_t{1} << 20), max_receive_message_bytes_)
          : max_receive_message_bytes_;
  const int64_t bytes = ReceiveMemoryFor(shard_->options().num_workers, message_bytes);
  if (bytes == receive_memory_bytes_.exchange(bytes)) return;
  quota_.Resize(static_cast<size_t>(bytes));
}

void PsServer::RegisterGauges(MetricsRegistry& registry) {
  ParameterShard* shard = shard_.get();
  registry.AddGaugeFunction("dptrain_ps_version",
                            "Steps (BSP) or pushes (SSP, async) every chunk of this shard has "
                            "applied.",
                            [shard] { return static_cast<double>(shard->GetInfo().version); });
  registry.AddGaugeFunction(
      "dptrain_ps_waiting_workers",
      "Workers that have not yet pushed the newest step any worker pushed (0: nobody is waited "
      "for).",
      [shard] {
        const ParameterShard::Info info = shard->GetInfo();
        int64_t newest = -1;
        for (int64_t s : info.rank_steps) newest = std::max(newest, s);
        int waiting = 0;
        for (int64_t s : info.rank_steps) waiting += s < newest ? 1 : 0;
        return static_cast<double>(waiting);
      });
  registry.AddGaugeFunction("dptrain_ps_learning_rate", "The rate of the next step.",
                            [shard] { return shard->GetInfo().learning_rate; });
  registry.AddGaugeFunction(
      "dptrain_ps_receive_memory_bytes",
      "gRPC's memory quota for this shard's read buffers (0: none; --max_receive_memory).",
      [this] { return static_cast<double>(receive_memory_bytes()); });
  TensorStreamService* streams = stream_service_.get();
  registry.AddGaugeFunction("dptrain_ps_active_streams", "Tensor streams open now.",
                            [streams] { return static_cast<double>(streams->active_streams()); });
  registry.AddCounterFunction("dptrain_ps_received_bytes_total",
                              "Request bytes received (unary and stream).",
                              [this] { return static_cast<double>(bytes_received()); });
  registry.AddCounterFunction("dptrain_ps_sent_bytes_total", "Answer bytes sent.",
                              [this] { return static_cast<double>(bytes_sent()); });
  registry.AddCounterFunction("dptrain_ps_pushes_total", "Chunk pushes counted.",
                              [shard] { return static_cast<double>(shard->GetInfo().pushes); });
  registry.AddCounterFunction(
      "dptrain_ps_nonfinite_skips_total",
      "Steps (BSP) or pushes (SSP, async) skipped for an unflagged inf/NaN gradient.", [shard] {
        const ParameterShard::Info info = shard->GetInfo();
        return static_cast<double>(info.nonfinite_steps + info.nonfinite_pushes);
      });
  registry.AddCounterFunction(
      "dptrain_ps_checkpoints_written_total", "Checkpoints written.",
      [shard] { return static_cast<double>(shard->GetInfo().checkpoints_written); });
  registry.AddCounterFunction(
      "dptrain_ps_checkpoint_failures_total", "Checkpoint writes failed.",
      [shard] { return static_cast<double>(shard->GetInfo().checkpoint_failures); });
}

void PsServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  server_->GetHealthCheckService()->SetServingStatus(false);
  shard_->Shutdown();
  sparse_service_->Shutdown();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
}

PsServer::~PsServer() {
  if (server_ != nullptr) Shutdown();
}

}  // namespace dptrain
