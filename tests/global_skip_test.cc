// Mixed precision in data-parallel training: when one worker's gradient overflows, the step
// is skipped by every replica and every shard, in ps mode (over real gRPC, 2 shards) and in
// all-reduce mode, and the next step applies normally.
#include <limits>
#include <thread>

#include "common/in_memory_link.h"
#include "gtest/gtest.h"
#include "tests/test_cluster.h"
#include "worker/comm/allreduce_sync.h"
#include "worker/comm/ps_client.h"

namespace dptrain {
namespace {

constexpr int kWorkers = 2;
constexpr int64_t kElements = 10;

OptimizerOptions Sgd() {
  OptimizerOptions o;
  o.learning_rate = 0.5f;
  return o;
}

// Runs steps 0..2 on every rank; rank 1 overflows at step 1 (its gradient has an inf).
// Returns each rank's weights after each step, and whether each step was skipped.
struct Run {
  std::vector<std::vector<std::vector<float>>> weights;  // [rank][step]
  std::vector<std::vector<bool>> skipped;                // [rank][step]
};

Run Train(std::vector<std::unique_ptr<GradientSync>>& syncs) {
  Run run;
  run.weights.assign(kWorkers, {});
  run.skipped.assign(kWorkers, {});
  std::vector<std::thread> threads;
  std::vector<absl::Status> status(kWorkers);
  for (int r = 0; r < kWorkers; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> w(kElements);
      for (int64_t i = 0; i < kElements; ++i) w[i] = static_cast<float>(i);
      absl::Status s = syncs[r]->Start(absl::MakeSpan(w));
      for (int step = 0; step < 3 && s.ok(); ++step) {
        std::vector<float> g(kElements, static_cast<float>(r + 1));
        const bool overflow = r == 1 && step == 1;
        if (overflow) g[3] = std::numeric_limits<float>::infinity();
        syncs[r]->SetOverflow(overflow);
        s = syncs[r]->Step(step, g, absl::MakeSpan(w));
        run.weights[r].push_back(w);
        run.skipped[r].push_back(syncs[r]->last_step_skipped());
      }
      status[r] = s;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorkers; ++r) EXPECT_TRUE(status[r].ok()) << status[r];
  return run;
}

void ExpectGlobalSkip(const Run& run) {
  ASSERT_EQ(run.weights[0].size(), 3u);
  ASSERT_EQ(run.weights[1].size(), 3u);
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_EQ(run.skipped[r], (std::vector<bool>{false, true, false})) << "rank " << r;
    EXPECT_EQ(run.weights[r][1], run.weights[r][0]) << "rank " << r << " applied step 1";
    EXPECT_NE(run.weights[r][2], run.weights[r][1]) << "rank " << r << " did not apply step 2";
    EXPECT_EQ(run.weights[r], run.weights[0]) << "replicas differ";
  }
  // Step 0 and step 2 each move w by -lr * mean(g) = -0.5 * 1.5.
  EXPECT_FLOAT_EQ(run.weights[0][2][0], 0.0f - 2 * 0.75f);
  EXPECT_FLOAT_EQ(run.weights[0][2][9], 9.0f - 2 * 0.75f);
}

// Through both ways to a shard: the tensor stream and the unary PushPull.
class PsGlobalSkipTest : public ::testing::TestWithParam<bool> {};

TEST_P(PsGlobalSkipTest, SkipsOnEveryShardAndReplica) {
  TestShards shards = StartShards(2, kWorkers, Sgd());
  ASSERT_EQ(shards.addresses.size(), 2u);
  std::vector<std::unique_ptr<GradientSync>> syncs;
  for (int r = 0; r < kWorkers; ++r) {
    PsClientOptions o;
    o.shard_addresses = shards.addresses;
    o.rank = r;
    o.world_size = kWorkers;
    o.tensors = {{"a", 6}, {"b", 4}};  // Both shards own a chunk.
    o.max_chunk_elements = 4;
    o.stream_min_bytes = GetParam() ? 0 : int64_t{1} << 20;
    auto client = PsClient::Connect(o);
    ASSERT_TRUE(client.ok()) << client.status();
    syncs.push_back(*std::move(client));
  }
  ExpectGlobalSkip(Train(syncs));
}

INSTANTIATE_TEST_SUITE_P(StreamOrUnary, PsGlobalSkipTest, ::testing::Bool());

TEST(GlobalSkipTest, AllReduceModeSkipsOnEveryReplica) {
  InMemoryHub hub(kWorkers, absl::Seconds(10));
  std::vector<std::unique_ptr<GradientSync>> syncs;
  for (int r = 0; r < kWorkers; ++r) {
    auto sync = AllReduceSync::Create(&hub.link(r), {Sgd(), 3});
    ASSERT_TRUE(sync.ok()) << sync.status();
    syncs.push_back(*std::move(sync));
  }
  ExpectGlobalSkip(Train(syncs));
}

// The flag alone (a finite gradient, e.g. an overflow seen in fp16 before unscaling) is
// enough: the other replica skips too.
TEST(GlobalSkipTest, FlagWithoutInfIsEnough) {
  InMemoryHub hub(kWorkers, absl::Seconds(10));
  std::vector<std::unique_ptr<AllReduceSync>> syncs;
  for (int r = 0; r < kWorkers; ++r) syncs.push_back(*AllReduceSync::Create(&hub.link(r), {Sgd(), 3}));
  std::vector<std::vector<float>> w(kWorkers, std::vector<float>(kElements, 1.0f));
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorkers; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> g(kElements, 1.0f);
      syncs[r]->SetOverflow(r == 0);
      EXPECT_TRUE(syncs[r]->Step(0, g, absl::MakeSpan(w[r])).ok());
      EXPECT_TRUE(syncs[r]->last_step_skipped());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(w[0], std::vector<float>(kElements, 1.0f));
  EXPECT_EQ(w[1], std::vector<float>(kElements, 1.0f));
}

// With set_apply (a model that updates its weights on a GPU) the sync hands every applied
// step's averaged gradient to the model and leaves the host weights alone; a skipped step
// reaches nobody.
TEST(GlobalSkipTest, AllReduceApplyFnGetsTheAverageAndSkipsTogether) {
  InMemoryHub hub(kWorkers, absl::Seconds(10));
  std::vector<std::unique_ptr<AllReduceSync>> syncs;
  std::vector<std::vector<std::vector<float>>> applied(kWorkers);
  for (int r = 0; r < kWorkers; ++r) {
    syncs.push_back(*AllReduceSync::Create(&hub.link(r), {Sgd(), 3}));
    syncs[r]->set_apply([&applied, r](absl::Span<const float> averaged) {
      applied[r].emplace_back(averaged.begin(), averaged.end());
      return absl::OkStatus();
    });
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorkers; ++r) {
    threads.emplace_back([&, r] {
      for (int step = 0; step < 3; ++step) {
        std::vector<float> g(kElements, static_cast<float>(r + 1));
        syncs[r]->SetOverflow(r == 1 && step == 1);
        EXPECT_TRUE(syncs[r]->Step(step, g, absl::Span<float>()).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_EQ(applied[r].size(), 2u) << "rank " << r << ": steps 0 and 2, not the skipped 1";
    for (const auto& avg : applied[r]) EXPECT_EQ(avg, std::vector<float>(kElements, 1.5f));
  }
}

}  // namespace
}  // namespace dptrain
