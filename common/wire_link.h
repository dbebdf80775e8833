// A PeerLink that carries its floats in 16 bits (--wire_dtype=bf16|fp16 for the ring's
// gradients): Send rounds each value to nearest even and packs two per 32-bit word of the
// inner link's message; Recv and RecvAdd unpack and widen, so a collective sees floats and
// sums them in fp32. Half the bytes on the wire. Nothing is received in place (Expect is not
// passed on: the inner message has half the elements). The collective must round the values
// it keeps itself (PeerLink::wire_dtype; ring_allreduce.h does) so that every rank ends
// bit-identical. Only for gradients: weights and statistics keep using the inner link.
#ifndef DPTRAIN_COMMON_WIRE_LINK_H_
#define DPTRAIN_COMMON_WIRE_LINK_H_

#include "common/peer_link.h"

namespace dptrain {

class NarrowingLink final : public PeerLink {
 public:
  // `wire`: kBf16 or kFp16. `inner` must outlive this link.
  NarrowingLink(PeerLink& inner, DType wire) : inner_(inner), wire_(wire) {}

  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  DType wire_dtype() const override { return wire_; }
  absl::Status Send(int peer, uint64_t tag, absl::Span<const float> data) override;
  absl::Status Recv(int peer, uint64_t tag, absl::Span<float> out) override;
  absl::Status RecvAdd(int peer, uint64_t tag, absl::Span<float> inout, float scale) override;
  int64_t bytes_sent() const override { return inner_.bytes_sent(); }
  int64_t bytes_received() const override { return inner_.bytes_received(); }

 private:
  // The message of `n` floats, received packed and widened into `out` (n elements).
  absl::Status Receive(int peer, uint64_t tag, int64_t n, std::vector<float>& out);

  PeerLink& inner_;
  const DType wire_;
};

// Rounds `values` in place to what `wire` carries (nothing for kFp32).
void RoundToWire(DType wire, absl::Span<float> values);

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_WIRE_LINK_H_
