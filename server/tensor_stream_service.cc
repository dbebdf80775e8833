#include "server/tensor_stream_service.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/tensor_frame.h"
#include "server/ps_requests.h"

namespace dptrain {

// One call. Reads run on gRPC's callback threads and never block; the writer thread does
// the waiting (PullChunk) and the writes. The reactor deletes itself when both gRPC is done
// with it (OnDone) and the writer thread has returned.
class PushPullReactor final : public grpc::ServerGenericBidiReactor {
 public:
  friend class TensorStreamService;  // Its reaper: Ref, CancelForNoFrame, Unref.
  PushPullReactor(TensorStreamService* service, grpc::GenericCallbackServerContext* context)
      : service_(service), shard_(service->shard_), context_(context) {
    const absl::Time theirs = absl::FromChrono(context->deadline());
    deadline_ = std::min(theirs, absl::Now() + shard_->options().step_timeout);
    if (context->method() != kTensorStreamMethod) {
      refs_ = 1;  // No writer thread.
      Finish(grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                          absl::StrCat("unknown method ", context->method())));
      return;
    }
    service_->Watch(this);
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!first_read_done_) {
      first_read_done_ = true;
      service_->Unwatch(this);
    }
    absl::Status status;
    if (ok) {
      service_->bytes_received_ += static_cast<int64_t>(in_.Length());
      status = Push();
      in_.Clear();
    } else {
      status = absl::InvalidArgumentError("the tensor stream ended before its first frame");
    }
    bool no_writer = false;
    {
      absl::MutexLock lock(&mu_);
      if (ok && status.ok()) {
        StartRead(&in_);
        return;
      }
      reads_done_ = true;  // The worker half-closed, the call broke or a frame was bad.
      if (!status.ok() && (ok || !writer_started_)) error_ = status;
      // A bad frame: the writer stops waiting for the other ranks. Under mu_, so that the
      // writer cannot finish (and the reactor go) before this returns.
      if (ok && !status.ok() && writer_started_) AbandonLocked();
      if (!writer_started_) {
        FinishLocked(ToGrpcStatus(error_));
        no_writer = true;
      }
    }
    if (no_writer) Unref();  // The writer's reference: it will never run.
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    write_pending_ = false;
    write_ok_ = ok;
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    AbandonLocked();  // The worker cancelled or went away: nobody waits for its answer.
    ReleaseSlotLocked();
  }

  // After Finish, which the writer calls only once it stopped waiting; the server's
  // shutdown waits for every OnDone, so the service is still alive here (unlike in the
  // destructor, which the writer thread may run after the server is gone).
  void OnDone() override {
    if (service_->options_.on_done_for_test) service_->options_.on_done_for_test();
    {
      absl::MutexLock lock(&mu_);
      ReleaseSlotLocked();  // Already done at Finish or OnCancel, unless neither came.
    }
    Unref();
  }

 private:
  // Gives this call's slot of max_streams_per_rank back, once. Lock order: this call's mu_,
  // then the service's.
  void ReleaseSlotLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!admitted_) return;
    admitted_ = false;
    service_->ReleaseStream(rank_);
  }

  // Ends the writer's wait in the shard now. Lock order: this call's mu_, then the shard's.
  void AbandonLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    abandoned_ = true;
    shard_->WakeWaiters();
  }

  // Decodes the frame in in_ and pushes its chunk; starts the writer after the first.
  absl::Status Push() {
    auto frame = ReceivedFrame::Parse(in_);
    if (!frame.ok()) return frame.status();
    // Shared: the shard keeps the payload (a view into the message) until the step completes.
    auto held = std::make_shared<ReceivedFrame>(*std::move(frame));
    const proto::FrameHeader& h = held->header();
    {
      absl::MutexLock lock(&mu_);
      if (!writer_started_) {
        if (h.caller().rank() < 0 || h.caller().rank() >= shard_->options().num_workers) {
          return absl::InvalidArgumentError(absl::StrCat(
              "rank ", h.caller().rank(), " is not in [0, ", shard_->options().num_workers, ")"));
        }
        if (!service_->AdmitStream(h.caller().rank())) {
          busy_ = true;
          return absl::ResourceExhaustedError(absl::StrCat(
              "rank ", h.caller().rank(), " already has ", service_->options_.max_streams_per_rank,
              " tensor streams open on this shard (ps_server --max_streams_per_rank)"));
        }
        admitted_ = true;
        job_id_ = h.caller().job_id();
        rank_ = h.caller().rank();
        step_ = h.step();
      } else if (h.caller().job_id() != job_id_ || h.caller().rank() != rank_ ||
                 h.step() != step_) {
        return absl::InvalidArgumentError(
            "every frame of a tensor stream must carry the same job id, rank and step");
      }
    }
    ChunkView view{h.key().tensor_id(), h.key().chunk_index(), static_cast<DType>(h.dtype()),
                   held->ContiguousPayload()};
    std::shared_ptr<const void> hold = held;
    if (view.dtype == DType::kBf16 || view.dtype == DType::kFp16) {
      // 16 bits on the wire (--wire_dtype): the shard sums and keeps fp32.
      auto wide = std::make_shared<std::vector<float>>();
      absl::StatusOr<ChunkView> widened = WidenedToFp32(view, *wide);
      if (!widened.ok()) return widened.status();
      view = *widened;
      hold = std::move(wide);
    }
    auto slot = shard_->PushChunk(job_id_, rank_, step_, view, std::move(hold), h.overflow());
    if (!slot.ok()) return slot.status();
    absl::MutexLock lock(&mu_);
    if (pushed_.empty()) pushed_.assign(shard_->num_chunks(), false);
    if (pushed_[*slot]) {
      return absl::InvalidArgumentError(absl::StrCat("chunk (tensor ", h.key().tensor_id(),
                                                     ", chunk ", h.key().chunk_index(),
                                                     ") appears twice in one step"));
    }
    pushed_[*slot] = true;
    if (!writer_started_) {
      writer_started_ = true;
      std::thread([this] { Write(); }).detach();
    }
    return absl::OkStatus();
  }

  // The writer thread: each chunk's weights, in slot order, once this rank pushed it and
  // the shard completed its step; then the status.
  void Write() {
    const int n = shard_->num_chunks();
    // Under BSP a chunk's weights stay as they are until every rank pushed the next step,
    // which each does only after this call ended (its status comes after the frames), so
    // the frame can send them in place. SSP/async change them at any push: copy.
    const bool reference_weights = shard_->options().policy == SyncPolicy::kBsp;
    grpc::Status result = grpc::Status::OK;
    for (int slot = 0; slot < n && result.ok(); ++slot) {
      {
        absl::MutexLock lock(&mu_);
        auto pushed_or_over = [this, slot]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return pushed_[slot] || reads_done_ || cancelled_;
        };
        mu_.AwaitWithDeadline(absl::Condition(&pushed_or_over), deadline_);
        if (!error_.ok()) {
          result = ToGrpcStatus(error_);
        } else if (cancelled_) {
          result = grpc::Status(grpc::StatusCode::CANCELLED, "the worker cancelled the step");
        } else if (!pushed_[slot]) {
          result =
              grpc::Status(reads_done_ ? grpc::StatusCode::INVALID_ARGUMENT
                                       : grpc::StatusCode::DEADLINE_EXCEEDED,
                           absl::StrCat("step ", step_, ": the stream of rank ", rank_, " carried ",
                                        std::count(pushed_.begin(), pushed_.end(), true),
                                        " of the ", n, " chunks of shard ", shard_->options().shard,
                                        reads_done_ ? " before it ended" : " in time"));
        }
      }
      if (!result.ok()) break;
      grpc::Slice payload;
      proto::FrameHeader header;
      auto pulled = shard_->PullChunk(
          rank_, step_, slot, deadline_,
          [&](const ChunkSpec& spec, absl::Span<const float> w) {
            header.mutable_key()->set_tensor_id(spec.tensor_id);
            header.mutable_key()->set_chunk_index(spec.chunk_index);
            const size_t bytes = w.size() * sizeof(float);
            if (reference_weights) {
              payload = grpc::Slice(w.data(), bytes, grpc::Slice::STATIC_SLICE);
            } else {
              payload = NewPayload(bytes);
              std::memcpy(MutableData(payload), w.data(), bytes);
            }
          },
          &abandoned_);
      if (!pulled.ok()) {
        absl::MutexLock lock(&mu_);  // A bad frame that abandoned the wait says why.
        result = ToGrpcStatus(error_.ok() ? pulled.status() : error_);
        break;
      }
      header.set_dtype(proto::FP32);
      header.set_version(pulled->version);
      header.set_staleness(pulled->staleness);
      header.set_overflow(pulled->skipped);
      out_ = FrameOwning(header, std::move(payload));
      service_->bytes_sent_ += static_cast<int64_t>(out_.Length());
      absl::MutexLock lock(&mu_);
      if (cancelled_) {
        result = grpc::Status(grpc::StatusCode::CANCELLED, "the worker cancelled the step");
        break;
      }
      write_pending_ = true;
      StartWrite(&out_);
      auto written = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !write_pending_; };
      mu_.Await(absl::Condition(&written));
      if (!write_ok_) result = grpc::Status(grpc::StatusCode::CANCELLED, "the worker went away");
    }
    {
      absl::MutexLock lock(&mu_);
      // A failed read may have come after the last write; it wins over OK.
      if (result.ok() && !error_.ok()) result = ToGrpcStatus(error_);
      FinishLocked(result);
    }
    Unref();
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    if (service_->telemetry_ != nullptr) service_->telemetry_->CountRequest("stream", status);
    // A slot is free as soon as the answer is on its way: the worker may open its next
    // stream the moment it reads this status.
    ReleaseSlotLocked();
    if (busy_) context_->AddTrailingMetadata(kStreamBusyKey, "50");
    Finish(status);
  }

  void Ref() { refs_.fetch_add(1); }
  // The service's reaper: no first frame in time.
  void CancelForNoFrame() { context_->TryCancel(); }
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  TensorStreamService* const service_;
  ParameterShard* const shard_;
  grpc::GenericCallbackServerContext* const context_;
  bool first_read_done_ = false;  // Reads are sequential: only OnReadDone touches it.
  absl::Time deadline_;
  grpc::ByteBuffer in_;
  grpc::ByteBuffer out_;
  // OnDone and the writer thread each hold one.
  std::atomic<int> refs_{2};
  std::atomic<bool> abandoned_{false};  // Set before the shard's waiters are woken.

  absl::Mutex mu_;
  // Set from the first frame (reads are sequential), before the writer starts; then constant.
  std::string job_id_;
  int rank_ = 0;
  int64_t step_ = 0;
  std::vector<bool> pushed_ ABSL_GUARDED_BY(mu_);  // By slot.
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool writer_started_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool write_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool write_ok_ ABSL_GUARDED_BY(mu_) = true;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // Holds a slot of the service's streams (from the first frame until Finish or OnCancel).
  bool admitted_ ABSL_GUARDED_BY(mu_) = false;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // Refused by max_streams_per_rank.
};

TensorStreamService::TensorStreamService(ParameterShard* shard, const TensorStreamOptions& options,
                                         ShardTelemetry* telemetry)
    : shard_(shard), options_(options), telemetry_(telemetry) {
  reaper_ = std::thread([this] { Reap(); });
}

TensorStreamService::~TensorStreamService() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  reaper_.join();
}

void TensorStreamService::Watch(PushPullReactor* call) {
  absl::MutexLock lock(&mu_);
  no_frame_yet_[call] = absl::Now();
}

void TensorStreamService::Unwatch(PushPullReactor* call) {
  absl::MutexLock lock(&mu_);
  no_frame_yet_.erase(call);
}

void TensorStreamService::Reap() {
  const absl::Duration period = std::min(
      absl::Milliseconds(500), std::max(absl::Milliseconds(10), options_.first_frame_timeout / 4));
  for (;;) {
    std::vector<PushPullReactor*> expired;
    {
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      mu_.AwaitWithTimeout(absl::Condition(&stop), period);
      if (stopping_) return;
      const absl::Time now = absl::Now();
      for (auto it = no_frame_yet_.begin(); it != no_frame_yet_.end();) {
        if (now - it->second < options_.first_frame_timeout) {
          ++it;
          continue;
        }
        // The call is alive while it is here (its first read's end removes it, and nothing
        // can end the call before that); the reference keeps it alive after the lock.
        it->first->Ref();
        expired.push_back(it->first);
        ++reaped_;
        it = no_frame_yet_.erase(it);
      }
    }
    // Without the lock: cancelling may run the call's callbacks on this thread.
    for (PushPullReactor* call : expired) {
      call->CancelForNoFrame();
      call->Unref();
    }
  }
}

int64_t TensorStreamService::reaped_streams() const {
  absl::MutexLock lock(&mu_);
  return reaped_;
}

bool TensorStreamService::AdmitStream(int rank) {
  absl::MutexLock lock(&mu_);
  int& open = streams_by_rank_[rank];
  if (open >= options_.max_streams_per_rank) return false;
  ++open;
  return true;
}

void TensorStreamService::ReleaseStream(int rank) {
  absl::MutexLock lock(&mu_);
  if (--streams_by_rank_[rank] == 0) streams_by_rank_.erase(rank);
}

int TensorStreamService::active_streams() const {
  absl::MutexLock lock(&mu_);
  int total = 0;
  for (const auto& [rank, open] : streams_by_rank_) total += open;
  return total;
}

grpc::ServerGenericBidiReactor* TensorStreamService::CreateReactor(
    grpc::GenericCallbackServerContext* context) {
  return new PushPullReactor(this, context);
}

}  // namespace dptrain
