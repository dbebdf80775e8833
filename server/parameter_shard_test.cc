#include "server/parameter_shard.h"

#include <atomic>
#include <cstring>
#include <limits>
#include <thread>

#include "common/captured_log.h"
#include "gtest/gtest.h"

namespace dptrain {
namespace {

using absl::StatusCode;

// Model: tensor 0 with 6 elements (chunks of <= 4: 3 + 3), tensor 1 with 2 elements.
// Two shards: largest first -> (0,0)->0, (0,1)->1, (1,0)->0.
const ModelDescription& Model() {
  static const auto* m = new ModelDescription{{{"w", 6}, {"b", 2}}, 2, 4};
  return *m;
}

std::string Bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// Payloads of shard 0's chunks: (0,0) with 3 elements and (1,0) with 2.
struct Payload {
  std::string a, b;
  std::vector<ChunkView> views() const {
    return {{0, 0, DType::kFp32, a}, {1, 0, DType::kFp32, b}};
  }
};

Payload Shard0(const std::vector<float>& a, const std::vector<float>& b) {
  return {Bytes(a), Bytes(b)};
}

struct Collected {
  std::vector<float> values;
  ChunkSink sink() {
    return [this](const ChunkSpec&, absl::Span<const float> w) {
      values.insert(values.end(), w.begin(), w.end());
    };
  }
};

std::unique_ptr<ParameterShard> MakeShard(int workers, absl::Duration timeout = absl::Seconds(5)) {
  ParameterShardOptions o;
  o.shard = 0;
  o.num_shards = 2;
  o.num_workers = workers;
  o.step_timeout = timeout;
  o.optimizer.learning_rate = 0.5f;
  auto shard = ParameterShard::Create(o);
  EXPECT_TRUE(shard.ok()) << shard.status();
  return *std::move(shard);
}

absl::Time Soon() { return absl::Now() + absl::Seconds(5); }

void InitShard(ParameterShard& shard) {
  Payload p = Shard0({1, 2, 3}, {10, 20});
  ASSERT_TRUE(shard.Init("job", 0, Model(), p.views()).ok());
}

TEST(ParameterShardTest, InitThenPullReturnsInitialWeights) {
  auto shard = MakeShard(2);
  InitShard(*shard);
  Collected got;
  auto version = shard->Pull("job", 1, Model(), Soon(), got.sink());
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ(*version, 0);
  EXPECT_EQ(got.values, (std::vector<float>{1, 2, 3, 10, 20}));
}

TEST(ParameterShardTest, InitIsIdempotentAndRejectsDifferentWeights) {
  auto shard = MakeShard(2);
  InitShard(*shard);
  Payload same = Shard0({1, 2, 3}, {10, 20});
  EXPECT_TRUE(shard->Init("job", 0, Model(), same.views()).ok());
  Payload other = Shard0({1, 2, 4}, {10, 20});
  EXPECT_EQ(shard->Init("job", 0, Model(), other.views()).status().code(),
            StatusCode::kAlreadyExists);
  Collected got;
  ASSERT_TRUE(shard->Pull("job", 0, Model(), Soon(), got.sink()).ok());
  EXPECT_EQ(got.values, (std::vector<float>{1, 2, 3, 10, 20}));
}

TEST(ParameterShardTest, BspAveragesAllWorkersThenAppliesSgd) {
  auto shard = MakeShard(2);
  InitShard(*shard);
  Payload g0 = Shard0({1, 1, 1}, {2, 2});
  Payload g1 = Shard0({3, 3, 3}, {0, 4});
  Collected r0, r1;
  absl::StatusOr<int64_t> v0;
  std::thread t([&] { v0 = shard->PushPull("job", 0, 0, g0.views(), Soon(), r0.sink()); });
  auto v1 = shard->PushPull("job", 1, 0, g1.views(), Soon(), r1.sink());
  t.join();
  ASSERT_TRUE(v0.ok()) << v0.status();
  ASSERT_TRUE(v1.ok()) << v1.status();
  EXPECT_EQ(*v0, 1);
  EXPECT_EQ(*v1, 1);
  // w - 0.5 * mean(g): {1,2,3} - 0.5*2 ; {10,20} - 0.5*{1,3}.
  const std::vector<float> expected = {0, 1, 2, 9.5f, 18.5f};
  EXPECT_EQ(r0.values, expected);
  EXPECT_EQ(r1.values, expected);
}

TEST(ParameterShardTest, RetriesNeverDoubleCount) {
  auto shard = MakeShard(1);
  InitShard(*shard);
  Payload g = Shard0({2, 2, 2}, {2, 2});
  Collected first, retry;
  ASSERT_TRUE(shard->PushPull("job", 0, 0, g.views(), Soon(), first.sink()).ok());
  auto v = shard->PushPull("job", 0, 0, g.views(), Soon(), retry.sink());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 1);
  EXPECT_EQ(first.values, retry.values);
  EXPECT_EQ(first.values, (std::vector<float>{0, 1, 2, 9, 19}));
}

TEST(ParameterShardTest, RetryWhileStepOpenWaitsAndCountsOnce) {
  auto shard = MakeShard(2);
  InitShard(*shard);
  Payload g0 = Shard0({1, 1, 1}, {1, 1});
  Payload g1 = Shard0({3, 3, 3}, {3, 3});
  Collected a, b, c;
  absl::StatusOr<int64_t> va, vb;
  std::thread ta([&] { va = shard->PushPull("job", 0, 0, g0.views(), Soon(), a.sink()); });
  std::thread tb([&] { vb = shard->PushPull("job", 0, 0, g0.views(), Soon(), b.sink()); });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(shard->GetInfo().version, 0);  // Rank 0 twice is still one of two.
  ASSERT_TRUE(shard->PushPull("job", 1, 0, g1.views(), Soon(), c.sink()).ok());
  ta.join();
  tb.join();
  ASSERT_TRUE(va.ok() && vb.ok());
  EXPECT_EQ(c.values, (std::vector<float>{0, 1, 2, 9, 19}));
  EXPECT_EQ(a.values, c.values);
  EXPECT_EQ(b.values, c.values);
}

TEST(ParameterShardTest, TimeoutNamesMissingRanks) {
  auto shard = MakeShard(3, absl::Milliseconds(200));
  InitShard(*shard);
  Payload g = Shard0({1, 1, 1}, {1, 1});
  Collected got;
  auto v =
      shard->PushPull("job", 1, 0, g.views(), absl::Now() + absl::Milliseconds(200), got.sink());
  EXPECT_EQ(v.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(v.status().message().find("rank(s) 0,2"), std::string::npos) << v.status();
  EXPECT_TRUE(got.values.empty());
}

TEST(ParameterShardTest, PullWaitsForInitWithDeadline) {
  auto shard = MakeShard(2);
  Collected got;
  auto v = shard->Pull("job", 1, Model(), absl::Now() + absl::Milliseconds(100), got.sink());
  EXPECT_EQ(v.status().code(), StatusCode::kDeadlineExceeded);
  std::thread t([&] {
    absl::SleepFor(absl::Milliseconds(100));
    InitShard(*shard);
  });
  v = shard->Pull("job", 1, Model(), Soon(), got.sink());
  t.join();
  EXPECT_TRUE(v.ok()) << v.status();
}

TEST(ParameterShardTest, ShutdownWakesWaiters) {
  auto shard = MakeShard(2);
  InitShard(*shard);
  Payload g = Shard0({1, 1, 1}, {1, 1});
  Collected got;
  std::thread t([&] {
    absl::SleepFor(absl::Milliseconds(100));
    shard->Shutdown();
  });
  auto v = shard->PushPull("job", 0, 0, g.views(), Soon(), got.sink());
  t.join();
  EXPECT_EQ(v.status().code(), StatusCode::kUnavailable);
}

// The job's last step at its end: rank 0 got its answer and stopped the shard (master mode:
// the reducer lives in rank 0) while rank 1's stream still waits for its chunks. A step that
// is complete is still answered during shutdown; one that is not, and any new push, is not.
TEST(ParameterShardTest, ShutdownStillAnswersACompleteStep) {
  auto shard = MakeShard(2);
  InitShard(*shard);
  Payload g0 = Shard0({1, 1, 1}, {2, 2});
  Payload g1 = Shard0({3, 3, 3}, {0, 4});
  for (const ChunkView& v : g0.views()) ASSERT_TRUE(shard->PushChunk("job", 0, 0, v, nullptr).ok());
  for (const ChunkView& v : g1.views()) ASSERT_TRUE(shard->PushChunk("job", 1, 0, v, nullptr).ok());
  shard->Shutdown();
  Collected got;
  for (int slot = 0; slot < shard->num_chunks(); ++slot) {
    auto pulled = shard->PullChunk(1, 0, slot, Soon(), got.sink());
    ASSERT_TRUE(pulled.ok()) << pulled.status();
  }
  EXPECT_EQ(got.values, (std::vector<float>{0, 1, 2, 9.5f, 18.5f}));
  // Step 1 never completes: its wait ends at once, and new pushes are refused.
  for (const ChunkView& v : g0.views()) {
    EXPECT_EQ(shard->PushChunk("job", 0, 1, v, nullptr).status().code(), StatusCode::kUnavailable);
  }
  const absl::Time start = absl::Now();
  EXPECT_EQ(shard->PullChunk(0, 1, 0, Soon(), got.sink()).status().code(),
            StatusCode::kUnavailable);
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
}

// Every invalid request gets a precise code and leaves the shard unchanged.
TEST(ParameterShardTest, BadInputIsRejectedAndChangesNothing) {
  auto shard = MakeShard(1);
  Payload good = Shard0({1, 1, 1}, {1, 1});
  Collected sink;
  // Before Init.
  EXPECT_EQ(shard->PushPull("job", 0, 0, good.views(), Soon(), sink.sink()).status().code(),
            StatusCode::kFailedPrecondition);
  // Init from a rank other than 0, or a worker expecting another shard count.
  EXPECT_EQ(shard->Init("job", 1, Model(), good.views()).status().code(),
            StatusCode::kInvalidArgument);  // Rank 1 >= num_workers 1.
  ModelDescription three = Model();
  three.num_shards = 3;
  EXPECT_EQ(shard->Init("job", 0, three, good.views()).status().code(),
            StatusCode::kFailedPrecondition);
  InitShard(*shard);

  auto push = [&](absl::string_view job, int rank, int64_t step,
                  const std::vector<ChunkView>& chunks) {
    return shard->PushPull(job, rank, step, chunks, Soon(), sink.sink()).status().code();
  };
  const std::string three_floats = Bytes({1, 1, 1}), two_floats = Bytes({1, 1});
  EXPECT_EQ(push("job", 1, 0, good.views()), StatusCode::kInvalidArgument);   // Rank.
  EXPECT_EQ(push("job", -1, 0, good.views()), StatusCode::kInvalidArgument);  // Rank.
  EXPECT_EQ(push("other", 0, 0, good.views()), StatusCode::kFailedPrecondition);
  EXPECT_EQ(push("job", 0, 5, good.views()), StatusCode::kOutOfRange);
  EXPECT_EQ(push("job", 0, -1, good.views()), StatusCode::kOutOfRange);
  // Unknown key, foreign key (0,1 belongs to shard 1), wrong dtype, wrong size.
  EXPECT_EQ(
      push("job", 0, 0, {{0, 7, DType::kFp32, three_floats}, {1, 0, DType::kFp32, two_floats}}),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(
      push("job", 0, 0, {{0, 1, DType::kFp32, three_floats}, {1, 0, DType::kFp32, two_floats}}),
      StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      push("job", 0, 0, {{0, 0, DType::kFp16, three_floats}, {1, 0, DType::kFp32, two_floats}}),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(push("job", 0, 0, {{0, 0, DType::kFp32, two_floats}, {1, 0, DType::kFp32, two_floats}}),
            StatusCode::kInvalidArgument);
  // Missing and duplicated chunks.
  EXPECT_EQ(push("job", 0, 0, {{0, 0, DType::kFp32, three_floats}}), StatusCode::kInvalidArgument);
  EXPECT_EQ(push("job", 0, 0,
                 {{0, 0, DType::kFp32, three_floats},
                  {0, 0, DType::kFp32, three_floats},
                  {1, 0, DType::kFp32, two_floats}}),
            StatusCode::kInvalidArgument);
  // Model mismatch on Pull.
  ModelDescription renamed = Model();
  renamed.tensors[1].name = "bias";
  EXPECT_EQ(shard->Pull("job", 0, renamed, Soon(), sink.sink()).status().code(),
            StatusCode::kFailedPrecondition);
  ModelDescription resized = Model();
  resized.tensors[0].num_elements = 7;
  EXPECT_EQ(shard->Pull("job", 0, resized, Soon(), sink.sink()).status().code(),
            StatusCode::kFailedPrecondition);

  // Nothing changed: version 0, initial weights.
  EXPECT_EQ(shard->GetInfo().version, 0);
  Collected now;
  ASSERT_TRUE(shard->Pull("job", 0, Model(), Soon(), now.sink()).ok());
  EXPECT_EQ(now.values, (std::vector<float>{1, 2, 3, 10, 20}));
  // And a good push still works.
  EXPECT_EQ(push("job", 0, 0, good.views()), StatusCode::kOk);
}

TEST(ParameterShardTest, RejectsBadOptions) {
  ParameterShardOptions o;
  o.shard = 2;
  o.num_shards = 2;
  EXPECT_FALSE(ParameterShard::Create(o).ok());
  o = {};
  o.num_workers = 0;
  EXPECT_FALSE(ParameterShard::Create(o).ok());
  o = {};
  o.optimizer.name = "nope";
  EXPECT_FALSE(ParameterShard::Create(o).ok());
}

}  // namespace
}  // namespace dptrain

namespace dptrain {
namespace {

std::unique_ptr<ParameterShard> MakePolicyShard(SyncPolicy policy, int staleness, int workers,
                                                LogSink log = StderrLog()) {
  ParameterShardOptions o;
  o.shard = 0;
  o.num_shards = 2;
  o.num_workers = workers;
  o.step_timeout = absl::Seconds(5);
  o.optimizer.learning_rate = 0.5f;
  o.policy = policy;
  o.staleness = staleness;
  o.log = std::move(log);
  auto shard = ParameterShard::Create(o);
  EXPECT_TRUE(shard.ok()) << shard.status();
  return *std::move(shard);
}

TEST(SyncPolicyTest, AsyncAppliesEachPushAtOnceScaledByWorkerCount) {
  auto shard = MakePolicyShard(SyncPolicy::kAsync, 0, 2);
  InitShard(*shard);
  Payload g = Shard0({2, 2, 2}, {4, 4});
  Collected got;
  int64_t staleness = -1;
  auto v = shard->PushPull("job", 0, 0, g.views(), Soon(), got.sink(), &staleness);
  ASSERT_TRUE(v.ok()) << v.status();  // No wait for rank 1.
  EXPECT_EQ(*v, 1);
  EXPECT_EQ(staleness, 0);
  EXPECT_EQ(got.values, (std::vector<float>{0.5f, 1.5f, 2.5f, 9, 19}));  // w - 0.5 * g / 2.
  // Rank 1 pushes after rank 0's update: it computed on version 0, so staleness 1.
  Collected got1;
  ASSERT_TRUE(shard->PushPull("job", 1, 0, g.views(), Soon(), got1.sink(), &staleness).ok());
  EXPECT_EQ(staleness, 1);
  EXPECT_EQ(got1.values, (std::vector<float>{0, 1, 2, 8, 18}));
  // A retry of rank 1's step 0 is not applied again; step 5 is out of range.
  Collected retry;
  ASSERT_TRUE(shard->PushPull("job", 1, 0, g.views(), Soon(), retry.sink()).ok());
  EXPECT_EQ(retry.values, got1.values);
  EXPECT_EQ(shard->PushPull("job", 1, 5, g.views(), Soon(), retry.sink()).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(shard->GetInfo().max_staleness, 1);
}

// A fast worker never gets more than `staleness` steps ahead of a deliberately slow one.
TEST(SyncPolicyTest, SspBoundsHowFarTheFastWorkerRunsAhead) {
  for (int bound : {0, 2}) {
    auto shard = MakePolicyShard(SyncPolicy::kSsp, bound, 2);
    InitShard(*shard);
    Payload g = Shard0({0.01f, 0.01f, 0.01f}, {0.01f, 0.01f});
    std::atomic<int64_t> slow_started{0};
    const int64_t steps = 12;
    std::thread slow([&] {
      for (int64_t t = 0; t < steps; ++t) {
        absl::SleepFor(absl::Milliseconds(20));
        ++slow_started;
        Collected c;
        ASSERT_TRUE(shard->PushPull("job", 1, t, g.views(), Soon(), c.sink()).ok());
      }
    });
    int64_t max_ahead = 0;
    for (int64_t t = 0; t < steps; ++t) {
      Collected c;
      ASSERT_TRUE(shard->PushPull("job", 0, t, g.views(), Soon(), c.sink()).ok());
      // Rank 0 may now compute step t + 1; the slow rank has started at most slow_started.
      max_ahead = std::max(max_ahead, (t + 1) - slow_started.load());
    }
    slow.join();
    EXPECT_LE(max_ahead, bound) << "bound " << bound;
    EXPECT_GE(max_ahead, bound) << "the fast worker should use the slack it has";
    EXPECT_GT(shard->GetInfo().max_staleness, 0);
  }
}

TEST(SyncPolicyTest, SspTimeoutNamesTheSlowRank) {
  auto shard = MakePolicyShard(SyncPolicy::kSsp, 1, 3);
  InitShard(*shard);
  Payload g = Shard0({1, 1, 1}, {1, 1});
  Collected c;
  ASSERT_TRUE(shard->PushPull("job", 0, 0, g.views(), Soon(), c.sink()).ok());  // Within bound.
  auto v = shard->PushPull("job", 0, 1, g.views(), absl::Now() + absl::Milliseconds(200), c.sink());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(v.status().message().find("rank(s) 1,2"), std::string::npos) << v.status();
}

TEST(SyncPolicyTest, ParsesPolicyNames) {
  EXPECT_EQ(*ParseSyncPolicy("bsp"), SyncPolicy::kBsp);
  EXPECT_EQ(*ParseSyncPolicy("ssp"), SyncPolicy::kSsp);
  EXPECT_EQ(*ParseSyncPolicy("async"), SyncPolicy::kAsync);
  EXPECT_FALSE(ParseSyncPolicy("sometimes").ok());
}

}  // namespace
}  // namespace dptrain

namespace dptrain {
namespace {

// Mixed precision: one worker's overflow makes the whole BSP step a no-op on every replica,
// reported to every worker; the next step applies normally.
TEST(OverflowTest, BspSkipsTheWholeStepForEveryone) {
  auto shard = MakeShard(2);
  InitShard(*shard);
  Payload g0 = Shard0({1, 1, 1}, {2, 2});
  Payload g1 = Shard0({3, 3, 3}, {0, 4});
  Collected r0, r1;
  bool skipped0 = false, skipped1 = false;
  absl::StatusOr<int64_t> v0;
  std::thread t([&] {
    v0 = shard->PushPull("job", 0, 0, g0.views(), Soon(), r0.sink(), nullptr, false, &skipped0);
  });
  auto v1 = shard->PushPull("job", 1, 0, g1.views(), Soon(), r1.sink(), nullptr,
                            /*overflow=*/true, &skipped1);
  t.join();
  ASSERT_TRUE(v0.ok()) << v0.status();
  ASSERT_TRUE(v1.ok()) << v1.status();
  EXPECT_EQ(*v0, 1);  // The step counts: the next one is step 1.
  EXPECT_TRUE(skipped0);
  EXPECT_TRUE(skipped1);
  const std::vector<float> initial = {1, 2, 3, 10, 20};
  EXPECT_EQ(r0.values, initial);
  EXPECT_EQ(r1.values, initial);

  Collected a0, a1;
  skipped0 = skipped1 = true;
  std::thread t2([&] {
    v0 = shard->PushPull("job", 0, 1, g0.views(), Soon(), a0.sink(), nullptr, false, &skipped0);
  });
  v1 = shard->PushPull("job", 1, 1, g1.views(), Soon(), a1.sink(), nullptr, false, &skipped1);
  t2.join();
  ASSERT_TRUE(v0.ok() && v1.ok());
  EXPECT_FALSE(skipped0);
  EXPECT_FALSE(skipped1);
  EXPECT_EQ(a0.values, (std::vector<float>{0, 1, 2, 9.5f, 18.5f}));
}

TEST(OverflowTest, AsyncDropsOnlyTheOverflowingPush) {
  auto shard = MakePolicyShard(SyncPolicy::kAsync, 0, 2);
  InitShard(*shard);
  Payload g = Shard0({2, 2, 2}, {4, 4});
  Collected got;
  bool skipped = false;
  auto v = shard->PushPull("job", 0, 0, g.views(), Soon(), got.sink(), nullptr, true, &skipped);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(skipped);
  EXPECT_EQ(*v, 0);  // Nothing applied.
  EXPECT_EQ(got.values, (std::vector<float>{1, 2, 3, 10, 20}));
  // The rank's clock moved on: its next push is step 1, and it applies.
  Collected next;
  ASSERT_TRUE(
      shard->PushPull("job", 0, 1, g.views(), Soon(), next.sink(), nullptr, false, &skipped).ok());
  EXPECT_FALSE(skipped);
  EXPECT_EQ(next.values, (std::vector<float>{0.5f, 1.5f, 2.5f, 9, 19}));
}

}  // namespace
}  // namespace dptrain

namespace dptrain {
namespace {

// Non-finite gradients without the overflow flag: the shard finds them where it sums and
// treats them like a flagged overflow, counts them and logs the first of each kind.
std::unique_ptr<ParameterShard> MakeLoggingShard(SyncPolicy policy, int workers, CapturedLog& log) {
  return MakePolicyShard(policy, 0, workers, log.sink());
}

std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> bits(v.size());
  std::memcpy(bits.data(), v.data(), v.size() * sizeof(float));
  return bits;
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Both ranks push step `step` (unary PushPull, no overflow flag); returns rank 0's answer.
Collected BspStep(ParameterShard& shard, int64_t step, const Payload& g0, const Payload& g1,
                  bool& skipped0, bool& skipped1) {
  Collected r0, r1;
  absl::StatusOr<int64_t> v0;
  std::thread t([&] {
    v0 = shard.PushPull("job", 0, step, g0.views(), Soon(), r0.sink(), nullptr, false, &skipped0);
  });
  auto v1 =
      shard.PushPull("job", 1, step, g1.views(), Soon(), r1.sink(), nullptr, false, &skipped1);
  t.join();
  EXPECT_TRUE(v0.ok()) << v0.status();
  EXPECT_TRUE(v1.ok()) << v1.status();
  EXPECT_EQ(Bits(r0.values), Bits(r1.values));
  return r0;
}

TEST(NonFiniteGradientTest, BspUnflaggedNaNSkipsTheWholeStepBitForBit) {
  CapturedLog log;
  auto shard = MakeLoggingShard(SyncPolicy::kBsp, 2, log);
  InitShard(*shard);
  const std::vector<float> initial = {1, 2, 3, 10, 20};
  // Only chunk (1,0) of rank 1 is bad: chunk (0,0) must be skipped too.
  Payload good = Shard0({1, 1, 1}, {2, 2}), bad = Shard0({3, 3, 3}, {0, kNaN});
  bool skipped0 = false, skipped1 = false;
  Collected got = BspStep(*shard, 0, good, bad, skipped0, skipped1);
  EXPECT_TRUE(skipped0);
  EXPECT_TRUE(skipped1);
  EXPECT_EQ(Bits(got.values), Bits(initial));
  // A second occurrence (Inf this time) is counted, not logged again.
  Payload inf = Shard0({kInf, 3, 3}, {0, 4});
  got = BspStep(*shard, 1, inf, good, skipped0, skipped1);
  EXPECT_TRUE(skipped0);
  EXPECT_EQ(Bits(got.values), Bits(initial));
  EXPECT_EQ(shard->GetInfo().nonfinite_steps, 2);
  ASSERT_EQ(log.lines().size(), 1u);
  EXPECT_EQ(log.lines()[0],
            "ps shard 0: step 0 chunk (tensor 1, chunk 0): gradient has inf/NaN but no overflow "
            "flag; step skipped (further occurrences only counted: GetShardInfo "
            "nonfinite_steps)");
  // The next clean step applies normally.
  got = BspStep(*shard, 2, good, good, skipped0, skipped1);
  EXPECT_FALSE(skipped0);
  EXPECT_EQ(got.values, (std::vector<float>{0.5f, 1.5f, 2.5f, 9, 19}));
}

TEST(NonFiniteGradientTest, BspFiniteGradientsWhoseSumOverflowsAreSkipped) {
  CapturedLog log;
  auto shard = MakeLoggingShard(SyncPolicy::kBsp, 2, log);
  InitShard(*shard);
  Payload big = Shard0({3e38f, 1, 1}, {1, 1});
  bool skipped0 = false, skipped1 = false;
  Collected got = BspStep(*shard, 0, big, big, skipped0, skipped1);
  EXPECT_TRUE(skipped0);
  EXPECT_EQ(Bits(got.values), Bits({1, 2, 3, 10, 20}));
  EXPECT_EQ(shard->GetInfo().nonfinite_steps, 1);
}

TEST(NonFiniteGradientTest, BspStreamedChunkWithNaNIsSkipped) {
  CapturedLog log;
  auto shard = MakeLoggingShard(SyncPolicy::kBsp, 1, log);
  InitShard(*shard);
  Payload bad = Shard0({kNaN, 1, 1}, {1, 1});
  std::vector<ChunkView> views = bad.views();
  for (const ChunkView& v : views) {
    ASSERT_TRUE(shard->PushChunk("job", 0, 0, v, nullptr).ok());
  }
  Collected got;
  for (int slot = 0; slot < shard->num_chunks(); ++slot) {
    auto pulled = shard->PullChunk(0, 0, slot, Soon(), got.sink());
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    EXPECT_TRUE(pulled->skipped) << slot;  // Slot 1 completes after slot 0's detection.
  }
  EXPECT_EQ(Bits(got.values), Bits({1, 2, 3, 10, 20}));
  EXPECT_EQ(shard->GetInfo().nonfinite_steps, 1);
}

TEST(NonFiniteGradientTest, AsyncAndSspDropAnUnflaggedNaNPush) {
  for (SyncPolicy policy : {SyncPolicy::kAsync, SyncPolicy::kSsp}) {
    CapturedLog log;
    auto shard = MakeLoggingShard(policy, 1, log);
    InitShard(*shard);
    Payload bad = Shard0({1, kNaN, 1}, {1, 1});
    Collected got;
    bool skipped = false;
    auto v =
        shard->PushPull("job", 0, 0, bad.views(), Soon(), got.sink(), nullptr, false, &skipped);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_TRUE(skipped);
    EXPECT_EQ(Bits(got.values), Bits({1, 2, 3, 10, 20}));
    EXPECT_EQ(shard->GetInfo().nonfinite_pushes, 1);
    ASSERT_EQ(log.lines().size(), 1u);
    EXPECT_EQ(log.lines()[0],
              "ps shard 0: step 0 chunk (tensor 0, chunk 0): gradient has inf/NaN but no "
              "overflow flag; push dropped (further occurrences only counted: GetShardInfo "
              "nonfinite_pushes)");
  }
}

// Init declarations are bounded before anything is built from them.
TEST(InitLimitsTest, HugeDeclarationsAreRejectedBeforeBuildingAnything) {
  auto shard = MakeShard(1);
  ModelDescription many_chunks{{{"w", int64_t{1} << 22}}, 2, 1};  // 4M chunks of 1.
  auto v = shard->Init("job", 0, many_chunks, {});
  EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(v.status().message().find("tensors[0].num_elements"), std::string::npos) << v.status();
  ModelDescription overflow{{{"w", int64_t{1} << 62}}, 2, 4};
  v = shard->Init("job", 0, overflow, {});
  EXPECT_EQ(v.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(v.status().message().find("tensors[0].num_elements = 4611686018427387904: its fp32 "
                                      "byte size overflows int64"),
            std::string::npos)
      << v.status();
  EXPECT_FALSE(shard->GetInfo().initialized);
  InitShard(*shard);  // A sane model still initialises.
}

}  // namespace
}  // namespace dptrain
