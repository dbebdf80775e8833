#include "worker/comm/ring_wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace dptrain {

std::string EncodeRingHello(int rank, uint64_t job_hash, bool keyed) {
  const ring_auth::Hello hello{keyed ? ring_auth::kKeyedMagic : ring_auth::kPlainMagic,
                               static_cast<uint32_t>(rank), job_hash};
  return std::string(reinterpret_cast<const char*>(&hello), sizeof(hello));
}

absl::StatusOr<int> ParseRingHello(absl::string_view bytes, uint64_t job_hash, int world_size,
                                   bool keyed) {
  if (bytes.size() != kRingHelloBytes) {
    return absl::DataLossError(
        absl::StrCat("a hello has ", kRingHelloBytes, " bytes, not ", bytes.size()));
  }
  ring_auth::Hello hello;
  std::memcpy(&hello, bytes.data(), sizeof(hello));
  if (hello.magic == ring_auth::kPlainMagic && keyed) {
    return absl::UnauthenticatedError(
        "a hello without a job-token proof (this ring requires the job token)");
  }
  if (hello.magic == ring_auth::kKeyedMagic && !keyed) {
    return absl::UnauthenticatedError(
        "a job-token hello, but this rank has no job token (--job_token_file on some ranks "
        "only?)");
  }
  if ((hello.magic != ring_auth::kPlainMagic && hello.magic != ring_auth::kKeyedMagic) ||
      hello.job != job_hash) {
    return absl::PermissionDeniedError("not a hello of this job");
  }
  if (world_size < 0 || hello.rank >= static_cast<uint32_t>(world_size)) {
    return absl::InvalidArgumentError(absl::StrCat("claimed rank ", hello.rank, ", not a peer"));
  }
  return static_cast<int>(hello.rank);
}

void EncodeRingFrameHeader(const RingFrameHeader& header, char* out) {
  std::memcpy(out, &header.tag, 8);
  std::memcpy(out + 8, &header.payload_bytes, 8);
}

absl::StatusOr<RingFrameHeader> ParseRingFrameHeader(absl::string_view bytes,
                                                     uint64_t max_payload_bytes) {
  if (bytes.size() != kRingFrameHeaderBytes) {
    return absl::DataLossError(
        absl::StrCat("a frame header has ", kRingFrameHeaderBytes, " bytes, not ", bytes.size()));
  }
  RingFrameHeader header;
  std::memcpy(&header.tag, bytes.data(), 8);
  std::memcpy(&header.payload_bytes, bytes.data() + 8, 8);
  if (header.payload_bytes > max_payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a frame declares ", header.payload_bytes,
                                                   " bytes, more than the ", max_payload_bytes,
                                                   " allowed"));
  }
  return header;
}

}  // namespace dptrain
