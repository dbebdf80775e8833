// HoldOut: a seeded split, the same for the same seed, every sample on exactly one side with its
// own label (or targets) and values, each store kind kept; the refusals.
#include "worker/data/holdout.h"

#include <algorithm>
#include <memory>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace dptrain {
namespace {

// `n` samples of two float values each, sample i's values {i, -i}, label i % 3.
Dataset Numbered(int n) {
  Dataset d;
  d.size = n;
  d.channels = 2;
  d.rows = d.cols = 1;
  d.num_classes = 3;
  for (int i = 0; i < n; ++i) {
    d.images.push_back(static_cast<float>(i));
    d.images.push_back(static_cast<float>(-i));
    d.labels.push_back(i % 3);
  }
  return d;
}

// The original indices of a part's samples (its first values).
std::vector<int> Indices(const Dataset& part) {
  std::vector<int> out;
  for (int64_t i = 0; i < part.size; ++i) out.push_back(static_cast<int>(part.image(i)[0]));
  return out;
}

TEST(HoldOutTest, SplitsEverySampleOnceWithItsLabelAndIsSeeded) {
  absl::StatusOr<HeldOut> split = HoldOut(Numbered(10), 0.25, 7);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(split->test.size, 3);  // ceil(2.5), as scikit-learn's test_size.
  EXPECT_EQ(split->train.size, 7);
  EXPECT_TRUE(split->train.consistent());
  EXPECT_TRUE(split->test.consistent());
  EXPECT_EQ(split->test.num_classes, 3);
  std::set<int> seen;
  for (const Dataset* part : {&split->train, &split->test}) {
    const std::vector<int> indices = Indices(*part);
    EXPECT_TRUE(std::is_sorted(indices.begin(), indices.end())) << "the data's order kept";
    for (int64_t k = 0; k < part->size; ++k) {
      const int i = indices[k];
      EXPECT_TRUE(seen.insert(i).second) << i;
      EXPECT_EQ(part->image(k)[1], -i);
      EXPECT_EQ(part->labels[k], i % 3);
    }
  }
  EXPECT_EQ(seen.size(), 10u);
  // The same seed, the same split (every rank holds out the same samples); another seed, another.
  EXPECT_EQ(Indices(HoldOut(Numbered(10), 0.25, 7)->test), Indices(split->test));
  bool differs = false;
  for (uint64_t seed = 8; seed < 12; ++seed) {
    differs |= Indices(HoldOut(Numbered(10), 0.25, seed)->test) != Indices(split->test);
  }
  EXPECT_TRUE(differs);
}

TEST(HoldOutTest, KeepsByteStoresAndRegressionTargets) {
  Dataset bytes;
  bytes.size = 4;
  bytes.rows = bytes.cols = 1;
  bytes.byte_storage = true;
  bytes.bytes = {10, 20, 30, 40};
  bytes.norm_mean = {0.5f};
  bytes.norm_inv_std = {2.0f};
  bytes.targets_per_sample = 2;
  bytes.num_classes = 0;
  bytes.targets = {1, 10, 2, 20, 3, 30, 4, 40};
  absl::StatusOr<HeldOut> split = HoldOut(bytes, 0.5, 1);
  ASSERT_TRUE(split.ok()) << split.status();
  for (const Dataset* part : {&split->train, &split->test}) {
    ASSERT_EQ(part->size, 2);
    EXPECT_TRUE(part->byte_storage && part->images.empty() && part->consistent());
    EXPECT_EQ(part->norm_mean, bytes.norm_mean);
    EXPECT_TRUE(part->labels.empty());
    for (int k = 0; k < 2; ++k) {
      const int i = part->bytes[k] / 10;  // Sample i - 1 of the original.
      EXPECT_EQ(part->targets[2 * k], i);
      EXPECT_EQ(part->targets[2 * k + 1], 10 * i);
    }
  }
}

TEST(HoldOutTest, Refusals) {
  EXPECT_EQ(HoldOut(Numbered(10), 0, 1).status().message(),
            "the fraction to hold out must be in (0, 1), got 0");
  EXPECT_EQ(HoldOut(Numbered(10), 1, 1).status().message(),
            "the fraction to hold out must be in (0, 1), got 1");
  EXPECT_EQ(HoldOut(Numbered(1), 0.1, 1).status().message(),
            "holding out 1 of 1 sample(s) (ceil of 0.1 of them) leaves none to train on");
  Dataset short_labels = Numbered(4);
  short_labels.labels.pop_back();
  EXPECT_EQ(HoldOut(short_labels, 0.5, 1).status().code(), absl::StatusCode::kInvalidArgument);
  Dataset streamed;
  streamed.size = 4;
  streamed.byte_storage = true;
  struct NoSource : ImageSource {
    void Plan(absl::Span<const int64_t>) override {}
    absl::Status Read(int64_t, uint8_t*) override { return absl::OkStatus(); }
  };
  streamed.source = std::make_shared<NoSource>();
  EXPECT_EQ(HoldOut(streamed, 0.5, 1).status().message(),
            "a training set read as needed cannot be split (nothing is held): load it "
            "(--data_loading=load), or save a test split");
}

}  // namespace
}  // namespace dptrain
