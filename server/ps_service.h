// gRPC adapter for one ParameterShard: decodes requests into views (no copies of the
// tensor bytes), calls the shard, encodes the answer. No logic of its own.
#ifndef DPTRAIN_SERVER_PS_SERVICE_H_
#define DPTRAIN_SERVER_PS_SERVICE_H_

#include <atomic>
#include <functional>
#include <utility>

#include "proto/ps.grpc.pb.h"
#include "server/buffer_averager.h"
#include "server/parameter_shard.h"
#include "server/shard_telemetry.h"

namespace dptrain {

class PsService final : public proto::ParameterServer::Service {
 public:
  // `shard` must outlive the service.
  // `telemetry` (may be null) counts the calls; both must outlive the service.
  // `after_init` (may be empty) runs after every Init that succeeded.
  explicit PsService(ParameterShard* shard, ShardTelemetry* telemetry = nullptr,
                     std::function<void()> after_init = {})
      : shard_(shard),
        telemetry_(telemetry),
        after_init_(std::move(after_init)),
        buffers_(shard->options().num_workers) {}

  grpc::Status Init(grpc::ServerContext* context, const proto::InitRequest* request,
                    proto::InitResponse* response) override;
  grpc::Status Pull(grpc::ServerContext* context, const proto::PullRequest* request,
                    proto::PullResponse* response) override;
  grpc::Status PushPull(grpc::ServerContext* context, const proto::PushPullRequest* request,
                        proto::PullResponse* response) override;
  grpc::Status AverageBuffers(grpc::ServerContext* context,
                              const proto::AverageBuffersRequest* request,
                              proto::AverageBuffersResponse* response) override;
  grpc::Status GetShardInfo(grpc::ServerContext* context, const proto::ShardInfoRequest* request,
                            proto::ShardInfoResponse* response) override;
  grpc::Status Rollback(grpc::ServerContext* context, const proto::RollbackRequest* request,
                        proto::RollbackResponse* response) override;
  grpc::Status KeepBuffers(grpc::ServerContext* context, const proto::KeepBuffersRequest* request,
                           proto::KeepBuffersResponse* response) override;
  grpc::Status GetBuffers(grpc::ServerContext* context, const proto::GetBuffersRequest* request,
                          proto::GetBuffersResponse* response) override;

  // Message bytes of Init/Pull/PushPull requests received and answers sent: what this
  // shard's link carried.
  int64_t bytes_received() const { return bytes_received_.load(); }
  int64_t bytes_sent() const { return bytes_sent_.load(); }

 private:
  grpc::Status DoInit(grpc::ServerContext* context, const proto::InitRequest* request,
                      proto::InitResponse* response);
  grpc::Status DoPull(grpc::ServerContext* context, const proto::PullRequest* request,
                      proto::PullResponse* response);
  grpc::Status DoPushPull(grpc::ServerContext* context, const proto::PushPullRequest* request,
                          proto::PullResponse* response);
  grpc::Status DoAverageBuffers(grpc::ServerContext* context,
                                const proto::AverageBuffersRequest* request,
                                proto::AverageBuffersResponse* response);
  grpc::Status DoGetShardInfo(grpc::ServerContext* context, const proto::ShardInfoRequest* request,
                              proto::ShardInfoResponse* response);
  grpc::Status DoRollback(grpc::ServerContext* context, const proto::RollbackRequest* request,
                          proto::RollbackResponse* response);
  grpc::Status DoKeepBuffers(const proto::KeepBuffersRequest* request);
  grpc::Status DoGetBuffers(const proto::GetBuffersRequest* request,
                            proto::GetBuffersResponse* response);
  // Counts the call's outcome; returns `status`.
  grpc::Status Counted(const char* method, grpc::Status status);
  // The earlier of the client's deadline and now + step_timeout.
  absl::Time Deadline(const grpc::ServerContext& context) const;

  ParameterShard* const shard_;
  ShardTelemetry* const telemetry_;
  const std::function<void()> after_init_;
  BufferAverager buffers_;
  std::atomic<int64_t> bytes_received_{0}, bytes_sent_{0};
};

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_PS_SERVICE_H_
