// Averages one vector per worker, round by round (BSP): the all-reduce that keeps batch
// norm's running statistics equal on every replica. Each worker calls Average(round) with
// its vector; when all num_workers have, everybody gets the mean (summed in rank order).
// Plain C++, thread-safe.
#ifndef DPTRAIN_SERVER_BUFFER_AVERAGER_H_
#define DPTRAIN_SERVER_BUFFER_AVERAGER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace dptrain {

// The mean of equal-size `parts` (one per rank), summed in rank order and divided by their
// count: the arithmetic of every average of batch-norm statistics, so that one kept with a
// checkpoint (rank_buffers.h) is bit-identical to the one the workers got.
std::vector<float> MeanInRankOrder(const std::vector<std::vector<float>>& parts);

class BufferAverager {
 public:
  explicit BufferAverager(int num_workers);

  // Round `round` must be the current one (or the previous, for a retry: its result again;
  // a negative round, before any completed, is OutOfRange). Before any round
  // completed and any rank arrived, a later round becomes the current one (a restarted
  // shard joins a job in progress).
  // `latest_round` bounds the rounds that can have ended (a round is an epoch, and the shard
  // has seen a step of every epoch that ended: ps_service passes the newest step it knows);
  // a round past it is OutOfRange at once, never a wait for ranks that are not there.
  // InvalidArgument for a bad rank or a size that differs from the round's first vector;
  // OutOfRange for another round; DeadlineExceeded naming the ranks that did not come.
  absl::StatusOr<std::vector<float>> Average(int rank, int64_t round, int64_t latest_round,
                                             absl::Span<const float> values, absl::Time deadline);

 private:
  const int num_workers_;
  absl::Mutex mu_;
  int64_t round_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::vector<float>> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> arrived_ ABSL_GUARDED_BY(mu_);
  int count_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<float> result_ ABSL_GUARDED_BY(mu_);  // Of round_ - 1.
};

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_BUFFER_AVERAGER_H_
