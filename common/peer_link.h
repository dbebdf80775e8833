// The transport seen by collective algorithms (gloo's transport::Pair idea): tagged messages
// of floats between ranks. Implementations: InMemoryLinks (tests, threads of one process);
// a gRPC link between worker processes.
#ifndef DPTRAIN_COMMON_PEER_LINK_H_
#define DPTRAIN_COMMON_PEER_LINK_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/dtype.h"

namespace dptrain {

// Where an expected message goes (PeerLink::Expect): copied into `dest`, or (add)
// dest = (dest + message) * scale.
struct Posting {
  absl::Span<float> dest;
  bool add = false;
  float scale = 1.0f;
};

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
  // As Recv, but sets inout = (inout + message) * scale element-wise (the reduce step of a
  // collective; `scale` folds in an average), straight from where the link keeps it.
  virtual absl::Status RecvAdd(int peer, uint64_t tag, absl::Span<float> inout, float scale) = 0;

  // Optional, for links that can receive in place: announces that the message (peer, tag)
  // will be taken by a Recv into posting.dest (or a RecvAdd, if posting.add, with
  // posting.scale), so that the link may write it there as it arrives. From this call until
  // that Recv/RecvAdd returns, or Unexpect, the memory belongs to the link.
  virtual void Expect(int peer, uint64_t tag, const Posting& posting) {}
  // Withdraws an Expect whose Recv will not come. False if a delivery in progress did not
  // end within the link's timeout: the memory must then stay alive.
  virtual bool Unexpect(int peer, uint64_t tag) { return true; }

  // What the floats travel as: fp32, or (NarrowingLink, common/wire_link.h) bf16/fp16,
  // rounded. A collective over a 16-bit link rounds the values it keeps the same way, so
  // that every rank ends with the same bits.
  virtual DType wire_dtype() const { return DType::kFp32; }

  // Bytes this link sent and received so far (message payload plus framing it knows of).
  virtual int64_t bytes_sent() const = 0;
  virtual int64_t bytes_received() const = 0;
};

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_PEER_LINK_H_
