// Messages that arrived for one rank, keyed by (sender, tag), waiting for Recv. Shared by
// the in-memory links and the TCP link. A receiver may also post where a message is to go
// (Post) before it arrives; a link's reader then claims the posting and writes the bytes
// straight there (Claim, Delivered) instead of buffering them.
#ifndef DPTRAIN_COMMON_MAILBOX_H_
#define DPTRAIN_COMMON_MAILBOX_H_

#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/peer_link.h"

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

// out[i] = (out[i] + in[i]) * scale for n fp32 values; `in` is unaligned bytes.
void AddScaled(float* out, const char* in, size_t n, float scale);

class Mailbox {
 public:
  // Stores the little-endian fp32 bytes `data` from `from` under `tag`. AlreadyExists if a
  // message with that key is already waiting. Thread-safe.
  absl::Status Deposit(int from, uint64_t tag, MessageBytes data);

  // Waits until the message (from, tag) is there or `deadline`, then removes and returns
  // it. DeadlineExceeded naming the sender; InvalidArgument if it does not have `bytes`
  // bytes; Unavailable after Close(). Thread-safe; the caller reads the bytes unlocked.
  absl::StatusOr<MessageBytes> Take(int from, uint64_t tag, size_t bytes, absl::Time deadline);

  // Take, then copy into `out` / set inout = (inout + message) * scale (fp32). If the
  // message was delivered to a posting, just consume that delivery.
  absl::Status TakeInto(int from, uint64_t tag, absl::Span<float> out, absl::Time deadline);
  absl::Status TakeAdd(int from, uint64_t tag, absl::Span<float> inout, float scale,
                       absl::Time deadline);

  // Posts where (from, tag) goes, unless it is already here. Until the TakeInto/TakeAdd
  // for it returns (or Unpost), the posting's memory may be written by a reader.
  void Post(int from, uint64_t tag, const Posting& posting);
  // Withdraws a posting whose Take will not come (a failed collective); waits, up to
  // `deadline`, for a delivery in progress to end. False if it did not end in time.
  bool Unpost(int from, uint64_t tag, absl::Time deadline);
  // For a link's reader, on the header of (from, tag) with `bytes` bytes: the posting, now
  // claimed, or nullopt (none, or a different size: then Deposit the message as usual).
  std::optional<Posting> Claim(int from, uint64_t tag, size_t bytes);
  // The reader finished writing a claimed posting (ok) or failed half way.
  void Delivered(int from, uint64_t tag, bool ok);

  // Wakes every waiting Take with Unavailable.
  void Close();

  // `from` will send nothing more (its connection closed): a Take for a message from it that
  // is not already here fails at once with Unavailable instead of waiting.
  void MarkClosed(int from);

 private:
  absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  using Key = std::pair<int, uint64_t>;
  // Waits until (from, tag) has a message or a delivery, or cannot come.
  absl::Status AwaitArrival(const Key& key, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::map<Key, MessageBytes> messages_ ABSL_GUARDED_BY(mu_);
  std::map<Key, Posting> posted_ ABSL_GUARDED_BY(mu_);
  std::set<Key> claimed_ ABSL_GUARDED_BY(mu_);    // Being written by a reader.
  std::set<Key> delivered_ ABSL_GUARDED_BY(mu_);  // Written; the Take just consumes it.
  std::set<int> closed_senders_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_MAILBOX_H_
