#include "server/sparse_checkpoint.h"

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file_system.h"
#include "gtest/gtest.h"
#include "server/sparse_table.h"

namespace dptrain {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

SparseTableSpec Spec(const std::string& optimizer) {
  SparseTableSpec s;
  s.name = "user.id-emb_0";
  s.rows = 1000;
  s.dim = 4;
  s.optimizer = optimizer;
  s.lr = 0.1f;
  s.seed = 3;
  return s;
}

// Step k's gradients of rank r: a few rows, some shared by both ranks.
void PushStep(SparseTable& table, int64_t k, int workers) {
  std::vector<std::thread> threads;
  for (int r = 0; r < workers; ++r) {
    threads.emplace_back([&table, k, r] {
      std::vector<int64_t> ids = {k % 7, 10 + r, 100 + (k * 13 + r) % 50};
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      std::vector<float> grads(ids.size() * 4);
      for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * (i + 1) * (k + 1) - 0.02f * r;
      ASSERT_TRUE(table.Push(r, k, ids, grads, Soon()).ok());
    });
  }
  for (auto& t : threads) t.join();
}

std::vector<float> AllRows(SparseTable& table) {
  std::vector<int64_t> ids(200);
  for (int i = 0; i < 200; ++i) ids[i] = i;
  std::vector<float> out(ids.size() * 4);
  EXPECT_TRUE(table.Pull(ids, absl::MakeSpan(out)).ok());
  return out;
}

// For every optimizer: a table restored from its checkpoint of step 3 and given steps 3..5
// again ends bit-identical to the table that never stopped (the state and the per-row adam
// counts travel); the file survives serialisation exactly.
TEST(SparseCheckpointTest, RestoreThenTheSameStepsEndsBitIdentical) {
  for (const std::string optimizer : {"sgd", "adagrad", "adam"}) {
    SCOPED_TRACE(optimizer);
    SparseTableOptions o;
    o.num_workers = 2;
    SparseTable table(Spec(optimizer), o);
    for (int k = 0; k < 3; ++k) PushStep(table, k, 2);
    std::vector<float> pulled(4);
    ASSERT_TRUE(table.Pull(std::vector<int64_t>{999}, absl::MakeSpan(pulled)).ok());
    EXPECT_FALSE(table.Snapshot(2).has_value());
    auto snapshot = table.Snapshot(3);
    ASSERT_TRUE(snapshot.has_value());
    EXPECT_EQ(snapshot->ids.back(), 999);  // Pulled only: held, no state yet.
    snapshot->job_id = "job";
    auto parsed = ParseSparseCheckpoint(SerializeSparseCheckpoint(*snapshot));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->ids, snapshot->ids);
    EXPECT_EQ(parsed->weights, snapshot->weights);
    EXPECT_EQ(parsed->state_a, snapshot->state_a);
    EXPECT_EQ(parsed->state_b, snapshot->state_b);
    EXPECT_EQ(parsed->state_steps, snapshot->state_steps);
    EXPECT_EQ(parsed->job_id, "job");
    for (int k = 3; k < 6; ++k) PushStep(table, k, 2);
    const std::vector<float> uninterrupted = AllRows(table);

    SparseTable restored(Spec(optimizer), o);
    ASSERT_TRUE(restored.Restore(&*parsed).ok());
    EXPECT_EQ(restored.step(), 3);
    for (int k = 3; k < 6; ++k) PushStep(restored, k, 2);
    EXPECT_EQ(AllRows(restored), uninterrupted);
  }
}

TEST(SparseCheckpointTest, CorruptOrForeignBytesAreRefusedNeverLoaded) {
  SparseTableOptions o;
  SparseTable table(Spec("adam"), o);
  PushStep(table, 0, 1);
  const std::string bytes = SerializeSparseCheckpoint(*table.Snapshot(1));
  for (size_t cut : {size_t{0}, size_t{5}, bytes.size() / 2, bytes.size() - 1}) {
    EXPECT_FALSE(ParseSparseCheckpoint(bytes.substr(0, cut)).ok()) << cut;
  }
  for (size_t at = 0; at < bytes.size(); at += 7) {
    std::string flipped = bytes;
    flipped[at] ^= 0x20;
    EXPECT_FALSE(ParseSparseCheckpoint(flipped).ok()) << at;
  }
  EXPECT_EQ(ParseSparseCheckpoint(bytes.substr(0, bytes.size() - 3) + "abc").status().code(),
            absl::StatusCode::kDataLoss);
  SparseTableSpec other = Spec("adam");
  other.dim = 5;
  SparseTable wrong(other, o);
  auto parsed = ParseSparseCheckpoint(bytes);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(wrong.Restore(&*parsed).code(), absl::StatusCode::kFailedPrecondition);
}

// The directory keeps the newest `keep` per table, skips a corrupt newest file for the one
// before (with a log line), and names the steps it has when asked for another.
TEST(SparseCheckpointTest, DirectoryKeepsTheNewestAndSkipsCorruptFiles) {
  const std::string dir = absl::StrCat(testing::TempDir(), "/sparse_dir");
  PosixFileSystem fs;
  std::vector<std::string> logged;
  auto opened = SparseCheckpointDir::Open(dir, 1, 2, &fs,
                                          [&](absl::string_view l) { logged.emplace_back(l); });
  ASSERT_TRUE(opened.ok()) << opened.status();
  SparseCheckpointDir& d = *opened;
  SparseTableOptions o;
  o.shard = 1;
  o.num_shards = 2;
  SparseTable table(Spec("adagrad"), o);
  for (int k = 0; k < 3; ++k) {
    std::vector<int64_t> ids = {1, 3};
    ASSERT_TRUE(table.Push(0, k, ids, std::vector<float>(8, 0.5f), Soon()).ok());
    ASSERT_TRUE(d.Write(*table.Snapshot(k + 1)).ok());
  }
  auto tables = d.Tables();
  ASSERT_TRUE(tables.ok());
  EXPECT_EQ((*tables)["user.id-emb_0"], (std::vector<int64_t>{3, 2}));
  ASSERT_TRUE(fs.WriteFile(d.PathOf("user.id-emb_0", 3), "garbage").ok());
  auto newest = d.LoadNewest("user.id-emb_0");
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->step, 2);
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_NE(logged[0].find("skipping sparse table 'user.id-emb_0' checkpoint of step 3"),
            std::string::npos)
      << logged[0];
  EXPECT_EQ(d.Load("user.id-emb_0", 1).status().message(),
            absl::StrCat("shard 1 has no checkpoint of sparse table 'user.id-emb_0' of step 1 in '",
                         dir, "' (it has: 3,2)"));
}

// A push waiting for the other rank ends with Aborted when the table goes back under it.
TEST(SparseCheckpointTest, RestoreAbortsAWaitingPush) {
  SparseTableOptions o;
  o.num_workers = 2;
  SparseTable table(Spec("sgd"), o);
  absl::Status waiting;
  std::thread t([&] {
    waiting = table.Push(0, 0, std::vector<int64_t>{1}, std::vector<float>(4, 1.0f), Soon());
  });
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(table.Restore(nullptr).ok());
  t.join();
  EXPECT_EQ(waiting.code(), absl::StatusCode::kAborted) << waiting;
  EXPECT_EQ(table.step(), 0);
}

}  // namespace
}  // namespace dptrain
