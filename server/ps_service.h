// gRPC adapter for one ParameterShard: decodes requests into views (no copies of the
// tensor bytes), calls the shard, encodes the answer. No logic of its own.
#ifndef DPTRAIN_SERVER_PS_SERVICE_H_
#define DPTRAIN_SERVER_PS_SERVICE_H_

#include "proto/ps.grpc.pb.h"
#include "server/parameter_shard.h"

namespace dptrain {

class PsService final : public proto::ParameterServer::Service {
 public:
  // `shard` must outlive the service.
  explicit PsService(ParameterShard* shard) : shard_(shard) {}

  grpc::Status Init(grpc::ServerContext* context, const proto::InitRequest* request,
                    proto::InitResponse* response) override;
  grpc::Status Pull(grpc::ServerContext* context, const proto::PullRequest* request,
                    proto::PullResponse* response) override;
  grpc::Status PushPull(grpc::ServerContext* context, const proto::PushPullRequest* request,
                        proto::PullResponse* response) override;
  grpc::Status GetShardInfo(grpc::ServerContext* context, const proto::ShardInfoRequest* request,
                            proto::ShardInfoResponse* response) override;

 private:
  // The earlier of the client's deadline and now + step_timeout.
  absl::Time Deadline(const grpc::ServerContext& context) const;

  ParameterShard* const shard_;
};

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_PS_SERVICE_H_
