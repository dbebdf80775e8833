// A PeerLink that wraps another and breaks it on purpose, by a script: leveldb's
// EnvWrapper / FaultInjectionTestEnv idea for the ring's transport. Tests run the collectives
// of common/ring_allreduce over it and assert the exact Status each rank ends with, and that
// nothing waits longer than the link's timeout.
//
// Each LinkFault matches the messages this rank sends to (or receives from) one peer, or
// any, and applies to every match or only to the n-th. Faults:
//   kFailSend   Send returns `status` (default: Unavailable naming this rank and the peer,
//               like a reset TCP connection); nothing is sent.
//   kDrop       Send returns OK and nothing is sent: the peer's Recv runs into its timeout.
//   kDelay      Send returns OK at once and the message is sent `delay` later, from another
//               thread (so later messages may overtake it).
//   kTruncate   only the first `keep_elements` floats are sent (a message of the wrong
//               length: the peer's Recv fails with InvalidArgument naming this rank).
//   kFailRecv   Recv/RecvAdd return `status` (default: Unavailable, the peer closed its
//               connection) without taking the message.
// Messages that match no fault pass through unchanged, as do Expect and Unexpect.
//
// Thread-safe as the wrapped link is. The destructor waits for delayed messages to be sent.
#ifndef DPTRAIN_COMMON_FAULTY_LINK_H_
#define DPTRAIN_COMMON_FAULTY_LINK_H_

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/peer_link.h"

namespace dptrain {

struct LinkFault {
  enum class Kind { kFailSend, kDrop, kDelay, kTruncate, kFailRecv };
  Kind kind = Kind::kDrop;
  int peer = -1;  // The rank sent to (received from, for kFailRecv); -1: any.
  // Only the n-th (0-based) message this rank sends to `peer` (receives from, kFailRecv);
  // -1: every one.
  int occurrence = -1;
  absl::Duration delay = absl::ZeroDuration();  // kDelay.
  size_t keep_elements = 0;                     // kTruncate.
  absl::Status status;  // kFailSend, kFailRecv; OK means the default described above.

  static LinkFault FailSend(int peer, int occurrence = -1) {
    return {Kind::kFailSend, peer, occurrence};
  }
  static LinkFault Drop(int peer, int occurrence = -1) { return {Kind::kDrop, peer, occurrence}; }
  static LinkFault Delay(int peer, absl::Duration delay, int occurrence = -1) {
    return {Kind::kDelay, peer, occurrence, delay};
  }
  static LinkFault Truncate(int peer, size_t keep_elements, int occurrence = -1) {
    return {Kind::kTruncate, peer, occurrence, absl::ZeroDuration(), keep_elements};
  }
  static LinkFault FailRecv(int peer, int occurrence = -1) {
    return {Kind::kFailRecv, peer, occurrence};
  }
};

class FaultyLink : public PeerLink {
 public:
  // `base` must outlive this link. Of the faults that match a message, the first in `plan`
  // is applied.
  FaultyLink(PeerLink& base, std::vector<LinkFault> plan);
  ~FaultyLink() override;

  int rank() const override { return base_.rank(); }
  int world_size() const override { return base_.world_size(); }
  absl::Status Send(int peer, uint64_t tag, absl::Span<const float> data) override;
  absl::Status Recv(int peer, uint64_t tag, absl::Span<float> out) override;
  absl::Status RecvAdd(int peer, uint64_t tag, absl::Span<float> inout, float scale) override;
  void Expect(int peer, uint64_t tag, const Posting& posting) override {
    base_.Expect(peer, tag, posting);
  }
  bool Unexpect(int peer, uint64_t tag) override { return base_.Unexpect(peer, tag); }
  int64_t bytes_sent() const override { return base_.bytes_sent(); }
  int64_t bytes_received() const override { return base_.bytes_received(); }

  // One line per fault applied so far, e.g. "rank 1 dropped its send to rank 2 (tag 5)".
  std::vector<std::string> injected() const;

 private:
  // The fault to apply to this message, or nullptr; counts the match.
  const LinkFault* Match(bool send, int peer) ABSL_LOCKS_EXCLUDED(mu_);
  void Note(std::string what) ABSL_LOCKS_EXCLUDED(mu_);
  // The status a kFailRecv fault injects into this receive, or OK (none matches).
  absl::Status InjectedRecvFailure(int peer, uint64_t tag) ABSL_LOCKS_EXCLUDED(mu_);

  PeerLink& base_;
  const std::vector<LinkFault> plan_;
  mutable absl::Mutex mu_;
  std::vector<int64_t> matches_ ABSL_GUARDED_BY(mu_);  // Per fault of plan_.
  std::vector<std::string> injected_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> delayed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_FAULTY_LINK_H_
