// Mixed precision in data-parallel training: when one worker's gradient overflows, the step
// is skipped by every replica and every shard, in ps mode (over real gRPC, 2 shards) and in
// all-reduce mode, and the next step applies normally.
#include <cmath>
#include <functional>
#include <limits>
#include <thread>

#include "common/in_memory_link.h"
#include "gtest/gtest.h"
#include "tests/test_cluster.h"
#include "worker/comm/allreduce_sync.h"
#include "worker/comm/ps_client.h"
#include "worker/comm/sharded_ring_store.h"

namespace dptrain {
namespace {

constexpr int kWorkers = 2;
constexpr int64_t kElements = 10;

OptimizerOptions Sgd() {
  OptimizerOptions o;
  o.learning_rate = 0.5f;
  return o;
}

// One rank's step: its gradient followed by its overflow flag in, the new weights in `w`.
using StepFn = std::function<absl::StatusOr<StepOutcome>(int64_t step, absl::Span<float> g,
                                                         absl::Span<float> w)>;

StepFn Through(ParameterStore* store) {
  return [store](int64_t step, absl::Span<float> g, absl::Span<float> w) {
    return store->PushPull(step, g, w);
  };
}

// What a replica does with a reducer: reduce, then (unless skipped) apply the average as
// the model would, w -= lr * average.
StepFn Through(GradientReducer* reducer) {
  return [reducer](int64_t step, absl::Span<float> g,
                   absl::Span<float> w) -> absl::StatusOr<StepOutcome> {
    absl::StatusOr<StepOutcome> outcome = reducer->Reduce(step, g);
    if (outcome.ok() && !outcome->skipped) {
      for (size_t i = 0; i < w.size(); ++i) w[i] -= Sgd().learning_rate * g[i];
    }
    return outcome;
  };
}

// Runs steps 0..2 on every rank; rank 1 overflows at step 1 (its gradient has an inf and
// its flag is set, unless `flag_only` says the flag alone).
// Returns each rank's weights after each step, and whether each step was skipped.
struct Run {
  std::vector<std::vector<std::vector<float>>> weights;  // [rank][step]
  std::vector<std::vector<bool>> skipped;                // [rank][step]
};

Run Train(const std::vector<ReplicaSync*>& syncs, const std::vector<StepFn>& steps) {
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
        std::vector<float> g(kElements + 1, static_cast<float>(r + 1));
        const bool overflow = r == 1 && step == 1;
        if (overflow) g[3] = std::numeric_limits<float>::infinity();
        g.back() = overflow ? 1.0f : 0.0f;
        absl::StatusOr<StepOutcome> outcome = steps[r](step, absl::MakeSpan(g), absl::MakeSpan(w));
        s = outcome.status();
        run.weights[r].push_back(w);
        run.skipped[r].push_back(outcome.ok() && outcome->skipped);
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
  std::vector<std::unique_ptr<PsClient>> clients;
  std::vector<ReplicaSync*> syncs;
  std::vector<StepFn> steps;
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
    clients.push_back(*std::move(client));
    syncs.push_back(clients.back().get());
    steps.push_back(Through(clients.back().get()));
  }
  ExpectGlobalSkip(Train(syncs, steps));
}

INSTANTIATE_TEST_SUITE_P(StreamOrUnary, PsGlobalSkipTest, ::testing::Bool());

TEST(GlobalSkipTest, AllReduceModeSkipsOnEveryReplica) {
  InMemoryHub hub(kWorkers, absl::Seconds(10));
  std::vector<std::unique_ptr<AllReduceSync>> reducers;
  std::vector<ReplicaSync*> syncs;
  std::vector<StepFn> steps;
  for (int r = 0; r < kWorkers; ++r) {
    reducers.push_back(std::make_unique<AllReduceSync>(&hub.link(r), AllReduceSyncOptions{3}));
    syncs.push_back(reducers.back().get());
    steps.push_back(Through(reducers.back().get()));
  }
  ExpectGlobalSkip(Train(syncs, steps));
}

TEST(GlobalSkipTest, ShardedRingStoreSkipsOnEveryReplica) {
  InMemoryHub hub(kWorkers, absl::Seconds(10));
  std::vector<std::unique_ptr<ShardedRingStore>> stores;
  std::vector<ReplicaSync*> syncs;
  std::vector<StepFn> steps;
  for (int r = 0; r < kWorkers; ++r) {
    auto store = ShardedRingStore::Create(&hub.link(r), {3, Sgd()});
    ASSERT_TRUE(store.ok()) << store.status();
    stores.push_back(*std::move(store));
    syncs.push_back(stores.back().get());
    steps.push_back(Through(static_cast<ParameterStore*>(stores.back().get())));
  }
  ExpectGlobalSkip(Train(syncs, steps));
}

// A NaN in the segment rank 1 owns, sent by rank 0 without a flag: only rank 1 sees the
// average there, and its vote still stops rank 0 from applying its own segment.
TEST(GlobalSkipTest, ShardedRingStoreVoteCoversOtherRanksSegments) {
  InMemoryHub hub(kWorkers, absl::Seconds(10));
  std::vector<std::vector<float>> w(kWorkers, std::vector<float>(kElements, 1.0f));
  std::vector<bool> skipped(kWorkers);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorkers; ++r) {
    threads.emplace_back([&, r] {
      auto store = ShardedRingStore::Create(&hub.link(r), {3, Sgd()});
      ASSERT_TRUE(store.ok());
      std::vector<float> g(kElements + 1, 1.0f);
      g.back() = 0.0f;
      // Rank 1 owns segment 0 (RingOwnedSegment(1, 2)), elements [0, 5).
      if (r == 0) g[2] = std::nanf("");
      auto outcome = (*store)->PushPull(0, absl::MakeSpan(g), absl::MakeSpan(w[r]));
      ASSERT_TRUE(outcome.ok()) << outcome.status();
      skipped[r] = outcome->skipped;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(skipped, (std::vector<bool>{true, true}));
  EXPECT_EQ(w[0], std::vector<float>(kElements, 1.0f));
  EXPECT_EQ(w[1], std::vector<float>(kElements, 1.0f));
}

// Runs one all-reduce step on both ranks with gradients of ones, rank 0's modified by
// `poison`, and returns what each rank's Reduce said.
std::vector<bool> ReduceOnce(const std::function<void(std::vector<float>&)>& poison) {
  InMemoryHub hub(kWorkers, absl::Seconds(10));
  std::vector<bool> skipped(kWorkers);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorkers; ++r) {
    threads.emplace_back([&, r] {
      AllReduceSync reducer(&hub.link(r), AllReduceSyncOptions{3});
      std::vector<float> g(kElements + 1, 1.0f);
      g.back() = 0.0f;
      if (r == 0) poison(g);
      absl::StatusOr<StepOutcome> outcome = reducer.Reduce(0, absl::MakeSpan(g));
      EXPECT_TRUE(outcome.ok()) << outcome.status();
      skipped[r] = outcome.ok() && outcome->skipped;
    });
  }
  for (auto& t : threads) t.join();
  return skipped;
}

// The flag alone (a finite gradient, e.g. an overflow seen in fp16 before unscaling) is
// enough: the other replica skips too.
TEST(GlobalSkipTest, FlagWithoutInfIsEnough) {
  EXPECT_EQ(ReduceOnce([](std::vector<float>& g) { g.back() = 1.0f; }),
            (std::vector<bool>{true, true}));
}

// A NaN without the flag (a broken worker, or fp32) is caught where it is summed.
TEST(GlobalSkipTest, NonFiniteWithoutFlagIsCaught) {
  EXPECT_EQ(ReduceOnce([](std::vector<float>& g) { g[7] = std::nanf(""); }),
            (std::vector<bool>{true, true}));
  EXPECT_EQ(ReduceOnce([](std::vector<float>&) {}), (std::vector<bool>{false, false}));
}

TEST(GlobalSkipTest, BadStepsAndRoundsAreOutOfRange) {
  InMemoryHub hub(1, absl::Seconds(1));
  AllReduceSync reducer(&hub.link(0), AllReduceSyncOptions{3});
  std::vector<float> g(4, 1.0f);
  EXPECT_EQ(reducer.Reduce(-1, absl::MakeSpan(g)).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(reducer.AverageBuffers(-1, absl::MakeSpan(g)).code(), absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace dptrain
