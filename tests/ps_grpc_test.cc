// The parameter server over real gRPC: every bad request gets its precise status and
// changes nothing, retries are idempotent, and grpc.health.v1.Health answers; a worker learns
// the steps its job can be sent back to.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "common/health_client.h"
#include "common/net.h"
#include "common/sparse_frames.h"
#include "common/sparse_rows.h"
#include "common/wire_dtype.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "proto/ps.grpc.pb.h"
#include "tests/test_cluster.h"
#include "worker/comm/ps_client.h"
#include "worker/comm/sparse_client.h"

namespace dptrain {
namespace {

using grpc::StatusCode;

// Model: "w" 6 elements in chunks of <= 4 (3 + 3), "b" 2 elements; 2 shards:
// shard 0 owns (0,0) and (1,0), shard 1 owns (0,1).
class PsGrpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    OptimizerOptions sgd;
    sgd.learning_rate = 1.0f;
    shards_ = StartShards(2, 2, sgd, absl::Seconds(2));
    ASSERT_EQ(shards_.addresses.size(), 2u);
    stub_ = proto::ParameterServer::NewStub(MakeChannel(shards_.addresses[0]));
  }

  template <typename Request>
  void Describe(Request& r, int rank, const std::string& job = "job") {
    DescribeTinyModel(r, rank, job);
  }

  static void AddChunk(google::protobuf::RepeatedPtrField<proto::Chunk>* chunks, int t, int c,
                       std::vector<float> values, proto::DType dtype = proto::FP32) {
    proto::Chunk* chunk = chunks->Add();
    chunk->mutable_key()->set_tensor_id(t);
    chunk->mutable_key()->set_chunk_index(c);
    chunk->set_dtype(dtype);
    chunk->set_data(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  }

  grpc::Status Init(const proto::InitRequest& request) {
    grpc::ClientContext context;
    proto::InitResponse response;
    return stub_->Init(&context, request, &response);
  }

  proto::InitRequest GoodInit() {
    proto::InitRequest r;
    Describe(r, 0);
    AddChunk(r.mutable_chunks(), 0, 0, {1, 2, 3});
    AddChunk(r.mutable_chunks(), 1, 0, {10, 20});
    return r;
  }

  proto::PushPullRequest Push(int rank, int64_t step, std::vector<float> a = {1, 1, 1},
                              std::vector<float> b = {1, 1}) {
    proto::PushPullRequest r;
    r.mutable_caller()->set_job_id("job");
    r.mutable_caller()->set_rank(rank);
    r.set_step(step);
    AddChunk(r.mutable_chunks(), 0, 0, a);
    AddChunk(r.mutable_chunks(), 1, 0, b);
    return r;
  }

  grpc::Status PushPull(const proto::PushPullRequest& r, proto::PullResponse* response = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::PullResponse ignored;
    return stub_->PushPull(&context, r, response != nullptr ? response : &ignored);
  }

  std::vector<float> PullWeights() { return PullTinyModel(*stub_); }

  TestShards shards_;
  std::unique_ptr<proto::ParameterServer::Stub> stub_;
};

TEST_F(PsGrpcTest, BadRequestsGetPreciseStatusAndChangeNothing) {
  // Before init.
  EXPECT_EQ(PushPull(Push(0, 0)).error_code(), StatusCode::FAILED_PRECONDITION);
  // Init from rank 1, rank out of range, wrong shard count.
  proto::InitRequest r1 = GoodInit();
  r1.mutable_caller()->set_rank(1);
  EXPECT_EQ(Init(r1).error_code(), StatusCode::FAILED_PRECONDITION);
  r1.mutable_caller()->set_rank(2);
  EXPECT_EQ(Init(r1).error_code(), StatusCode::INVALID_ARGUMENT);
  proto::InitRequest three = GoodInit();
  three.set_num_shards(3);
  EXPECT_EQ(Init(three).error_code(), StatusCode::FAILED_PRECONDITION);

  ASSERT_TRUE(Init(GoodInit()).ok());
  EXPECT_TRUE(Init(GoodInit()).ok());  // Idempotent.
  proto::InitRequest different = GoodInit();
  AddChunk(different.mutable_chunks(), 0, 0, {9, 9, 9});
  different.mutable_chunks()->DeleteSubrange(0, 1);
  grpc::Status mismatch = Init(different);
  EXPECT_EQ(mismatch.error_code(), StatusCode::ALREADY_EXISTS) << mismatch.error_message();

  // Rank >= num_workers, step outside the window, another job.
  EXPECT_EQ(PushPull(Push(2, 0)).error_code(), StatusCode::INVALID_ARGUMENT);
  grpc::Status window = PushPull(Push(0, 3));
  EXPECT_EQ(window.error_code(), StatusCode::OUT_OF_RANGE);
  EXPECT_NE(window.error_message().find("step 3"), std::string::npos);
  proto::PushPullRequest other_job = Push(0, 0);
  other_job.mutable_caller()->set_job_id("other");
  EXPECT_EQ(PushPull(other_job).error_code(), StatusCode::FAILED_PRECONDITION);

  // Unknown key, foreign key, wrong size, wrong dtype.
  proto::PushPullRequest bad = Push(0, 0);
  bad.mutable_chunks(0)->mutable_key()->set_chunk_index(9);
  EXPECT_EQ(PushPull(bad).error_code(), StatusCode::INVALID_ARGUMENT);
  bad = Push(0, 0);
  bad.mutable_chunks(0)->mutable_key()->set_chunk_index(1);
  grpc::Status foreign = PushPull(bad);
  EXPECT_EQ(foreign.error_code(), StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(foreign.error_message().find("belongs to shard 1"), std::string::npos);
  EXPECT_EQ(PushPull(Push(0, 0, {1, 1})).error_code(), StatusCode::INVALID_ARGUMENT);
  bad = Push(0, 0);
  bad.mutable_chunks(1)->set_dtype(proto::BF16);
  EXPECT_EQ(PushPull(bad).error_code(), StatusCode::INVALID_ARGUMENT);

  // Model mismatch on Pull.
  proto::PullRequest pull;
  Describe(pull, 1);
  pull.mutable_tensors(0)->set_num_elements(7);
  grpc::ClientContext context;
  proto::PullResponse response;
  EXPECT_EQ(stub_->Pull(&context, pull, &response).error_code(), StatusCode::FAILED_PRECONDITION);

  // None of it changed anything.
  EXPECT_EQ(PullWeights(), (std::vector<float>{1, 2, 3, 10, 20}));
}

TEST_F(PsGrpcTest, StepCompletesOnceAndRetriesAreIdempotent) {
  ASSERT_TRUE(Init(GoodInit()).ok());
  grpc::Status s0;
  proto::PullResponse r0, r1, again;
  std::thread t([&] { s0 = PushPull(Push(0, 0, {1, 1, 1}, {1, 1}), &r0); });
  ASSERT_TRUE(PushPull(Push(1, 0, {3, 3, 3}, {3, 3}), &r1).ok());
  t.join();
  ASSERT_TRUE(s0.ok()) << s0.error_message();
  EXPECT_EQ(r0.version(), 1);
  // A retry of rank 1's push (lost answer) gets the same answer and does not count again.
  ASSERT_TRUE(PushPull(Push(1, 0, {3, 3, 3}, {3, 3}), &again).ok());
  EXPECT_EQ(again.version(), 1);
  EXPECT_EQ(again.SerializeAsString(), r1.SerializeAsString());
  EXPECT_EQ(PullWeights(), (std::vector<float>{-1, 0, 1, 8, 18}));  // w - 1.0 * mean(g).
}

TEST_F(PsGrpcTest, MissingWorkerTimesOutNamingIt) {
  ASSERT_TRUE(Init(GoodInit()).ok());
  const absl::Time start = absl::Now();
  grpc::Status s = PushPull(Push(0, 0));
  EXPECT_EQ(s.error_code(), StatusCode::DEADLINE_EXCEEDED);
  EXPECT_NE(s.error_message().find("rank(s) 1"), std::string::npos) << s.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// Issue 30 item 7: a batch-norm round far ahead of the job is OUT_OF_RANGE at once, like a
// step outside the window, not DEADLINE_EXCEEDED after the step timeout.
TEST_F(PsGrpcTest, AverageBuffersRoundAheadOfTheJobIsOutOfRangeAtOnce) {
  ASSERT_TRUE(Init(GoodInit()).ok());
  proto::AverageBuffersRequest request;
  request.mutable_caller()->set_job_id("job");
  request.mutable_caller()->set_rank(0);
  request.set_round(1000);
  const float values[2] = {1, 2};
  request.set_data(reinterpret_cast<const char*>(values), sizeof(values));
  grpc::ClientContext context;
  proto::AverageBuffersResponse response;
  const absl::Time start = absl::Now();
  const grpc::Status s = stub_->AverageBuffers(&context, request, &response);
  EXPECT_EQ(s.error_code(), StatusCode::OUT_OF_RANGE) << s.error_message();
  EXPECT_NE(s.error_message().find("buffer round 1000 is ahead of the job"), std::string::npos)
      << s.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));  // The step timeout is 2 s.
}

// grpc.health.v1.Health answers SERVING while the server runs, NOT_SERVING once it stops.
TEST_F(PsGrpcTest, HealthServiceAnswers) {
  auto health = CheckHealth(shards_.addresses[1], absl::Seconds(5));
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, ServingStatus::kServing);
  shards_.servers[1]->Shutdown(absl::Seconds(0));
  EXPECT_FALSE(CheckHealth(shards_.addresses[1], absl::Seconds(1)).ok());
}

// Review item 5: a tiny Init declaring a huge model is refused before the shard builds
// anything; an element count whose byte size overflows int64 (was UNKNOWN) names the field.
TEST_F(PsGrpcTest, HugeInitDeclarationsAreInvalidArgumentNamingTheField) {
  proto::InitRequest many_chunks;
  many_chunks.mutable_caller()->set_job_id("job");
  many_chunks.set_num_shards(2);
  many_chunks.set_max_chunk_elements(1);
  many_chunks.add_tensors()->set_num_elements(int64_t{1} << 22);
  grpc::Status s = Init(many_chunks);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(),
            "tensors[0].num_elements = 4194304 in chunks of max_chunk_elements = 1 brings the "
            "model past the limit of 65536 chunks (ps_server --max_chunks)");
  proto::InitRequest overflow = many_chunks;
  overflow.set_max_chunk_elements(4);
  overflow.mutable_tensors(0)->set_num_elements(int64_t{1} << 62);
  s = Init(overflow);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(),
            "tensors[0].num_elements = 4611686018427387904: its fp32 byte size overflows int64");
  ASSERT_TRUE(Init(GoodInit()).ok());  // Nothing was left half-initialised.
}

// Shard s of 2 for 2 workers, checkpointing every `every` steps into TempDir()/name-s.
PsServerOptions CheckpointedShard(int s, const std::string& name, int64_t every) {
  PsServerOptions o;
  o.listen_address = "127.0.0.1:0";
  o.shard.shard = s;
  o.shard.num_shards = 2;
  o.shard.num_workers = 2;
  o.shard.checkpoints.dir = absl::StrCat(::testing::TempDir(), "/", name, "-", s);
  o.shard.checkpoints.every = every;
  return o;
}

// A shard can only go back to a step it checkpointed, so under BSP the job can be sent back
// to multiples of the gcd of the shards' intervals (4 and 6: 2) and the worker keeps batch
// norm's statistics of those steps; under async nothing is ever sent back.
TEST(PsClientTest, RewindIntervalIsTheGcdOfTheShardsCheckpointIntervals) {
  for (SyncPolicy policy : {SyncPolicy::kBsp, SyncPolicy::kAsync}) {
    std::vector<std::unique_ptr<PsServer>> servers;
    std::vector<std::string> addresses;
    for (int s = 0; s < 2; ++s) {
      PsServerOptions o = CheckpointedShard(
          s, policy == SyncPolicy::kBsp ? "rewind-bsp" : "rewind-async", s == 0 ? 4 : 6);
      o.shard.num_workers = 1;
      o.shard.policy = policy;
      auto server = PsServer::Start(o);
      ASSERT_TRUE(server.ok()) << server.status();
      addresses.push_back(absl::StrCat("127.0.0.1:", (*server)->port()));
      servers.push_back(*std::move(server));
    }
    PsClientOptions po;
    po.shard_addresses = addresses;
    po.tensors = {{"w", 6}, {"b", 2}};
    auto client = PsClient::Connect(po);
    ASSERT_TRUE(client.ok()) << client.status();
    EXPECT_EQ((*client)->rewind_interval(), policy == SyncPolicy::kBsp ? 2 : 0);
  }
}

// Two shards with checkpoints every step (BSP) and two clients of the tiny model.
struct CheckpointedJob {
  std::vector<std::unique_ptr<PsServer>> servers;
  std::vector<std::unique_ptr<PsClient>> clients;
  std::vector<std::vector<float>> weights{2, std::vector<float>(8, 1.0f)};
  std::vector<std::vector<float>> grads{2, std::vector<float>(9, 0.25f)};  // + the flag.
};

void StartCheckpointedJob(CheckpointedJob& job, const std::string& name, int64_t stream_min_bytes,
                          absl::Duration step_timeout, absl::Duration reconnect_timeout) {
  std::vector<std::string> addresses;
  for (int s = 0; s < 2; ++s) {
    PsServerOptions o = CheckpointedShard(s, name, 1);
    o.shard.step_timeout = step_timeout;
    auto server = PsServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status();
    addresses.push_back(absl::StrCat("127.0.0.1:", (*server)->port()));
    job.servers.push_back(*std::move(server));
  }
  for (int rank = 0; rank < 2; ++rank) {
    PsClientOptions po;
    po.shard_addresses = addresses;
    po.rank = rank;
    po.world_size = 2;
    po.tensors = {{"w", 6}, {"b", 2}};
    po.max_chunk_elements = 4;
    po.stream_min_bytes = stream_min_bytes;
    po.reconnect_timeout = reconnect_timeout;
    auto client = PsClient::Connect(po);
    ASSERT_TRUE(client.ok()) << client.status();
    job.clients.push_back(*std::move(client));
  }
  ASSERT_TRUE(job.clients[0]->Start(absl::MakeSpan(job.weights[0])).ok());
  ASSERT_TRUE(job.clients[1]->Start(absl::MakeSpan(job.weights[1])).ok());
}

// Both ranks push `step`; true if both completed it without going back.
bool StepBoth(CheckpointedJob& job, int64_t step) {
  absl::StatusOr<StepOutcome> other;
  std::thread rank1([&] {
    other = job.clients[1]->PushPull(step, absl::MakeSpan(job.grads[1]),
                                     absl::MakeSpan(job.weights[1]));
  });
  auto mine =
      job.clients[0]->PushPull(step, absl::MakeSpan(job.grads[0]), absl::MakeSpan(job.weights[0]));
  rank1.join();
  EXPECT_TRUE(mine.ok()) << mine.status();
  EXPECT_TRUE(other.ok()) << other.status();
  return mine.ok() && other.ok() && mine->rewind_to < 0 && other->rewind_to < 0;
}

// A step that fails on one shard ends at once, even while another shard still waits for a
// rank: waiting there could only end in the step timeout (the rank waited for may itself be
// waiting on this one), so the call to it is cancelled and the first failure returned.
TEST(PsClientTest, AShardThatFailsTheStepCancelsTheCallsToTheOthers) {
  for (int64_t stream_min_bytes : {int64_t{0}, int64_t{1} << 30}) {
    SCOPED_TRACE(stream_min_bytes == 0 ? "stream" : "unary");
    CheckpointedJob job;
    StartCheckpointedJob(job, stream_min_bytes == 0 ? "cancel-stream" : "cancel-unary",
                         stream_min_bytes, absl::Minutes(10), absl::ZeroDuration());
    job.servers[0]->Shutdown(absl::ZeroDuration());  // Gone: its call fails at once.
    absl::StatusOr<StepOutcome> result;
    absl::Notification returned;
    std::thread rank0([&] {
      result =
          job.clients[0]->PushPull(0, absl::MakeSpan(job.grads[0]), absl::MakeSpan(job.weights[0]));
      returned.Notify();
    });
    // Shard 1 would wait for rank 1 for the step timeout (10 minutes); a minute is only a
    // bound for a test that would otherwise hang.
    const bool ended = returned.WaitForNotificationWithTimeout(absl::Minutes(1));
    EXPECT_TRUE(ended) << "the step still waits on shard 1 after shard 0 failed it";
    if (!ended) {  // Let rank 0's call end so that the thread can be joined.
      (void)job.clients[1]->PushPull(0, absl::MakeSpan(job.grads[1]),
                                     absl::MakeSpan(job.weights[1]));
    }
    rank0.join();
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), absl::StatusCode::kUnavailable) << result.status();
    EXPECT_TRUE(absl::StrContains(result.status().message(), "shard 0")) << result.status();
  }
}

// Rank 0 goes back to step 1 (a new incarnation of the job); rank 1, a step ahead, finds its
// push refused and recovers by joining that incarnation instead of sending the shards back
// once more, and both redo step 1 together: each shard loaded its checkpoint once.
TEST(PsClientTest, ARankThatFindsTheJobWentBackJoinsItsIncarnation) {
  CheckpointedJob job;
  StartCheckpointedJob(job, "join", int64_t{1} << 30, absl::Seconds(30), absl::Seconds(30));
  auto step_both = [&](int64_t step) { return StepBoth(job, step); };
  ASSERT_TRUE(step_both(0));
  ASSERT_TRUE(step_both(1));
  const std::vector<float> at2 = job.weights[0];
  ASSERT_TRUE(job.clients[0]->Rewind(1, absl::MakeSpan(job.weights[0]), absl::Seconds(30)).ok());
  // Rank 1 pushes step 2 in incarnation 0: refused; it joins incarnation 1 at step 1.
  auto joined =
      job.clients[1]->PushPull(2, absl::MakeSpan(job.grads[1]), absl::MakeSpan(job.weights[1]));
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->rewind_to, 1);
  EXPECT_EQ(job.weights[1], job.weights[0]);
  ASSERT_TRUE(step_both(1));
  EXPECT_EQ(job.weights[0], at2) << "step 1 replayed gives the same weights";
  for (const auto& server : job.servers) {
    EXPECT_EQ(server->shard().GetInfo().rollbacks, 1);
    EXPECT_EQ(server->shard().GetInfo().incarnation, 1);
  }
}

// Rank 0 opens incarnation 1 at step 1, then shard 0 restarts from its checkpoint of step 1
// (incarnation 0 again, every rank in it) and rank 1 joins incarnation 1, which opens it on
// shard 0 without rank 0. Rank 0 believes it is in incarnation 1 everywhere, but shard 0
// says it is not (ShardInfoResponse.rank_incarnations): it joins too instead of pushing the
// same step again until its recovery time runs out.
TEST(PsClientTest, ARankShutOutOfItsIncarnationByAShardRestartJoinsAgain) {
  CheckpointedJob job;
  StartCheckpointedJob(job, "rejoin", int64_t{1} << 30, absl::Seconds(30), absl::Seconds(20));
  ASSERT_TRUE(StepBoth(job, 0));
  ASSERT_TRUE(StepBoth(job, 1));
  const std::vector<float> at2 = job.weights[0];
  ASSERT_TRUE(job.clients[0]->Rewind(1, absl::MakeSpan(job.weights[0]), absl::Seconds(30)).ok());
  const int port = job.servers[0]->port();
  job.servers[0]->Shutdown(absl::ZeroDuration());
  job.servers[0].reset();
  PsServerOptions o = CheckpointedShard(0, "rejoin", 1);
  const std::string newest =
      absl::StrCat(o.shard.checkpoints.dir, "/shard-0-step-000000000002.safetensors");
  ASSERT_EQ(std::remove(newest.c_str()), 0);
  o.listen_address = absl::StrCat("127.0.0.1:", port);
  auto restarted = PsServer::Start(o);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  job.servers[0] = *std::move(restarted);
  ASSERT_EQ(job.servers[0]->shard().GetInfo().version, 1);
  auto joined =
      job.clients[1]->PushPull(2, absl::MakeSpan(job.grads[1]), absl::MakeSpan(job.weights[1]));
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(joined->rewind_to, 1);
  auto rejoined =
      job.clients[0]->PushPull(1, absl::MakeSpan(job.grads[0]), absl::MakeSpan(job.weights[0]));
  ASSERT_TRUE(rejoined.ok()) << rejoined.status();
  EXPECT_EQ(rejoined->rewind_to, 1);
  ASSERT_TRUE(StepBoth(job, 1));
  EXPECT_EQ(job.weights[0], at2);
  EXPECT_EQ(job.weights[1], at2);
}

// --wire_dtype: 2 ranks push 16-bit gradients through 2 real shards, over the tensor stream
// and in unary calls. The shards widen them and sum in fp32: the SGD step equals the fp32
// one computed from the gradients rounded as the wire rounds them, bit for bit; against
// the unrounded gradients the error is within the format's rounding (bf16 2^-8, fp16
// 2^-11 relative per value), and half the bytes are pushed.
TEST(PsClientTest, SixteenBitWireSumsInFp32WithHalfTheBytes) {
  const int n = 3000;  // "w" in chunks of 1024: 3 chunks over 2 shards, and "b".
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> initial(n + 7);
  for (float& x : initial) x = normal(gen);
  std::vector<std::vector<float>> grads(2, std::vector<float>(n + 7 + 1, 0.0f));  // + flag.
  for (auto& g : grads) {
    for (int i = 0; i < n + 7; ++i) g[i] = normal(gen) * 1e-2f;
  }
  for (DType wire : {DType::kFp32, DType::kBf16, DType::kFp16}) {
    for (int64_t stream_min_bytes : {int64_t{0}, int64_t{1} << 30}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(wire), stream_min_bytes == 0 ? " stream" : " unary"));
      OptimizerOptions sgd;
      sgd.learning_rate = 0.5f;
      TestShards shards = StartShards(2, 2, sgd);
      std::vector<std::unique_ptr<PsClient>> clients;
      for (int rank = 0; rank < 2; ++rank) {
        PsClientOptions po;
        po.shard_addresses = shards.addresses;
        po.rank = rank;
        po.world_size = 2;
        po.tensors = {{"w", n}, {"b", 7}};
        po.max_chunk_elements = 1024;
        po.stream_min_bytes = stream_min_bytes;
        po.wire_dtype = wire;
        auto client = PsClient::Connect(po);
        ASSERT_TRUE(client.ok()) << client.status();
        clients.push_back(*std::move(client));
      }
      std::vector<std::vector<float>> weights(2, initial);
      ASSERT_TRUE(clients[0]->Start(absl::MakeSpan(weights[0])).ok());
      ASSERT_TRUE(clients[1]->Start(absl::MakeSpan(weights[1])).ok());
      const int64_t bytes_before = clients[0]->stats().bytes_pushed;  // Init's weights.
      absl::Status s1;
      std::thread other([&] {
        s1 = clients[1]->PushPull(0, absl::MakeSpan(grads[1]), absl::MakeSpan(weights[1])).status();
      });
      absl::Status s0 =
          clients[0]->PushPull(0, absl::MakeSpan(grads[0]), absl::MakeSpan(weights[0])).status();
      other.join();
      ASSERT_TRUE(s0.ok()) << s0;
      ASSERT_TRUE(s1.ok()) << s1;
      EXPECT_EQ(weights[0], weights[1]);
      double diff = 0, norm = 0;
      for (int i = 0; i < n + 7; ++i) {
        auto rounded = [&](float g) {
          return wire == DType::kBf16   ? Bf16BitsToFloat(FloatToBf16Bits(g))
                 : wire == DType::kFp16 ? Fp16BitsToFloat(FloatToFp16Bits(g))
                                        : g;
        };
        // The shard's arithmetic: sum in fp32, times 1/N, then w -= lr * mean.
        const float mean = (rounded(grads[0][i]) + rounded(grads[1][i])) * 0.5f;
        ASSERT_EQ(weights[0][i], initial[i] - 0.5f * mean) << i;
        const double exact = (double{grads[0][i]} + grads[1][i]) / 2;
        diff += (mean - exact) * (mean - exact);
        norm += exact * exact;
      }
      const double bound = wire == DType::kBf16   ? std::ldexp(1.0, -8)
                           : wire == DType::kFp16 ? std::ldexp(1.0, -11)
                                                  : 1e-6;
      EXPECT_LE(std::sqrt(diff / norm), bound);
      std::cout << DTypeName(wire) << (stream_min_bytes == 0 ? " stream" : " unary")
                << ": relative error of the averaged step " << std::sqrt(diff / norm)
                << ", bytes pushed " << clients[0]->stats().bytes_pushed - bytes_before
                << std::endl;
      const int64_t payload = int64_t{n + 7} * static_cast<int64_t>(ElementSize(wire));
      const int64_t pushed = clients[0]->stats().bytes_pushed - bytes_before;
      EXPECT_GE(pushed, payload);
      EXPECT_LE(pushed, payload + 1024) << "headers only beside it";
    }
  }
}

// A push that starts while backward runs (dptrain.torch in ps and master mode): nothing
// leaves before its chunk is ready, each chunk leaves as soon as it is, the step completes
// once the whole gradient is; a cancelled one ends Cancelled and the step can be pushed again.
TEST(PsClientTest, ChunksLeaveAsTheGradientBecomesReady) {
  OptimizerOptions sgd;
  sgd.learning_rate = 1.0f;
  TestShards shards = StartShards(1, 1, sgd);
  PsClientOptions po;
  po.shard_addresses = shards.addresses;
  po.tensors = {{"w", 3000}};
  po.max_chunk_elements = 1024;  // 3 chunks of 1000 (the map splits evenly).
  po.stream_min_bytes = 0;
  auto client = PsClient::Connect(po);
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<float> weights(3000, 1.0f), grads(3001, 0.5f), mean(3000);
  grads.back() = 0;  // The flag.
  ASSERT_TRUE((*client)->Start(absl::MakeSpan(weights)).ok());
  PsServer& server = *shards.servers[0];
  auto settle = [&server](int64_t at_least) {
    for (int i = 0; i < 500 && server.bytes_received() < at_least; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    absl::SleepFor(absl::Milliseconds(200));  // Time for anything more to arrive.
    return server.bytes_received();
  };
  const int64_t before = server.bytes_received();

  GradientReadiness ready;
  absl::StatusOr<StepOutcome> outcome;
  std::thread push([&] {
    outcome = (*client)->PushPull(0, absl::MakeSpan(grads), absl::MakeSpan(mean), &ready);
  });
  EXPECT_EQ(settle(before), before) << "nothing is ready: nothing may leave";
  ready.Advance(999);  // Not all of the first chunk.
  EXPECT_EQ(settle(before), before);
  ready.Advance(1500);
  const int64_t first = settle(before + 4000);
  EXPECT_GE(first - before, 4000);
  EXPECT_LT(first - before, 2 * 4000) << "the first chunk only";
  ready.Advance(3000);
  push.join();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(mean, std::vector<float>(3000, 0.5f));  // The new weights: 1 - 1.0 x 0.5.

  // Cancelled after the first chunk of step 1 left: the call ends at once, Cancelled.
  GradientReadiness cancelled;
  std::thread failed([&] {
    outcome = (*client)->PushPull(1, absl::MakeSpan(grads), absl::MakeSpan(mean), &cancelled);
  });
  cancelled.Advance(1000);
  settle(first + 4000);
  cancelled.Cancel();
  failed.join();
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kCancelled) << outcome.status();
  // The same step pushed again (the chunk that left was final) completes.
  outcome = (*client)->PushPull(1, absl::MakeSpan(grads), absl::MakeSpan(mean));
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(mean, std::vector<float>(3000, 0.0f));  // 0.5 - 1.0 x 0.5.
}

// Row-sparse tables through 2 real shards: rows split by id, pulled and pushed to their
// owners only, counted in each shard's /metrics; a second declaration must match, an
// undeclared table is NOT_FOUND.
TEST(SparseTablesGrpcTest, RowsGoToTheirShardsAndAreCounted) {
  std::vector<std::unique_ptr<MetricsRegistry>> registries;
  std::vector<std::unique_ptr<PsServer>> servers;
  std::vector<std::string> addresses;
  for (int s = 0; s < 2; ++s) {
    registries.push_back(std::make_unique<MetricsRegistry>());
    PsServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.shard.shard = s;
    o.shard.num_shards = 2;
    o.metrics = registries.back().get();
    auto server = PsServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status();
    addresses.push_back(absl::StrCat("127.0.0.1:", (*server)->port()));
    servers.push_back(*std::move(server));
  }
  SparseClientOptions co;
  co.shard_addresses = addresses;
  auto client = SparseClient::Create(co);
  ASSERT_TRUE(client.ok()) << client.status();
  proto::SparseTableSpec spec;
  spec.set_name("ids");
  spec.set_rows(1000);
  spec.set_dim(2);
  spec.set_optimizer("sgd");
  spec.set_lr(1.0f);
  spec.set_eps(1e-10);
  spec.set_beta1(0.9);
  spec.set_beta2(0.999);
  auto step = (*client)->Declare(spec);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(*step, 0);
  const std::vector<int64_t> ids = {7, 4, 999};
  std::vector<float> rows(6);
  ASSERT_TRUE((*client)->Pull("ids", 2, ids, absl::MakeSpan(rows)).ok());
  std::vector<float> start(2);
  InitialRow(0, "ids", 4, absl::MakeSpan(start));
  EXPECT_EQ(rows[2], start[0]);
  ASSERT_TRUE((*client)->Push("ids", 2, 0, ids, std::vector<float>{1, 1, 2, 2, 3, 3}).ok());
  ASSERT_TRUE((*client)->Pull("ids", 2, ids, absl::MakeSpan(rows)).ok());
  EXPECT_FLOAT_EQ(rows[2], start[0] - 2.0f);
  // Row 4 lives on shard 0, rows 7 and 999 on shard 1.
  EXPECT_EQ(servers[0]->sparse_service().rows_held(), 1);
  EXPECT_EQ(servers[1]->sparse_service().rows_held(), 2);
  const std::string text = registries[1]->Render();
  EXPECT_NE(text.find("dptrain_ps_sparse_rows_pulled_total 4"), std::string::npos) << text;
  EXPECT_NE(text.find("dptrain_ps_sparse_rows_pushed_total 2"), std::string::npos) << text;
  EXPECT_NE(text.find("dptrain_ps_sparse_rows_held 2"), std::string::npos) << text;

  spec.set_dim(3);
  const absl::Status other = (*client)->Declare(spec).status();
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition) << other;
  EXPECT_NE(other.message().find("sparse table 'ids' is declared as 1000 rows x 2"),
            std::string::npos)
      << other;
  const absl::Status missing = (*client)->Pull("nope", 2, ids, absl::MakeSpan(rows));
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
}

// One raw unary call of the sparse rows' frames (proto/ps.proto, SparseRows).
grpc::Status RawSparseCall(const std::string& address, const std::string& method,
                           const grpc::ByteBuffer& request, grpc::ByteBuffer* response) {
  grpc::GenericStub stub(MakeChannel(address));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, response, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

// Bad frames on the raw row path: each is one precise status naming what is wrong, and
// nothing is applied; a push that waits for another worker ends when the shard stops.
TEST(SparseTablesGrpcTest, BadRawFramesAreRefusedAndAWaitingPushEndsAtShutdown) {
  PsServerOptions o;
  o.listen_address = "127.0.0.1:0";
  o.shard.num_workers = 2;
  auto server = PsServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  SparseClientOptions co;
  co.shard_addresses = {address};
  auto client = SparseClient::Create(co);
  ASSERT_TRUE(client.ok());
  proto::SparseTableSpec spec;
  spec.set_name("ids");
  spec.set_rows(100);
  spec.set_dim(2);
  spec.set_optimizer("sgd");
  spec.set_lr(1.0f);
  spec.set_eps(1e-10);
  ASSERT_TRUE((*client)->Declare(spec).ok());
  std::vector<float> before(2), after(2);
  ASSERT_TRUE((*client)->Pull("ids", 2, {5}, absl::MakeSpan(before)).ok());

  proto::SparseFrameHeader h;
  h.mutable_caller()->set_job_id("dptrain");
  h.set_table("ids");
  grpc::ByteBuffer response;
  // Not a frame at all.
  grpc::Slice junk("ab", 2);
  grpc::Status s = RawSparseCall(address, kSparsePushMethod, grpc::ByteBuffer(&junk, 1), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS) << s.error_message();
  // Values for rows of 3 in a table of 2.
  const std::vector<int64_t> id = {5};
  s = RawSparseCall(address, kSparsePushMethod, SparseRowsFrame(h, id, {1, 2, 3}, 3), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("sparse table 'ids'"), std::string::npos) << s.error_message();
  // Fewer bytes than the ids it claims.
  proto::SparseFrameHeader lying = h;
  lying.set_rows(4);
  s = RawSparseCall(address, kSparsePullMethod, FrameReferencing(lying, "12345678"), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  // An id outside the table, and a rank outside the job.
  s = RawSparseCall(address, kSparsePullMethod, SparseRowsFrame(h, {100}, {}, 2), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("id 100 is not in [0, 100)"), std::string::npos)
      << s.error_message();
  proto::SparseFrameHeader stranger = h;
  stranger.mutable_caller()->set_rank(7);
  s = RawSparseCall(address, kSparsePushMethod, SparseRowsFrame(stranger, id, {1, 2}, 2),
                    &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  // Another method of the service.
  s = RawSparseCall(address, "/dptrain.proto.SparseRows/Nope", SparseRowsFrame(h, id, {}, 2),
                    &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED) << s.error_message();
  ASSERT_TRUE((*client)->Pull("ids", 2, {5}, absl::MakeSpan(after)).ok());
  EXPECT_EQ(after, before);  // Nothing was applied.

  // Rank 0 pushes step 0 (and retries it) and waits for rank 1, which never comes: the
  // shard serves 4 pushes per worker at once (8 here); one more is RESOURCE_EXHAUSTED at once.
  // Stopping the shard then ends the waits with UNAVAILABLE, not at the step timeout.
  constexpr int kAllowed = 8;
  std::vector<grpc::Status> waited(kAllowed);
  std::vector<std::thread> pushes;
  for (int k = 0; k < kAllowed; ++k) {
    pushes.emplace_back([&, k] {
      grpc::ByteBuffer answer;
      waited[k] =
          RawSparseCall(address, kSparsePushMethod, SparseRowsFrame(h, id, {1, 1}, 2), &answer);
    });
  }
  for (int wait = 0; wait < 400 && (*server)->sparse_rows().pushes_in_flight() < kAllowed; ++wait) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ((*server)->sparse_rows().pushes_in_flight(), kAllowed);
  s = RawSparseCall(address, kSparsePushMethod, SparseRowsFrame(h, id, {1, 1}, 2), &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  const absl::Time stop = absl::Now();
  (*server)->Shutdown();
  for (auto& t : pushes) t.join();
  EXPECT_LT(absl::Now() - stop, absl::Seconds(10));
  for (const grpc::Status& w : waited) {
    EXPECT_EQ(w.error_code(), grpc::StatusCode::UNAVAILABLE) << w.error_message();
  }
}

}  // namespace
}  // namespace dptrain
