#include "common/shard_map.h"

#include <set>

#include "gtest/gtest.h"

namespace dptrain {
namespace {

ShardMap MustBuild(const std::vector<TensorInfo>& t, int shards, int64_t max_chunk) {
  auto map = ShardMap::Build(t, {shards, max_chunk});
  EXPECT_TRUE(map.ok()) << map.status();
  return *std::move(map);
}

// Every element of every tensor is covered exactly once, in order.
void ExpectExactCover(const ShardMap& map) {
  int64_t flat = 0;
  int prev_tensor = -1;
  int64_t next_offset = 0;
  for (const ChunkSpec& c : map.chunks()) {
    if (c.tensor_id != prev_tensor) {
      EXPECT_EQ(prev_tensor + 1, c.tensor_id);
      if (prev_tensor >= 0) {
        EXPECT_EQ(next_offset, map.tensors()[prev_tensor].num_elements);
      }
      prev_tensor = c.tensor_id;
      next_offset = 0;
    }
    EXPECT_EQ(c.offset, next_offset);
    EXPECT_EQ(c.flat_offset, flat);
    EXPECT_GE(c.count, 1);
    EXPECT_LE(c.count, map.options().max_chunk_elements);
    next_offset += c.count;
    flat += c.count;
  }
  EXPECT_EQ(flat, map.total_elements());
  int64_t by_shard = 0;
  for (int s = 0; s < map.options().num_shards; ++s) by_shard += map.ShardElements(s);
  EXPECT_EQ(by_shard, map.total_elements());
}

TEST(ShardMapTest, SingleShardOwnsEverything) {
  ShardMap map = MustBuild({{"w", 10}, {"b", 3}}, 1, 4);
  ExpectExactCover(map);
  EXPECT_EQ(map.chunks().size(), 4u);  // 10 -> 4+3+3, 3 -> 3.
  EXPECT_EQ(map.ChunksOfShard(0).size(), 4u);
  EXPECT_EQ(map.chunks()[0].count, 4);
  EXPECT_EQ(map.chunks()[1].count, 3);
}

TEST(ShardMapTest, LargeTensorSpreadsAcrossShards) {
  ShardMap map = MustBuild({{"big", 1000}, {"small", 10}}, 4, 250);
  ExpectExactCover(map);
  std::set<int> owners;
  for (const ChunkSpec& c : map.chunks()) {
    if (c.tensor_id == 0) owners.insert(c.shard);
  }
  EXPECT_EQ(owners.size(), 4u);
}

TEST(ShardMapTest, MoreShardsThanChunksLeavesSomeEmpty) {
  ShardMap map = MustBuild({{"a", 5}}, 3, 100);
  ExpectExactCover(map);
  EXPECT_EQ(map.ChunksOfShard(0).size(), 1u);
  EXPECT_TRUE(map.ChunksOfShard(1).empty());
  EXPECT_TRUE(map.ChunksOfShard(2).empty());
}

TEST(ShardMapTest, BalancedByBytes) {
  // LeNet-like sizes: the largest shard is within one chunk of the mean.
  ShardMap map = MustBuild({{"c1.w", 150}, {"c1.b", 6}, {"c2.w", 2400}, {"c2.b", 16},
                            {"f1.w", 48000}, {"f1.b", 120}, {"f2.w", 10080}, {"f2.b", 84},
                            {"f3.w", 840}, {"f3.b", 10}},
                           2, 8192);
  ExpectExactCover(map);
  const int64_t diff = std::abs(map.ShardElements(0) - map.ShardElements(1));
  EXPECT_LE(diff, 8192);
}

TEST(ShardMapTest, DeterministicAcrossCalls) {
  std::vector<TensorInfo> t = {{"a", 777}, {"b", 1}, {"c", 4096}, {"d", 33}};
  ShardMap m1 = MustBuild(t, 3, 100);
  ShardMap m2 = MustBuild(t, 3, 100);
  ASSERT_EQ(m1.chunks().size(), m2.chunks().size());
  for (size_t i = 0; i < m1.chunks().size(); ++i) {
    EXPECT_EQ(m1.chunks()[i].shard, m2.chunks()[i].shard);
  }
}

TEST(ShardMapTest, FindKeys) {
  ShardMap map = MustBuild({{"a", 10}, {"b", 3}}, 2, 4);
  EXPECT_EQ(map.Find(0, 0), 0);
  EXPECT_EQ(map.Find(0, 2), 2);
  EXPECT_EQ(map.Find(1, 0), 3);
  EXPECT_EQ(map.Find(0, 3), -1);
  EXPECT_EQ(map.Find(1, 1), -1);
  EXPECT_EQ(map.Find(2, 0), -1);
  EXPECT_EQ(map.Find(-1, 0), -1);
  EXPECT_EQ(map.Find(0, -1), -1);
}

TEST(ShardMapTest, RejectsBadInput) {
  EXPECT_FALSE(ShardMap::Build({}, {1, 4}).ok());
  EXPECT_FALSE(ShardMap::Build({{"a", 0}}, {1, 4}).ok());
  EXPECT_FALSE(ShardMap::Build({{"a", 3}}, {0, 4}).ok());
  EXPECT_FALSE(ShardMap::Build({{"a", 3}}, {1, 0}).ok());
}

}  // namespace
}  // namespace dptrain
