#include "server/sparse_table.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "common/sparse_rows.h"
#include "gtest/gtest.h"

namespace dptrain {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

SparseTableSpec Spec(const std::string& optimizer, int64_t rows = 100, int dim = 3) {
  SparseTableSpec s;
  s.name = "emb";
  s.rows = rows;
  s.dim = dim;
  s.optimizer = optimizer;
  s.lr = 0.5f;
  s.seed = 7;
  return s;
}

std::vector<float> Initial(int64_t row, int dim = 3) {
  std::vector<float> v(dim);
  InitialRow(7, "emb", row, absl::MakeSpan(v));
  return v;
}

TEST(SparseRowsTest, InitialRowsAreDeterministicAndNormal) {
  std::vector<float> a(1001), b(1001);
  InitialRow(7, "emb", 5, absl::MakeSpan(a));
  InitialRow(7, "emb", 5, absl::MakeSpan(b));
  EXPECT_EQ(a, b);
  InitialRow(7, "emb", 6, absl::MakeSpan(b));
  EXPECT_NE(a, b);
  InitialRow(7, "other", 5, absl::MakeSpan(b));
  EXPECT_NE(a, b);
  double mean = 0, square = 0;
  for (float x : a) mean += x / a.size(), square += double{x} * x / a.size();
  EXPECT_NEAR(mean, 0.0, 0.1);
  EXPECT_NEAR(square, 1.0, 0.15);
  EXPECT_EQ(RowShard(7, 3), 1);
}

TEST(SparseTableTest, RowsAreCreatedOnFirstTouchAndBadIdsChangeNothing) {
  SparseTableOptions o;
  o.shard = 1;
  o.num_shards = 2;
  SparseTable table(Spec("sgd"), o);
  std::vector<float> out(6);
  const std::vector<int64_t> ids = {3, 99};
  ASSERT_TRUE(table.Pull(ids, absl::MakeSpan(out)).ok());
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + 3), Initial(3));
  EXPECT_EQ(table.rows_held(), 2);
  const std::vector<int64_t> outside = {5, 100}, foreign = {4};
  absl::Status s = table.Pull(outside, absl::MakeSpan(out));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "sparse table 'emb': id 100 is not in [0, 100)");
  s = table.Push(0, 0, foreign, std::vector<float>(3, 1.0f), Soon());
  EXPECT_EQ(s.message(), "sparse table 'emb': row 4 belongs to shard 0, not to shard 1");
  EXPECT_EQ(table.Push(0, 0, ids, std::vector<float>(5), Soon()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table.rows_held(), 2);  // Row 5 was never created.
  EXPECT_EQ(table.step(), 0);
}

// One push of g on row 2 for each rule, against the rule written out in double.
TEST(SparseTableTest, EachOptimizerUpdatesOnlyTheTouchedRows) {
  const std::vector<float> g = {0.5f, -1.0f, 2.0f};
  const std::vector<int64_t> ids = {2};
  for (const std::string optimizer : {"sgd", "adagrad", "adam"}) {
    SparseTable table(Spec(optimizer), SparseTableOptions());
    for (int step = 0; step < 2; ++step) ASSERT_TRUE(table.Push(0, step, ids, g, Soon()).ok());
    std::vector<float> row(3), untouched(3);
    ASSERT_TRUE(table.Pull(ids, absl::MakeSpan(row)).ok());
    const std::vector<int64_t> other = {9};
    ASSERT_TRUE(table.Pull(other, absl::MakeSpan(untouched)).ok());
    EXPECT_EQ(untouched, Initial(9)) << optimizer;
    const std::vector<float> w0 = Initial(2);
    for (int i = 0; i < 3; ++i) {
      double w = w0[i], s = 0, m = 0, v = 0;
      for (int t = 1; t <= 2; ++t) {
        if (optimizer == "sgd") w -= 0.5 * g[i];
        if (optimizer == "adagrad")
          s += double{g[i]} * g[i], w -= 0.5 * g[i] / (std::sqrt(s) + 1e-10);
        if (optimizer == "adam") {
          m = 0.9 * m + 0.1 * g[i];
          v = 0.999 * v + 0.001 * g[i] * g[i];
          w -= 0.5 / (1 - std::pow(0.9, t)) * m / (std::sqrt(v / (1 - std::pow(0.999, t))) + 1e-10);
        }
      }
      EXPECT_NEAR(row[i], w, 1e-5 * std::max(1.0, std::abs(w))) << optimizer << " " << i;
    }
  }
}

// BSP: the step is applied once both ranks pushed it, with the mean (rows only one rank
// touched get half that rank's gradient); a retry is answered without applying again.
TEST(SparseTableTest, BspAppliesTheMeanOnceEveryRankPushed) {
  SparseTableOptions o;
  o.num_workers = 2;
  SparseTable table(Spec("sgd", 100, 1), o);
  const std::vector<int64_t> ids0 = {1, 2}, ids1 = {2};
  absl::Status s0;
  std::thread t([&] { s0 = table.Push(0, 0, ids0, std::vector<float>{2, 4}, Soon()); });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(table.step(), 0);  // Rank 0 waits for rank 1.
  ASSERT_TRUE(table.Push(1, 0, ids1, std::vector<float>{6}, Soon()).ok());
  t.join();
  ASSERT_TRUE(s0.ok()) << s0;
  EXPECT_EQ(table.step(), 1);
  std::vector<float> rows(2);
  ASSERT_TRUE(table.Pull(ids0, absl::MakeSpan(rows)).ok());
  EXPECT_FLOAT_EQ(rows[0], Initial(1, 1)[0] - 0.5f * 1.0f);                 // (2 + 0) / 2
  EXPECT_FLOAT_EQ(rows[1], Initial(2, 1)[0] - 0.5f * 5.0f);                 // (4 + 6) / 2
  ASSERT_TRUE(table.Push(1, 0, ids1, std::vector<float>{6}, Soon()).ok());  // A retry.
  EXPECT_EQ(table.step(), 1);
  EXPECT_EQ(table.Push(0, 5, ids1, std::vector<float>{1}, Soon()).code(),
            absl::StatusCode::kOutOfRange);
  const absl::Status late =
      table.Push(0, 1, ids1, std::vector<float>{1}, absl::Now() + absl::Milliseconds(100));
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(late.message(), "sparse table 'emb': step 1 timed out waiting for rank(s) 1");
}

// 4 ranks x 30 BSP steps of overlapping random rows (adam: per-row step counts), pushed from
// 4 threads (every other step after the rank's pull of the same ids, whose lookups the push
// reuses), so that the step's apply runs in parts on several threads: the rows equal a
// serial reference that sums each row's gradients in rank order (bitwise), and a push after
// Shutdown is Unavailable and applies nothing.
// Every rule; rows pushed by one rank (applied from that push) and by several (summed in rank
// order), an id twice in one push; compared bit for bit.
class ParallelBspTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ParallelBspTest, ParallelBspApplyEqualsTheSerialMeanInRankOrder) {
  constexpr int kRanks = 4, kSteps = 30, kDim = 5;
  constexpr int64_t kRows = 2000;
  SparseTableOptions o;
  o.num_workers = kRanks;
  SparseTableSpec spec = Spec(GetParam(), kRows, kDim);
  SparseTable table(spec, o);
  // The reference: the same rule through a one-worker table, fed the rank-order mean.
  SparseTable reference(spec, SparseTableOptions{});
  auto ids_of = [](int rank, int step) {
    std::vector<int64_t> ids;
    uint64_t x = 1000 * step + rank;
    for (int i = 0; i < 300; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const int64_t id = static_cast<int64_t>((x >> 33) % (i % 3 == 0 ? 64 : kRows));
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
    }
    if (rank % 2 == 1) ids.push_back(ids[5]);  // Twice in one push: both count.
    return ids;
  };
  auto grads_of = [](int rank, int step, size_t n) {
    std::vector<float> g(n * kDim);
    for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(0.37f * (i + 1) + rank + 0.1f * step);
    return g;
  };
  for (int step = 0; step < kSteps; ++step) {
    std::vector<absl::Status> pushed(kRanks);
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] {
        const std::vector<int64_t> ids = ids_of(r, step);
        if (step % 2 == 0 && step > 0) {
          // As a worker's step: its pull first, whose lookups its push then reuses.
          std::vector<float> rows(ids.size() * kDim);
          pushed[r] = table.Pull(ids, absl::MakeSpan(rows), r);
          if (!pushed[r].ok()) return;
        }
        pushed[r] = table.Push(r, step, ids, grads_of(r, step, ids.size()), Soon());
      });
    }
    for (auto& t : threads) t.join();
    for (const absl::Status& p : pushed) ASSERT_TRUE(p.ok()) << p;
    // Reference: each row's sum in rank order, divided as the table scales it.
    std::map<int64_t, std::vector<float>> sums;
    for (int r = 0; r < kRanks; ++r) {
      const std::vector<int64_t> ids = ids_of(r, step);
      const std::vector<float> g = grads_of(r, step, ids.size());
      for (size_t i = 0; i < ids.size(); ++i) {
        auto [it, fresh] = sums.try_emplace(ids[i], std::vector<float>(kDim, 0.0f));
        for (int k = 0; k < kDim; ++k) it->second[k] += g[i * kDim + k];
      }
    }
    std::vector<int64_t> ids;
    std::vector<float> mean;
    for (const auto& [id, sum] : sums) {
      ids.push_back(id);
      for (float v : sum) mean.push_back(v * (1.0f / kRanks));
    }
    ASSERT_TRUE(reference.Push(0, step, ids, mean, Soon()).ok());
  }
  EXPECT_EQ(table.step(), kSteps);
  std::vector<int64_t> all(kRows);
  for (int64_t i = 0; i < kRows; ++i) all[i] = i;
  std::vector<float> got(kRows * kDim), want(kRows * kDim);
  ASSERT_TRUE(table.Pull(all, absl::MakeSpan(got)).ok());
  ASSERT_TRUE(reference.Pull(all, absl::MakeSpan(want)).ok());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
        << "row " << i / kDim << ": " << got[i] << " vs " << want[i];
  }

  table.Shutdown();
  const std::vector<int64_t> one = {3};
  std::vector<float> before(kDim), after(kDim);
  ASSERT_TRUE(table.Pull(one, absl::MakeSpan(before)).ok());
  EXPECT_EQ(table.Push(0, kSteps, one, std::vector<float>(kDim, 1.0f), Soon()).code(),
            absl::StatusCode::kUnavailable);
  ASSERT_TRUE(table.Pull(one, absl::MakeSpan(after)).ok());
  EXPECT_EQ(after, before);
}

INSTANTIATE_TEST_SUITE_P(Rules, ParallelBspTest, ::testing::Values("sgd", "adagrad", "adam"));

TEST(SparseTableTest, AsyncAppliesEachPushAtOnce) {
  SparseTableOptions o;
  o.num_workers = 2;
  o.bsp = false;
  SparseTable table(Spec("sgd", 10, 1), o);
  const std::vector<int64_t> ids = {4};
  ASSERT_TRUE(table.Push(1, 0, ids, std::vector<float>{2}, Soon()).ok());
  std::vector<float> row(1);
  ASSERT_TRUE(table.Pull(ids, absl::MakeSpan(row)).ok());
  EXPECT_FLOAT_EQ(row[0], Initial(4, 1)[0] - 0.5f);  // lr 0.5 x 2 / 2 workers.
  // Rank 1 runs ahead without waiting.
  ASSERT_TRUE(table.Push(1, 5, ids, std::vector<float>{2}, Soon()).ok());
}

// SSP (staleness 1): a push is applied at once, scaled by 1/N; a rank more than one step
// ahead of the slowest waits for it, and a timeout names the slow rank.
TEST(SparseTableTest, SspWaitsForTheSlowestRank) {
  SparseTableOptions o;
  o.num_workers = 2;
  o.bsp = false;
  o.staleness = 1;
  SparseTable table(Spec("sgd", 10, 1), o);
  const std::vector<int64_t> ids = {3};
  ASSERT_TRUE(table.Push(0, 0, ids, std::vector<float>{2}, Soon()).ok());  // Nobody to wait for.
  std::atomic<bool> done{false};
  absl::Status ahead;
  std::thread t([&] {
    ahead = table.Push(0, 1, ids, std::vector<float>{2}, Soon());
    done = true;
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(done.load());  // Step 1 waits for rank 1's step 0.
  ASSERT_TRUE(table.Push(1, 0, ids, std::vector<float>{2}, Soon()).ok());
  t.join();
  EXPECT_TRUE(ahead.ok()) << ahead;
  const absl::Status late =
      table.Push(0, 3, ids, std::vector<float>{2}, absl::Now() + absl::Milliseconds(100));
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(late.message(),
            "sparse table 'emb': step 3 (staleness 1) timed out waiting for rank(s) 1");
  std::vector<float> row(1);
  ASSERT_TRUE(table.Pull(ids, absl::MakeSpan(row)).ok());
  // Four pushes of 2, each x lr 0.5 / 2 workers (the late one was applied before it waited,
  // as the dense shards' SSP does).
  EXPECT_FLOAT_EQ(row[0], Initial(3, 1)[0] - 4 * 0.5f);
}

TEST(SparseTableTest, BadSpecsNameTheField) {
  SparseTableSpec s = Spec("adagrad");
  s.dim = 0;
  EXPECT_EQ(ValidateSparseTableSpec(s).message(),
            "sparse table 'emb': dim must be in [1, 2^20], got 0");
  s = Spec("lamb");
  EXPECT_EQ(ValidateSparseTableSpec(s).message(),
            "sparse table 'emb': optimizer must be sgd, adagrad or adam, got 'lamb'");
  EXPECT_TRUE(ValidateSparseTableSpec(Spec("adam")).ok());
}

}  // namespace
}  // namespace dptrain
