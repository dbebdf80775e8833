#include "worker/comm/ring_wire.h"

#include <string>

#include "gtest/gtest.h"

namespace dptrain {
namespace {

TEST(RingWireTest, HelloRoundTripsAndNamesWhatIsWrong) {
  const uint64_t job = HashRingJob("job-a");
  const std::string hello = EncodeRingHello(2, job);
  ASSERT_EQ(hello.size(), kRingHelloBytes);
  absl::StatusOr<int> rank = ParseRingHello(hello, job, 3);
  ASSERT_TRUE(rank.ok()) << rank.status();
  EXPECT_EQ(*rank, 2);

  EXPECT_EQ(ParseRingHello(hello, HashRingJob("job-b"), 3).status().message(),
            "not a hello of this job");
  std::string bad_magic = hello;
  bad_magic[0] ^= 1;
  EXPECT_TRUE(absl::IsPermissionDenied(ParseRingHello(bad_magic, job, 3).status()));
  const absl::Status out_of_ring = ParseRingHello(hello, job, 2).status();
  EXPECT_TRUE(absl::IsInvalidArgument(out_of_ring));
  EXPECT_EQ(out_of_ring.message(), "claimed rank 2, not a peer");
  // A rank field of 2^32 - 1 is not -1.
  EXPECT_TRUE(absl::IsInvalidArgument(ParseRingHello(EncodeRingHello(-1, job), job, 8).status()));
  EXPECT_TRUE(absl::IsDataLoss(ParseRingHello(hello.substr(0, 15), job, 3).status()));
  EXPECT_TRUE(absl::IsDataLoss(ParseRingHello(hello + "x", job, 3).status()));
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
