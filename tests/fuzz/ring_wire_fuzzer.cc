// Fuzzes what a ring link's reader does with the bytes of one connection
// (worker/comm/tcp_peer_link.cc Handshake and ReadFrames, without the socket): ParseRingHello
// (as a rank with or without a job token; the HMAC proof after a keyed hello is not fuzzed),
// then frame after frame ParseRingFrameHeader and the Mailbox (Claim of an expected message
// and a write into place, or Deposit), then the collective's TakeInto/TakeAdd of what it
// expected.
// Input: [world size][max payload][keyed][3 expectations: tag, floats, add][hello][frames...].
// Checks: what parses re-encodes to the same bytes and is within the bounds; only the
// documented statuses; a message is never delivered beyond the memory that expected it
// (ASan); nothing waits (every Take has a deadline in the past).
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/mailbox.h"
#include "tests/fuzz/fuzz_check.h"
#include "worker/comm/ring_wire.h"

namespace {

using namespace dptrain;  // NOLINT: a fuzz target's one function.

struct Expected {
  uint64_t tag;
  std::vector<float> dest;
  bool add;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const int world_size = in.ConsumeIntegralInRange<int>(0, 8);
  const uint64_t max_payload = in.ConsumeIntegralInRange<uint64_t>(0, 1024);
  const bool keyed = in.ConsumeBool();
  const int from = 1;
  Mailbox inbox;
  std::vector<Expected> expected(3);
  for (Expected& e : expected) {
    e.tag = in.ConsumeIntegralInRange<uint64_t>(0, 3);
    e.dest.assign(in.ConsumeIntegralInRange<size_t>(0, 16), 1.0f);
    e.add = in.ConsumeBool();
    inbox.Post(from, e.tag, {absl::MakeSpan(e.dest), e.add, 0.5f});
  }
  const std::string stream = in.ConsumeRemainingBytesAsString();
  const uint64_t job = ring_auth::HashJob("fuzz");

  absl::string_view rest = stream;
  const absl::string_view hello = rest.substr(0, kRingHelloBytes);
  rest.remove_prefix(hello.size());
  absl::StatusOr<int> rank = ParseRingHello(hello, job, world_size, keyed);
  if (rank.ok()) {
    FUZZ_CHECK(*rank >= 0 && *rank < world_size);
    FUZZ_CHECK(EncodeRingHello(*rank, job, keyed) == hello);
  } else {
    const absl::Status& s = rank.status();
    FUZZ_CHECK(absl::IsDataLoss(s) || absl::IsPermissionDenied(s) || absl::IsInvalidArgument(s) ||
               absl::IsUnauthenticated(s));
    FUZZ_CHECK(!absl::IsDataLoss(s) || hello.size() != kRingHelloBytes);
    // Reads the frames anyway: the parse of frames must not depend on a valid hello.
  }
  while (!rest.empty()) {
    const absl::string_view bytes = rest.substr(0, kRingFrameHeaderBytes);
    rest.remove_prefix(bytes.size());
    absl::StatusOr<RingFrameHeader> header = ParseRingFrameHeader(bytes, max_payload);
    if (!header.ok()) {
      FUZZ_CHECK(absl::IsDataLoss(header.status()) || absl::IsInvalidArgument(header.status()));
      break;
    }
    FUZZ_CHECK(header->payload_bytes <= max_payload);
    char encoded[kRingFrameHeaderBytes];
    EncodeRingFrameHeader(*header, encoded);
    FUZZ_CHECK(absl::string_view(encoded, sizeof(encoded)) == bytes);
    const size_t length = header->payload_bytes;
    const absl::string_view payload = rest.substr(0, length);
    rest.remove_prefix(payload.size());
    const bool whole = payload.size() == length;
    if (std::optional<Posting> posting = inbox.Claim(from, header->tag, length)) {
      FUZZ_CHECK(posting->dest.size() * sizeof(float) == length);
      if (whole && posting->add) {
        AddScaled(posting->dest.data(), payload.data(), posting->dest.size(), posting->scale);
      } else if (whole && length > 0) {
        std::memcpy(posting->dest.data(), payload.data(), length);
      }
      inbox.Delivered(from, header->tag, whole);
    } else if (whole) {
      absl::Status s = inbox.Deposit(from, header->tag, MessageBytes::Copy(payload.data(), length));
      FUZZ_CHECK(s.ok() || absl::IsAlreadyExists(s));
    }
    if (!whole) break;
  }
  inbox.MarkClosed(from);
  for (Expected& e : expected) {
    const absl::Status s =
        e.add ? inbox.TakeAdd(from, e.tag, absl::MakeSpan(e.dest), 0.5f, absl::InfinitePast())
              : inbox.TakeInto(from, e.tag, absl::MakeSpan(e.dest), absl::InfinitePast());
    FUZZ_CHECK(s.ok() || absl::IsUnavailable(s) || absl::IsInvalidArgument(s) ||
               absl::IsDeadlineExceeded(s));
    FUZZ_CHECK(inbox.Unpost(from, e.tag, absl::InfinitePast()));
  }
  return 0;
}
