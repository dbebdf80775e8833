#include "worker/data/batch.h"

#include <vector>

#include "gtest/gtest.h"

namespace dptrain {
namespace {

Dataset Tiny(int n, int rows, int cols) {
  Dataset d;
  d.size = n;
  d.rows = rows;
  d.cols = cols;
  for (int i = 0; i < n * rows * cols; ++i) d.images.push_back(static_cast<float>(i));
  for (int i = 0; i < n; ++i) d.labels.push_back(static_cast<uint8_t>(i % 10));
  return d;
}

// Issue 30 item 2: 8x8 or 32x32 images for a model that takes 1x28x28 are one clear error.
TEST(BatchTest, ImagesOfAnotherSizeAreOneClearError) {
  const ImageShape lenet{1, 28, 28};
  EXPECT_TRUE(CheckImageShape(Tiny(1, 28, 28), lenet, "lenet", "the training set").ok());
  for (auto [rows, cols] : {std::pair{8, 8}, std::pair{32, 32}, std::pair{28, 27}}) {
    const absl::Status s = CheckImageShape(Tiny(1, rows, cols), lenet, "lenet", "the test set");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(), absl::StrCat("the test set holds 1x", rows, "x", cols,
                                        " images but model lenet takes 1x28x28 inputs"));
  }
}

TEST(BatchTest, GathersInIndexOrderAndNeverPastItsBuffers) {
  const Dataset d = Tiny(4, 2, 2);
  std::vector<float> images(3 * 4, -1);
  std::vector<uint8_t> labels(3, 99);
  const std::vector<int64_t> order = {3, 0, 2};
  ASSERT_TRUE(GatherBatch(d, order, absl::MakeSpan(images), absl::MakeSpan(labels)).ok());
  EXPECT_EQ(images, (std::vector<float>{12, 13, 14, 15, 0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ(labels, (std::vector<uint8_t>{3, 0, 2}));

  std::vector<float> small(2 * 4);
  EXPECT_EQ(GatherBatch(d, order, absl::MakeSpan(small), absl::MakeSpan(labels)).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int64_t> outside = {4};
  EXPECT_EQ(GatherBatch(d, outside, absl::MakeSpan(images), absl::MakeSpan(labels)).code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int64_t> negative = {-1};
  EXPECT_EQ(GatherBatch(d, negative, absl::MakeSpan(images), absl::MakeSpan(labels)).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dptrain
