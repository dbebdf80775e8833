#include "server/buffer_averager.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dptrain {

std::vector<float> MeanInRankOrder(const std::vector<std::vector<float>>& parts) {
  if (parts.empty()) return {};
  std::vector<float> mean = parts[0];
  for (size_t r = 1; r < parts.size(); ++r) {
    for (size_t i = 0; i < mean.size(); ++i) mean[i] += parts[r][i];
  }
  for (float& v : mean) v /= static_cast<float>(parts.size());
  return mean;
}

BufferAverager::BufferAverager(int num_workers)
    : num_workers_(num_workers), pending_(num_workers), arrived_(num_workers, false) {}

absl::StatusOr<std::vector<float>> BufferAverager::Average(int rank, int64_t round,
                                                           int64_t latest_round,
                                                           absl::Span<const float> values,
                                                           absl::Time deadline) {
  if (rank < 0 || rank >= num_workers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " not in [0, ", num_workers_, ")"));
  }
  if (round > latest_round) {
    return absl::OutOfRangeError(absl::StrCat("buffer round ", round,
                                              " is ahead of the job: this shard has seen no "
                                              "step past ",
                                              latest_round));
  }
  absl::MutexLock lock(&mu_);
  // A retry of a completed round; before the first round completes there is none.
  if (round == round_ - 1 && round >= 0) return result_;
  // A shard restarted from a checkpoint starts afresh; the first rank to come decides the
  // round of the job in progress.
  if (round_ == 0 && count_ == 0 && round > 0) round_ = round;
  if (round != round_) {
    return absl::OutOfRangeError(
        absl::StrCat("buffer round ", round, " is not the current round ", round_));
  }
  if (!arrived_[rank]) {
    for (int r = 0; r < num_workers_; ++r) {
      if (arrived_[r] && pending_[r].size() != values.size()) {
        return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " sent ", values.size(),
                                                       " buffer values, rank ", r, " sent ",
                                                       pending_[r].size()));
      }
    }
    pending_[rank].assign(values.begin(), values.end());
    arrived_[rank] = true;
    if (++count_ == num_workers_) {
      result_ = MeanInRankOrder(pending_);
      arrived_.assign(num_workers_, false);
      count_ = 0;
      ++round_;
    }
  }
  auto done = [this, round]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return round_ > round; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) {
    std::vector<int> missing;
    for (int r = 0; r < num_workers_; ++r) {
      if (!arrived_[r]) missing.push_back(r);
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "buffer round ", round, " timed out waiting for rank(s) ", absl::StrJoin(missing, ",")));
  }
  return result_;
}

}  // namespace dptrain
