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
  for (int i = 0; i < n; ++i) d.labels.push_back(static_cast<nn::Label>(i % 10));
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

// Ids (token ids) and images are not each other's data, and a model with embedding tables
// refuses, before any step, an id its tables do not have, naming the sample and the position.
TEST(BatchTest, IdsAreTheirOwnKindAndBelowTheTables) {
  Dataset ids = Tiny(2, 1, 3);  // 2 samples of 3 ids: 0 1 2 | 3 4 5.
  ids.ids = true;
  ids.channels = 3;
  ids.rows = ids.cols = 1;
  EXPECT_TRUE(CheckImageShape(ids, {3, 1, 1, true, 6}, "text", "the training set").ok());
  EXPECT_TRUE(CheckImageShape(ids, {3, 1, 1, true, 0}, "text", "the training set").ok());
  EXPECT_EQ(CheckImageShape(ids, {3, 1, 1, true, 5}, "text", "the training set").message(),
            "the training set: id 5 at sample 1, position 2 is not below 5, the rows of model "
            "text's embedding table");
  EXPECT_EQ(CheckImageShape(ids, {4, 1, 1, true, 6}, "text", "the test set").message(),
            "the test set holds 3 integer id(s) per sample but model text takes 4 integer id(s) "
            "per sample");
  EXPECT_EQ(CheckImageShape(ids, {3, 1, 1}, "mlp", "the test set").message(),
            "the test set holds 3 integer id(s) per sample but model mlp takes 3 feature(s) "
            "per sample (an integer .npy array of rank 2 is read as ids: save features as "
            "float32)");
  EXPECT_EQ(CheckImageShape(Tiny(2, 1, 1), {3, 1, 1}, "mlp", "the test set").message(),
            "the test set holds 1 feature(s) per sample but model mlp takes 3 feature(s) per "
            "sample");
  EXPECT_EQ(CheckImageShape(Tiny(1, 1, 3), {1, 1, 3, true}, "text", "the test set").message(),
            "the test set holds 1x1x3 images but model text takes 3 integer id(s) per sample");
}

TEST(BatchTest, GathersInIndexOrderAndNeverPastItsBuffers) {
  const Dataset d = Tiny(4, 2, 2);
  std::vector<float> images(3 * 4, -1);
  std::vector<nn::Label> labels(3, 99);
  const std::vector<int64_t> order = {3, 0, 2};
  ASSERT_TRUE(GatherBatch(d, order, absl::MakeSpan(images), absl::MakeSpan(labels)).ok());
  EXPECT_EQ(images, (std::vector<float>{12, 13, 14, 15, 0, 1, 2, 3, 8, 9, 10, 11}));
  EXPECT_EQ(labels, (std::vector<nn::Label>{3, 0, 2}));

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

// Issue 27: CIFAR and ImageFolder data have 3 channels; the channels are compared too.
TEST(BatchTest, ChannelsAreComparedAndGatheredWhole) {
  Dataset rgb = Tiny(3, 2, 2);  // 3 images of 1x2x2 = 12 values, read as 1 image of 3x2x2.
  rgb.size = 1;
  rgb.channels = 3;
  rgb.labels.resize(1);
  EXPECT_EQ(rgb.image_size(), 12);
  EXPECT_TRUE(CheckImageShape(rgb, {3, 2, 2}, "resnet", "the training set").ok());
  const absl::Status s = CheckImageShape(rgb, {1, 2, 2}, "lenet", "the training set");
  EXPECT_EQ(s.message(), "the training set holds 3x2x2 images but model lenet takes 1x2x2 inputs");
  EXPECT_EQ(CheckImageShape(Tiny(1, 2, 2), {3, 2, 2}, "resnet", "the test set").message(),
            "the test set holds 1x2x2 images but model resnet takes 3x2x2 inputs");

  Dataset two = Tiny(4, 2, 2);  // Read as 2 images of 2x2x2.
  two.size = 2;
  two.channels = 2;
  two.labels.resize(2);
  std::vector<float> images(8, -1);
  std::vector<nn::Label> labels(1);
  const std::vector<int64_t> second = {1};
  ASSERT_TRUE(GatherBatch(two, second, absl::MakeSpan(images), absl::MakeSpan(labels)).ok());
  EXPECT_EQ(images, (std::vector<float>{8, 9, 10, 11, 12, 13, 14, 15}));
  two.KeepFirst(1);
  EXPECT_EQ(two.images, (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
}

}  // namespace
}  // namespace dptrain
