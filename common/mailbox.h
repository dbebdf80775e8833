// Messages that arrived for one rank, keyed by (sender, tag), waiting for Recv. Shared by
// the in-memory links and the gRPC peer service.
#ifndef DPTRAIN_COMMON_MAILBOX_H_
#define DPTRAIN_COMMON_MAILBOX_H_

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace dptrain {

// A message body: bytes that are not zero-filled before they are written.
struct MessageBytes {
  std::unique_ptr<char[]> data;
  size_t size = 0;
  static MessageBytes Allocate(size_t n) { return {std::unique_ptr<char[]>(new char[n]), n}; }
  static MessageBytes Copy(const void* p, size_t n) {
    MessageBytes m = Allocate(n);
    std::memcpy(m.data.get(), p, n);
    return m;
  }
};

class Mailbox {
 public:
  // Stores the little-endian fp32 bytes `data` from `from` under `tag`. AlreadyExists if a
  // message with that key is already waiting. Thread-safe.
  absl::Status Deposit(int from, uint64_t tag, MessageBytes data);

  // Waits until the message (from, tag) is there or `deadline`, then removes and returns
  // it. DeadlineExceeded naming the sender; InvalidArgument if it does not have `bytes`
  // bytes; Unavailable after Close(). Thread-safe; the caller reads the bytes unlocked.
  absl::StatusOr<MessageBytes> Take(int from, uint64_t tag, size_t bytes, absl::Time deadline);

  // Take, then copy into `out` / add element-wise into `inout` (fp32).
  absl::Status TakeInto(int from, uint64_t tag, absl::Span<float> out, absl::Time deadline);
  absl::Status TakeAdd(int from, uint64_t tag, absl::Span<float> inout, absl::Time deadline);

  // Wakes every waiting Take with Unavailable.
  void Close();

  // `from` will send nothing more (its connection closed): a Take for a message from it that
  // is not already here fails at once with Unavailable instead of waiting.
  void MarkClosed(int from);

 private:
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::pair<int, uint64_t>, MessageBytes> messages_ ABSL_GUARDED_BY(mu_);
  std::set<int> closed_senders_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_MAILBOX_H_
