// How a worker's gradient becomes the next weights of every replica: the step contract.
// The gradient's path runs one way, model -> synchroniser -> model, through one of two
// roles:
//   - a GradientReducer (all-reduce mode) averages the gradients of all replicas in place
//     and says whether the step is skipped everywhere; each replica then applies the
//     average itself (nn::Model::ApplyUpdate), so all replicas hold the same weights;
//   - a ParameterStore (ps and master mode) takes the gradient and gives back the new
//     weights, which the store's optimizer computed, plus the same skip decision.
// Both read the model's gradient exchange buffer (nn::Model::gradient_exchange): the
// gradient followed by one slot, the overflow flag of mixed precision (1 if this rank's
// gradient has inf/NaN at its loss scale, else 0). A step is skipped everywhere when any
// rank flagged it or the sum has inf/NaN, GradScaler-style but global: nobody applies any
// gradient of it, and every rank's loss scale hears the same outcome.
#ifndef DPTRAIN_WORKER_COMM_STEP_SYNC_H_
#define DPTRAIN_WORKER_COMM_STEP_SYNC_H_

#include <cstdint>
#include <memory>
#include <variant>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dptrain {

struct CommStats {
  int64_t bytes_pushed = 0;  // Message bytes this process sent.
  int64_t bytes_pulled = 0;  // Message bytes this process received.
  // Under SSP/async: updates by other workers between this worker's pull and its push.
  int64_t max_staleness = 0;
  int64_t staleness_sum = 0;
  int64_t staleness_count = 0;
  // Parameter-server streams sent again because a shard refused them as one too many open
  // for this rank (ps_server --max_streams_per_rank), after a back-off.
  int64_t busy_retries = 0;
};

// What a step's synchronisation decided, the same on every replica.
struct StepOutcome {
  // Some rank's gradient overflowed (or the sum had inf/NaN): nobody applied the step.
  // Under SSP/async through a store: this rank's own push was dropped.
  bool skipped = false;
  // A ParameterStore that recovered from a failure by going back (a shard restarted from an
  // older checkpoint): every replica resumes at this step, whose weights are in `weights`;
  // this step's gradient was not applied. -1: no rewind.
  int64_t rewind_to = -1;
};

// What both roles share: the start, batch norm's buffers, and byte counts.
class ReplicaSync {
 public:
  virtual ~ReplicaSync() = default;

  // Makes every replica start from the same weights: rank 0's `weights` become the job's,
  // the other ranks' are overwritten with them.
  virtual absl::Status Start(absl::Span<float> weights) = 0;

  // Replaces `buffers` (e.g. batch norm's running statistics) with their mean over all
  // replicas. Round r is the r-th call (0, 1, ...); every rank makes the same calls.
  // OutOfRange for a negative round.
  virtual absl::Status AverageBuffers(int64_t round, absl::Span<float> buffers) = 0;

  virtual CommStats stats() const = 0;

  // The step the job was at when Start returned: 0 for a new job; for a worker that rejoins
  // a running one (restarted with the same rank), the step to compute next.
  virtual int64_t resume_step() const { return 0; }

  // A StepOutcome::rewind_to is always a multiple of this many steps (a parameter server's
  // checkpoint interval); 0: the job is never sent back. The trainer keeps batch norm's
  // running statistics of those steps, which no checkpoint holds, to go back with them.
  virtual int64_t rewind_interval() const { return 0; }
};

class GradientReducer : public ReplicaSync {
 public:
  virtual int world_size() const = 0;

  // `gradient_and_flag`: this rank's gradient of `step` (0, 1, ...) followed by its
  // overflow flag. On success it holds the average over all replicas (flag slot included:
  // non-zero if any rank flagged), bit-identical on every rank, and the outcome says
  // whether to apply it. On failure its contents are unspecified and the job should stop.
  virtual absl::StatusOr<StepOutcome> Reduce(int64_t step, absl::Span<float> gradient_and_flag) = 0;
};

class ParameterStore : public ReplicaSync {
 public:
  // Contributes this rank's gradient of `step` followed by its overflow flag; on success
  // `weights` holds the weights after the step (the same on every replica under BSP). The
  // store may use `gradient_and_flag` as scratch space: its contents are unspecified
  // afterwards. On failure `weights` is unspecified and the job should stop. A store that
  // rides out a lost peer (PsClient with a reconnect timeout) may instead answer with
  // `rewind_to` (see StepOutcome).
  virtual absl::StatusOr<StepOutcome> PushPull(int64_t step, absl::Span<float> gradient_and_flag,
                                               absl::Span<float> weights) = 0;

  // Batch norm's running statistics, which live in the replicas, at the steps the store
  // checkpoints (multiples of rewind_interval()). KeepBuffers hands this rank's `buffers` as
  // they are before it computes `step` to the store, before its push of step - 1, so that
  // the checkpoint of `step` holds them; RestoreBuffers puts back this rank's of `step` (a
  // job resumed or sent back there). `epoch_end`: `step` begins an epoch, so the replicas
  // average their statistics (AverageBuffers) before it and the store keeps that mean of the
  // `buffers` the ranks send. Defaults: a store that keeps none (RestoreBuffers is NotFound).
  virtual absl::Status KeepBuffers(int64_t step, absl::Span<const float> buffers, bool epoch_end) {
    return absl::OkStatus();
  }
  virtual absl::Status RestoreBuffers(int64_t step, absl::Span<float> buffers) {
    return absl::NotFoundError("this store keeps no batch-norm statistics");
  }
};

// The synchroniser a trainer steps with: one of the two roles (not owned).
using StepSync = std::variant<GradientReducer*, ParameterStore*>;
// The same, owned.
using OwnedStepSync =
    std::variant<std::unique_ptr<GradientReducer>, std::unique_ptr<ParameterStore>>;
inline StepSync Borrow(const OwnedStepSync& owned) {
  return std::visit([](const auto& p) -> StepSync { return p.get(); }, owned);
}
inline ReplicaSync& Common(StepSync sync) {
  return *std::visit([](auto* p) -> ReplicaSync* { return p; }, sync);
}

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_COMM_STEP_SYNC_H_
