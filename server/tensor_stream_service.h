// The tensor stream (proto/ps.proto, TensorStream/PushPull) for one ParameterShard: a
// training step chunk by chunk over one bidirectional stream of raw byte-buffer frames.
// Each call reads gradient frames and pushes each chunk as it arrives; a writer thread per
// call sends each chunk's new weights as soon as the chunk's step completes, so the
// download of early chunks overlaps the upload of later ones. Registered as the server's
// generic service: any other unknown method gets UNIMPLEMENTED.
#ifndef DPTRAIN_SERVER_TENSOR_STREAM_SERVICE_H_
#define DPTRAIN_SERVER_TENSOR_STREAM_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <map>

#include "absl/synchronization/mutex.h"
#include "grpcpp/generic/async_generic_service.h"
#include "server/parameter_shard.h"
#include "server/shard_telemetry.h"

namespace dptrain {

struct TensorStreamOptions {
  // Streams one rank may have open at once (ps_server --max_streams_per_rank); one more is
  // answered RESOURCE_EXHAUSTED. A worker uses one per step, so a few allow for overlap.
  int max_streams_per_rank = 4;
};

// A call whose worker cancels or vanishes, or whose stream turns out bad, releases its
// waits (and its writer thread) at once, not at --step_timeout.
class TensorStreamService final : public grpc::CallbackGenericService {
 public:
  // `shard` must outlive the service.
  // `telemetry` (may be null) counts the calls; both must outlive the service.
  explicit TensorStreamService(ParameterShard* shard,
                               const TensorStreamOptions& options = TensorStreamOptions(),
                               ShardTelemetry* telemetry = nullptr)
      : shard_(shard), options_(options), telemetry_(telemetry) {}

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override;

  // Frame bytes received and sent over all calls.
  int64_t bytes_received() const { return bytes_received_.load(); }
  int64_t bytes_sent() const { return bytes_sent_.load(); }
  // Streams admitted (their first frame named a rank) and not yet finished.
  int active_streams() const;

 private:
  friend class PushPullReactor;
  // Counts a stream of `rank`; false (counting nothing) if it has the most allowed.
  bool AdmitStream(int rank);
  void ReleaseStream(int rank);

  ParameterShard* const shard_;
  const TensorStreamOptions options_;
  ShardTelemetry* const telemetry_;
  std::atomic<int64_t> bytes_received_{0}, bytes_sent_{0};
  mutable absl::Mutex mu_;
  std::map<int, int> streams_by_rank_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_TENSOR_STREAM_SERVICE_H_
