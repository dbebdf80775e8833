#include "worker/nn/batch_sample.h"

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace dptrain {
namespace nn {
namespace {

TEST(BatchSampleTest, CarriedShiftedAndNamed) {
  const absl::Status plain = absl::InvalidArgumentError("bad");
  EXPECT_FALSE(BatchSampleOf(plain).has_value());
  EXPECT_EQ(ShiftBatchSample(plain, 5), plain);
  EXPECT_EQ(NameDataSample(
                plain, [](int64_t k) { return k; }, "the set"),
            plain);

  const absl::Status at = AtBatchSample(
      absl::InvalidArgumentError("id 7 (" + BatchSampleText(2) + ", position 1) is bad"), 2);
  EXPECT_EQ(BatchSampleOf(at), 2);
  const absl::Status node = Prefixed(at, "node 'e' (Gather): ");
  EXPECT_EQ(node.message(), "node 'e' (Gather): id 7 (sample 2 of the batch, position 1) is bad");
  EXPECT_EQ(BatchSampleOf(node), 2);
  const absl::Status shifted = ShiftBatchSample(node, 10);  // A piece that began at sample 10.
  EXPECT_EQ(shifted.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shifted.message(),
            "node 'e' (Gather): id 7 (sample 12 of the batch, position 1) is bad");
  EXPECT_EQ(BatchSampleOf(shifted), 12);
  // A quoted name holding the words is left as it is.
  const absl::Status named_node =
      ShiftBatchSample(Prefixed(at, "node 'sample 2 of the batch' (Gather): "), 10);
  EXPECT_EQ(named_node.message(),
            "node 'sample 2 of the batch' (Gather): id 7 (sample 12 of the batch, position 1) "
            "is bad");
  const absl::Status named = NameDataSample(
      shifted, [](int64_t k) { return 1000 + k; }, "the training set");
  EXPECT_EQ(named.message(),
            "node 'e' (Gather): id 7 (sample 12 of the batch, position 1) is bad; sample 12 of "
            "the batch is sample 1012 of the training set");
}

}  // namespace
}  // namespace nn
}  // namespace dptrain
