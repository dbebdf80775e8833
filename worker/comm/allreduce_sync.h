// The GradientReducer of all-reduce mode (the DistributedDataParallel model): rank 0's
// initial weights are broadcast along the ring, then every step the replicas' gradients
// are averaged in place with a ring all-reduce; each replica applies the average itself
// (nn::Model::ApplyUpdate).
#ifndef DPTRAIN_WORKER_COMM_ALLREDUCE_SYNC_H_
#define DPTRAIN_WORKER_COMM_ALLREDUCE_SYNC_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/optimizer.h"
#include "common/peer_link.h"
#include "common/ring_allreduce.h"
#include "worker/comm/step_sync.h"

namespace dptrain {

struct AllReduceSyncOptions {
  int64_t chunk_elements = int64_t{1} << 18;  // Elements per ring message.
  // What the gradients travel as (--wire_dtype; common/wire_link.h); weights and batch-norm
  // statistics stay fp32.
  DType wire_dtype = DType::kFp32;
};

// What a checkpoint of the ring holds beyond the weights (gpu_worker --save_dir).
struct RingSnapshot {
  int64_t step = 0;  // The step to compute next.
  // Of the whole model (momentum, Adam's moments and t).
  OptimizerState optimizer;
  // Every rank's batch-norm running statistics: world_size equal parts, rank r's at part
  // RingOwnedSegment(r, world_size) (common/ring_allreduce.h). Empty for a model without any.
  std::vector<float> rank_buffers;
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
  int64_t resume_step() const override { return resume_step_; }

  // Checkpoint collectives (gpu_worker --save_dir), every rank between the same two steps.
  // The ring options of a checkpoint's message `i` (0..7) at `step` (>= 1; 0: Resume's), on
  // tag bases of their own above the steps' and the buffer rounds'.
  RingOptions SaveRing(int64_t step, int i) const;
  // Every rank's `buffers` (equal sizes on every rank) in RingSnapshot::rank_buffers' layout;
  // every rank returns the same. Fails with the link's error.
  absl::StatusOr<std::vector<float>> GatherRankBuffers(int64_t step,
                                                       absl::Span<const float> buffers);
  // Before Start, for a job resumed from a checkpoint: rank 0's `snapshot` (the others' is
  // overwritten) reaches every rank with its optimizer vectors of `model_size` values each,
  // `buffers` (this rank's batch-norm statistics) is overwritten with this rank's part of its
  // rank buffers, and resume_step() becomes its step. InvalidArgument when rank 0's does not fit
  // these sizes on some rank; OutOfRange for a step outside [0, kMaxSteps).
  absl::Status BroadcastSnapshot(RingSnapshot& snapshot, int64_t model_size,
                                 absl::Span<float> buffers);

 private:
  PeerLink* const link_;
  const AllReduceSyncOptions options_;
  int64_t resume_step_ = 0;
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_COMM_ALLREDUCE_SYNC_H_
