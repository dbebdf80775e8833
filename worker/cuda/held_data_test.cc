// The training set in device memory (CudaModel::HoldTrainingData, TrainStepHeld; issue 28's
// "data on the device"): steps on held samples, cropped, flipped, normalised and padded by the
// gather kernel, equal bit for bit the steps on the same batches made on the host with
// nn::HeldValue (which worker/held_batches_test checks against GatherBatch + AugmentBatch), and
// the refusals. Needs a GPU (skips visibly without one).
#include "worker/nn/held_data.h"

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/cuda/cuda_model.h"
#include "worker/cuda/gpu_twin_testing.h"

namespace dptrain {
namespace cuda {
namespace {

constexpr int kImages = 20, kRows = 28, kCols = 28;

class HeldDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!HaveGpu(&why)) GTEST_SKIP() << "no usable GPU here (" << why << ")";
    std::mt19937 gen(5);
    bytes_.resize(kImages * kRows * kCols);
    for (uint8_t& b : bytes_) b = static_cast<uint8_t>(gen() % 256);
    for (int i = 0; i < kImages; ++i) labels_.push_back(static_cast<nn::Label>(i % 10));
    data_.size = kImages;
    data_.channels = 1;
    data_.rows = kRows;
    data_.cols = kCols;
    data_.bytes = bytes_;
    data_.labels = labels_;
    data_.mean = {0.3f};
    data_.inv_std = {2.5f};
    data_.fill = {-0.75f};
  }

  static std::unique_ptr<CudaModel> Lenet(bool cuda_graphs = false) {
    nn::ModelOptions options;
    options.name = "lenet";
    options.seed = 3;
    DeviceOptions device;
    device.deterministic = true;
    device.cuda_graphs = cuda_graphs;
    absl::StatusOr<std::unique_ptr<CudaModel>> m = CudaModel::Create(options, device);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *std::move(m) : nullptr;
  }

  // The batch of `samples` as the host makes it.
  std::vector<float> HostBatch(const std::vector<nn::HeldSample>& samples) const {
    std::vector<float> out;
    for (const nn::HeldSample& s : samples) {
      for (int y = 0; y < kRows; ++y) {
        for (int x = 0; x < kCols; ++x) {
          out.push_back(nn::HeldValue(bytes_.data() + s.index * kRows * kCols, kRows, kCols, 0, y,
                                      x, s, data_.mean.data(), data_.inv_std.data(),
                                      data_.fill.data()));
        }
      }
    }
    return out;
  }

  std::vector<uint8_t> bytes_;
  std::vector<nn::Label> labels_;
  nn::HeldData data_;
};

TEST_F(HeldDataTest, HeldStepsAreTheHostGatheredSteps) {
  std::unique_ptr<CudaModel> held = Lenet(), host = Lenet();
  ASSERT_TRUE(held && host);
  ASSERT_TRUE(held->HoldTrainingData(data_).ok());
  std::mt19937 gen(9);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    std::vector<nn::HeldSample> samples(8);
    std::vector<nn::Label> labels;
    for (nn::HeldSample& s : samples) {
      s.index = gen() % kImages;
      s.shift_y = static_cast<int>(gen() % 9) - 4;  // Padding 4.
      s.shift_x = static_cast<int>(gen() % 9) - 4;
      s.flip = static_cast<int>(gen() % 2);
      labels.push_back(labels_[s.index]);
    }
    const std::vector<float> images = HostBatch(samples);
    absl::StatusOr<nn::BatchResult> a = held->TrainStepHeld(samples);
    absl::StatusOr<nn::BatchResult> b = host->TrainStep(images.data(), labels.data(), 8);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(a->loss, b->loss);
    EXPECT_EQ(a->correct, b->correct);
    absl::StatusOr<std::vector<float>> ga = held->DeviceGradsForTest();
    absl::StatusOr<std::vector<float>> gb = host->DeviceGradsForTest();
    ASSERT_TRUE(ga.ok() && gb.ok());
    EXPECT_TRUE(*ga == *gb) << "the gradients differ";
    ASSERT_TRUE(held->ApplySgd(0.1f).ok());
    ASSERT_TRUE(host->ApplySgd(0.1f).ok());
  }
  EXPECT_EQ(held->weights(), host->weights());
}

// Deferred results (what the trainer asks of a lone replica whose data is held): the steps
// return without their loss, TakeResults gives each step's, equal to an immediate model's.
TEST_F(HeldDataTest, DeferredStepsGiveTheSameResults) {
  std::unique_ptr<CudaModel> deferred = Lenet(), immediate = Lenet();
  ASSERT_TRUE(deferred && immediate);
  ASSERT_TRUE(deferred->HoldTrainingData(data_).ok());
  ASSERT_TRUE(immediate->HoldTrainingData(data_).ok());
  ASSERT_TRUE(deferred->DeferResults(true));
  std::vector<nn::BatchResult> expected;
  for (int step = 0; step < 5; ++step) {
    std::vector<nn::HeldSample> samples(4 + step);
    for (size_t i = 0; i < samples.size(); ++i) samples[i].index = (3 * step + 7 * i) % kImages;
    absl::StatusOr<nn::BatchResult> a = deferred->TrainStepHeld(samples);
    absl::StatusOr<nn::BatchResult> b = immediate->TrainStepHeld(samples);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(a->deferred);
    EXPECT_FALSE(b->deferred);
    expected.push_back(*b);
    ASSERT_TRUE(deferred->ApplySgd(0.1f).ok());
    ASSERT_TRUE(immediate->ApplySgd(0.1f).ok());
  }
  EXPECT_TRUE(deferred->DeferResults(false)) << "five steps still pending";
  absl::StatusOr<std::vector<nn::BatchResult>> taken = deferred->TakeResults();
  ASSERT_TRUE(taken.ok()) << taken.status();
  ASSERT_EQ(taken->size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ((*taken)[i].loss, expected[i].loss) << i;
    EXPECT_EQ((*taken)[i].correct, expected[i].correct) << i;
  }
  EXPECT_TRUE(deferred->TakeResults()->empty());
  EXPECT_FALSE(deferred->DeferResults(false));
  EXPECT_EQ(deferred->weights(), immediate->weights());
}

// CUDA graphs (DeviceOptions::cuda_graphs): deferred held steps replayed from a captured graph
// give the eager steps' results and weights bit for bit; the first step of a batch size runs
// eagerly, the next is captured, the later ones replay; an eager step (Evaluate, another batch
// size, a larger one that moves the buffers) drops the graph and the one after it runs eagerly
// again. LeNet has no batch norm: its buffers compared below are empty (batch-norm statistics
// under replays are not checked here).
TEST_F(HeldDataTest, GraphReplaysAreTheEagerSteps) {
  std::unique_ptr<CudaModel> graphed = Lenet(/*cuda_graphs=*/true), eager = Lenet();
  ASSERT_TRUE(graphed && eager);
  for (CudaModel* m : {graphed.get(), eager.get()}) {
    ASSERT_TRUE(m->HoldTrainingData(data_).ok());
    ASSERT_TRUE(m->DeferResults(true));
  }
  const std::vector<float> test(2 * kRows * kCols, 0.25f);
  const std::vector<nn::Label> test_labels = {1, 2};
  std::mt19937 gen(11);
  // Batch sizes in order (-1: an evaluation; 12 grows every buffer after a capture), and the
  // replays expected after each step.
  const std::vector<int> batches = {8, 8, 8, 8, 5, 8, 8, 8, -1, 8, 8, 8, 12, 8, 8, 8};
  const std::vector<int> replays = {0, 1, 2, 3, 3, 3, 4, 5, 5, 5, 6, 7, 7, 7, 8, 9};
  for (size_t step = 0; step < batches.size(); ++step) {
    SCOPED_TRACE(step);
    if (batches[step] < 0) {  // An evaluation between steps.
      for (CudaModel* m : {graphed.get(), eager.get()}) {
        ASSERT_TRUE(m->Evaluate(test.data(), test_labels.data(), 2).ok());
      }
      EXPECT_EQ(graphed->graph_replays(), replays[step]);
      continue;
    }
    std::vector<nn::HeldSample> samples(batches[step]);
    for (nn::HeldSample& s : samples) {
      s.index = gen() % kImages;
      s.flip = static_cast<int>(gen() % 2);
    }
    for (CudaModel* m : {graphed.get(), eager.get()}) {
      absl::StatusOr<nn::BatchResult> r = m->TrainStepHeld(samples);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_TRUE(r->deferred);
      ASSERT_TRUE(m->ApplySgd(0.1f).ok());
    }
    EXPECT_TRUE(graphed->graph_refusal().ok()) << graphed->graph_refusal();
    EXPECT_EQ(graphed->graph_replays(), replays[step]);
  }
  EXPECT_EQ(eager->graph_replays(), 0);
  absl::StatusOr<std::vector<nn::BatchResult>> a = graphed->TakeResults();
  absl::StatusOr<std::vector<nn::BatchResult>> b = eager->TakeResults();
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), b->size());
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].loss, (*b)[i].loss) << i;
    EXPECT_EQ((*a)[i].correct, (*b)[i].correct) << i;
  }
  EXPECT_EQ(graphed->weights(), eager->weights());
  EXPECT_EQ(graphed->buffer_values(), eager->buffer_values());
}

TEST_F(HeldDataTest, Refusals) {
  std::unique_ptr<CudaModel> m = Lenet();
  ASSERT_TRUE(m);
  std::vector<nn::HeldSample> one(1);
  EXPECT_EQ(m->TrainStepHeld(one).status().code(), absl::StatusCode::kFailedPrecondition);
  nn::HeldData wrong = data_;
  wrong.rows = 27;  // Not the model's input.
  EXPECT_EQ(m->HoldTrainingData(wrong).code(), absl::StatusCode::kInvalidArgument);
  std::vector<nn::Label> bad = labels_;
  bad[3] = 10;
  wrong = data_;
  wrong.labels = bad;
  EXPECT_EQ(m->HoldTrainingData(wrong).message(), "held sample 3 has label 10, not in [0, 10)");
  ASSERT_TRUE(m->HoldTrainingData(data_).ok());
  one[0].index = kImages;
  EXPECT_EQ(m->TrainStepHeld(one).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m->TrainStepHeld({}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cuda
}  // namespace dptrain
