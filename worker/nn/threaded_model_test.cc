// ModelOptions.threads > 1 (the intra-op pool, or no pool and BLAS's threads): the
// same loss and gradients as one thread, up to float rounding, and bit-identical from run to run,
// for each convolution algorithm (the two differ by more than rounding on random data, where a
// ReLU input near 0 can change sign; pytorch_parity_test checks each against PyTorch).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/graph/builtin_models.h"
#include "worker/nn/model.h"

namespace dptrain {
namespace nn {
namespace {

constexpr int kImage = 28 * 28;

std::unique_ptr<Model> MustCreate(const std::string& name, int threads, DenseGemm dense_gemm,
                                  ConvAlgorithm conv) {
  ModelOptions options;
  options.name = name;
  options.seed = 7;
  options.threads = threads;
  options.dense_gemm = dense_gemm;
  options.conv_algorithm = conv;
  absl::StatusOr<std::unique_ptr<Model>> model = graph::CreateBuiltinModel(options);
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

struct Batch {
  std::vector<float> images;
  std::vector<nn::Label> labels;
};

Batch MakeBatch(int batch) {
  Batch b;
  b.images.resize(static_cast<size_t>(batch) * kImage);
  b.labels.resize(batch);
  uint64_t state = 12345;
  for (float& v : b.images) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    v = static_cast<float>((state >> 40) % 1000) / 1000.0f;
  }
  for (int i = 0; i < batch; ++i) b.labels[i] = static_cast<nn::Label>(i % 10);
  return b;
}

struct StepResult {
  double loss;
  std::vector<float> grads;
  std::vector<float> buffers;
};

StepResult Step(Model& model, const Batch& b) {
  absl::StatusOr<BatchResult> r =
      model.TrainStep(b.images.data(), b.labels.data(), static_cast<int>(b.labels.size()));
  EXPECT_TRUE(r.ok()) << r.status();
  return {
      r.ok() ? r->loss : 0.0, {model.grads().begin(), model.grads().end()}, model.buffer_values()};
}

void CheckModel(const std::string& name, int batch,
                ConvAlgorithm conv = ConvAlgorithm::kIm2col) {
  const Batch b = MakeBatch(batch);
  auto one = MustCreate(name, 1, DenseGemm::kPoolSplit, conv);
  const StepResult ref = Step(*one, b);
  for (int threads : {2, 3}) {
    for (DenseGemm dense : {DenseGemm::kPoolSplit, DenseGemm::kBlasThreads}) {
      SCOPED_TRACE(name + ", threads " + std::to_string(threads) +
                   (dense == DenseGemm::kBlasThreads ? ", on BLAS threads, no pool" : "") +
                   (conv == ConvAlgorithm::kOneDnn ? ", oneDNN convolutions" : ""));
      auto model = MustCreate(name, threads, dense, conv);
      const StepResult first = Step(*model, b);
      const StepResult second = Step(*model, b);  // Same weights: must repeat exactly.
      EXPECT_NEAR(first.loss, ref.loss, 1e-5 * std::max(1.0, std::fabs(ref.loss)));
      ASSERT_EQ(first.grads.size(), ref.grads.size());
      double scale = 1e-12, worst = 0;
      for (float g : ref.grads) scale = std::max(scale, static_cast<double>(std::fabs(g)));
      for (size_t i = 0; i < ref.grads.size(); ++i) {
        worst = std::max(worst, std::fabs(static_cast<double>(first.grads[i]) - ref.grads[i]));
      }
      EXPECT_LE(worst, 1e-4 * scale) << "largest |grad| " << scale;
      EXPECT_EQ(first.loss, second.loss);
      EXPECT_TRUE(first.grads == second.grads) << "gradients differ between identical steps";
      // Batch-norm running statistics (resnet18): channel-split, so as with one thread.
      ASSERT_EQ(first.buffers.size(), ref.buffers.size());
      for (size_t i = 0; i < ref.buffers.size(); ++i) {
        EXPECT_NEAR(first.buffers[i], ref.buffers[i],
                    1e-5 * std::max(1.0f, std::fabs(ref.buffers[i])))
            << i;
      }
      absl::StatusOr<BatchResult> eval_one = one->Evaluate(b.images.data(), b.labels.data(), batch);
      absl::StatusOr<BatchResult> eval = model->Evaluate(b.images.data(), b.labels.data(), batch);
      ASSERT_TRUE(eval.ok() && eval_one.ok());
      EXPECT_EQ(eval->correct, eval_one->correct);
    }
  }
}

TEST(ThreadedModelTest, MlpMatchesOneThread) { CheckModel("mlp", 67); }
TEST(ThreadedModelTest, LeNetMatchesOneThread) { CheckModel("lenet", 67); }
TEST(ThreadedModelTest, LeNetOnOneDnnMatchesOneThread) {
  CheckModel("lenet", 67, ConvAlgorithm::kOneDnn);
}
TEST(ThreadedModelTest, LeNetBatchOfOne) { CheckModel("lenet", 1); }
TEST(ThreadedModelTest, ResNet18MatchesOneThread) { CheckModel("resnet18", 11); }
TEST(ThreadedModelTest, ResNet18OnOneDnnMatchesOneThread) {
  CheckModel("resnet18", 11, ConvAlgorithm::kOneDnn);
}

}  // namespace
}  // namespace nn
}  // namespace dptrain
