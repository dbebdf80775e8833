#include "common/ring_allreduce.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/wire_link.h"

namespace dptrain {
namespace {

int Mod(int a, int n) { return ((a % n) + n) % n; }

// Tags: [tag_base | phase | step | chunk] packed so that no two messages of one collective
// between the same pair of ranks share a tag.
uint64_t Tag(const RingOptions& o, int phase, int step, int64_t chunk) {
  return (o.tag_base << 40) ^ (static_cast<uint64_t>(phase) << 36) ^
         (static_cast<uint64_t>(step) << 24) ^ static_cast<uint64_t>(chunk);
}

absl::Status CheckOptions(const PeerLink& link, const RingOptions& o) {
  if (o.chunk_elements < 1) return absl::InvalidArgumentError("chunk_elements must be >= 1");
  if (link.world_size() < 1 || link.rank() < 0 || link.rank() >= link.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", link.rank(), " not in [0, ", link.world_size(), ")"));
  }
  return absl::OkStatus();
}

// The messages a collective told the link to expect from `peer` and has not received yet;
// withdrawn when it returns early, so the link never writes into the caller's buffer after
// the collective returned.
class ExpectedMessages {
 public:
  ExpectedMessages(PeerLink& link, int peer) : link_(link), peer_(peer) {}
  ~ExpectedMessages() {
    for (uint64_t tag : pending_) link_.Unexpect(peer_, tag);
  }
  void Expect(uint64_t tag, const Posting& posting) {
    link_.Expect(peer_, tag, posting);
    pending_.insert(tag);
  }
  void Done(uint64_t tag) { pending_.erase(tag); }

 private:
  PeerLink& link_;
  const int peer_;
  std::set<uint64_t> pending_;
};

}  // namespace

Range SegmentRange(int64_t n, int parts, int segment) {
  const int64_t base = n / parts, extra = n % parts;
  Range r;
  r.begin = segment * base + std::min<int64_t>(segment, extra);
  r.end = r.begin + base + (segment < extra ? 1 : 0);
  return r;
}

int RingOwnedSegment(int rank, int world_size) { return Mod(rank + 1, world_size); }

namespace {

// Runs stages [first, end) of the 2(n-1) stages of a ring all-reduce: reduce-scatter stages
// k = 0..n-2 send segment r-k and add the received segment r-k-1 into place (after them
// rank r holds the full sum of segment r+1); all-gather stages k = n-1..2n-3 send segment
// r+1-j and copy in segment r-j (j = k-n+1). A stage sends exactly the segment the
// previous stage received, so it is pipelined chunk by chunk: chunk c goes out as soon as
// its previous stage has landed. A stage's receives are expected when it starts, so the
// link writes (or adds) each chunk in place as it arrives; that segment is not one being
// sent until the next stage.
absl::Status RunStages(PeerLink& link, absl::Span<float> data, const RingOptions& o, int first,
                       int end) {
  if (auto s = CheckOptions(link, o); !s.ok()) return s;
  const int n = link.world_size(), r = link.rank();
  const int right = Mod(r + 1, n), left = Mod(r - 1, n);
  const int64_t size = static_cast<int64_t>(data.size());
  if (n == 1 || first >= end) return absl::OkStatus();
  ExpectedMessages expected(link, left);
  // The average is folded into the last add: (sum + last) * (1/n), the same two roundings
  // as summing then scaling.
  const float average = o.average ? 1.0f / static_cast<float>(n) : 1.0f;
  auto send_segment = [&](int k) { return k < n - 1 ? r - k : r + 1 - (k - n + 1); };
  auto recv_segment = [&](int k) { return k < n - 1 ? r - k - 1 : r - (k - n + 1); };
  // Waits for chunk c (at offset off, len elements) of stage k.
  auto receive = [&](int k, int64_t c, int64_t off, int64_t len) -> absl::Status {
    const uint64_t tag = Tag(o, k < n - 1 ? 0 : 1, k < n - 1 ? k : k - n + 1, c);
    const absl::Span<float> dest = data.subspan(off, len);
    absl::Status s = k < n - 1 ? link.RecvAdd(left, tag, dest, k == n - 2 ? average : 1.0f)
                               : link.Recv(left, tag, dest);
    if (s.ok()) expected.Done(tag);  // Else still expected: withdrawn on the way out.
    return s;
  };
  for (int k = first; k < end; ++k) {
    const bool reduce = k < n - 1;
    const Range recv = SegmentRange(size, n, Mod(recv_segment(k), n));
    for (int64_t c = 0, off = recv.begin; off < recv.end; ++c, off += o.chunk_elements) {
      const int64_t len = std::min(o.chunk_elements, recv.end - off);
      expected.Expect(Tag(o, reduce ? 0 : 1, reduce ? k : k - n + 1, c),
                      {data.subspan(off, len), reduce, k == n - 2 ? average : 1.0f});
    }
    const Range send = SegmentRange(size, n, Mod(send_segment(k), n));
    for (int64_t c = 0, off = send.begin; off < send.end; ++c, off += o.chunk_elements) {
      const int64_t len = std::min(o.chunk_elements, send.end - off);
      if (k > first) {
        if (auto s = receive(k - 1, c, off, len); !s.ok()) return s;
      }
      const uint64_t tag = Tag(o, reduce ? 0 : 1, reduce ? k : k - n + 1, c);
      if (k == n - 1 && link.wire_dtype() != DType::kFp32) {
        // A 16-bit wire: the owner keeps what the others will receive.
        RoundToWire(link.wire_dtype(), data.subspan(off, len));
      }
      if (auto s = link.Send(right, tag, data.subspan(off, len)); !s.ok()) return s;
    }
  }
  const Range last = SegmentRange(size, n, Mod(recv_segment(end - 1), n));
  for (int64_t c = 0, off = last.begin; off < last.end; ++c, off += o.chunk_elements) {
    const int64_t len = std::min(o.chunk_elements, last.end - off);
    if (auto s = receive(end - 1, c, off, len); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RingAllReduce(PeerLink& link, absl::Span<float> data, const RingOptions& o) {
  return RunStages(link, data, o, 0, 2 * (link.world_size() - 1));
}

absl::Status RingReduceScatter(PeerLink& link, absl::Span<float> data, const RingOptions& o) {
  return RunStages(link, data, o, 0, link.world_size() - 1);
}

absl::Status RingAllGather(PeerLink& link, absl::Span<float> data, const RingOptions& o) {
  return RunStages(link, data, o, link.world_size() - 1, 2 * (link.world_size() - 1));
}

absl::Status RingBroadcast(PeerLink& link, absl::Span<float> data, int root, const RingOptions& o) {
  if (auto s = CheckOptions(link, o); !s.ok()) return s;
  const int n = link.world_size(), r = link.rank();
  if (root < 0 || root >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " not in [0, ", n, ")"));
  }
  if (n == 1) return absl::OkStatus();
  const int right = Mod(r + 1, n), left = Mod(r - 1, n);
  const bool last = right == root;  // The rank before the root only receives.
  const int64_t size = static_cast<int64_t>(data.size());
  ExpectedMessages expected(link, left);
  if (r != root) {
    for (int64_t c = 0, off = 0; off < size; ++c, off += o.chunk_elements) {
      const int64_t len = std::min(o.chunk_elements, size - off);
      expected.Expect(Tag(o, 2, 0, c), {data.subspan(off, len), /*add=*/false, 1.0f});
    }
  }
  // Chunk by chunk: receive from the left (unless root), forward to the right (unless last).
  for (int64_t c = 0, off = 0; off < size; ++c, off += o.chunk_elements) {
    const int64_t len = std::min(o.chunk_elements, size - off);
    if (r != root) {
      absl::Status s = link.Recv(left, Tag(o, 2, 0, c), data.subspan(off, len));
      if (!s.ok()) return s;  // Still expected: withdrawn on the way out.
      expected.Done(Tag(o, 2, 0, c));
    }
    if (!last) {
      if (auto s = link.Send(right, Tag(o, 2, 0, c), data.subspan(off, len)); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace dptrain
