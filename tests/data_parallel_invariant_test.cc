// The data-parallel contract, end to end through real gRPC shards: k workers with batch b
// and averaging give the same weights as one worker with batch k*b (to float rounding),
// for models without batch norm.
#include "gtest/gtest.h"
#include "tests/test_cluster.h"
#include "tests/train_harness.h"
#include "worker/comm/ps_client.h"
#include "worker/data/synthetic.h"
#include "worker/graph/builtin_models.h"

namespace dptrain {
namespace {

// Trains through `shards` in-process PS shards; checks that every replica ends
// bit-identical and returns rank 0's weights.
std::vector<float> TrainThroughPs(const HarnessConfig& c, int shards, const Dataset& data) {
  OptimizerOptions optimizer;
  optimizer.learning_rate = 0.1f;
  optimizer.momentum = 0.9f;
  optimizer.weight_decay = 1e-4f;
  TestShards cluster = StartShards(shards, c.workers, optimizer);
  auto finals = RunWorkers(c, data, [&](int r, const std::vector<TensorInfo>& tensors)
                                        -> absl::StatusOr<OwnedStepSync> {
    PsClientOptions po;
    po.shard_addresses = cluster.addresses;
    po.rank = r;
    po.world_size = c.workers;
    po.max_chunk_elements = 50000;  // Several chunks per large tensor, spread over shards.
    po.tensors = tensors;
    auto client = PsClient::Connect(po);
    if (!client.ok()) return client.status();
    return std::unique_ptr<ParameterStore>(*std::move(client));
  });
  for (int r = 1; r < c.workers; ++r) EXPECT_EQ(finals[r], finals[0]) << "replica " << r;
  return finals[0];
}

class InvariantTest : public ::testing::TestWithParam<std::string> {};

TEST_P(InvariantTest, TwoWorkersEqualOneWorkerWithDoubleBatch) {
  const Dataset data = MakeSyntheticDataset(512, 28, 28, /*seed=*/11);
  HarnessConfig two;
  two.model = GetParam();
  two.workers = 2;
  two.batch_size = 32;
  HarnessConfig one = two;
  one.workers = 1;
  one.batch_size = 64;
  const std::vector<float> initial =
      (*graph::CreateBuiltinModel({GetParam(), two.model_seed, 1}))->weights();
  const std::vector<float> w2 = TrainThroughPs(two, /*shards=*/2, data);
  const std::vector<float> w1 = TrainThroughPs(one, /*shards=*/1, data);
  ASSERT_FALSE(w1.empty());
  // Training moved the weights (the comparison below is not vacuous) ...
  EXPECT_GT(RelativeDifference(w1, initial), 1e-3);
  // ... and both runs moved them the same way.
  EXPECT_LE(RelativeDifference(w2, w1), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Models, InvariantTest, ::testing::Values("mlp", "lenet"));

}  // namespace
}  // namespace dptrain
