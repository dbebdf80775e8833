#include "server/ps_service.h"

#include <algorithm>
#include <vector>

#include "common/grpc_status.h"
#include "server/ps_requests.h"
#include "server/shard_status.h"

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

grpc::Status PsService::DoInit(grpc::ServerContext*, const proto::InitRequest* request,
                               proto::InitResponse* response) {
  // Initial weights are fp32: 16-bit chunks stay as sent and the shard refuses them.
  absl::StatusOr<std::vector<ChunkView>> views = ViewsOf(request->chunks());
  if (!views.ok()) return ToGrpcStatus(views.status());
  auto version = shard_->Init(request->caller().job_id(), request->caller().rank(),
                              DescriptionOf(*request), *views);
  if (!version.ok()) return ToGrpcStatus(version.status());
  response->set_version(*version);
  if (after_init_) after_init_();
  return grpc::Status::OK;
}

grpc::Status PsService::DoPull(grpc::ServerContext* context, const proto::PullRequest* request,
                               proto::PullResponse* response) {
  auto version = shard_->Pull(request->caller().job_id(), request->caller().rank(),
                              DescriptionOf(*request), Deadline(*context), SinkInto(response));
  if (!version.ok()) return ToGrpcStatus(version.status());
  response->set_version(*version);
  return grpc::Status::OK;
}

grpc::Status PsService::DoPushPull(grpc::ServerContext* context,
                                   const proto::PushPullRequest* request,
                                   proto::PullResponse* response) {
  int64_t staleness = 0;
  bool skipped = false;
  std::vector<std::vector<float>> widened;  // 16-bit gradients as fp32 (--wire_dtype).
  absl::StatusOr<std::vector<ChunkView>> views = ViewsOf(request->chunks(), &widened);
  if (!views.ok()) return ToGrpcStatus(views.status());
  auto version = shard_->PushPull(request->caller().job_id(), request->caller().rank(),
                                  request->step(), *views, Deadline(*context), SinkInto(response),
                                  &staleness, request->overflow(), &skipped);
  bytes_received_ += static_cast<int64_t>(request->ByteSizeLong());
  if (!version.ok()) return ToGrpcStatus(version.status());
  response->set_version(*version);
  response->set_staleness(staleness);
  response->set_skipped(skipped);
  bytes_sent_ += static_cast<int64_t>(response->ByteSizeLong());
  return grpc::Status::OK;
}

grpc::Status PsService::DoAverageBuffers(grpc::ServerContext* context,
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
  // A round is an epoch that ended: this shard saw a step of it (the newest step any rank
  // pushed, or its version).
  int64_t latest_round = info.version;
  for (int64_t step : info.rank_steps) latest_round = std::max(latest_round, step);
  auto mean = buffers_.Average(
      request->caller().rank(), request->round(), latest_round,
      absl::MakeConstSpan(reinterpret_cast<const float*>(data.data()), data.size() / 4),
      Deadline(*context));
  if (!mean.ok()) return ToGrpcStatus(mean.status());
  response->set_data(reinterpret_cast<const char*>(mean->data()), mean->size() * sizeof(float));
  return grpc::Status::OK;
}

grpc::Status PsService::DoGetShardInfo(grpc::ServerContext*, const proto::ShardInfoRequest*,
                                       proto::ShardInfoResponse* response) {
  FillShardInfo(*shard_, response);
  return grpc::Status::OK;
}

grpc::Status PsService::DoRollback(grpc::ServerContext*, const proto::RollbackRequest* request,
                                   proto::RollbackResponse* response) {
  auto step = shard_->Rollback(request->caller().job_id(), request->caller().rank(),
                               request->step(), request->incarnation());
  if (!step.ok()) return ToGrpcStatus(step.status());
  response->set_step(*step);
  return grpc::Status::OK;
}

grpc::Status PsService::DoKeepBuffers(const proto::KeepBuffersRequest* request) {
  const std::string& data = request->data();
  if (data.size() % sizeof(float) != 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "KeepBuffers: data is not a whole number of fp32");
  }
  return ToGrpcStatus(shard_->KeepBuffers(
      request->caller().job_id(), request->caller().rank(), request->step(),
      absl::MakeConstSpan(reinterpret_cast<const float*>(data.data()), data.size() / 4),
      request->epoch_end()));
}

grpc::Status PsService::DoGetBuffers(const proto::GetBuffersRequest* request,
                                     proto::GetBuffersResponse* response) {
  auto values =
      shard_->Buffers(request->caller().job_id(), request->caller().rank(), request->step());
  if (!values.ok()) return ToGrpcStatus(values.status());
  response->set_data(reinterpret_cast<const char*>(values->data()), values->size() * sizeof(float));
  return grpc::Status::OK;
}

grpc::Status PsService::Counted(const char* method, grpc::Status status) {
  if (telemetry_ != nullptr) telemetry_->CountRequest(method, status);
  return status;
}

grpc::Status PsService::Init(grpc::ServerContext* context, const proto::InitRequest* request,
                             proto::InitResponse* response) {
  return Counted("init", DoInit(context, request, response));
}

grpc::Status PsService::Pull(grpc::ServerContext* context, const proto::PullRequest* request,
                             proto::PullResponse* response) {
  return Counted("pull", DoPull(context, request, response));
}

grpc::Status PsService::PushPull(grpc::ServerContext* context,
                                 const proto::PushPullRequest* request,
                                 proto::PullResponse* response) {
  return Counted("push_pull", DoPushPull(context, request, response));
}

grpc::Status PsService::AverageBuffers(grpc::ServerContext* context,
                                       const proto::AverageBuffersRequest* request,
                                       proto::AverageBuffersResponse* response) {
  return Counted("average_buffers", DoAverageBuffers(context, request, response));
}

grpc::Status PsService::GetShardInfo(grpc::ServerContext* context,
                                     const proto::ShardInfoRequest* request,
                                     proto::ShardInfoResponse* response) {
  return Counted("shard_info", DoGetShardInfo(context, request, response));
}

grpc::Status PsService::Rollback(grpc::ServerContext* context,
                                 const proto::RollbackRequest* request,
                                 proto::RollbackResponse* response) {
  return Counted("rollback", DoRollback(context, request, response));
}

grpc::Status PsService::KeepBuffers(grpc::ServerContext*, const proto::KeepBuffersRequest* request,
                                    proto::KeepBuffersResponse*) {
  return Counted("keep_buffers", DoKeepBuffers(request));
}

grpc::Status PsService::GetBuffers(grpc::ServerContext*, const proto::GetBuffersRequest* request,
                                   proto::GetBuffersResponse* response) {
  return Counted("get_buffers", DoGetBuffers(request, response));
}

}  // namespace dptrain
