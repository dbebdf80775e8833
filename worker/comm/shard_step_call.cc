#include "worker/comm/shard_step_call.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/tensor_frame.h"

namespace dptrain {

ShardStepCall::ShardStepCall(const ShardStep& step)
    : step_(step), chunks_(step.map->ChunksOfShard(step.shard)) {
  context_.set_deadline(absl::ToChronoTime(step.deadline));
  proto::FrameHeader header;
  header.mutable_caller()->set_job_id(step.job_id);
  header.mutable_caller()->set_rank(step.rank);
  header.set_step(step.step);
  const bool narrow = step.wire_dtype != DType::kFp32;
  header.set_dtype(static_cast<proto::DType>(step.wire_dtype));
  header.set_overflow(step.overflow);
  for (int i : chunks_) {
    const ChunkSpec& spec = step.map->chunks()[i];
    header.mutable_key()->set_tensor_id(spec.tensor_id);
    header.mutable_key()->set_chunk_index(spec.chunk_index);
    const char* from =
        narrow ? reinterpret_cast<const char*>(step.narrow_grads.data() + spec.flat_offset)
               : reinterpret_cast<const char*>(step.grads.data() + spec.flat_offset);
    out_.push_back(FrameReferencing(
        header, absl::string_view(from, spec.count * ElementSize(step.wire_dtype))));
    bytes_sent_ += static_cast<int64_t>(out_.back().Length());
  }
}

void ShardStepCall::Start() {
  timeline_.start = absl::Now();
  step_.stub->PrepareBidiStreamingCall(&context_, kTensorStreamMethod, grpc::StubOptions(), this);
  if (out_.size() == 1) {
    StartWriteLast(&out_[0], grpc::WriteOptions());
  } else {
    StartWrite(&out_[0]);
  }
  StartRead(&in_);
  StartCall();
}

void ShardStepCall::OnWriteDone(bool ok) {
  if (!ok) return;  // The call failed; OnDone says why.
  if (++next_write_ >= out_.size()) {
    timeline_.pushed = absl::Now();
    return;
  }
  if (next_write_ + 1 == out_.size()) {
    StartWriteLast(&out_[next_write_], grpc::WriteOptions());
  } else {
    StartWrite(&out_[next_write_]);
  }
}

void ShardStepCall::OnReadDone(bool ok) {
  if (!ok) return;  // End of the answer, or the call failed; OnDone follows.
  bytes_received_ += static_cast<int64_t>(in_.Length());
  if (received_ == 0) timeline_.first_answer = absl::Now();
  if (absl::Status s = Accept(); !s.ok()) {
    error_ = s;
    context_.TryCancel();
    return;
  }
  in_.Clear();
  StartRead(&in_);
}

absl::Status ShardStepCall::Accept() {
  auto frame = ReceivedFrame::Parse(in_);
  if (!frame.ok()) return frame.status();
  if (received_ >= chunks_.size()) {
    return absl::DataLossError(absl::StrCat("shard ", step_.shard, " answered with more than ",
                                            chunks_.size(), " chunks"));
  }
  const ChunkSpec& spec = step_.map->chunks()[chunks_[received_]];
  const proto::FrameHeader& h = frame->header();
  if (h.key().tensor_id() != spec.tensor_id || h.key().chunk_index() != spec.chunk_index ||
      h.dtype() != proto::FP32 || frame->payload_size() != spec.count * sizeof(float)) {
    return absl::DataLossError(
        absl::StrCat("shard ", step_.shard, " answered with an unexpected chunk ", received_,
                     " (tensor ", h.key().tensor_id(), ", chunk ", h.key().chunk_index(), ", ",
                     frame->payload_size(), " bytes)"));
  }
  frame->CopyPayload(reinterpret_cast<char*>(step_.weights.data() + spec.flat_offset));
  staleness_ = std::max<int64_t>(staleness_, h.staleness());
  skipped_ = skipped_ || h.overflow();
  ++received_;
  return absl::OkStatus();
}

void ShardStepCall::OnDone(const grpc::Status& status) {
  if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
    const auto& trailers = context_.GetServerTrailingMetadata();
    if (auto it = trailers.find(kStreamBusyKey); it != trailers.end()) {
      int ms = 0;
      if (absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &ms)) {
        busy_retry_after_ = absl::Milliseconds(std::clamp(ms, 1, 1000));
      }
    }
  }
  absl::MutexLock lock(&mu_);
  timeline_.done = absl::Now();
  status_ = status;
  done_ = true;
}

absl::Status ShardStepCall::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
  if (!error_.ok()) {
    return absl::Status(error_.code(), absl::StrCat(step_.context, ": ", error_.message()));
  }
  if (!status_.ok()) return FromGrpcStatus(status_, step_.context);
  if (received_ != chunks_.size()) {
    return absl::DataLossError(absl::StrCat(step_.context, ": the shard answered with ", received_,
                                            " of ", chunks_.size(), " chunks"));
  }
  return absl::OkStatus();
}

}  // namespace dptrain
