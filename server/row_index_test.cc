#include "server/row_index.h"

#include <random>
#include <unordered_map>

#include "gtest/gtest.h"

namespace dptrain {
namespace {

TEST(RowIndexTest, AgreesWithAMapThroughGrowth) {
  RowIndex index;
  std::unordered_map<int64_t, int64_t> reference;
  std::mt19937_64 rng(3);
  // Ids of one shard of three (same residue), clustered and spread, with repeats.
  for (int i = 0; i < 200000; ++i) {
    const int64_t id = 3 * static_cast<int64_t>(rng() % (i % 2 == 0 ? 1000 : 100000000)) + 2;
    bool created = false;
    const int64_t slot = index.FindOrAdd(id, created);
    auto [it, fresh] = reference.try_emplace(id, static_cast<int64_t>(reference.size()));
    ASSERT_EQ(created, fresh) << id;
    ASSERT_EQ(slot, it->second) << id;
  }
  EXPECT_EQ(index.size(), static_cast<int64_t>(reference.size()));
  for (const auto& [id, slot] : reference) ASSERT_EQ(index.Find(id), slot);
  EXPECT_EQ(index.Find(0), -1);
  EXPECT_EQ(index.Find(1), -1);
  int64_t seen = 0;
  index.ForEach([&](int64_t id, int64_t slot) {
    EXPECT_EQ(reference.at(id), slot);
    ++seen;
  });
  EXPECT_EQ(seen, index.size());
}

TEST(RowIndexTest, ReserveKeepsRowsAndClearDropsThem) {
  RowIndex index;
  bool created = false;
  EXPECT_EQ(index.FindOrAdd(7, created), 0);
  EXPECT_TRUE(created);
  EXPECT_EQ(index.FindOrAdd(9, created), 1);
  EXPECT_EQ(index.FindOrAdd(7, created), 0);
  EXPECT_FALSE(created);
  index.Reserve(100000);
  EXPECT_EQ(index.Find(7), 0);
  EXPECT_EQ(index.Find(9), 1);
  EXPECT_EQ(index.size(), 2);
  EXPECT_EQ(index.Find(-1), -1);  // Negative ids are never held (-1 marks empty entries).
  index.Clear();
  EXPECT_EQ(index.size(), 0);
  EXPECT_EQ(index.Find(7), -1);
  EXPECT_EQ(index.FindOrAdd(9, created), 0);
}

}  // namespace
}  // namespace dptrain
