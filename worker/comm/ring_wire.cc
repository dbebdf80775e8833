#include "worker/comm/ring_wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace dptrain {
namespace {

constexpr uint32_t kMagic = 0x44505452;  // "DPTR"

struct Hello {
  uint32_t magic, rank;
  uint64_t job;
};
static_assert(sizeof(Hello) == kRingHelloBytes, "hello layout");

}  // namespace

uint64_t HashRingJob(absl::string_view job_id) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : job_id) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string EncodeRingHello(int rank, uint64_t job_hash) {
  const Hello hello{kMagic, static_cast<uint32_t>(rank), job_hash};
  return std::string(reinterpret_cast<const char*>(&hello), sizeof(hello));
}

absl::StatusOr<int> ParseRingHello(absl::string_view bytes, uint64_t job_hash, int world_size) {
  if (bytes.size() != kRingHelloBytes) {
    return absl::DataLossError(
        absl::StrCat("a hello has ", kRingHelloBytes, " bytes, not ", bytes.size()));
  }
  Hello hello;
  std::memcpy(&hello, bytes.data(), sizeof(hello));
  if (hello.magic != kMagic || hello.job != job_hash) {
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
