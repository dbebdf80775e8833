#include "common/tensor_frame.h"

#include <cstring>
#include <vector>

#include "common/frame_testing.h"
#include "gtest/gtest.h"

namespace dptrain {
namespace {

proto::FrameHeader Header() {
  proto::FrameHeader h;
  h.mutable_caller()->set_job_id("job");
  h.mutable_caller()->set_rank(3);
  h.set_step(7);
  h.mutable_key()->set_tensor_id(2);
  h.mutable_key()->set_chunk_index(1);
  h.set_dtype(proto::FP32);
  return h;
}

TEST(TensorFrameTest, RoundTripsWithoutCopyingTheSentPayload) {
  std::vector<float> data = {1.5f, -2, 3, 4, 5};
  const absl::string_view bytes(reinterpret_cast<const char*>(data.data()), data.size() * 4);
  grpc::ByteBuffer frame = FrameReferencing(Header(), bytes);
  data[0] = 9;  // Referenced, not copied: the frame sees the change.
  for (size_t piece : {size_t{1}, size_t{3}, size_t{7}, size_t{1000}}) {
    grpc::ByteBuffer cut = Recut(frame, piece);
    auto got = ReceivedFrame::Parse(cut);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->header().caller().rank(), 3);
    EXPECT_EQ(got->header().step(), 7);
    EXPECT_EQ(got->header().key().tensor_id(), 2);
    ASSERT_EQ(got->payload_size(), data.size() * 4);
    std::vector<float> out(data.size());
    got->CopyPayload(reinterpret_cast<char*>(out.data()));
    EXPECT_EQ(out, data) << "piece " << piece;
    const absl::string_view contiguous = got->ContiguousPayload();
    ASSERT_EQ(contiguous.size(), data.size() * 4);
    EXPECT_EQ(std::memcmp(contiguous.data(), data.data(), contiguous.size()), 0);
  }
}

TEST(TensorFrameTest, OwningFrameAndEmptyPayload) {
  grpc::Slice payload = NewPayload(8);
  std::memcpy(MutableData(payload), "abcdefgh", 8);
  grpc::ByteBuffer frame = FrameOwning(Header(), std::move(payload));
  auto got = ReceivedFrame::Parse(frame);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->ContiguousPayload(), "abcdefgh");

  grpc::ByteBuffer empty = FrameReferencing(Header(), {});
  auto none = ReceivedFrame::Parse(empty);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->payload_size(), 0u);
  EXPECT_TRUE(none->ContiguousPayload().empty());
}

TEST(TensorFrameTest, RejectsTruncatedAndGarbledFrames) {
  grpc::Slice two("ab", 2);
  grpc::ByteBuffer tiny(&two, 1);
  EXPECT_EQ(ReceivedFrame::Parse(tiny).status().code(), absl::StatusCode::kDataLoss);

  const char too_long[] = {100, 0, 0, 0, 1, 2};  // Claims a 100-byte header.
  grpc::Slice s1(too_long, sizeof(too_long));
  grpc::ByteBuffer b1(&s1, 1);
  EXPECT_EQ(ReceivedFrame::Parse(b1).status().code(), absl::StatusCode::kDataLoss);

  const char garbage[] = {3, 0, 0, 0, '\xff', '\xff', '\xff', 0};  // Not a FrameHeader.
  grpc::Slice s2(garbage, sizeof(garbage));
  grpc::ByteBuffer b2(&s2, 1);
  EXPECT_EQ(ReceivedFrame::Parse(b2).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace dptrain
