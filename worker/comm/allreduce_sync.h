// The GradientReducer of all-reduce mode (the DistributedDataParallel model): rank 0's
// initial weights are broadcast along the ring, then every step the replicas' gradients
// are averaged in place with a ring all-reduce; each replica applies the average itself
// (nn::Model::ApplyUpdate).
#ifndef DPTRAIN_WORKER_COMM_ALLREDUCE_SYNC_H_
#define DPTRAIN_WORKER_COMM_ALLREDUCE_SYNC_H_

#include <cstdint>

#include "common/peer_link.h"
#include "worker/comm/step_sync.h"

namespace dptrain {

struct AllReduceSyncOptions {
  int64_t chunk_elements = int64_t{1} << 18;  // Elements per ring message.
};

class AllReduceSync final : public GradientReducer {
 public:
  // Tag bases (24 bits): 0 the initial broadcast, 1 + step for steps, kFlagTagBase + step
  // for a sharded store's skip vote, kBufferTagBase + round for buffer rounds.
  static constexpr int64_t kMaxSteps = int64_t{1} << 22;
  static constexpr uint64_t kFlagTagBase = uint64_t{1} << 22;
  static constexpr uint64_t kBufferTagBase = uint64_t{1} << 23;

  // `link` must outlive the sync.
  AllReduceSync(PeerLink* link, const AllReduceSyncOptions& options)
      : link_(link), options_(options) {}

  absl::Status Start(absl::Span<float> weights) override;
  int world_size() const override { return link_->world_size(); }
  // The flag slot is all-reduced with the gradient (no extra message); the step is skipped
  // if any rank flagged it or the average has inf/NaN (every rank sees the same bits, so
  // every rank decides the same). OutOfRange for a step outside [0, kMaxSteps).
  absl::StatusOr<StepOutcome> Reduce(int64_t step, absl::Span<float> gradient_and_flag) override;
  absl::Status AverageBuffers(int64_t round, absl::Span<float> buffers) override;
  CommStats stats() const override;

 private:
  PeerLink* const link_;
  const AllReduceSyncOptions options_;
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_COMM_ALLREDUCE_SYNC_H_
