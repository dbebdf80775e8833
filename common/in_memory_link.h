// PeerLinks between threads of one process, for multi-rank tests without a network (gloo's
// spawn-N-threads harness). Recv waits at most `timeout`, so a rank that never sends makes
// its peers fail with DeadlineExceeded instead of hanging.
#ifndef DPTRAIN_COMMON_IN_MEMORY_LINK_H_
#define DPTRAIN_COMMON_IN_MEMORY_LINK_H_

#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/peer_link.h"

namespace dptrain {

class InMemoryHub {
 public:
  InMemoryHub(int world_size, absl::Duration timeout);
  ~InMemoryHub();
  // The link of `rank`; owned by the hub. Thread-safe.
  PeerLink& link(int rank);
  int64_t messages() const;

 private:
  class Link;
  using Key = std::tuple<int, int, uint64_t>;  // (from, to, tag)

  const int world_size_;
  const absl::Duration timeout_;
  std::vector<std::unique_ptr<Link>> links_;
  mutable absl::Mutex mu_;
  std::map<Key, std::vector<float>> mailbox_ ABSL_GUARDED_BY(mu_);
  int64_t messages_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_IN_MEMORY_LINK_H_
