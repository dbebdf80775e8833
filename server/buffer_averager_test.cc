#include "server/buffer_averager.h"

#include <limits>
#include <thread>

#include "gtest/gtest.h"

namespace dptrain {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(5); }
constexpr int64_t kAnyRound = std::numeric_limits<int64_t>::max();

TEST(BufferAveragerTest, EveryRankGetsTheMeanEachRound) {
  BufferAverager averager(3);
  for (int64_t round = 0; round < 3; ++round) {
    std::vector<absl::StatusOr<std::vector<float>>> out(3);
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back([&, r] {
        const std::vector<float> v = {float(r), float(10 * r + round)};
        out[r] = averager.Average(r, round, kAnyRound, v, Soon());
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(out[r].ok()) << out[r].status();
      EXPECT_EQ(*out[r], (std::vector<float>{1.0f, 10.0f + round}));
    }
  }
  // A retry of the last round gets its result again; an old or future round is refused.
  auto again = averager.Average(1, 2, kAnyRound, std::vector<float>{5, 5}, Soon());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, (std::vector<float>{1.0f, 12.0f}));
  EXPECT_EQ(averager.Average(0, 0, kAnyRound, std::vector<float>{1, 1}, Soon()).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(averager.Average(0, 7, kAnyRound, std::vector<float>{1, 1}, Soon()).status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST(BufferAveragerTest, RejectsBadInputAndNamesMissingRanks) {
  BufferAverager averager(3);
  EXPECT_EQ(averager.Average(3, 0, kAnyRound, {}, Soon()).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::thread t([&] {
    auto r = averager.Average(0, 0, kAnyRound, std::vector<float>{1, 2},
                              absl::Now() + absl::Milliseconds(300));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_NE(r.status().message().find("rank(s) 1,2"), std::string::npos) << r.status();
  });
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(averager.Average(1, 0, kAnyRound, std::vector<float>{1, 2, 3}, Soon()).status().code(),
            absl::StatusCode::kInvalidArgument);
  t.join();
}

TEST(BufferAveragerTest, AFreshAveragerJoinsTheRoundOfAJobInProgress) {
  BufferAverager averager(2);  // A restarted shard 0; the workers are at round 5.
  std::thread t([&] {
    auto r = averager.Average(1, 5, kAnyRound, std::vector<float>{3}, Soon());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, std::vector<float>{2});
  });
  auto r = averager.Average(0, 5, kAnyRound, std::vector<float>{1}, Soon());
  t.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(averager.Average(0, 7, kAnyRound, std::vector<float>{1}, Soon()).status().code(),
            absl::StatusCode::kOutOfRange);
}

// Review item: round -1 before any round completed used to answer OK with no data.
TEST(BufferAveragerTest, NegativeRoundsAreOutOfRange) {
  BufferAverager averager(2);
  auto r = averager.Average(0, -1, kAnyRound, std::vector<float>{1, 2}, Soon());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kOutOfRange) << r.status();
  EXPECT_EQ(r.status().message(), "buffer round -1 is not the current round 0");
  EXPECT_EQ(averager.Average(1, -7, kAnyRound, std::vector<float>{1, 2}, Soon()).status().code(),
            absl::StatusCode::kOutOfRange);
}

// Issue 30 item 7: a round far ahead of the job (round 1000 at round 0) used to become the
// current round of a fresh averager and wait out the deadline for ranks that never come.
TEST(BufferAveragerTest, ARoundAheadOfTheJobIsOutOfRangeAtOnce) {
  BufferAverager averager(2);
  const absl::Time start = absl::Now();
  auto r = averager.Average(0, 1000, /*latest_round=*/3, std::vector<float>{1}, Soon());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kOutOfRange) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));  // Not the 5 s deadline.
  EXPECT_EQ(r.status().message(),
            "buffer round 1000 is ahead of the job: this shard has seen no step past 3");
  // The averager was left alone: round 3 (the current one for a restarted shard) still works.
  std::thread t(
      [&] { EXPECT_TRUE(averager.Average(1, 3, 3, std::vector<float>{3}, Soon()).ok()); });
  auto ok = averager.Average(0, 3, 3, std::vector<float>{1}, Soon());
  t.join();
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, std::vector<float>{2});
}

}  // namespace
}  // namespace dptrain
