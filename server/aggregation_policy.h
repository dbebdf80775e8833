// How a shard turns the workers' pushes into updates of its store (shard_store.h): one
// class per synchronisation policy behind one interface, chosen once when the shard is
// created.
//   BspPolicy:   a chunk's step completes when every worker pushed it; the gradients are
//                summed in rank order (bit-reproducible), averaged and applied once.
//   SspPolicy:   each push is applied as it arrives, scaled by 1/num_workers (one push from
//                every worker moves the weights as far as one BSP step); a worker that pushed
//                step t may go on once the slowest has pushed step t - staleness.
//   AsyncPolicy: as SspPolicy without any wait.
// Every method is called with the shard's lock held. A push for a step the policy does not
// expect is refused by CheckStep before anything is recorded; a retry of a push already
// counted never counts twice.
#ifndef DPTRAIN_SERVER_AGGREGATION_POLICY_H_
#define DPTRAIN_SERVER_AGGREGATION_POLICY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/log_sink.h"
#include "server/shard_observer.h"
#include "server/shard_store.h"

namespace dptrain {

enum class SyncPolicy { kBsp, kSsp, kAsync };

// Parses "bsp", "ssp" or "async".
absl::StatusOr<SyncPolicy> ParseSyncPolicy(absl::string_view name);
const char* SyncPolicyName(SyncPolicy policy);

// What PullChunk returns besides the weights.
struct PulledChunk {
  int64_t version = 0;    // The chunk's version (BSP: step + 1; SSP/async: pushes applied).
  int64_t staleness = 0;  // SSP/async: other pushes applied since this rank last pulled it.
  // The step was not applied to this chunk because a gradient had inf/NaN (BSP: any
  // worker's push of the step; SSP/async: this rank's own push).
  bool skipped = false;
};

// Counters the shard reports (GetShardInfo), kept by the policies.
struct ShardStats {
  int64_t pushes = 0;  // Chunk pushes counted (all ranks, all chunks).
  int64_t max_staleness = 0;
  int64_t sum_staleness = 0;
  // BSP steps skipped / SSP-async pushes dropped because a gradient (sum) held inf/NaN
  // that no worker flagged.
  int64_t nonfinite_steps = 0;
  int64_t nonfinite_pushes = 0;
  // BSP: the latest step found non-finite (-1: none); its chunks that complete later skip.
  int64_t nonfinite_step = -1;
};

struct PolicyContext {
  int shard = 0;
  int num_workers = 1;
  int staleness = 0;                        // SspPolicy's bound.
  ShardStore* store = nullptr;              // Not owned.
  ShardStats* stats = nullptr;              // Not owned.
  std::function<float(int64_t)> rate_at;    // The learning rate of a step.
  ShardObserver* observer = nullptr;        // Not owned; never null.
  LogSink log;
};

class AggregationPolicy {
 public:
  static std::unique_ptr<AggregationPolicy> Create(SyncPolicy policy, const PolicyContext& context);
  virtual ~AggregationPolicy() = default;

  virtual SyncPolicy kind() const = 0;
  // The store was (re)built (Init, or a checkpoint restored): forget every pending push.
  // `restored`: the workers' positions are unknown (SSP/async adopt each rank's next step).
  virtual void Reset(bool restored) = 0;
  // Whether rank may push `step` to the chunk at `slot` now (OutOfRange naming the window).
  virtual absl::Status CheckStep(int slot, int rank, int64_t step) const = 0;
  // Whether such a push would repeat one already counted (it changes nothing then).
  virtual bool IsRetry(int slot, int rank, int64_t step) const = 0;
  // Records (BSP) or applies (SSP/async) a push that CheckStep accepted. `hold` keeps
  // `data` alive (may be null: the policy copies what it keeps).
  virtual void Push(int slot, int rank, int64_t step, absl::string_view data,
                    std::shared_ptr<const void> hold, bool overflow) = 0;
  // FailedPrecondition if rank may not pull the chunk after `step` at all.
  virtual absl::Status CheckPull(int slot, int rank, int64_t step) const = 0;
  // Whether a pull after pushing `step` may return now.
  virtual bool Ready(int slot, int rank, int64_t step) const = 0;
  // The DeadlineExceeded of a pull that waited in vain, naming the ranks waited for.
  virtual absl::Status TimedOut(int slot, int rank, int64_t step) const = 0;
  // After Ready: what the pull reports (and, SSP/async, the rank's new base version).
  virtual PulledChunk Pulled(int slot, int rank) = 0;
  // Rank pulled the weights (it starts, or restarted and rejoins): SSP/async adopt its next
  // push's step as its clock. BSP needs nothing.
  virtual void Rejoin(int rank) {}
  // The step every worker has completed on every chunk (-1: not known yet).
  virtual int64_t CompletedStep() const = 0;
  // Counts (and the first time, logs) an unflagged inf/NaN found in a push of `step` before
  // it was recorded: the push is then recorded as flagged.
  void NoteNonFinitePush(int64_t step, const ChunkSpec& spec) {
    NoteNonFinite(step, spec, /*dropped_push=*/kind() != SyncPolicy::kBsp);
  }

 protected:
  explicit AggregationPolicy(const PolicyContext& context) : c_(context) {}
  // Counts (and the first time, logs) an unflagged non-finite gradient of `step`.
  void NoteNonFinite(int64_t step, const ChunkSpec& spec, bool dropped_push);
  void CountStaleness(int64_t s);

  const PolicyContext c_;
};

// Whether no element of the n floats at `data` is inf or NaN.
bool AllFinite(const void* data, int64_t n);

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_AGGREGATION_POLICY_H_
