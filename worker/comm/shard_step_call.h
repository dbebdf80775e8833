// One training step with one parameter-server shard over the tensor stream
// (proto/ps.proto, TensorStream/PushPull): writes a frame per owned chunk straight from the
// gradient (no copy), and copies each returning frame of new weights into place as it
// arrives. The PS client runs one per shard at once.
#ifndef DPTRAIN_WORKER_COMM_SHARD_STEP_CALL_H_
#define DPTRAIN_WORKER_COMM_SHARD_STEP_CALL_H_

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

namespace dptrain {

struct ShardStep {
  grpc::GenericStub* stub = nullptr;
  const ShardMap* map = nullptr;
  int shard = 0;
  std::string job_id;
  int rank = 0;
  int64_t step = 0;
  absl::Span<const float> grads;  // The whole model's; must not change until Wait returns.
  // With wire_dtype kBf16/kFp16 the frames carry narrow_grads (grads rounded to it, the whole
  // model's, same lifetime) instead of grads.
  DType wire_dtype = DType::kFp32;
  absl::Span<const uint16_t> narrow_grads;
  absl::Span<float> weights;  // The whole model's; this shard's chunks are written.
  absl::Time deadline;
  std::string context;    // Prefixes errors, e.g. "PushPull of step 3 to shard 1 at host:port".
  bool overflow = false;  // This worker's gradient has inf/NaN (FrameHeader.overflow).
};

class ShardStepCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  explicit ShardStepCall(const ShardStep& step);

  // Starts the call; returns at once.
  void Start();
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

  const ShardStep step_;
  const std::vector<int>& chunks_;  // Global chunk indices, in the order they come back.
  grpc::ClientContext context_;
  std::vector<grpc::ByteBuffer> out_;
  size_t next_write_ = 0;
  grpc::ByteBuffer in_;
  size_t received_ = 0;
  int64_t bytes_sent_ = 0;
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
