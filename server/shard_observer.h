// What a parameter shard reports as it works, for its metrics and its step trace
// (server/shard_telemetry.h). The shard calls these under its lock: an observer must be
// cheap and must not call back into the shard. The default does nothing.
#ifndef DPTRAIN_SERVER_SHARD_OBSERVER_H_
#define DPTRAIN_SERVER_SHARD_OBSERVER_H_

#include <cstdint>

#include "absl/time/time.h"

namespace dptrain {

class ShardObserver {
 public:
  virtual ~ShardObserver() = default;
  // A chunk push was counted, `staleness` other pushes behind (BSP: 0).
  virtual void OnPush(int64_t staleness) {}
  // The optimizer ran on one chunk for `step`: the gradients were averaged (BSP; SSP/async:
  // scaled) from `sum_start` to `apply_start`, and applied until `end`.
  virtual void OnApply(int64_t step, absl::Time sum_start, absl::Time apply_start,
                       absl::Time end) {}
  // Every chunk of the shard completed `step` (BSP), whose first push came at `first_push`.
  virtual void OnStepComplete(int64_t step, absl::Time first_push, absl::Time end) {}
  // Rank waited for the other workers (or the staleness bound) after pushing `step` of a
  // chunk, then sent its new weights.
  virtual void OnWait(int rank, int64_t step, absl::Time start, absl::Time end) {}
  virtual void OnSend(int rank, int64_t step, absl::Time start, absl::Time end) {}
};

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_SHARD_OBSERVER_H_
