#include "worker/comm/shard_step_call.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/tensor_frame.h"
#include "common/wire_dtype.h"

namespace dptrain {

ShardStepCall::ShardStepCall(const ShardStep& step)
    : step_(step), chunks_(step.map->ChunksOfShard(step.shard)), out_(chunks_.size()) {
  context_.set_deadline(absl::ToChronoTime(step.deadline));
  header_.mutable_caller()->set_job_id(step.job_id);
  header_.mutable_caller()->set_rank(step.rank);
  header_.set_step(step.step);
  header_.set_dtype(static_cast<proto::DType>(step.wire_dtype));
  header_.set_overflow(step.overflow);
}

ShardStepCall::~ShardStepCall() {
  if (cancel_token_ >= 0) step_.cancellation->Deregister(cancel_token_);
  if (wake_id_ >= 0) step_.ready->Unsubscribe(wake_id_);
}

bool ShardStepCall::ChunkReady(size_t i) const {
  if (step_.ready == nullptr) return true;
  const ChunkSpec& spec = step_.map->chunks()[chunks_[i]];
  return step_.ready->ready() >= spec.flat_offset + spec.count;
}

grpc::ByteBuffer ShardStepCall::FrameFor(size_t i) {
  const ChunkSpec& spec = step_.map->chunks()[chunks_[i]];
  header_.mutable_key()->set_tensor_id(spec.tensor_id);
  header_.mutable_key()->set_chunk_index(spec.chunk_index);
  const absl::Span<const float> values = step_.grads.subspan(spec.flat_offset, spec.count);
  const char* from = reinterpret_cast<const char*>(values.data());
  if (step_.wire_dtype != DType::kFp32) {
    const absl::Span<uint16_t> narrow = step_.narrow_scratch.subspan(spec.flat_offset, spec.count);
    Narrow(step_.wire_dtype, values, narrow);
    from = reinterpret_cast<const char*>(narrow.data());
  }
  grpc::ByteBuffer frame = FrameReferencing(
      header_, absl::string_view(from, spec.count * ElementSize(step_.wire_dtype)));
  bytes_sent_ += static_cast<int64_t>(frame.Length());
  return frame;
}

void ShardStepCall::Start() {
  if (chunks_.empty()) {  // Nothing to send: the caller starts no call for such a shard.
    absl::MutexLock lock(&mu_);
    done_ = true;
    return;
  }
  if (step_.cancellation != nullptr) {
    cancel_token_ = step_.cancellation->Register([this] { Cancel(); });
  }
  if (step_.ready != nullptr) wake_id_ = step_.ready->Subscribe([this] { Pump(); });
  Pump();
}

void ShardStepCall::Pump() {
  if (step_.ready != nullptr && step_.ready->cancelled()) {
    Cancel();
    return;
  }
  size_t write = 0;
  bool begin = false, last = false;
  {
    absl::MutexLock lock(&write_mu_);
    if (stopped_ || writing_ || next_write_ >= out_.size() || !ChunkReady(next_write_)) return;
    writing_ = true;
    write = next_write_;
    last = write + 1 == out_.size();
    begin = !begun_;
    begun_ = true;
    holding_ = holding_ || begin;
  }
  out_[write] = FrameFor(write);  // Only the thread that set writing_ gets here.
  if (begin) {
    timeline_.start = absl::Now();
    step_.stub->PrepareBidiStreamingCall(&context_, kTensorStreamMethod, grpc::StubOptions(), this);
    AddHold();  // Writes may start from outside the reactions until the last one.
  }
  if (last) {
    StartWriteLast(&out_[write], grpc::WriteOptions());
  } else {
    StartWrite(&out_[write]);
  }
  if (begin) {
    StartRead(&in_);
    StartCall();
  }
  if (last) {
    bool release = false;
    {
      absl::MutexLock lock(&write_mu_);
      release = holding_;
      holding_ = false;
    }
    if (release) RemoveHold();
  }
}

void ShardStepCall::Cancel() {
  bool release = false, begun = false;
  {
    absl::MutexLock lock(&write_mu_);
    if (stopped_) return;
    stopped_ = true;
    begun = begun_;
    // With a write being started or in flight, its OnWriteDone releases the hold (the write
    // fails once the call is cancelled); gRPC must not end the call before StartWrite.
    if (!writing_) {
      release = holding_;
      holding_ = false;
    }
  }
  if (!begun) {
    absl::MutexLock lock(&mu_);
    status_ = grpc::Status(grpc::StatusCode::CANCELLED, "the gradient was not completed");
    done_ = true;
    return;
  }
  context_.TryCancel();
  if (release) RemoveHold();
}

void ShardStepCall::OnWriteDone(bool ok) {
  bool release = false;
  {
    absl::MutexLock lock(&write_mu_);
    writing_ = false;
    if (!ok) stopped_ = true;  // The call failed; OnDone says why.
    if (ok && ++next_write_ >= out_.size()) timeline_.pushed = absl::Now();
    if (stopped_) {
      release = holding_;
      holding_ = false;
    }
  }
  if (release) {
    RemoveHold();
    return;
  }
  if (ok) Pump();
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
  // Before done_: once Wait returns, the manager may be gone.
  if (!status.ok() && busy_retry_after_ == absl::ZeroDuration() && step_.cancellation != nullptr) {
    step_.cancellation->Cancel(
        !error_.ok()
            ? absl::Status(error_.code(), absl::StrCat(step_.context, ": ", error_.message()))
            : FromGrpcStatus(status, step_.context));
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
