// Rank discovery: every rank announces its address, and learns everybody's once all
// world_size ranks have announced. Plain C++; the gRPC service is an adapter over it.
#ifndef DPTRAIN_COMMON_RENDEZVOUS_H_
#define DPTRAIN_COMMON_RENDEZVOUS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dptrain {

class RendezvousTable {
 public:
  RendezvousTable(std::string job_id, int world_size);

  // Records `address` for `rank` and waits (until `deadline`) for all ranks. A repeated join
  // with the same address is accepted; another address for a joined rank is AlreadyExists;
  // a wrong job, world size or rank is FailedPrecondition / InvalidArgument; the deadline
  // gives DeadlineExceeded naming the ranks that have not joined.
  absl::StatusOr<std::vector<std::string>> Join(const std::string& job_id, int rank,
                                                int world_size, const std::string& address,
                                                absl::Time deadline);

 private:
  const std::string job_id_;
  const int world_size_;
  absl::Mutex mu_;
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);
  int joined_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_RENDEZVOUS_H_
