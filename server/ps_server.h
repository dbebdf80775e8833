// A running ps_server: one ParameterShard behind gRPC (ParameterServer and the tensor
// stream), plus grpc.health.v1.Health.
// Used by the ps_server binary and by in-process tests.
#ifndef DPTRAIN_SERVER_PS_SERVER_H_
#define DPTRAIN_SERVER_PS_SERVER_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/credentials.h"
#include "common/metrics.h"
#include "common/net.h"
#include "common/trace.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/server.h"
#include "server/generic_methods.h"
#include "server/parameter_shard.h"
#include "server/ps_service.h"
#include "server/shard_telemetry.h"
#include "server/sparse_rows_methods.h"
#include "server/sparse_service.h"
#include "server/tensor_stream_service.h"

namespace dptrain {

struct PsServerOptions {
  ParameterShardOptions shard;
  TensorStreamOptions stream;
  // "host:port"; port 0 picks a free port (see port()).
  std::string listen_address = "0.0.0.0:0";
  // TLS and the job-token check of the port (default: plaintext).
  std::shared_ptr<const Credentials> credentials = Credentials::Plaintext();
  // The largest gRPC message accepted (at most kMaxMessageBytes); gRPC answers
  // RESOURCE_EXHAUSTED for a larger one. ps_server derives it from --max_model_bytes.
  int max_receive_message_bytes = kMaxMessageBytes;
  // gRPC's memory quota for this server (grpc::ResourceQuota): what the read buffers of all
  // connections together may hold, so that many over-limit messages at once (gRPC 1.51
  // buffers each whole before its size check) cannot add up; past it gRPC resets streams
  // (RESOURCE_EXHAUSTED). 0: automatic (ReceiveMemoryFor, resized once the model is known);
  // -1: none (gRPC's default).
  int64_t max_receive_memory_bytes = 0;
  // Where the shard's metrics are registered and its steps traced (either may be null: none).
  // Not owned; both must outlive the server.
  MetricsRegistry* metrics = nullptr;
  TraceRecorder* trace = nullptr;
};

// The automatic receive-memory quota: 64 MiB, plus twice the room for one message of
// `message_bytes` from every worker and one more (a late retry, an Init).
int64_t ReceiveMemoryFor(int num_workers, int64_t message_bytes);

class PsServer {
 public:
  // The receive-memory quota in force (0: none).
  int64_t receive_memory_bytes() const { return receive_memory_bytes_.load(); }
  // Unavailable if the address cannot be bound; InvalidArgument for bad shard options.
  static absl::StatusOr<std::unique_ptr<PsServer>> Start(const PsServerOptions& options);
  ~PsServer();  // Shuts down if still running.

  int port() const { return port_; }
  ParameterShard& shard() { return *shard_; }
  const PsService& service() const { return *service_; }
  const TensorStreamService& stream_service() const { return *stream_service_; }
  const SparseService& sparse_service() const { return *sparse_service_; }
  const SparseRowsMethods& sparse_rows() const { return *sparse_rows_; }
  // Message bytes this shard's link carried, over both services.
  int64_t bytes_received() const {
    return service_->bytes_received() + stream_service_->bytes_received() +
           sparse_rows_->bytes_received();
  }
  int64_t bytes_sent() const {
    return service_->bytes_sent() + stream_service_->bytes_sent() + sparse_rows_->bytes_sent();
  }

  // Marks the server NOT_SERVING, wakes waiting calls and stops within `grace`.
  // Idempotent; thread-safe.
  void Shutdown(absl::Duration grace = absl::Seconds(2));

 private:
  PsServer() = default;

  // Registers the metrics read at scrape time (version, waiting workers, streams, bytes).
  void RegisterGauges(MetricsRegistry& registry);
  // With the automatic quota: sizes it for the largest message this shard now expects (its
  // chunks, once it holds a model; the receive limit before).
  void SizeReceiveMemory();

  std::unique_ptr<ShardTelemetry> telemetry_;  // Before shard_: the shard reports to it.
  std::unique_ptr<ParameterShard> shard_;
  std::unique_ptr<PsService> service_;
  std::unique_ptr<TensorStreamService> stream_service_;
  std::unique_ptr<SparseService> sparse_service_;   // Row-sparse embedding tables.
  std::unique_ptr<SparseRowsMethods> sparse_rows_;  // Their row path as raw frames.
  GenericMethods generic_methods_;                  // The tensor stream, the sparse rows.
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  grpc::ResourceQuota quota_{"ps_server"};
  bool auto_quota_ = false;
  int max_receive_message_bytes_ = kMaxMessageBytes;
  std::atomic<int64_t> receive_memory_bytes_{0};  // The quota now (0: none).
  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_PS_SERVER_H_
