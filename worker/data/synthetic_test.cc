#include "worker/data/synthetic.h"

#include "gtest/gtest.h"

namespace dptrain {
namespace {

TEST(SyntheticTest, ShapesRangesAndDeterminism) {
  const Dataset a = MakeSyntheticDataset(200, 4, 5, 9);
  EXPECT_EQ(a.size, 200);
  EXPECT_EQ(a.rows, 4);
  EXPECT_EQ(a.cols, 5);
  ASSERT_EQ(a.images.size(), 200u * 20);
  ASSERT_EQ(a.labels.size(), 200u);
  std::vector<int> histogram(10, 0);
  for (nn::Label label : a.labels) {
    ASSERT_LT(label, 10);
    ++histogram[label];
  }
  for (int count : histogram) EXPECT_GT(count, 0);
  for (float p : a.images) {
    ASSERT_GE(p, 0.0f);
    ASSERT_LE(p, 1.0f);
  }
  const Dataset b = MakeSyntheticDataset(200, 4, 5, 9);
  EXPECT_EQ(a.images, b.images);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_NE(a.images, MakeSyntheticDataset(200, 4, 5, 10).images);
}

TEST(SyntheticTest, DegenerateArgumentsGiveEmptyDataset) {
  EXPECT_EQ(MakeSyntheticDataset(0, 28, 28, 1).size, 0);
  EXPECT_EQ(MakeSyntheticDataset(-3, 28, 28, 1).images.size(), 0u);
  EXPECT_EQ(MakeSyntheticDataset(5, 0, 28, 1).size, 0);
}

}  // namespace
}  // namespace dptrain
