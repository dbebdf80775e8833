#include "server/rank_buffers.h"

#include "absl/strings/str_cat.h"
#include "server/buffer_averager.h"

namespace dptrain {

absl::Status RankBuffers::Keep(int rank, int64_t step, absl::Span<const float> values,
                               bool epoch_end) {
  if (rank < 0 || rank >= num_workers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not in [0, ", num_workers_, ")"));
  }
  if (static_cast<int64_t>(values.size()) > max_values_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " sent ", values.size(), " buffer values; at most ", max_values_));
  }
  if (values.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " sent no buffer values"));
  }
  if (step != pending_step_) {
    pending_step_ = step;
    pending_.assign(num_workers_, {});
    pending_epoch_end_ = epoch_end;
  }
  bool others = false;
  for (int r = 0; r < num_workers_; ++r) {
    if (r == rank || pending_[r].empty()) continue;
    others = true;
    if (pending_[r].size() != values.size()) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " sent ", values.size(),
                                                     " buffer values for step ", step, ", rank ",
                                                     r, " sent ", pending_[r].size()));
    }
  }
  if (others && epoch_end != pending_epoch_end_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " says step ", step, (epoch_end ? " begins" : " does not begin"),
        " an epoch, the ranks before it said otherwise"));
  }
  pending_epoch_end_ = epoch_end;
  pending_[rank].assign(values.begin(), values.end());
  return absl::OkStatus();
}

std::vector<float> RankBuffers::TakeForCheckpoint(int64_t step) {
  held_step_ = -1;
  held_.clear();
  if (step != pending_step_) return {};
  for (const std::vector<float>& part : pending_) {
    if (part.empty()) return {};
  }
  const std::vector<float> mean = pending_epoch_end_ ? MeanInRankOrder(pending_)
                                                     : std::vector<float>();
  std::vector<float> all;
  for (const std::vector<float>& part : pending_) {
    const std::vector<float>& kept = pending_epoch_end_ ? mean : part;
    all.insert(all.end(), kept.begin(), kept.end());
  }
  pending_step_ = -1;
  pending_.clear();
  held_step_ = step;
  held_ = all;
  return all;
}

bool RankBuffers::Restore(int64_t step, int world_size, std::vector<float> buffers) {
  held_step_ = -1;
  held_.clear();
  pending_step_ = -1;
  pending_.clear();
  if (world_size != num_workers_ || buffers.empty() || buffers.size() % num_workers_ != 0 ||
      static_cast<int64_t>(buffers.size() / num_workers_) > max_values_) {
    return false;
  }
  held_step_ = step;
  held_ = std::move(buffers);
  return true;
}

absl::StatusOr<std::vector<float>> RankBuffers::Held(int rank, int64_t step) const {
  if (rank < 0 || rank >= num_workers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is not in [0, ", num_workers_, ")"));
  }
  if (held_step_ < 0 || step != held_step_) {
    return absl::NotFoundError(absl::StrCat(
        "no batch-norm statistics of step ", step, " here (",
        held_step_ < 0 ? std::string("none held")
                       : absl::StrCat("the newest checkpoint's are of step ", held_step_),
        ")"));
  }
  const size_t part = held_.size() / num_workers_;
  return std::vector<float>(held_.begin() + rank * part, held_.begin() + (rank + 1) * part);
}

}  // namespace dptrain
