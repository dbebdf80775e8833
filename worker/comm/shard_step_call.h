// One training step with one parameter-server shard over the tensor stream
// (proto/ps.proto, TensorStream/PushPull): writes a frame per owned chunk straight from the
// gradient (no copy), and copies each returning frame of new weights into place as it
// arrives. The PS client runs one per shard at once.
#ifndef DPTRAIN_WORKER_COMM_SHARD_STEP_CALL_H_
#define DPTRAIN_WORKER_COMM_SHARD_STEP_CALL_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/shard_map.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/client_callback.h"
#include "proto/ps.pb.h"
#include "worker/comm/cancellation.h"
#include "worker/comm/gradient_readiness.h"

namespace dptrain {

struct ShardStep {
  grpc::GenericStub* stub = nullptr;
  const ShardMap* map = nullptr;
  int shard = 0;
  std::string job_id;
  int rank = 0;
  int64_t step = 0;
  absl::Span<const float> grads;  // The whole model's; must not change until Wait returns.
  // With wire_dtype kBf16/kFp16 each frame carries its chunk of grads rounded to it, written
  // into narrow_scratch (the whole model's size; this call writes its own chunks' ranges)
  // just before the frame leaves.
  DType wire_dtype = DType::kFp32;
  absl::Span<uint16_t> narrow_scratch;
  // If set, grads is still being computed: a chunk leaves once ready->ready() covers it, and
  // the call itself starts with this shard's first chunk (so that the shard's wait for a
  // first frame starts then). Not owned; must outlive the call.
  GradientReadiness* ready = nullptr;
  absl::Span<float> weights;  // The whole model's; this shard's chunks are written.
  absl::Time deadline;
  std::string context;    // Prefixes errors, e.g. "PushPull of step 3 to shard 1 at host:port".
  bool overflow = false;  // This worker's gradient has inf/NaN (FrameHeader.overflow).
  // If set, the step's calls to every shard: a failure of this one (but for a busy refusal)
  // cancels them all, and their failure cancels this one. Not owned; must outlive the call.
  CancellationManager* cancellation = nullptr;
};

class ShardStepCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit ShardStepCall(const ShardStep& step);
  ~ShardStepCall() override;

  // Starts the call (with `ready`: as soon as its first chunk is ready); returns at once.
  void Start();
  // Gives up (the gradient will not be completed, or the step's time is over): a call that
  // has not begun ends Cancelled at once, a running one is cancelled. Wait still returns.
  void Cancel();
  // Waits for the end of the call: OK once every chunk's weights arrived; the server's
  // status, or DataLoss for an answer that does not match the request.
  absl::Status Wait();

  int shard() const { return step_.shard; }
  const ShardStep& args() const { return step_; }
  int64_t bytes_sent() const { return bytes_sent_; }
  int64_t bytes_received() const { return bytes_received_; }
  // The most staleness any chunk reported.
  int64_t staleness() const { return staleness_; }
  // Whether the shard skipped the step (any chunk's answer said so).
  bool skipped() const { return skipped_; }
  // After Wait: the shard refused the stream because this rank had as many open as it allows
  // (ps_server --max_streams_per_rank) and counted none of it; the same step may be sent again
  // after this long. Zero otherwise.
  absl::Duration busy_retry_after() const { return busy_retry_after_; }
  // When the call started, its last gradient frame was written, its first answer frame
  // arrived and it ended (after Wait; InfinitePast for what did not happen).
  struct Timeline {
    absl::Time start = absl::InfinitePast(), pushed = absl::InfinitePast(),
               first_answer = absl::InfinitePast(), done = absl::InfinitePast();
  };
  const Timeline& timeline() const { return timeline_; }

  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  // Copies the frame in in_ into the weights; DataLoss if it is not the chunk expected next.
  absl::Status Accept();
  // Whether chunk i (of this shard's) may leave.
  bool ChunkReady(size_t i) const;
  // The frame of chunk i (narrowing it first for a 16-bit wire).
  grpc::ByteBuffer FrameFor(size_t i);
  // Begins the call and writes the next chunk when it is ready and no write is in flight;
  // from Start, OnWriteDone and the readiness' wakes.
  void Pump();

  const ShardStep step_;
  const std::vector<int>& chunks_;  // Global chunk indices, in the order they come back.
  grpc::ClientContext context_;
  proto::FrameHeader header_;  // Every frame's, but for the key.
  std::vector<grpc::ByteBuffer> out_;
  int wake_id_ = -1;  // The readiness subscription, if any.
  CancellationManager::Token cancel_token_ = -1;  // step_.cancellation's, if any.

  // The writes: one in flight at a time, started by whichever thread finds the next chunk
  // ready. A hold keeps gRPC from ending the call while writes may still be started from
  // outside its reactions (the readiness' thread).
  absl::Mutex write_mu_;
  size_t next_write_ ABSL_GUARDED_BY(write_mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(write_mu_) = false;
  bool begun_ ABSL_GUARDED_BY(write_mu_) = false;
  bool holding_ ABSL_GUARDED_BY(write_mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(write_mu_) = false;  // Failed or cancelled: no more writes.
  grpc::ByteBuffer in_;
  size_t received_ = 0;
  std::atomic<int64_t> bytes_sent_{0};
  int64_t bytes_received_ = 0;
  int64_t staleness_ = 0;
  bool skipped_ = false;
  Timeline timeline_;
  absl::Status error_;               // Set by Accept; then the call is cancelled.
  absl::Duration busy_retry_after_;  // Set by OnDone.

  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_COMM_SHARD_STEP_CALL_H_
