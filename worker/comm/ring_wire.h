// The bytes on the ring's TCP links (TcpPeerLink), as pure functions: built and parsed here
// without a socket, so they are tested and fuzzed on their own (tests/fuzz/ring_wire_fuzzer).
//   hello, once per connection, from the connecting rank: ring_auth::Hello
//     [magic u32: "DPTR" plain, "DPTA" a job-token proof follows][rank u32][job u64]
//   then per message, a frame:  [tag u64][payload bytes u64][payload]
// Integers are in the machine's byte order (little-endian on every target we build for).
// The job field is ring_auth::HashJob(job id): it tells jobs apart, it proves nothing; the
// proof that follows a keyed hello is ring_auth's.
#ifndef DPTRAIN_WORKER_COMM_RING_WIRE_H_
#define DPTRAIN_WORKER_COMM_RING_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/comm/ring_auth.h"

namespace dptrain {

inline constexpr size_t kRingHelloBytes = sizeof(ring_auth::Hello);
inline constexpr size_t kRingFrameHeaderBytes = 16;

// The hello of `rank` for the job whose hash is `job_hash`, keyed (a job-token proof
// follows) or plain: the bytes of the ring_auth::Hello a connecting rank sends.
std::string EncodeRingHello(int rank, uint64_t job_hash, bool keyed);

// The rank a hello claims, read by a rank that has a job token (`keyed`) or has none.
// DataLoss if `bytes` is not kRingHelloBytes long; Unauthenticated for a plain hello to a
// keyed ring or a keyed one to a plain ring; PermissionDenied ("not a hello of this job") for
// another magic or job; InvalidArgument for a rank outside [0, world_size). Checks no proof
// and says nothing about whether that rank is already connected.
absl::StatusOr<int> ParseRingHello(absl::string_view bytes, uint64_t job_hash, int world_size,
                                   bool keyed);

struct RingFrameHeader {
  uint64_t tag = 0;
  uint64_t payload_bytes = 0;
};

// Writes `header` into out[0 .. kRingFrameHeaderBytes).
void EncodeRingFrameHeader(const RingFrameHeader& header, char* out);

// DataLoss if `bytes` is not kRingFrameHeaderBytes long; InvalidArgument if the payload it
// declares exceeds `max_payload_bytes` (checked before the caller allocates anything).
absl::StatusOr<RingFrameHeader> ParseRingFrameHeader(absl::string_view bytes,
                                                     uint64_t max_payload_bytes);

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_COMM_RING_WIRE_H_
