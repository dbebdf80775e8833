// GradientSync of all-reduce mode (the DistributedDataParallel model): rank 0's initial
// weights are broadcast along the ring, then every step the gradients are averaged with a
// ring all-reduce and every replica applies the same optimizer step itself.
#ifndef DPTRAIN_WORKER_COMM_ALLREDUCE_SYNC_H_
#define DPTRAIN_WORKER_COMM_ALLREDUCE_SYNC_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/optimizer.h"
#include "common/peer_link.h"
#include "common/ring_allreduce.h"
#include "worker/comm/gradient_sync.h"

namespace dptrain {

struct AllReduceSyncOptions {
  OptimizerOptions optimizer;
  int64_t chunk_elements = int64_t{1} << 18;
};

class AllReduceSync : public GradientSync {
 public:
  // Tags of buffer rounds start here (steps use 1 .. 2^23 - 1; tags have 24 bits for it).
  static constexpr uint64_t kBufferTagBase = uint64_t{1} << 23;

  // `link` must outlive the sync. InvalidArgument for bad optimizer options.
  static absl::StatusOr<std::unique_ptr<AllReduceSync>> Create(PeerLink* link,
                                                               const AllReduceSyncOptions& options);

  absl::Status Start(absl::Span<float> weights) override;
  absl::Status Step(int64_t step, absl::Span<const float> grads,
                    absl::Span<float> weights) override;
  // The overflow flag travels as one extra element of the all-reduced buffer (no extra
  // message); a step is skipped if any rank flagged it or the average has inf/NaN.
  void SetOverflow(bool overflow) override { overflow_ = overflow; }
  bool last_step_skipped() const override { return last_step_skipped_; }
  absl::Status AverageBuffers(int64_t round, absl::Span<float> buffers) override;
  CommStats stats() const override;

  // Leaves the optimizer step to the owner of the weights: `apply` gets the averaged
  // gradient of every step that is applied, and Step() then neither reads nor writes its
  // `weights` (which may be empty). For a model whose weights live on a GPU
  // (CudaModel::ApplyOptimizer): in all-reduce mode only the gradient crosses the bus.
  using ApplyFn = std::function<absl::Status(absl::Span<const float> averaged)>;
  void set_apply(ApplyFn apply) { apply_ = std::move(apply); }

 private:
  AllReduceSync(PeerLink* link, const AllReduceSyncOptions& options,
                std::unique_ptr<Optimizer> optimizer);

  PeerLink* const link_;
  const AllReduceSyncOptions options_;
  const std::unique_ptr<Optimizer> optimizer_;
  OptimizerState state_;
  bool overflow_ = false;  // For the next Step.
  bool last_step_skipped_ = false;
  std::vector<float> buffer_;
  ApplyFn apply_;
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_COMM_ALLREDUCE_SYNC_H_
