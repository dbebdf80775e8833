// Ring all-reduce (reduce-scatter, then all-gather; N-1 steps each) and a ring broadcast,
// over an abstract PeerLink. No network and no GPU here.
//
// The buffer is cut into world_size segments (nearly equal; some are empty when the buffer
// is shorter than the ring), and each segment into chunks of at most `chunk_elements`, which
// travel as separate messages so that sending one overlaps with reducing the previous.
// Every element is reduced along one fixed path and then copied, so all ranks end with
// bit-identical results; over a 16-bit link (common/wire_link.h) the partial sums travel
// rounded and each owner rounds its reduced segment before the all-gather sends it.
#ifndef DPTRAIN_COMMON_RING_ALLREDUCE_H_
#define DPTRAIN_COMMON_RING_ALLREDUCE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/peer_link.h"

namespace dptrain {

struct RingOptions {
  int64_t chunk_elements = int64_t{1} << 18;  // 1 MiB of fp32 per message.
  bool average = true;                        // Divide the sum by world_size.
  uint64_t tag_base = 0;  // Distinguishes concurrent collectives (e.g. the step number).
};

// Element range [begin, end) of segment `segment` of a buffer of `n` elements cut into
// `parts` segments: the first n % parts segments are one element longer.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};
Range SegmentRange(int64_t n, int parts, int segment);

// In place: data becomes the sum (or mean) over all ranks. Every rank calls it with the same
// size and options. Fails with the link's error.
absl::Status RingAllReduce(PeerLink& link, absl::Span<float> data, const RingOptions& options);

// The two halves of RingAllReduce, for ZeRO-style sharded updates. After RingReduceScatter
// rank r holds the sum (or mean) over all ranks of segment RingOwnedSegment(r, world_size)
// (SegmentRange(data.size(), world_size, that)); the rest of its data is unspecified.
// RingAllGather then copies each rank's owned segment to every rank. Every rank calls them
// with the same size and options; a RingReduceScatter and the RingAllGather after it may
// share a tag_base.
int RingOwnedSegment(int rank, int world_size);
absl::Status RingReduceScatter(PeerLink& link, absl::Span<float> data, const RingOptions& options);
absl::Status RingAllGather(PeerLink& link, absl::Span<float> data, const RingOptions& options);

// In place: every rank's data becomes `root`'s (pipelined along the ring).
absl::Status RingBroadcast(PeerLink& link, absl::Span<float> data, int root,
                           const RingOptions& options);

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_RING_ALLREDUCE_H_
