// Batch norm's running statistics of every worker at a checkpoint step: the one part of the
// job's state that lives in the workers, not in the shard (each replica has its own until
// the epoch's average). A worker hands its statistics of step s to shard 0 before it pushes
// step s - 1, so that when step s completes every rank's are there and the checkpoint of s
// holds them (ShardCheckpoint::buffers); a job resumed from that checkpoint, or sent back
// to it, gets each rank's back. When step s begins an epoch, the workers average their
// statistics first (BufferAverager): they hand in the values before the average with
// `epoch_end`, and the checkpoint holds their mean (MeanInRankOrder, the same arithmetic),
// which is what every replica held before step s. Not thread-safe: ParameterShard guards it.
#ifndef DPTRAIN_SERVER_RANK_BUFFERS_H_
#define DPTRAIN_SERVER_RANK_BUFFERS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dptrain {

class RankBuffers {
 public:
  // `max_values`: the most values one rank may hand in.
  RankBuffers(int num_workers, int64_t max_values)
      : num_workers_(num_workers), max_values_(max_values) {}

  // Keeps rank's values of `step`, replacing any it handed in before (a retry). Values of
  // an earlier step are forgotten. InvalidArgument for a bad rank, more than max_values, or
  // a size or `epoch_end` that differs from another rank's of the same step.
  absl::Status Keep(int rank, int64_t step, absl::Span<const float> values, bool epoch_end);

  // For the checkpoint of `step`: every rank's values of that step back to back in rank
  // order (with epoch_end, each rank's part is their mean), or empty if some rank handed in
  // none (or none were). They become the held ones.
  std::vector<float> TakeForCheckpoint(int64_t step);

  // The values of a restored checkpoint (`world_size` equal parts): held from now on. False
  // (nothing held) if they are not num_workers equal parts.
  bool Restore(int64_t step, int world_size, std::vector<float> buffers);

  // rank's part of the held values of `step` (of the newest checkpoint taken or restored).
  // NotFound naming what is held otherwise.
  absl::StatusOr<std::vector<float>> Held(int rank, int64_t step) const;

 private:
  const int num_workers_;
  const int64_t max_values_;
  int64_t pending_step_ = -1;
  std::vector<std::vector<float>> pending_;  // Per rank; empty: not handed in.
  bool pending_epoch_end_ = false;
  int64_t held_step_ = -1;
  std::vector<float> held_;  // num_workers_ equal parts.
};

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_RANK_BUFFERS_H_
