// All-reduce mode with the optimizer sharded over the ring (ZeRO stage 1): a ParameterStore
// built from the two halves of a ring all-reduce. Each step the gradients are
// reduce-scattered (rank r ends with the average of its own segment, 1/N of the model),
// every rank checks its segment for inf/NaN and all agree on the skip in one tiny
// all-reduce, each rank applies the optimizer to its segment of the weights (its optimizer
// state is that segment's only: 1/N of the memory and of the work), and the weights are
// all-gathered. The same bytes on the wire as all-reducing the gradient, and replicas stay
// bit-identical (every weight is computed once, by its owner, and copied).
//
// For models whose weights live on the host (the CPU path). A GPU model keeps its weights
// on the device and takes the averaged gradient from an AllReduceSync instead.
#ifndef DPTRAIN_WORKER_COMM_SHARDED_RING_STORE_H_
#define DPTRAIN_WORKER_COMM_SHARDED_RING_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/lr_schedule.h"
#include "common/optimizer.h"
#include "common/peer_link.h"
#include "worker/comm/allreduce_sync.h"
#include "worker/comm/step_sync.h"

namespace dptrain {

struct ShardedRingStoreOptions {
  int64_t chunk_elements = int64_t{1} << 18;  // Elements per ring message.
  OptimizerOptions optimizer;
  // The rate of each step; none: optimizer.learning_rate throughout.
  std::optional<LrScheduleOptions> lr_schedule;
  // What the gradients travel as in the reduce-scatter (--wire_dtype); the weights'
  // all-gather stays fp32.
  DType wire_dtype = DType::kFp32;
};

class ShardedRingStore final : public ParameterStore {
 public:
  // `link` must outlive the store. InvalidArgument for bad optimizer or schedule options.
  static absl::StatusOr<std::unique_ptr<ShardedRingStore>> Create(
      PeerLink* link, const ShardedRingStoreOptions& options);

  // Rank 0's weights to every rank (as AllReduceSync::Start).
  absl::Status Start(absl::Span<float> weights) override;
  // OutOfRange for a step outside [0, AllReduceSync::kMaxSteps); InvalidArgument unless
  // gradient_and_flag has one element more than `weights`, or when `weights` changes size
  // between steps (the owned segment and its optimizer state are fixed by the first).
  absl::StatusOr<StepOutcome> PushPull(int64_t step, absl::Span<float> gradient_and_flag,
                                       absl::Span<float> weights) override;
  absl::Status AverageBuffers(int64_t round, absl::Span<float> buffers) override;
  CommStats stats() const override { return ring_.stats(); }
  int64_t resume_step() const override { return resume_step_; }

  // A collective for a checkpoint: every rank calls it between the same two steps (`step`
  // the one to compute next, >= 1, after at least one PushPull) with its own batch-norm
  // `buffers` (equal sizes on every rank). Every rank's optimizer state and buffers are
  // all-gathered over the ring, so every rank returns the same snapshot. Fails with the link's
  // error, or FailedPrecondition before the first step.
  absl::StatusOr<RingSnapshot> Snapshot(int64_t step, absl::Span<const float> buffers);

  // A collective before Start, for a job resumed from a checkpoint: rank 0's `snapshot` (the
  // other ranks' is ignored) reaches every rank, each keeps its segment's optimizer state and
  // its own part of the buffers, and resume_step() becomes the snapshot's step. `model_size`
  // is the number of weights, `buffers` this rank's batch-norm statistics (overwritten).
  // InvalidArgument when rank 0's snapshot does not fit this rank's model.
  absl::Status Resume(const RingSnapshot& snapshot, int64_t model_size, absl::Span<float> buffers);

 private:
  ShardedRingStore(PeerLink* link, const ShardedRingStoreOptions& options,
                   std::unique_ptr<Optimizer> optimizer);

  PeerLink* const link_;
  const ShardedRingStoreOptions options_;
  const std::unique_ptr<Optimizer> optimizer_;
  OptimizerState state_;     // Of the owned segment only.
  int64_t model_size_ = -1;  // Set by the first step (or Resume).
  int64_t resume_step_ = 0;
  AllReduceSync ring_;  // Start, AverageBuffers and the byte counts.
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_COMM_SHARDED_RING_STORE_H_
