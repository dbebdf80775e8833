// The data-parallel contract, end to end through real gRPC shards: k workers with batch b
// and averaging give the same weights as one worker with batch k*b (to float rounding),
// for models without batch norm.
#include <cmath>
#include <thread>

#include "gtest/gtest.h"
#include "tests/test_cluster.h"
#include "worker/comm/ps_client.h"
#include "worker/data/synthetic.h"
#include "worker/nn/model.h"
#include "worker/trainer.h"

namespace dptrain {
namespace {

struct RunConfig {
  std::string model;
  int workers;
  int shards;
  int batch_size;
  int64_t steps;
};

// Trains `steps` steps with `workers` workers in threads; returns rank 0's final weights and
// checks that every replica ends bit-identical.
std::vector<float> TrainWeights(const RunConfig& c, const Dataset& data) {
  OptimizerOptions optimizer;
  optimizer.learning_rate = 0.1f;
  optimizer.momentum = 0.9f;
  optimizer.weight_decay = 1e-4f;
  TestShards shards = StartShards(c.shards, c.workers, optimizer);
  std::vector<std::vector<float>> finals(c.workers);
  std::vector<absl::Status> statuses(c.workers);
  std::vector<std::thread> threads;
  for (int r = 0; r < c.workers; ++r) {
    threads.emplace_back([&, r] {
      auto model = nn::CreateModel({c.model, /*seed=*/7, /*threads=*/1});
      if (!model.ok()) {
        statuses[r] = model.status();
        return;
      }
      PsClientOptions po;
      po.shard_addresses = shards.addresses;
      po.rank = r;
      po.world_size = c.workers;
      po.max_chunk_elements = 50000;  // Several chunks per large tensor, spread over shards.
      for (const auto& p : (*model)->params()) po.tensors.push_back({p.name, p.size});
      auto client = PsClient::Connect(po);
      if (!client.ok()) {
        statuses[r] = client.status();
        return;
      }
      TrainerOptions to;
      to.rank = r;
      to.world_size = c.workers;
      to.batch_size = c.batch_size;
      to.epochs = 1;
      to.seed = 3;
      to.max_steps_per_epoch = c.steps;
      to.evaluate = false;
      statuses[r] = Train(to, **model, **client, data, nullptr, nullptr);
      finals[r] = (*model)->weights();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < c.workers; ++r) {
    EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
    EXPECT_EQ(finals[r], finals[0]) << "replica " << r << " differs from rank 0";
  }
  return finals[0];
}

double RelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

class InvariantTest : public ::testing::TestWithParam<std::string> {};

TEST_P(InvariantTest, TwoWorkersEqualOneWorkerWithDoubleBatch) {
  const Dataset data = MakeSyntheticDataset(512, 28, 28, /*seed=*/11);
  const int b = 32;
  const int64_t k = 5;
  const std::vector<float> initial = [&] {
    auto m = nn::CreateModel({GetParam(), 7, 1});
    return (*m)->weights();
  }();
  const std::vector<float> two = TrainWeights({GetParam(), 2, 2, b, k}, data);
  const std::vector<float> one = TrainWeights({GetParam(), 1, 1, 2 * b, k}, data);
  ASSERT_EQ(two.size(), one.size());
  ASSERT_FALSE(two.empty());
  // Training moved the weights (the comparison below is not vacuous) ...
  EXPECT_GT(RelativeDifference(one, initial), 1e-3);
  // ... and both runs moved them the same way.
  EXPECT_LE(RelativeDifference(two, one), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Models, InvariantTest, ::testing::Values("mlp", "lenet"));

}  // namespace
}  // namespace dptrain
