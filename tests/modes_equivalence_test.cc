// The three ways to synchronise give the same training result: after k steps of mlp with 2
// and 3 workers, sharded PS, master reducer and ring all-reduce agree within 1e-5
// (relative), and all-reduce (replicas applying the average, or the optimizer sharded over
// the ring) leaves every replica bit-identical.
#include "gtest/gtest.h"
#include "tests/test_cluster.h"
#include "tests/train_harness.h"
#include "worker/comm/allreduce_group.h"
#include "worker/comm/allreduce_sync.h"
#include "worker/comm/ps_client.h"
#include "worker/comm/sharded_ring_store.h"
#include "worker/data/synthetic.h"
#include "worker/graph/builtin_models.h"

namespace dptrain {
namespace {

OptimizerOptions Sgd() {
  OptimizerOptions o;
  o.learning_rate = 0.1f;
  o.momentum = 0.9f;
  o.weight_decay = 1e-4f;
  return o;
}

// The update rule, wherever it runs: the optimizer and the rate of each step.
struct Update {
  OptimizerOptions optimizer = Sgd();
  std::optional<LrScheduleOptions> schedule;
};

// ps (shards > 1) or master (one unsharded reducer, as rank 0 hosts it).
std::vector<std::vector<float>> TrainWithReducer(
    const HarnessConfig& c, int shards, const Dataset& data,
    std::vector<std::vector<float>>* buffers = nullptr, const Update& update = {}) {
  TestShards cluster =
      StartShards(shards, c.workers, update.optimizer, absl::Seconds(30), update.schedule);
  return RunWorkers(c, data, [&](int r, const std::vector<TensorInfo>& tensors)
                                 -> absl::StatusOr<OwnedStepSync> {
    PsClientOptions po;
    po.shard_addresses = cluster.addresses;
    po.rank = r;
    po.world_size = c.workers;
    po.tensors = tensors;
    po.max_chunk_elements = 30000;
    po.stream_min_bytes = 0;  // Every shard streams here (the invariant test: unary).
    auto client = PsClient::Connect(po);
    if (!client.ok()) return client.status();
    return std::unique_ptr<ParameterStore>(*std::move(client));
  }, buffers);
}

// A sync that owns the all-reduce group it runs over: a reducer, or a sharded store.
class OwningAllReduce : public GradientReducer {
 public:
  OwningAllReduce(std::unique_ptr<AllReduceGroup> g, std::unique_ptr<AllReduceSync> s)
      : group_(std::move(g)), sync_(std::move(s)) {}
  absl::Status Start(absl::Span<float> w) override { return sync_->Start(w); }
  int world_size() const override { return sync_->world_size(); }
  absl::StatusOr<StepOutcome> Reduce(int64_t t, absl::Span<float> g) override {
    return sync_->Reduce(t, g);
  }
  absl::Status AverageBuffers(int64_t round, absl::Span<float> b) override {
    return sync_->AverageBuffers(round, b);
  }
  CommStats stats() const override { return sync_->stats(); }

 private:
  std::unique_ptr<AllReduceGroup> group_;
  std::unique_ptr<AllReduceSync> sync_;
};

class OwningStore : public ParameterStore {
 public:
  OwningStore(std::unique_ptr<AllReduceGroup> g, std::unique_ptr<ShardedRingStore> s)
      : group_(std::move(g)), store_(std::move(s)) {}
  absl::Status Start(absl::Span<float> w) override { return store_->Start(w); }
  absl::StatusOr<StepOutcome> PushPull(int64_t t, absl::Span<float> g,
                                       absl::Span<float> w) override {
    return store_->PushPull(t, g, w);
  }
  absl::Status AverageBuffers(int64_t round, absl::Span<float> b) override {
    return store_->AverageBuffers(round, b);
  }
  CommStats stats() const override { return store_->stats(); }

 private:
  std::unique_ptr<AllReduceGroup> group_;
  std::unique_ptr<ShardedRingStore> store_;
};

// `sharded`: the optimizer sharded over the ring (the CPU worker's default), else every
// replica applies the averaged gradient (the GPU worker's way).
std::vector<std::vector<float>> TrainWithAllReduce(
    const HarnessConfig& c, const Dataset& data, bool sharded,
    std::vector<std::vector<float>>* buffers = nullptr, const Update& update = {}) {
  // Rank 0 listens first on a free port; the others are told it.
  AllReduceGroupOptions base;
  base.world_size = c.workers;
  base.advertise_host = "127.0.0.1";
  base.connect_timeout = absl::Seconds(20);
  base.timeout = absl::Seconds(20);
  AllReduceGroupOptions o0 = base;
  auto group0 = AllReduceGroup::Listen(o0);
  EXPECT_TRUE(group0.ok()) << group0.status();
  if (!group0.ok()) return {};
  const int port = (*group0)->master_port();
  std::unique_ptr<AllReduceGroup> rank0_group = *std::move(group0);
  HarnessConfig replicas_apply = c;
  if (!sharded) {
    replicas_apply.optimizer = update.optimizer;
    replicas_apply.lr_schedule = update.schedule;
  }
  return RunWorkers(replicas_apply, data, [&](int r, const std::vector<TensorInfo>&)
                                 -> absl::StatusOr<OwnedStepSync> {
    std::unique_ptr<AllReduceGroup> group;
    if (r == 0) {
      group = std::move(rank0_group);
    } else {
      AllReduceGroupOptions o = base;
      o.rank = r;
      o.master_port = port;
      auto g = AllReduceGroup::Listen(o);
      if (!g.ok()) return g.status();
      group = *std::move(g);
    }
    if (auto s = group->Join(); !s.ok()) return s;
    if (sharded) {
      auto store = ShardedRingStore::Create(&group->link(),
                                            {10000, update.optimizer, update.schedule});
      if (!store.ok()) return store.status();
      return std::unique_ptr<ParameterStore>(
          std::make_unique<OwningStore>(std::move(group), *std::move(store)));
    }
    AllReduceSyncOptions so;
    so.chunk_elements = 10000;
    auto sync = std::make_unique<AllReduceSync>(&group->link(), so);
    return std::unique_ptr<GradientReducer>(
        std::make_unique<OwningAllReduce>(std::move(group), std::move(sync)));
  }, buffers);
}

class ModesTest : public ::testing::TestWithParam<int> {};

TEST_P(ModesTest, PsMasterAndAllReduceAgree) {
  const Dataset data = MakeSyntheticDataset(600, 28, 28, /*seed=*/5);
  HarnessConfig c;
  c.workers = GetParam();
  c.batch_size = 20;
  c.steps = 5;
  const auto initial = (*graph::CreateBuiltinModel({"mlp", c.model_seed, 1}))->weights();
  const auto ps = TrainWithReducer(c, /*shards=*/2, data);
  const auto master = TrainWithReducer(c, /*shards=*/1, data);
  const auto ring = TrainWithAllReduce(c, data, /*sharded=*/false);
  const auto sharded = TrainWithAllReduce(c, data, /*sharded=*/true);
  ASSERT_EQ(ring.size(), static_cast<size_t>(c.workers));
  ASSERT_EQ(sharded.size(), static_cast<size_t>(c.workers));
  for (int r = 0; r < c.workers; ++r) {
    EXPECT_EQ(ring[r], ring[0]) << "all-reduce replica " << r << " is not bit-identical";
    EXPECT_EQ(sharded[r], sharded[0]) << "sharded replica " << r << " is not bit-identical";
    EXPECT_EQ(ps[r], ps[0]) << "ps replica " << r;
  }
  EXPECT_GT(RelativeDifference(ps[0], initial), 1e-3);  // Training happened.
  EXPECT_LE(RelativeDifference(master[0], ps[0]), 1e-5);
  EXPECT_LE(RelativeDifference(ring[0], ps[0]), 1e-5);
  EXPECT_LE(RelativeDifference(sharded[0], ps[0]), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Workers, ModesTest, ::testing::Values(2, 3));

// AdamW with warmup and cosine decay, and Adam with a step schedule and the linear scaling
// rule: the rate of each step and the moments are computed the same way by the shards, the
// master, every replica and the sharded ring.
class ScheduleTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ScheduleTest, EveryModeAppliesTheSameAdamAndSchedule) {
  const Dataset data = MakeSyntheticDataset(600, 28, 28, /*seed=*/5);
  HarnessConfig c;
  c.workers = 2;
  c.batch_size = 20;
  c.steps = 6;
  Update update;
  update.optimizer.name = GetParam();
  update.optimizer.learning_rate = 0.01f;
  update.optimizer.weight_decay = 0.01f;
  LrScheduleOptions schedule;
  schedule.base_lr = 0.01;
  if (GetParam() == "adamw") {
    schedule.name = "cosine";
    schedule.warmup_steps = 2;
    schedule.total_steps = 6;
  } else {
    schedule.name = "step";
    schedule.step_size = 2;
    schedule.gamma = 0.5;
    schedule.scale = c.workers;
  }
  update.schedule = schedule;
  const auto initial = (*graph::CreateBuiltinModel({"mlp", c.model_seed, 1}))->weights();
  const auto ps = TrainWithReducer(c, /*shards=*/2, data, nullptr, update);
  const auto master = TrainWithReducer(c, /*shards=*/1, data, nullptr, update);
  const auto ring = TrainWithAllReduce(c, data, /*sharded=*/false, nullptr, update);
  const auto sharded = TrainWithAllReduce(c, data, /*sharded=*/true, nullptr, update);
  ASSERT_EQ(ring.size(), 2u);
  ASSERT_EQ(sharded.size(), 2u);
  EXPECT_EQ(ring[1], ring[0]);
  EXPECT_EQ(sharded[1], sharded[0]);
  EXPECT_GT(RelativeDifference(ps[0], initial), 1e-3);
  EXPECT_LE(RelativeDifference(master[0], ps[0]), 1e-5);
  EXPECT_LE(RelativeDifference(ring[0], ps[0]), 1e-5);
  EXPECT_LE(RelativeDifference(sharded[0], ps[0]), 1e-5);
  // The schedule mattered: a constant rate ends elsewhere.
  Update constant = update;
  constant.schedule.reset();
  const auto flat = TrainWithReducer(c, /*shards=*/2, data, nullptr, constant);
  EXPECT_GT(RelativeDifference(flat[0], ps[0]), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ScheduleTest, ::testing::Values("adam", "adamw"));

// Batch norm: each worker's running statistics follow its own batches during the epoch, and
// are averaged at its end, so every replica evaluates (and saves) the same ones.
TEST(BatchNormTest, RunningStatisticsAgreeAcrossReplicasAfterAnEpoch) {
  const Dataset data = MakeSyntheticDataset(64, 28, 28, /*seed=*/9);
  HarnessConfig c;
  c.model = "resnet18";
  c.workers = 2;
  c.batch_size = 4;
  c.steps = 2;
  auto model = graph::CreateBuiltinModel({"resnet18", c.model_seed, 1});
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<float> initial = (*model)->buffer_values();
  ASSERT_FALSE(initial.empty());
  std::vector<std::vector<float>> ps_buffers, ring_buffers;
  TrainWithReducer(c, /*shards=*/2, data, &ps_buffers);
  TrainWithAllReduce(c, data, /*sharded=*/true, &ring_buffers);
  for (const auto* buffers : {&ps_buffers, &ring_buffers}) {
    ASSERT_EQ(buffers->size(), 2u);
    EXPECT_EQ((*buffers)[0], (*buffers)[1]);
    EXPECT_GT(RelativeDifference((*buffers)[0], initial), 1e-4);
  }
  EXPECT_LE(RelativeDifference(ring_buffers[0], ps_buffers[0]), 1e-5);
}

}  // namespace
}  // namespace dptrain
