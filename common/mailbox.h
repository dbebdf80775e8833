// Messages that arrived for one rank, keyed by (sender, tag), waiting for Recv. Shared by
// the in-memory links and the gRPC peer service.
#ifndef DPTRAIN_COMMON_MAILBOX_H_
#define DPTRAIN_COMMON_MAILBOX_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace dptrain {

class Mailbox {
 public:
  // Stores the little-endian fp32 bytes `data` from `from` under `tag`. AlreadyExists if a
  // message with that key is already waiting. Thread-safe.
  absl::Status Deposit(int from, uint64_t tag, std::string data);

  // Waits until the message (from, tag) is there or `deadline`, then moves it into `out`.
  // DeadlineExceeded naming the sender; InvalidArgument if the sizes differ; Unavailable
  // after Close(). Thread-safe.
  absl::Status Take(int from, uint64_t tag, absl::Span<float> out, absl::Time deadline);

  // Wakes every waiting Take with Unavailable.
  void Close();

 private:
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::pair<int, uint64_t>, std::string> messages_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_MAILBOX_H_
