#include "common/sparse_frames.h"

#include <vector>

#include "common/frame_testing.h"
#include "gtest/gtest.h"

namespace dptrain {
namespace {

proto::SparseFrameHeader Header() {
  proto::SparseFrameHeader h;
  h.mutable_caller()->set_job_id("job");
  h.mutable_caller()->set_rank(1);
  h.set_table("emb");
  h.set_step(5);
  return h;
}

TEST(SparseFramesTest, IdsAndRowsRoundTripAcrossAnySlicing) {
  const std::vector<int64_t> ids = {7, 0, 123456789012345};
  const std::vector<float> values = {1, 2, 3, 4, 5, 6};  // 3 rows of 2.
  grpc::ByteBuffer frame = SparseRowsFrame(Header(), ids, values, 2);
  for (size_t piece : {size_t{1}, size_t{5}, size_t{13}, size_t{4096}}) {
    grpc::ByteBuffer cut = Recut(frame, piece);
    auto got = SparseFrame::Parse(cut);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->header().table(), "emb");
    EXPECT_EQ(got->header().step(), 5);
    EXPECT_EQ(got->header().rows(), 3);
    std::vector<int64_t> got_ids;
    std::vector<float> got_values;
    ASSERT_TRUE(ReadSparseFrame(*got, 2, got_ids, &got_values).ok());
    EXPECT_EQ(got_ids, ids) << "piece " << piece;
    EXPECT_EQ(got_values, values) << "piece " << piece;
  }
}

TEST(SparseFramesTest, GathersRowsInTheGivenOrder) {
  const std::vector<int64_t> ids = {4, 9};
  const std::vector<float> values = {10, 11, 20, 21, 30, 31};  // Rows 0, 1, 2 of 2.
  const std::vector<size_t> order = {2, 0};
  grpc::ByteBuffer frame = SparseRowsFrame(Header(), ids, values, 2, order);
  auto got = SparseFrame::Parse(frame);
  ASSERT_TRUE(got.ok());
  std::vector<int64_t> got_ids;
  std::vector<float> got_values;
  ASSERT_TRUE(ReadSparseFrame(*got, 2, got_ids, &got_values).ok());
  EXPECT_EQ(got_values, (std::vector<float>{30, 31, 10, 11}));
}

TEST(SparseFramesTest, ValuesReadIntoABufferOfTheirSize) {
  const std::vector<int64_t> ids = {4, 9, 2};
  const std::vector<float> values = {10, 11, 20, 21, 30, 31};
  grpc::ByteBuffer frame = SparseRowsFrame(Header(), ids, values, 2);
  for (size_t piece : {size_t{3}, size_t{4096}}) {
    grpc::ByteBuffer cut = Recut(frame, piece);
    auto got = SparseFrame::Parse(cut);
    ASSERT_TRUE(got.ok()) << got.status();
    std::vector<int64_t> got_ids;
    std::vector<float> got_values(6, -1.0f);
    ASSERT_TRUE(ReadSparseFrame(*got, 2, got_ids, absl::MakeSpan(got_values)).ok());
    EXPECT_EQ(got_ids, ids);
    EXPECT_EQ(got_values, values);
    // A buffer of the wrong size is refused, naming the table.
    std::vector<float> short_buffer(5);
    const absl::Status s = ReadSparseFrame(*got, 2, got_ids, absl::MakeSpan(short_buffer));
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find("'emb'"), std::string::npos) << s;
  }
}

TEST(SparseFramesTest, IdsOnlyAndWrongSizesAreRefused) {
  const std::vector<int64_t> ids = {1, 2};
  grpc::ByteBuffer frame = SparseRowsFrame(Header(), ids, {}, 4);
  auto got = SparseFrame::Parse(frame);
  ASSERT_TRUE(got.ok());
  std::vector<int64_t> got_ids;
  ASSERT_TRUE(ReadSparseFrame(*got, 4, got_ids, nullptr).ok());
  EXPECT_EQ(got_ids, ids);
  // Read as a push (values expected): too short.
  std::vector<float> values;
  const absl::Status s = ReadSparseFrame(*got, 4, got_ids, &values);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("'emb'"), std::string::npos) << s;
  // A header that claims more ids than the payload holds.
  proto::SparseFrameHeader lying = Header();
  lying.set_rows(1000);
  grpc::ByteBuffer bad = FrameReferencing(lying, "12345678");
  auto parsed = SparseFrame::Parse(bad);
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(ReadSparseFrame(*parsed, 4, got_ids, nullptr)));
  lying.set_rows(-1);
  grpc::ByteBuffer negative = FrameReferencing(lying, "");
  parsed = SparseFrame::Parse(negative);
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(ReadSparseFrame(*parsed, 4, got_ids, nullptr)));
}

}  // namespace
}  // namespace dptrain
