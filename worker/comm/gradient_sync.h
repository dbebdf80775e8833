// How a worker's gradient becomes the next weights of every replica. The trainer sees only
// this interface; the parameter-server client implements it (the master reducer and the
// ring all-reduce plug in beside it).
#ifndef DPTRAIN_WORKER_COMM_GRADIENT_SYNC_H_
#define DPTRAIN_WORKER_COMM_GRADIENT_SYNC_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace dptrain {

struct CommStats {
  int64_t bytes_pushed = 0;  // Message bytes this process sent.
  int64_t bytes_pulled = 0;  // Message bytes this process received.
  // Under SSP/async: updates by other workers between this worker's pull and its push.
  int64_t max_staleness = 0;
  int64_t staleness_sum = 0;
  int64_t staleness_count = 0;
};

class GradientSync {
 public:
  virtual ~GradientSync() = default;

  // Makes every replica start from the same weights: rank 0's `weights` become the job's,
  // the other ranks' are overwritten with them.
  virtual absl::Status Start(absl::Span<float> weights) = 0;

  // Contributes this rank's gradient of `step` (0, 1, ...); on success `weights` holds the
  // weights after the step, the same on every replica. On failure `weights` is unspecified
  // and the job should stop.
  virtual absl::Status Step(int64_t step, absl::Span<const float> grads,
                            absl::Span<float> weights) = 0;

  // Mixed precision: this rank's gradient for the next Step has inf/NaN (its loss scale
  // overflowed). That step is then skipped everywhere, GradScaler-style but global: no
  // replica and no shard applies anybody's gradient of it.
  virtual void SetOverflow(bool overflow) = 0;
  // Whether the last Step was skipped because some rank's gradient had inf/NaN (under
  // SSP/async through a PS: this rank's own push). Every rank then backs off its scale.
  virtual bool last_step_skipped() const = 0;

  // Replaces `buffers` (e.g. batch norm's running statistics) with their mean over all
  // replicas. Round r is the r-th call (0, 1, ...); every rank makes the same calls.
  virtual absl::Status AverageBuffers(int64_t round, absl::Span<float> buffers) = 0;

  virtual CommStats stats() const = 0;
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_COMM_GRADIENT_SYNC_H_
