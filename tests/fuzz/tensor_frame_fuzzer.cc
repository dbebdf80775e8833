// Fuzzes ReceivedFrame::Parse (common/tensor_frame), the first thing a shard does with every
// message of a tensor stream. Input: [cut seed byte][frame bytes]; the frame is delivered
// in slices whose sizes the seed picks, as a network read might cut it.
// Checks: a frame that parses accounts for every byte (4 + header + payload), its payload
// reads back the same through CopyPayload and ContiguousPayload, and it survives a round
// trip through FrameReferencing; one that does not parse is DataLoss.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/tensor_frame.h"
#include "google/protobuf/stubs/logging.h"
#include "tests/fuzz/fuzz_check.h"

// Protobuf logs every string field with invalid UTF-8 it refuses to parse: millions of lines.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  uint32_t seed = data[0];
  const char* bytes = reinterpret_cast<const char*>(data + 1);
  const size_t n = size - 1;
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < n;) {
    seed = seed * 1103515245u + 12345u;
    const size_t piece = seed % 2 == 0 ? n - at : 1 + (seed >> 8) % 9;
    const size_t take = std::min(piece, n - at);
    slices.emplace_back(bytes + at, take);
    at += take;
  }
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  absl::StatusOr<dptrain::ReceivedFrame> frame = dptrain::ReceivedFrame::Parse(buffer);
  if (!frame.ok()) {
    FUZZ_CHECK(absl::IsDataLoss(frame.status()));
    return 0;
  }
  const size_t payload = frame->payload_size();
  FUZZ_CHECK(payload <= n - 4);
  std::string copied(payload, '\0');
  frame->CopyPayload(copied.data());
  FUZZ_CHECK(std::memcmp(copied.data(), bytes + n - payload, payload) == 0);
  FUZZ_CHECK(frame->ContiguousPayload() == copied);

  grpc::ByteBuffer again = dptrain::FrameReferencing(frame->header(), copied);
  absl::StatusOr<dptrain::ReceivedFrame> reparsed = dptrain::ReceivedFrame::Parse(again);
  FUZZ_CHECK(reparsed.ok());
  FUZZ_CHECK(reparsed->ContiguousPayload() == copied);
  FUZZ_CHECK(reparsed->header().SerializeAsString() == frame->header().SerializeAsString());
  return 0;
}
