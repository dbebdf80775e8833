// The bounds on what an Init may declare: every field checked with overflow-safe arithmetic,
// each failure InvalidArgument naming the field.
#include "server/model_limits.h"

#include <string>

#include "gtest/gtest.h"

namespace dptrain {
namespace {

void ExpectInvalid(const ModelDescription& m, const ModelLimits& limits,
                   const std::string& message) {
  absl::Status s = ValidateModel(m, limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(message), std::string::npos) << s;
}

TEST(ModelLimitsTest, AcceptsASaneModel) {
  EXPECT_TRUE(ValidateModel({{{"w", 6}, {"b", 2}}, 2, 4}, ModelLimits()).ok());
}

TEST(ModelLimitsTest, ElementCountsWhoseByteSizeOverflowsNameTheField) {
  ExpectInvalid({{{"w", 6}, {"x", int64_t{1} << 62}}, 1, 4}, ModelLimits(),
                "tensors[1].num_elements = 4611686018427387904: its fp32 byte size overflows");
  ExpectInvalid({{{"w", INT64_MAX}}, 1, 4}, ModelLimits(), "tensors[0].num_elements");
  ExpectInvalid({{{"w", 0}}, 1, 4}, ModelLimits(), "tensors[0].num_elements must be >= 1");
  ExpectInvalid({{{"w", -5}}, 1, 4}, ModelLimits(), "tensors[0].num_elements must be >= 1");
}

TEST(ModelLimitsTest, TotalBytesAreBoundedByMaxModelBytes) {
  ModelLimits limits;
  limits.max_model_bytes = 100;
  EXPECT_TRUE(ValidateModel({{{"a", 20}, {"b", 5}}, 1, 25}, limits).ok());  // Exactly 100.
  ExpectInvalid({{{"a", 20}, {"b", 6}}, 1, 25}, limits,
                "tensors[1].num_elements = 6 brings the model past the limit of 100 bytes");
  // Sums that would wrap around int64 are caught, not wrapped.
  ExpectInvalid({{{"a", int64_t{1} << 60}, {"b", int64_t{1} << 60}}, 1, 1 << 20}, ModelLimits(),
                "tensors[0].num_elements");
}

TEST(ModelLimitsTest, ChunkCountIsBoundedWhateverTheChunkSize) {
  // The review's case: one 4M-element tensor in chunks of 1.
  ExpectInvalid({{{"w", int64_t{1} << 22}}, 1, 1}, ModelLimits(),
                "tensors[0].num_elements = 4194304 in chunks of max_chunk_elements = 1 brings "
                "the model past the limit of 65536 chunks");
  ModelLimits limits;
  limits.max_chunks = 3;
  EXPECT_TRUE(ValidateModel({{{"a", 8}, {"b", 4}}, 1, 4}, limits).ok());  // 2 + 1 chunks.
  ExpectInvalid({{{"a", 9}, {"b", 4}}, 1, 4}, limits, "tensors[1].num_elements");
}

TEST(ModelLimitsTest, ChunkSizeShardsAndTensorListAreBounded) {
  ExpectInvalid({{{"w", 6}}, 1, 0}, ModelLimits(), "max_chunk_elements must be in [1, ");
  ExpectInvalid({{{"w", 6}}, 1, int64_t{1} << 40}, ModelLimits(), "max_chunk_elements");
  ExpectInvalid({{{"w", 6}}, 0, 4}, ModelLimits(), "num_shards must be >= 1");
  ExpectInvalid({{}, 1, 4}, ModelLimits(), "tensors: the model is empty");
  ModelLimits limits;
  limits.max_chunks = 1;
  ExpectInvalid({{{"a", 1}, {"b", 1}}, 1, 4}, limits, "tensors: 2 tensors");
}

}  // namespace
}  // namespace dptrain
