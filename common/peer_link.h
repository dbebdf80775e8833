// The transport seen by collective algorithms (gloo's transport::Pair idea): tagged messages
// of floats between ranks. Implementations: InMemoryLinks (tests, threads of one process);
// a gRPC link between worker processes.
#ifndef DPTRAIN_COMMON_PEER_LINK_H_
#define DPTRAIN_COMMON_PEER_LINK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace dptrain {

class PeerLink {
 public:
  virtual ~PeerLink() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Queues `data` for rank `peer` under `tag`. Buffered: returns without waiting for the
  // peer's Recv, so that every rank may send before it receives.
  virtual absl::Status Send(int peer, uint64_t tag, absl::Span<const float> data) = 0;
  // Waits for the message that `peer` sent under `tag` and copies it into `out`.
  // InvalidArgument if its size differs from out.size(); DeadlineExceeded / Unavailable
  // when the link gives up (a dead peer never makes this hang forever).
  virtual absl::Status Recv(int peer, uint64_t tag, absl::Span<float> out) = 0;
  // As Recv, but adds the message element-wise into `inout` (the reduce step of a
  // collective), straight from where the link keeps it.
  virtual absl::Status RecvAdd(int peer, uint64_t tag, absl::Span<float> inout) = 0;

  // Bytes this link sent and received so far (message payload plus framing it knows of).
  virtual int64_t bytes_sent() const = 0;
  virtual int64_t bytes_received() const = 0;
};

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_PEER_LINK_H_
