#include "worker/ring_checkpoints.h"

#include "absl/strings/str_cat.h"
#include "common/in_memory_link.h"
#include "gtest/gtest.h"
#include "worker/graph/builtin_models.h"

namespace dptrain {
namespace {

using absl::StatusCode;

std::string TempDir(absl::string_view name) { return absl::StrCat(::testing::TempDir(), name); }

// One rank's model, ring store and checkpointer over a ring of one.
struct Rank {
  InMemoryHub hub{1, absl::Seconds(5)};
  std::unique_ptr<nn::Model> model;
  std::unique_ptr<ShardedRingStore> store;
  std::unique_ptr<RingCheckpointer> saves;
};

RingCheckpointOptions Options(const std::string& dir, const nn::Model& model) {
  RingCheckpointOptions o;
  o.dir = dir;
  o.every = 2;
  o.job_id = "job";
  for (const nn::ParamInfo& p : model.params()) o.tensors.push_back({p.name, p.size});
  o.optimizer = "sgd";
  return o;
}

// `options` edits the checkpointer's options (after Options(dir, model)).
std::unique_ptr<Rank> MakeRank(const std::string& dir, PosixFileSystem* fs,
                               void (*edit)(RingCheckpointOptions&) = nullptr) {
  auto rank = std::make_unique<Rank>();
  nn::ModelOptions m;
  m.name = "mlp";
  m.seed = 3;
  auto model = graph::CreateBuiltinModel(m);
  EXPECT_TRUE(model.ok()) << model.status();
  rank->model = *std::move(model);
  ShardedRingStoreOptions s;
  s.optimizer.learning_rate = 0.1f;
  s.optimizer.momentum = 0.9f;
  auto store = ShardedRingStore::Create(&rank->hub.link(0), s);
  EXPECT_TRUE(store.ok()) << store.status();
  rank->store = *std::move(store);
  RingCheckpointOptions o = Options(dir, *rank->model);
  o.fs = fs;
  if (edit != nullptr) edit(o);
  auto saves = RingCheckpointer::Create(o, rank->store.get());
  EXPECT_TRUE(saves.ok()) << saves.status();
  rank->saves = *std::move(saves);
  return rank;
}

// Steps [0, steps) with a made-up gradient, each followed by the checkpointer.
void Train(Rank& r, int64_t steps) {
  std::vector<float>& w = r.model->weights();
  ASSERT_TRUE(r.store->Start(absl::MakeSpan(w)).ok());
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<float> g(w.size() + 1, 0.01f * static_cast<float>(step + 1));
    g.back() = 0;
    ASSERT_TRUE(r.store->PushPull(step, absl::MakeSpan(g), absl::MakeSpan(w)).ok());
    ASSERT_TRUE(r.saves->AfterStep(step + 1, *r.model).ok());
  }
}

TEST(RingCheckpointerTest, ResumesTheNewestCheckpointAndItsStep) {
  PosixFileSystem fs;
  const std::string dir = TempDir("resumes");
  auto first = MakeRank(dir, &fs);
  Train(*first, 5);  // Checkpoints of steps 2 and 4.
  auto second = MakeRank(dir, &fs);
  std::string said;
  ASSERT_TRUE(second->saves->Resume(*second->model, &said).ok());
  EXPECT_EQ(second->store->resume_step(), 4);
  EXPECT_NE(said.find("restored step 4"), std::string::npos) << said;
  EXPECT_NE(second->model->weights(), first->model->weights());  // Step 5 is not in it.
}

TEST(RingCheckpointerTest, ACheckpointOfAnotherJobShapeIsRefused) {
  PosixFileSystem fs;
  const std::string dir = TempDir("refused");
  Train(*MakeRank(dir, &fs), 2);
  struct Case {
    void (*edit)(RingCheckpointOptions&);
    const char* says;
  };
  const Case cases[] = {
      {[](RingCheckpointOptions& o) { o.world_size = 2; }, "world size of 1, this job has 2"},
      {[](RingCheckpointOptions& o) { o.optimizer = "adam"; }, "of optimizer sgd"},
      {[](RingCheckpointOptions& o) { o.job_id = "other"; }, "of job 'job'"},
      {[](RingCheckpointOptions& o) { o.tensors.back().name = "x"; }, "of another model"},
  };
  for (const Case& c : cases) {
    auto rank = MakeRank(dir, &fs, c.edit);
    std::string said;
    const absl::Status s = rank->saves->Resume(*rank->model, &said);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s;
  }
}

TEST(RingCheckpointerTest, ResumingAnEmptyDirectoryIsNotFound) {
  PosixFileSystem fs;
  auto rank = MakeRank(TempDir("empty"), &fs);
  std::string said;
  EXPECT_EQ(rank->saves->Resume(*rank->model, &said).code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace dptrain
