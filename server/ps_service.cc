#include "server/ps_service.h"

#include <vector>

#include "common/grpc_status.h"
#include "server/ps_requests.h"

namespace dptrain {
namespace {

ChunkSink SinkInto(proto::PullResponse* response) {
  return [response](const ChunkSpec& spec, absl::Span<const float> weights) {
    proto::Chunk* c = response->add_chunks();
    c->mutable_key()->set_tensor_id(spec.tensor_id);
    c->mutable_key()->set_chunk_index(spec.chunk_index);
    c->set_dtype(proto::FP32);
    c->set_data(reinterpret_cast<const char*>(weights.data()), weights.size() * sizeof(float));
  };
}

}  // namespace

absl::Time PsService::Deadline(const grpc::ServerContext& context) const {
  const absl::Time ours = absl::Now() + shard_->options().step_timeout;
  const absl::Time theirs = absl::FromChrono(context.deadline());
  return std::min(ours, theirs);
}

grpc::Status PsService::Init(grpc::ServerContext*, const proto::InitRequest* request,
                             proto::InitResponse* response) {
  auto version = shard_->Init(request->caller().job_id(), request->caller().rank(),
                              DescriptionOf(*request), ViewsOf(request->chunks()));
  if (!version.ok()) return ToGrpcStatus(version.status());
  response->set_version(*version);
  return grpc::Status::OK;
}

grpc::Status PsService::Pull(grpc::ServerContext* context, const proto::PullRequest* request,
                             proto::PullResponse* response) {
  auto version = shard_->Pull(request->caller().job_id(), request->caller().rank(),
                              DescriptionOf(*request), Deadline(*context), SinkInto(response));
  if (!version.ok()) return ToGrpcStatus(version.status());
  response->set_version(*version);
  return grpc::Status::OK;
}

grpc::Status PsService::PushPull(grpc::ServerContext* context,
                                 const proto::PushPullRequest* request,
                                 proto::PullResponse* response) {
  int64_t staleness = 0;
  bool skipped = false;
  auto version = shard_->PushPull(request->caller().job_id(), request->caller().rank(),
                                  request->step(), ViewsOf(request->chunks()),
                                  Deadline(*context), SinkInto(response), &staleness,
                                  request->overflow(), &skipped);
  bytes_received_ += static_cast<int64_t>(request->ByteSizeLong());
  if (!version.ok()) return ToGrpcStatus(version.status());
  response->set_version(*version);
  response->set_staleness(staleness);
  response->set_skipped(skipped);
  bytes_sent_ += static_cast<int64_t>(response->ByteSizeLong());
  return grpc::Status::OK;
}

grpc::Status PsService::AverageBuffers(grpc::ServerContext* context,
                                       const proto::AverageBuffersRequest* request,
                                       proto::AverageBuffersResponse* response) {
  const ParameterShard::Info info = shard_->GetInfo();
  if (info.initialized && request->caller().job_id() != info.job_id) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "AverageBuffers: job id does not match this shard's job");
  }
  const std::string& data = request->data();
  if (data.size() % sizeof(float) != 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "AverageBuffers: data is not a whole number of fp32");
  }
  auto mean = buffers_.Average(
      request->caller().rank(), request->round(),
      absl::MakeConstSpan(reinterpret_cast<const float*>(data.data()), data.size() / 4),
      Deadline(*context));
  if (!mean.ok()) return ToGrpcStatus(mean.status());
  response->set_data(reinterpret_cast<const char*>(mean->data()), mean->size() * sizeof(float));
  return grpc::Status::OK;
}

grpc::Status PsService::GetShardInfo(grpc::ServerContext*, const proto::ShardInfoRequest*,
                                     proto::ShardInfoResponse* response) {
  const ParameterShardOptions& o = shard_->options();
  const ParameterShard::Info info = shard_->GetInfo();
  response->set_shard(o.shard);
  response->set_num_shards(o.num_shards);
  response->set_num_workers(o.num_workers);
  response->set_job_id(info.job_id);
  response->set_initialized(info.initialized);
  response->set_version(info.version);
  response->set_optimizer(o.optimizer.name);
  response->set_learning_rate(o.optimizer.learning_rate);
  response->set_sync_policy(SyncPolicyName(o.policy));
  response->set_staleness_bound(o.staleness);
  response->set_max_staleness(info.max_staleness);
  response->set_mean_staleness(info.mean_staleness);
  response->set_nonfinite_steps(info.nonfinite_steps);
  response->set_nonfinite_pushes(info.nonfinite_pushes);
  response->set_checkpoint_every(o.checkpoints.every);
  response->set_restored_step(info.restored_step);
  response->set_checkpoint_step(info.checkpoint_step);
  response->set_checkpoints_written(info.checkpoints_written);
  response->set_checkpoint_failures(info.checkpoint_failures);
  response->set_checkpoint_seconds(info.checkpoint_seconds);
  response->set_checkpoint_bytes(info.checkpoint_bytes);
  response->set_rollbacks(info.rollbacks);
  return grpc::Status::OK;
}

grpc::Status PsService::Rollback(grpc::ServerContext*, const proto::RollbackRequest* request,
                                 proto::RollbackResponse* response) {
  auto step =
      shard_->Rollback(request->caller().job_id(), request->caller().rank(), request->step());
  if (!step.ok()) return ToGrpcStatus(step.status());
  response->set_step(*step);
  return grpc::Status::OK;
}

}  // namespace dptrain
