#include "worker/comm/ring_wire.h"

#include <string>

#include "gtest/gtest.h"

namespace dptrain {
namespace {

TEST(RingWireTest, HelloRoundTripsAndNamesWhatIsWrong) {
  const uint64_t job = ring_auth::HashJob("job-a");
  for (bool keyed : {false, true}) {
    const std::string hello = EncodeRingHello(2, job, keyed);
    ASSERT_EQ(hello.size(), kRingHelloBytes);
    absl::StatusOr<int> rank = ParseRingHello(hello, job, 3, keyed);
    ASSERT_TRUE(rank.ok()) << rank.status();
    EXPECT_EQ(*rank, 2);

    EXPECT_EQ(ParseRingHello(hello, ring_auth::HashJob("job-b"), 3, keyed).status().message(),
              "not a hello of this job");
    std::string bad_magic = hello;
    bad_magic[0] ^= 0x10;
    EXPECT_TRUE(absl::IsPermissionDenied(ParseRingHello(bad_magic, job, 3, keyed).status()));
    const absl::Status out_of_ring = ParseRingHello(hello, job, 2, keyed).status();
    EXPECT_TRUE(absl::IsInvalidArgument(out_of_ring));
    EXPECT_EQ(out_of_ring.message(), "claimed rank 2, not a peer");
    // A rank field of 2^32 - 1 is not -1.
    EXPECT_TRUE(absl::IsInvalidArgument(
        ParseRingHello(EncodeRingHello(-1, job, keyed), job, 8, keyed).status()));
    EXPECT_TRUE(absl::IsDataLoss(ParseRingHello(hello.substr(0, 15), job, 3, keyed).status()));
    EXPECT_TRUE(absl::IsDataLoss(ParseRingHello(hello + "x", job, 3, keyed).status()));
  }
  // A plain hello to a ring with a job token, and a keyed one to a ring without.
  const absl::Status unproven =
      ParseRingHello(EncodeRingHello(1, job, false), job, 3, true).status();
  EXPECT_TRUE(absl::IsUnauthenticated(unproven)) << unproven;
  EXPECT_EQ(unproven.message(),
            "a hello without a job-token proof (this ring requires the job token)");
  EXPECT_TRUE(absl::IsUnauthenticated(
      ParseRingHello(EncodeRingHello(1, job, true), job, 3, false).status()));
}

TEST(RingWireTest, FrameHeaderRoundTripsAndIsBoundedBeforeAllocation) {
  char bytes[kRingFrameHeaderBytes];
  EncodeRingFrameHeader({0x0123456789abcdefull, 4096}, bytes);
  const absl::string_view view(bytes, sizeof(bytes));
  absl::StatusOr<RingFrameHeader> h = ParseRingFrameHeader(view, 4096);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->tag, 0x0123456789abcdefull);
  EXPECT_EQ(h->payload_bytes, 4096u);

  const absl::Status over = ParseRingFrameHeader(view, 4095).status();
  EXPECT_TRUE(absl::IsInvalidArgument(over));
  EXPECT_EQ(over.message(), "a frame declares 4096 bytes, more than the 4095 allowed");
  EncodeRingFrameHeader({1, ~uint64_t{0}}, bytes);
  EXPECT_TRUE(absl::IsInvalidArgument(ParseRingFrameHeader(view, uint64_t{1} << 20).status()));
  EXPECT_TRUE(absl::IsDataLoss(ParseRingFrameHeader(view.substr(0, 8), 1 << 20).status()));
}

}  // namespace
}  // namespace dptrain
