// PeerLinks between threads of one process, for multi-rank tests without a network (gloo's
// spawn-N-threads harness). Recv waits at most `timeout`, so a rank that never sends makes
// its peers fail with DeadlineExceeded instead of hanging.
#ifndef DPTRAIN_COMMON_IN_MEMORY_LINK_H_
#define DPTRAIN_COMMON_IN_MEMORY_LINK_H_

#include <atomic>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "common/mailbox.h"
#include "common/peer_link.h"

namespace dptrain {

class InMemoryHub {
 public:
  InMemoryHub(int world_size, absl::Duration timeout);
  ~InMemoryHub();
  // The link of `rank`; owned by the hub. Thread-safe.
  PeerLink& link(int rank);
  int64_t messages() const { return messages_.load(); }

 private:
  class Link;

  const absl::Duration timeout_;
  std::vector<Mailbox> inboxes_;
  std::vector<std::unique_ptr<Link>> links_;
  std::atomic<int64_t> messages_{0};
};

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_IN_MEMORY_LINK_H_
