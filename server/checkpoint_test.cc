#include "server/checkpoint.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/captured_log.h"
#include "gtest/gtest.h"
#include "server/buffer_averager.h"
#include "server/parameter_shard.h"

namespace dptrain {
namespace {

using absl::StatusCode;

std::string TempDir(absl::string_view name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return absl::StrCat(base != nullptr ? base : "/tmp", "/", name);
}

ShardCheckpoint Sample(int64_t step) {
  ShardCheckpoint cp;
  cp.job_id = "job \"x\"";
  cp.shard = 1;
  cp.num_shards = 2;
  cp.init_fingerprint = 0xfedcba9876543210ull;
  cp.model = {{{"conv.weight", 6}, {"fc\nbias", 2}}, 2, 4};
  cp.optimizer = "adam";
  cp.policy = "bsp";
  cp.step = step;
  ChunkCheckpoint a;
  a.tensor_id = 0;
  a.chunk_index = 1;
  a.version = step;
  a.weights = {1.5f, -2.0f, 3.25f};
  a.state.exp_avg = {0.1f, 0.2f, 0.3f};
  a.state.exp_avg_sq = {1e-8f, 2e-8f, 3e-8f};
  a.state.steps = step;
  ChunkCheckpoint b;
  b.tensor_id = 1;
  b.chunk_index = 0;
  b.version = step + 1;
  b.weights = {7.0f, 8.0f};
  cp.chunks = {a, b};
  return cp;
}

void ExpectEqual(const ShardCheckpoint& x, const ShardCheckpoint& y) {
  EXPECT_EQ(x.job_id, y.job_id);
  EXPECT_EQ(x.shard, y.shard);
  EXPECT_EQ(x.num_shards, y.num_shards);
  EXPECT_EQ(x.init_fingerprint, y.init_fingerprint);
  ASSERT_EQ(x.model.tensors.size(), y.model.tensors.size());
  for (size_t i = 0; i < x.model.tensors.size(); ++i) {
    EXPECT_EQ(x.model.tensors[i].name, y.model.tensors[i].name);
    EXPECT_EQ(x.model.tensors[i].num_elements, y.model.tensors[i].num_elements);
  }
  EXPECT_EQ(x.model.max_chunk_elements, y.model.max_chunk_elements);
  EXPECT_EQ(x.optimizer, y.optimizer);
  EXPECT_EQ(x.policy, y.policy);
  EXPECT_EQ(x.step, y.step);
  EXPECT_EQ(x.world_size, y.world_size);
  EXPECT_EQ(x.buffers, y.buffers);
  ASSERT_EQ(x.chunks.size(), y.chunks.size());
  for (size_t i = 0; i < x.chunks.size(); ++i) {
    const ChunkCheckpoint &a = x.chunks[i], &b = y.chunks[i];
    EXPECT_EQ(a.tensor_id, b.tensor_id);
    EXPECT_EQ(a.chunk_index, b.chunk_index);
    EXPECT_EQ(a.version, b.version);
    EXPECT_EQ(a.weights, b.weights);
    EXPECT_EQ(a.state.momentum_buffer, b.state.momentum_buffer);
    EXPECT_EQ(a.state.exp_avg, b.state.exp_avg);
    EXPECT_EQ(a.state.exp_avg_sq, b.state.exp_avg_sq);
    EXPECT_EQ(a.state.steps, b.state.steps);
  }
}

TEST(CheckpointFormatTest, RoundTripsEveryField) {
  auto bytes = SerializeCheckpoint(Sample(40));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto back = ParseCheckpoint(*bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectEqual(*back, Sample(40));
}

TEST(CheckpointFormatTest, RoundTripsARingCheckpointWithBuffers) {
  ShardCheckpoint ring = Sample(60);
  ring.policy = "allreduce";
  ring.world_size = 2;
  ring.buffers = {0.5f, 1.5f, -0.25f, 4.0f};
  auto bytes = SerializeCheckpoint(ring);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto back = ParseCheckpoint(*bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectEqual(*back, ring);
  // The buffers are under the checksum too.
  std::string flipped = *bytes;
  flipped[flipped.size() - 2] ^= 0x40;
  EXPECT_EQ(ParseCheckpoint(flipped).status().code(), StatusCode::kDataLoss);
}

TEST(CheckpointFormatTest, EveryTruncationIsAnErrorNotACrash) {
  auto bytes = SerializeCheckpoint(Sample(3));
  ASSERT_TRUE(bytes.ok());
  for (size_t n = 0; n < bytes->size(); ++n) {
    auto parsed = ParseCheckpoint(absl::string_view(*bytes).substr(0, n));
    ASSERT_FALSE(parsed.ok()) << "a checkpoint cut to " << n << " bytes parsed";
    EXPECT_EQ(parsed.status().code(), StatusCode::kDataLoss) << n << ": " << parsed.status();
  }
}

TEST(CheckpointFormatTest, AnyFlippedByteIsDetected) {
  auto bytes = SerializeCheckpoint(Sample(3));
  ASSERT_TRUE(bytes.ok());
  for (size_t i = 8; i < bytes->size(); ++i) {
    std::string bad = *bytes;
    bad[i] ^= 0x10;
    auto parsed = ParseCheckpoint(bad);
    if (parsed.ok()) {
      // Only a flip inside the header's padding or JSON whitespace can leave it valid, and
      // then it must still be the same checkpoint.
      ExpectEqual(*parsed, Sample(3));
    }
  }
  std::string bad = *bytes;
  bad[bad.size() - 1] ^= 0x01;  // The last data byte.
  EXPECT_EQ(ParseCheckpoint(bad).status().code(), StatusCode::kDataLoss);
}

// verify_checksum = false (the fuzzer's way past the CRC) reads the bytes as they are: a
// flipped data byte then parses, with the flipped value; the default refuses the same file.
TEST(CheckpointFormatTest, WithoutChecksumVerificationTheDataIsReadAsItIs) {
  auto bytes = SerializeCheckpoint(Sample(3));
  ASSERT_TRUE(bytes.ok());
  std::string bad = *bytes;
  bad[bad.size() - 1] ^= 0x40;  // The last data byte: the last float's sign bit.
  EXPECT_EQ(ParseCheckpoint(bad).status().code(), StatusCode::kDataLoss);
  ParseCheckpointOptions unverified;
  unverified.verify_checksum = false;
  auto parsed = ParseCheckpoint(bad, unverified);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const ShardCheckpoint want = Sample(3);
  ASSERT_EQ(parsed->chunks.size(), want.chunks.size());
  EXPECT_EQ(parsed->step, want.step);
  int differing = 0;
  for (size_t c = 0; c < want.chunks.size(); ++c) {
    const ChunkCheckpoint& got = parsed->chunks[c];
    const ChunkCheckpoint& ref = want.chunks[c];
    for (const auto& [a, b] : {std::pair{&got.weights, &ref.weights},
                               std::pair{&got.state.momentum_buffer, &ref.state.momentum_buffer},
                               std::pair{&got.state.exp_avg, &ref.state.exp_avg},
                               std::pair{&got.state.exp_avg_sq, &ref.state.exp_avg_sq}}) {
      ASSERT_EQ(a->size(), b->size());
      for (size_t i = 0; i < a->size(); ++i) differing += (*a)[i] != (*b)[i];
    }
  }
  EXPECT_EQ(differing, 1);
}

// The fuzz target's seeds (tests/fuzz/corpus/checkpoint_fuzzer, written by hand in the
// documented format, docs/checkpoints.md) are valid checkpoints: the format is what the
// documentation says, and the fuzzer starts from inputs that reach Restore.
TEST(CheckpointFormatTest, TheDocumentedFormatWrittenByHandParses) {
  PosixFileSystem fs;
  const std::string dir = "tests/fuzz/corpus/checkpoint_fuzzer";
  for (const char* name : {"sgd_momentum", "adam", "plain"}) {
    auto bytes = fs.ReadFile(dir + "/" + name);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    auto cp = ParseCheckpoint(*bytes);
    ASSERT_TRUE(cp.ok()) << name << ": " << cp.status();
    EXPECT_EQ(cp->chunks.size(), 3u) << name;
  }
}

TEST(CheckpointFormatTest, ForeignSafetensorsIsRejected) {
  EXPECT_FALSE(ParseCheckpoint("not a checkpoint").ok());
}

// Fails or truncates writes on request (leveldb's EnvWrapper idea).
class FaultyFileSystem : public FileSystemWrapper {
 public:
  explicit FaultyFileSystem(FileSystem* target) : FileSystemWrapper(target) {}
  enum class Mode { kNormal, kFail, kCrashMidWrite, kTruncateSilently };
  Mode mode = Mode::kNormal;
  absl::Status WriteFile(const std::string& path, absl::string_view data) override {
    switch (mode) {
      case Mode::kNormal:
        return target()->WriteFile(path, data);
      case Mode::kFail:
        return absl::ResourceExhaustedError("no space left on device (injected)");
      case Mode::kCrashMidWrite:  // Half the bytes reach the disk, then the process "dies".
        (void)target()->WriteFile(path, data.substr(0, data.size() / 2));
        return absl::UnavailableError("crashed mid-write (injected)");
      case Mode::kTruncateSilently:  // The disk lies: it says OK but keeps half.
        return target()->WriteFile(path, data.substr(0, data.size() / 2));
    }
    return absl::InternalError("unreachable");
  }
};

TEST(CheckpointDirTest, KeepsTheNewestAndFallsBackPastCorruptOnes) {
  PosixFileSystem posix;
  FaultyFileSystem fs(&posix);
  CapturedLog log;
  const std::string dir = TempDir("keep/nested");
  auto cd = CheckpointDir::Open({dir, 1, 3, &fs, log.sink()});
  ASSERT_TRUE(cd.ok()) << cd.status();
  for (int64_t step : {10, 20, 30, 40}) ASSERT_TRUE(cd->Write(Sample(step)).ok());
  auto steps = cd->Steps();
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(*steps, (std::vector<int64_t>{40, 30, 20}));
  auto newest = cd->LoadNewest();
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->step, 40);

  // A write that fails or crashes midway leaves the previous checkpoints as they were and
  // no temporary file.
  fs.mode = FaultyFileSystem::Mode::kFail;
  EXPECT_EQ(cd->Write(Sample(50)).code(), StatusCode::kResourceExhausted);
  fs.mode = FaultyFileSystem::Mode::kCrashMidWrite;
  EXPECT_FALSE(cd->Write(Sample(50)).ok());
  auto names = posix.ListDir(dir);
  ASSERT_TRUE(names.ok());
  for (const std::string& n : *names) EXPECT_FALSE(absl::EndsWith(n, ".tmp")) << n;
  EXPECT_EQ(cd->LoadNewest()->step, 40);

  // A checkpoint that reads back truncated is skipped with a log line.
  fs.mode = FaultyFileSystem::Mode::kTruncateSilently;
  ASSERT_TRUE(cd->Write(Sample(60)).ok());
  newest = cd->LoadNewest();
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(newest->step, 40);
  EXPECT_EQ(log.Count("skipping checkpoint of step 60"), 1) << log.lines().size();
  EXPECT_EQ(cd->Load(60).status().code(), StatusCode::kDataLoss);
  auto missing = cd->Load(20);  // Pruned by keep = 3.
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "60,40,30")) << missing.status();
}

TEST(CheckpointDirTest, AStaleTemporaryFileIsRemovedOnOpen) {
  PosixFileSystem fs;
  const std::string dir = TempDir("stale");
  ASSERT_TRUE(fs.CreateDir(dir).ok());
  const std::string tmp = dir + "/shard-0-step-000000000007.safetensors.tmp";
  ASSERT_TRUE(fs.WriteFile(tmp, "half").ok());
  ASSERT_TRUE(CheckpointDir::Open({dir, 0, 3, &fs, StderrLog()}).ok());
  EXPECT_FALSE(fs.ReadFile(tmp).ok());
}

// --- The shard with checkpoints: restore, resume, roll back. ---

// One tensor of 5 elements in chunks of <= 2 (three chunks), one shard, two workers.
const ModelDescription& Model() {
  static const auto* m = new ModelDescription{{{"w", 5}}, 1, 2};
  return *m;
}

ParameterShardOptions Options(const std::string& dir, FileSystem* fs = nullptr) {
  ParameterShardOptions o;
  o.num_workers = 2;
  o.step_timeout = absl::Seconds(10);
  o.optimizer.name = "sgd";
  o.optimizer.learning_rate = 0.1f;
  o.optimizer.momentum = 0.9f;
  o.checkpoints.dir = dir;
  o.checkpoints.every = dir.empty() ? 0 : 2;
  o.checkpoints.fs = fs;
  return o;
}

std::vector<ChunkView> Views(const std::vector<float>& v, std::vector<std::string>& storage) {
  storage = {std::string(reinterpret_cast<const char*>(v.data()), 8),
             std::string(reinterpret_cast<const char*>(v.data() + 2), 8),
             std::string(reinterpret_cast<const char*>(v.data() + 4), 4)};
  return {{0, 0, DType::kFp32, storage[0]},
          {0, 1, DType::kFp32, storage[1]},
          {0, 2, DType::kFp32, storage[2]}};
}

// A gradient that depends on the step, the rank and the weights (as a real one does).
std::vector<float> Gradient(int64_t step, int rank, const std::vector<float>& w) {
  std::vector<float> g(5);
  for (int i = 0; i < 5; ++i) g[i] = 0.3f * w[i] - 0.01f * (step + 1) * (rank + 1) + 0.001f * i;
  return g;
}

// Both workers push `steps` steps from `first`; returns the weights after the last.
absl::StatusOr<std::vector<float>> Train(ParameterShard& shard, int64_t first, int64_t steps,
                                         std::vector<float> w) {
  for (int64_t step = first; step < first + steps; ++step) {
    std::vector<float> out[2];
    absl::Status status[2];
    std::vector<std::thread> workers;
    for (int rank = 0; rank < 2; ++rank) {
      workers.emplace_back([&, rank] {
        std::vector<std::string> storage;
        const std::vector<float> g = Gradient(step, rank, w);
        auto v = shard.PushPull("job", rank, step, Views(g, storage), absl::Now() + absl::Seconds(10),
                                [&](const ChunkSpec&, absl::Span<const float> x) {
                                  out[rank].insert(out[rank].end(), x.begin(), x.end());
                                });
        status[rank] = v.status();
      });
    }
    for (auto& t : workers) t.join();
    for (const absl::Status& s : status) {
      if (!s.ok()) return s;
    }
    if (out[0] != out[1]) return absl::InternalError("replicas differ");
    w = out[0];
  }
  return w;
}

const std::vector<float> kInitial = {1, -2, 3, -4, 5};

TEST(ShardCheckpointTest, ARestartedShardResumesBitIdentically) {
  // Uninterrupted: 7 steps.
  auto straight = ParameterShard::Create(Options(""));
  ASSERT_TRUE(straight.ok());
  std::vector<std::string> storage;
  ASSERT_TRUE((*straight)->Init("job", 0, Model(), Views(kInitial, storage)).ok());
  auto expected = Train(**straight, 0, 7, kInitial);
  ASSERT_TRUE(expected.ok()) << expected.status();

  // Crashed after step 5 (last checkpoint: step 4), restarted: the workers rewind to 4.
  const std::string dir = TempDir("resume");
  std::vector<float> at4;
  {
    auto first = ParameterShard::Create(Options(dir));
    ASSERT_TRUE(first.ok());
    ASSERT_TRUE((*first)->Init("job", 0, Model(), Views(kInitial, storage)).ok());
    auto w4 = Train(**first, 0, 4, kInitial);
    ASSERT_TRUE(w4.ok());
    at4 = *w4;
    ASSERT_TRUE(Train(**first, 4, 1, at4).ok());
    EXPECT_EQ((*first)->GetInfo().checkpoint_step, 4);
  }
  CapturedLog log;
  ParameterShardOptions o = Options(dir);
  o.log = log.sink();
  auto restarted = ParameterShard::Create(o);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_EQ(log.Count("restored step 4"), 1);
  const ParameterShard::Info info = (*restarted)->GetInfo();
  EXPECT_TRUE(info.initialized);
  EXPECT_EQ(info.version, 4);
  EXPECT_EQ(info.restored_step, 4);
  // Rank 0's repeated Init is recognised, not an error; the weights are the checkpoint's.
  auto again = (*restarted)->Init("job", 0, Model(), Views(kInitial, storage));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, 4);
  auto resumed = Train(**restarted, 4, 3, at4);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(*resumed, *expected);  // Momentum came back too: bit-identical.
}

TEST(ShardCheckpointTest, RollbackGoesBackAndAbortsWaiters) {
  const std::string dir = TempDir("rollback");
  auto shard = ParameterShard::Create(Options(dir));
  ASSERT_TRUE(shard.ok());
  std::vector<std::string> storage;
  ASSERT_TRUE((*shard)->Init("job", 0, Model(), Views(kInitial, storage)).ok());
  auto w2 = Train(**shard, 0, 2, kInitial);
  ASSERT_TRUE(w2.ok());
  auto w3 = Train(**shard, 2, 1, *w2);
  ASSERT_TRUE(w3.ok());
  // Rank 1 pushes step 3 and waits for rank 0, which goes back to step 2 instead.
  absl::Status waiter;
  std::thread t([&] {
    std::vector<std::string> s;
    waiter = (*shard)
                 ->PushPull("job", 1, 3, Views(Gradient(3, 1, *w3), s),
                            absl::Now() + absl::Seconds(10), [](const ChunkSpec&, auto) {})
                 .status();
  });
  while ((*shard)->GetInfo().pushes < 2 * 3 * 3 + 3) absl::SleepFor(absl::Milliseconds(1));
  auto back = (*shard)->Rollback("job", 0, 2, 1);
  ASSERT_TRUE(back.ok()) << back.status();
  t.join();
  EXPECT_EQ(waiter.code(), StatusCode::kAborted) << waiter;
  EXPECT_EQ((*shard)->GetInfo().version, 2);
  EXPECT_EQ((*shard)->GetInfo().rollbacks, 1);
  EXPECT_EQ((*shard)->GetInfo().incarnation, 1);
  EXPECT_EQ((*shard)->GetInfo().incarnation_step, 2);
  // Rank 1 joins the same incarnation: nothing changes. Replaying step 2 gives the same weights.
  EXPECT_TRUE((*shard)->Rollback("job", 1, 2, 1).ok());
  EXPECT_EQ((*shard)->GetInfo().rollbacks, 1);
  auto replayed = Train(**shard, 2, 1, *w2);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  EXPECT_EQ(*replayed, *w3);
  // A step without a checkpoint.
  EXPECT_EQ((*shard)->Rollback("job", 0, 1, 2).status().code(), StatusCode::kNotFound);
}

// Two ranks that each find a shard behind must not each send the other's progress back:
// the first Rollback of an incarnation goes back, the second only lets its rank in, and a
// rank on the old side of it can neither push nor open it again.
TEST(ShardCheckpointTest, AnIncarnationGoesBackOnceAndLetsEachRankIn) {
  auto shard = ParameterShard::Create(Options(TempDir("incarnation")));
  ASSERT_TRUE(shard.ok());
  ParameterShard& s = **shard;
  std::vector<std::string> storage;
  ASSERT_TRUE(s.Init("job", 0, Model(), Views(kInitial, storage)).ok());
  auto w2 = Train(s, 0, 2, kInitial);
  ASSERT_TRUE(w2.ok());
  auto push = [&](int rank, int64_t step, absl::Duration wait) {
    std::vector<std::string> g;
    return s
        .PushPull("job", rank, step, Views(Gradient(step, rank, *w2), g), absl::Now() + wait,
                  [](const ChunkSpec&, auto) {})
        .status();
  };
  // Rank 1 pushes step 2 and waits; rank 0 opens incarnation 1 at step 2, where every chunk
  // is: the weights stay, rank 1's push is dropped and its wait ends Aborted.
  absl::Status waiter;
  std::thread t([&] { waiter = push(1, 2, absl::Seconds(10)); });
  while (s.GetInfo().rank_steps[1] != 2) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(s.Rollback("job", 0, 2, 1).ok());
  t.join();
  EXPECT_EQ(waiter.code(), StatusCode::kAborted) << waiter;
  EXPECT_EQ(s.GetInfo().rollbacks, 0) << "at the step already: nothing loaded";
  // Rank 1 is still in incarnation 0: its pushes do not count until it joins.
  absl::Status stale = push(1, 2, absl::Seconds(10));
  EXPECT_EQ(stale.code(), StatusCode::kAborted) << stale;
  EXPECT_TRUE(absl::StrContains(stale.message(), "rank 1 is still in incarnation 0")) << stale;
  // Neither an older incarnation nor the same one from another step opens it again.
  EXPECT_EQ(s.Rollback("job", 1, 2, 0).status().code(), StatusCode::kAborted);
  EXPECT_EQ(s.Rollback("job", 1, 0, 1).status().code(), StatusCode::kAborted);
  EXPECT_EQ(s.GetInfo().incarnation_step, 2);
  // Rank 0 pushes step 2 in incarnation 1; rank 1 joins, which keeps that push.
  absl::Status first;
  std::thread t0([&] { first = push(0, 2, absl::Seconds(10)); });
  while (s.GetInfo().rank_steps[0] != 2) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(s.Rollback("job", 1, 2, 1).ok());
  ASSERT_TRUE(push(1, 2, absl::Seconds(10)).ok());
  t0.join();
  ASSERT_TRUE(first.ok()) << first;
  EXPECT_EQ(s.GetInfo().version, 3);
  // A shard at incarnation 1 (from step 2) is sent back to incarnation 2 from step 2: the
  // checkpoint of step 2 is loaded.
  ASSERT_TRUE(s.Rollback("job", 0, 2, 2).ok());
  EXPECT_EQ(s.GetInfo().version, 2);
  EXPECT_EQ(s.GetInfo().rollbacks, 1);
}

TEST(ShardCheckpointTest, RollbackNeedsBspAndACheckpointDirectory) {
  std::vector<std::string> storage;
  auto plain = ParameterShard::Create(Options(""));
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE((*plain)->Init("job", 0, Model(), Views(kInitial, storage)).ok());
  ASSERT_TRUE(Train(**plain, 0, 1, kInitial).ok());
  EXPECT_EQ((*plain)->Rollback("job", 0, 0, 1).status().code(), StatusCode::kFailedPrecondition);
  ParameterShardOptions o = Options(TempDir("ssp"));
  o.policy = SyncPolicy::kAsync;
  auto async = ParameterShard::Create(o);
  ASSERT_TRUE(async.ok());
  ASSERT_TRUE((*async)->Init("job", 0, Model(), Views(kInitial, storage)).ok());
  // Async applies each push at once, so the two ranks may read different weights: one push.
  std::vector<std::string> g_storage;
  auto pushed = (*async)->PushPull("job", 0, 0, Views(Gradient(0, 0, kInitial), g_storage),
                                   absl::Now() + absl::Seconds(10), [](const ChunkSpec&, auto) {});
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_EQ((*async)->Rollback("job", 0, 0, 1).status().code(), StatusCode::kFailedPrecondition);
}

TEST(ShardCheckpointTest, EveryRanksBatchNormStatisticsTravelWithTheCheckpoint) {
  const std::string dir = TempDir("buffers");
  const std::vector<float> rank0 = {1, 2, 3}, rank1 = {4, 5, 6};
  std::vector<std::string> storage;
  {
    auto shard = ParameterShard::Create(Options(dir));
    ASSERT_TRUE(shard.ok());
    ParameterShard& s = **shard;
    ASSERT_TRUE(s.Init("job", 0, Model(), Views(kInitial, storage)).ok());
    auto w1 = Train(s, 0, 1, kInitial);  // At step 1: the next checkpoint step is 2.
    ASSERT_TRUE(w1.ok());
    EXPECT_EQ(s.KeepBuffers("job", 0, 3, rank0).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(s.KeepBuffers("job", 0, 4, rank0).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(s.KeepBuffers("other", 0, 2, rank0).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(s.KeepBuffers("job", 2, 2, rank0).code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE(s.KeepBuffers("job", 0, 2, {9, 9, 9}).ok());
    ASSERT_TRUE(s.KeepBuffers("job", 0, 2, rank0).ok());  // A repeat replaces.
    EXPECT_EQ(s.KeepBuffers("job", 1, 2, {4, 5}).code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE(s.KeepBuffers("job", 1, 2, rank1).ok());
    EXPECT_EQ(s.Buffers("job", 0, 2).status().code(), StatusCode::kNotFound);  // Not yet taken.
    auto w3 = Train(s, 1, 2, *w1);  // Completes step 2 (its checkpoint) and step 3.
    ASSERT_TRUE(w3.ok()) << w3.status();
    auto held = s.Buffers("job", 1, 2);
    ASSERT_TRUE(held.ok()) << held.status();
    EXPECT_EQ(*held, rank1);
    EXPECT_EQ(s.KeepBuffers("job", 0, 2, rank0).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(s.Buffers("job", 0, 4).status().code(), StatusCode::kNotFound);
  }
  // A restarted shard gives each rank its own back.
  auto restarted = ParameterShard::Create(Options(dir));
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  ParameterShard& s = **restarted;
  ASSERT_EQ(s.GetInfo().restored_step, 2);
  auto held0 = s.Buffers("job", 0, 2);
  ASSERT_TRUE(held0.ok()) << held0.status();
  EXPECT_EQ(*held0, rank0);
  // A checkpoint that not every rank handed statistics in for holds none...
  ASSERT_TRUE(Train(s, 2, 1, kInitial).ok());
  ASSERT_TRUE(s.KeepBuffers("job", 0, 4, rank0).ok());
  ASSERT_TRUE(Train(s, 3, 1, kInitial).ok());
  EXPECT_EQ(s.GetInfo().checkpoint_step, 4);
  EXPECT_EQ(s.Buffers("job", 0, 4).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(s.Buffers("job", 0, 2).status().code(), StatusCode::kNotFound);
  // ...and going back to step 2 brings its statistics back from the file.
  ASSERT_TRUE(s.Rollback("job", 1, 2, 1).ok());
  auto held1 = s.Buffers("job", 1, 2);
  ASSERT_TRUE(held1.ok()) << held1.status();
  EXPECT_EQ(*held1, rank1);

  // A shard of another world size does not take them (from the newest checkpoint: step 2's).
  ASSERT_EQ(std::remove(absl::StrCat(dir, "/shard-0-step-000000000004.safetensors").c_str()), 0);
  CapturedLog log;
  ParameterShardOptions three = Options(dir);
  three.num_workers = 3;
  three.log = log.sink();
  auto other = ParameterShard::Create(three);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(log.Count("not restored"), 1);
  EXPECT_EQ((*other)->Buffers("job", 0, 2).status().code(), StatusCode::kNotFound);
}

TEST(ShardCheckpointTest, AtAnEpochsStartTheCheckpointKeepsTheRanksMean) {
  auto shard = ParameterShard::Create(Options(TempDir("epoch_buffers")));
  ASSERT_TRUE(shard.ok());
  ParameterShard& s = **shard;
  std::vector<std::string> storage;
  ASSERT_TRUE(s.Init("job", 0, Model(), Views(kInitial, storage)).ok());
  auto w1 = Train(s, 0, 1, kInitial);
  ASSERT_TRUE(w1.ok());
  const std::vector<float> rank0 = {1, 2, 0.1f}, rank1 = {4, 6, 0.2f};
  ASSERT_TRUE(s.KeepBuffers("job", 0, 2, rank0, /*epoch_end=*/true).ok());
  EXPECT_EQ(s.KeepBuffers("job", 1, 2, rank1, /*epoch_end=*/false).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(s.KeepBuffers("job", 1, 2, rank1, /*epoch_end=*/true).ok());
  ASSERT_TRUE(Train(s, 1, 1, *w1).ok());
  // What every replica held after the epoch's average: BufferAverager's arithmetic.
  const std::vector<float> mean = MeanInRankOrder({rank0, rank1});
  EXPECT_EQ(mean[0], 2.5f);
  for (int rank = 0; rank < 2; ++rank) {
    auto held = s.Buffers("job", rank, 2);
    ASSERT_TRUE(held.ok()) << held.status();
    EXPECT_EQ(*held, mean);
  }
}

TEST(ShardCheckpointTest, StatisticsAreKeptOnlyWithBspCheckpoints) {
  std::vector<std::string> storage;
  auto plain = ParameterShard::Create(Options(""));
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE((*plain)->Init("job", 0, Model(), Views(kInitial, storage)).ok());
  absl::Status no_interval = (*plain)->KeepBuffers("job", 0, 1, {1});
  EXPECT_EQ(no_interval.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(no_interval.message(), "--checkpoint_every")) << no_interval;
  ParameterShardOptions o = Options(TempDir("ssp_buffers"));
  o.policy = SyncPolicy::kSsp;
  auto ssp = ParameterShard::Create(o);
  ASSERT_TRUE(ssp.ok());
  ASSERT_TRUE((*ssp)->Init("job", 0, Model(), Views(kInitial, storage)).ok());
  EXPECT_EQ((*ssp)->KeepBuffers("job", 0, 2, {1}).code(), StatusCode::kFailedPrecondition);
}

TEST(ShardCheckpointTest, ACheckpointOfAnotherLayoutIsRefusedAtStart) {
  const std::string dir = TempDir("layout");
  {
    auto shard = ParameterShard::Create(Options(dir));
    ASSERT_TRUE(shard.ok());
    std::vector<std::string> storage;
    ASSERT_TRUE((*shard)->Init("job", 0, Model(), Views(kInitial, storage)).ok());
    ASSERT_TRUE(Train(**shard, 0, 2, kInitial).ok());
  }
  ParameterShardOptions o = Options(dir);
  o.optimizer.name = "adam";
  auto adam = ParameterShard::Create(o);
  EXPECT_EQ(adam.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(adam.status().message(), "optimizer")) << adam.status();
}

TEST(ShardCheckpointTest, FailedWritesAreCountedAndTrainingGoesOn) {
  PosixFileSystem posix;
  FaultyFileSystem fs(&posix);
  fs.mode = FaultyFileSystem::Mode::kFail;
  CapturedLog log;
  ParameterShardOptions o = Options(TempDir("failing"), &fs);
  o.log = log.sink();
  auto shard = ParameterShard::Create(o);
  ASSERT_TRUE(shard.ok());
  std::vector<std::string> storage;
  ASSERT_TRUE((*shard)->Init("job", 0, Model(), Views(kInitial, storage)).ok());
  ASSERT_TRUE(Train(**shard, 0, 4, kInitial).ok());
  // Steps 0 (the initial weights, at the first push), 2 and 4; the first failure is logged.
  EXPECT_EQ((*shard)->GetInfo().checkpoint_failures, 3);
  EXPECT_EQ((*shard)->GetInfo().checkpoints_written, 0);
  EXPECT_EQ(log.Count("checkpoint of step 0 failed"), 1);
  EXPECT_EQ(log.Count("failed"), 1);
}

}  // namespace
}  // namespace dptrain
