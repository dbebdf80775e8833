// The tensor stream (proto/ps.proto, TensorStream/PushPull) for one ParameterShard: a
// training step chunk by chunk over one bidirectional stream of raw byte-buffer frames.
// Each call reads gradient frames and pushes each chunk as it arrives; a writer thread per
// call sends each chunk's new weights as soon as the chunk's step completes, so the
// download of early chunks overlaps the upload of later ones. One of the server's generic
// methods (generic_methods.h).
#ifndef DPTRAIN_SERVER_TENSOR_STREAM_SERVICE_H_
#define DPTRAIN_SERVER_TENSOR_STREAM_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "grpcpp/generic/async_generic_service.h"
#include "server/parameter_shard.h"
#include "server/shard_telemetry.h"

namespace dptrain {

class PushPullReactor;

struct TensorStreamOptions {
  // Streams one rank may have open at once (ps_server --max_streams_per_rank); one more is
  // answered RESOURCE_EXHAUSTED with kStreamBusyKey, before any of its chunks is counted. A
  // stream holds its slot until its answer is written or it is cancelled (not until gRPC has
  // finished closing it, which under load comes after the worker opened the next one). A
  // worker uses one per step, so a few allow for overlap.
  int max_streams_per_rank = 4;
  // A stream that has not sent its first frame this long after it opened is cancelled (it
  // names no rank yet, so max_streams_per_rank cannot bound it). A worker sends its first
  // frame at once.
  absl::Duration first_frame_timeout = absl::Seconds(10);
  // Fault injection for tests: runs at the start of every call's OnDone (a sleep there is
  // gRPC finishing a call late, as under load). Null: nothing.
  std::function<void()> on_done_for_test;
};

// A call whose worker cancels or vanishes, or whose stream turns out bad, releases its
// waits (and its writer thread) at once, not at --step_timeout.
class TensorStreamService final {
 public:
  // `shard` must outlive the service.
  // `telemetry` (may be null) counts the calls; both must outlive the service.
  explicit TensorStreamService(ParameterShard* shard,
                               const TensorStreamOptions& options = TensorStreamOptions(),
                               ShardTelemetry* telemetry = nullptr);
  ~TensorStreamService();  // Stops the reaper thread.

  // A call of kTensorStreamMethod (GenericMethods routes it here).
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* context);

  // Frame bytes received and sent over all calls.
  int64_t bytes_received() const { return bytes_received_.load(); }
  int64_t bytes_sent() const { return bytes_sent_.load(); }
  // Streams admitted (their first frame named a rank) and not yet finished.
  int active_streams() const;
  // Streams cancelled for not sending a first frame in time.
  int64_t reaped_streams() const;

 private:
  friend class PushPullReactor;
  // Counts a stream of `rank`; false (counting nothing) if it has the most allowed.
  bool AdmitStream(int rank);
  void ReleaseStream(int rank);
  // A call waits for its first frame until Unwatch (at its first read's end); the reaper
  // cancels it after first_frame_timeout.
  void Watch(PushPullReactor* call);
  void Unwatch(PushPullReactor* call);
  void Reap();  // The reaper thread's loop.

  ParameterShard* const shard_;
  const TensorStreamOptions options_;
  ShardTelemetry* const telemetry_;
  std::atomic<int64_t> bytes_received_{0}, bytes_sent_{0};
  mutable absl::Mutex mu_;
  std::map<int, int> streams_by_rank_ ABSL_GUARDED_BY(mu_);
  // Calls without a first frame yet, with when they opened.
  std::map<PushPullReactor*, absl::Time> no_frame_yet_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t reaped_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread reaper_;
};

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_TENSOR_STREAM_SERVICE_H_
