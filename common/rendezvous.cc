#include "common/rendezvous.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dptrain {

RendezvousTable::RendezvousTable(std::string job_id, int world_size)
    : job_id_(std::move(job_id)), world_size_(world_size), addresses_(world_size) {}

absl::StatusOr<std::vector<std::string>> RendezvousTable::Join(const std::string& job_id,
                                                               int rank, int world_size,
                                                               const std::string& address,
                                                               absl::Time deadline) {
  if (job_id != job_id_) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job_id, "' joined the rendezvous of job '", job_id_, "'"));
  }
  if (world_size != world_size_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "world size mismatch: rank ", rank, " has ", world_size, ", rank 0 has ", world_size_));
  }
  if (rank < 0 || rank >= world_size_) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " not in [0, ", world_size_, ")"));
  }
  if (address.empty()) return absl::InvalidArgumentError("empty peer address");
  absl::MutexLock lock(&mu_);
  if (addresses_[rank].empty()) {
    addresses_[rank] = address;
    ++joined_;
  } else if (addresses_[rank] != address) {
    return absl::AlreadyExistsError(absl::StrCat("rank ", rank, " already joined from ",
                                                 addresses_[rank], "; now from ", address));
  }
  auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return joined_ == world_size_; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&all), deadline)) {
    std::vector<int> missing;
    for (int r = 0; r < world_size_; ++r) {
      if (addresses_[r].empty()) missing.push_back(r);
    }
    return absl::DeadlineExceededError(
        absl::StrCat("rendezvous: rank(s) ", absl::StrJoin(missing, ","), " did not join"));
  }
  return addresses_;
}

}  // namespace dptrain
