#include "worker/data/sampler.h"

#include <algorithm>
#include <map>
#include <vector>

#include "gtest/gtest.h"

namespace dptrain {
namespace {

DistributedSampler MustCreate(int64_t n, int world, int rank, uint64_t seed = 42,
                              bool shuffle = true) {
  absl::StatusOr<DistributedSampler> s =
      DistributedSampler::Create({n, world, rank, seed, shuffle});
  EXPECT_TRUE(s.ok()) << s.status();
  return *std::move(s);
}

// All ranks' indices for one epoch.
std::vector<std::vector<int64_t>> AllRanks(int64_t n, int world, int64_t epoch,
                                           uint64_t seed = 42) {
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < world; ++r) out.push_back(MustCreate(n, world, r, seed).EpochIndices(epoch));
  return out;
}

TEST(SamplerTest, DivisibleIsDisjointAndCompleteCover) {
  const auto ranks = AllRanks(120, 4, 0);
  std::vector<int> seen(120, 0);
  for (const auto& indices : ranks) {
    EXPECT_EQ(indices.size(), 30u);
    for (int64_t i : indices) {
      ASSERT_GE(i, 0);
      ASSERT_LT(i, 120);
      ++seen[i];
    }
  }
  for (int count : seen) EXPECT_EQ(count, 1);
}

TEST(SamplerTest, NotDivisiblePadsFromTheStartOfThePermutation) {
  const int64_t n = 10;
  const int world = 4;  // total_size 12: two indices repeated.
  const DistributedSampler s0 = MustCreate(n, world, 0);
  EXPECT_EQ(s0.num_samples(), 3);
  EXPECT_EQ(s0.total_size(), 12);
  const std::vector<int64_t> global = s0.GlobalIndices(3);
  ASSERT_EQ(global.size(), 12u);
  EXPECT_EQ(global[10], global[0]);
  EXPECT_EQ(global[11], global[1]);
  std::vector<int64_t> head(global.begin(), global.begin() + n);
  std::sort(head.begin(), head.end());
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(head[i], i);

  std::map<int64_t, int> seen;
  const auto ranks = AllRanks(n, world, 3);
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(ranks[r].size(), 3u) << "rank " << r;
    for (int64_t k = 0; k < 3; ++k) {
      EXPECT_EQ(ranks[r][k], global[r + k * world]);  // Interleaved.
      ++seen[ranks[r][k]];
    }
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(n));  // Every index at least once.
  EXPECT_EQ(seen[global[0]], 2);
  EXPECT_EQ(seen[global[1]], 2);
}

TEST(SamplerTest, DatasetSmallerThanWorldSizeRepeatsCyclically) {
  const int64_t n = 3;
  const int world = 8;
  const auto ranks = AllRanks(n, world, 0);
  const std::vector<int64_t> global = MustCreate(n, world, 0).GlobalIndices(0);
  ASSERT_EQ(global.size(), 8u);
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(ranks[r].size(), 1u);
    EXPECT_EQ(ranks[r][0], global[r % n]);
  }
}

TEST(SamplerTest, WorldSizeOneIsAPermutation) {
  const DistributedSampler s = MustCreate(1000, 1, 0);
  EXPECT_EQ(s.num_samples(), 1000);
  std::vector<int64_t> indices = s.EpochIndices(5);
  EXPECT_EQ(indices, s.GlobalIndices(5));
  std::vector<int64_t> identity(1000);
  for (int64_t i = 0; i < 1000; ++i) identity[i] = i;
  EXPECT_NE(indices, identity);
  std::sort(indices.begin(), indices.end());
  EXPECT_EQ(indices, identity);
}

TEST(SamplerTest, NoShuffleIsIdentityThenInterleaved) {
  const DistributedSampler s = MustCreate(7, 3, 1, 42, /*shuffle=*/false);
  EXPECT_EQ(s.EpochIndices(9), (std::vector<int64_t>{1, 4, 0}));
}

TEST(SamplerTest, SingleExample) {
  EXPECT_EQ(MustCreate(1, 1, 0).EpochIndices(0), std::vector<int64_t>{0});
  EXPECT_EQ(MustCreate(1, 3, 2).EpochIndices(7), std::vector<int64_t>{0});
}

TEST(SamplerTest, InvalidOptions) {
  EXPECT_EQ(DistributedSampler::Create({10, 0, 0, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DistributedSampler::Create({10, 4, 4, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DistributedSampler::Create({10, 4, -1, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DistributedSampler::Create({0, 1, 0, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DistributedSampler::Create({-5, 1, 0, 1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SamplerTest, DeterministicPerSeedAndEpoch) {
  const DistributedSampler a = MustCreate(500, 3, 1, 7);
  const DistributedSampler b = MustCreate(500, 3, 1, 7);
  EXPECT_EQ(a.EpochIndices(4), b.EpochIndices(4));
  EXPECT_NE(a.EpochIndices(4), a.EpochIndices(5));
  EXPECT_NE(a.EpochIndices(0), MustCreate(500, 3, 1, 8).EpochIndices(0));
}

// Pins the PRNG so that a change of generator or shuffle (which would change every run's data
// order) is caught. Computed once from this implementation.
TEST(SamplerTest, PermutationIsStable) {
  EXPECT_EQ(MustCreate(10, 1, 0, 42).EpochIndices(0),
            (std::vector<int64_t>{9, 6, 2, 0, 1, 4, 3, 8, 5, 7}));
}

// The data-parallel property: the union of all ranks' batch i is the global slice
// [i*N*b, (i+1)*N*b), the samples of batch i of one worker with batch N*b.
TEST(SamplerTest, UnionOfRankBatchesIsTheSingleWorkerBatch) {
  for (int64_t n : {96, 100, 7}) {
    for (int world : {1, 2, 3, 4}) {
      for (int b : {1, 5, 8}) {
        const auto ranks = AllRanks(n, world, 11, 3);
        const DistributedSampler single = MustCreate(n, 1, 0, 3);
        const std::vector<int64_t> one = single.EpochIndices(11);
        const std::vector<int64_t> global = MustCreate(n, world, 0, 3).GlobalIndices(11);
        const int64_t num_samples = ranks[0].size();
        const int64_t batches = NumBatches(num_samples, b);
        ASSERT_EQ(NumBatches(global.size(), world * b), batches);
        for (int64_t i = 0; i < batches; ++i) {
          std::vector<int64_t> from_ranks;
          for (int r = 0; r < world; ++r) {
            const int64_t end = std::min<int64_t>((i + 1) * b, num_samples);
            from_ranks.insert(from_ranks.end(), ranks[r].begin() + i * b, ranks[r].begin() + end);
          }
          const int64_t lo = i * world * b;
          const int64_t hi = std::min<int64_t>((i + 1) * world * b, global.size());
          std::vector<int64_t> slice(global.begin() + lo, global.begin() + hi);
          std::sort(from_ranks.begin(), from_ranks.end());
          std::sort(slice.begin(), slice.end());
          ASSERT_EQ(from_ranks, slice) << "n=" << n << " world=" << world << " b=" << b;
          // Apart from padding, the slice is the single worker's batch i.
          for (int64_t j = lo; j < std::min(hi, n); ++j) ASSERT_EQ(global[j], one[j]);
        }
      }
    }
  }
}

TEST(SamplerTest, NumBatches) {
  EXPECT_EQ(NumBatches(0, 4), 0);
  EXPECT_EQ(NumBatches(8, 4), 2);
  EXPECT_EQ(NumBatches(9, 4), 3);
  EXPECT_EQ(NumBatches(1, 64), 1);
}

}  // namespace
}  // namespace dptrain
