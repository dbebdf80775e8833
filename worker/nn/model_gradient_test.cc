// Numerical properties of the models as a whole: gradients against finite differences of an
// independent double-precision run, the data-parallel averaging identity, and that plain SGD on
// the gradients learns.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/graph/builtin_models.h"
#include "worker/nn/architectures.h"
#include "worker/nn/layer_check.h"
#include "worker/nn/model.h"
#include "worker/nn/softmax_cross_entropy.h"

namespace dptrain {
namespace nn {
namespace {

constexpr int kImage = 28 * 28;

std::unique_ptr<Model> MustCreate(const std::string& name, uint64_t seed) {
  absl::StatusOr<std::unique_ptr<Model>> model = graph::CreateBuiltinModel({name, seed});
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

// Ten random prototype images, smooth enough for a convnet (7x7 blocks of 4x4 pixels, each block
// -4 or +4); sample i has label i % 10 and is its prototype plus uniform noise.
struct Dataset {
  std::vector<float> images;
  std::vector<nn::Label> labels;
};

Dataset MakeDataset(int n, uint64_t seed, float noise) {
  std::mt19937_64 proto_rng(1234);  // Same prototypes for every call.
  std::vector<float> prototypes(10 * kImage);
  for (int k = 0; k < 10; ++k) {
    float blocks[7][7];
    for (auto& row : blocks) {
      for (float& b : row) b = (proto_rng() & 1) ? 4.0f : -4.0f;
    }
    for (int y = 0; y < 28; ++y) {
      for (int x = 0; x < 28; ++x) prototypes[k * kImage + y * 28 + x] = blocks[y / 4][x / 4];
    }
  }
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> jitter(-noise, noise);
  Dataset d;
  for (int i = 0; i < n; ++i) {
    d.labels.push_back(static_cast<nn::Label>(i % 10));
    for (int j = 0; j < kImage; ++j) {
      d.images.push_back(prototypes[(i % 10) * kImage + j] + jitter(rng));
    }
  }
  return d;
}

class ModelGradientTest : public ::testing::TestWithParam<std::string> {};

// TrainStep's float gradients against the same network run in double (the layers' double
// instantiation), whose own gradients are checked against central differences of its loss.
TEST_P(ModelGradientTest, MatchesDoublePrecisionFiniteDifferences) {
  auto model = MustCreate(GetParam(), 17);
  const int batch = 3;
  const Dataset data = MakeDataset(batch, 5, 0.5f);
  absl::StatusOr<BatchResult> result =
      model->TrainStep(data.images.data(), data.labels.data(), batch);
  ASSERT_TRUE(result.ok()) << result.status();

  absl::StatusOr<Sequential<double>> net = BuildNetwork<double>(GetParam());
  ASSERT_TRUE(net.ok()) << net.status();
  std::vector<double> params(model->weights().begin(), model->weights().end());
  std::vector<double> grads(params.size());
  const std::vector<double> images(data.images.begin(), data.images.end());
  net->BindParams(params.data(), grads.data());
  auto loss = [&](double* grad_logits) {
    TensorRef<double> logits = net->Forward(images.data(), batch, true);
    return SoftmaxCrossEntropy(logits.data, data.labels.data(), batch, kNumClasses, grad_logits)
        .loss;
  };
  std::vector<double> grad_logits(batch * kNumClasses);
  const double loss_double = loss(grad_logits.data());
  net->Backward({grad_logits.data(), batch, {kNumClasses, 1, 1}});
  EXPECT_NEAR(result->loss, loss_double, 1e-5 * loss_double);

  std::mt19937_64 rng(99);
  for (const ParamInfo& p : model->params()) {
    SCOPED_TRACE(p.name);
    const std::vector<double> analytic(grads.begin() + p.offset, grads.begin() + p.offset + p.size);
    ExpectAllClose("float gradient",
                   std::vector<double>(model->grads().begin() + p.offset,
                                       model->grads().begin() + p.offset + p.size),
                   analytic, 1e-4);
    std::vector<double> picked, numeric;
    for (int k = 0; k < 20; ++k) {
      const int64_t i = p.offset + static_cast<int64_t>(rng() % p.size);
      const double saved = params[i];
      params[i] = saved + 1e-5;
      const double plus = loss(nullptr);
      params[i] = saved - 1e-5;
      const double minus = loss(nullptr);
      params[i] = saved;
      numeric.push_back((plus - minus) / 2e-5);
      picked.push_back(grads[i]);
    }
    ExpectAllClose("double gradient vs finite differences", picked, numeric, 1e-6);
  }
}

// With no batch norm, the gradient of the mean loss over 2b samples is the average of the
// gradients over the two halves: the identity data-parallel training relies on.
TEST_P(ModelGradientTest, FullBatchGradientIsAverageOfHalves) {
  auto model = MustCreate(GetParam(), 23);
  const int b = 8;
  const Dataset data = MakeDataset(2 * b, 8, 0.5f);
  absl::StatusOr<BatchResult> full =
      model->TrainStep(data.images.data(), data.labels.data(), 2 * b);
  ASSERT_TRUE(full.ok()) << full.status();
  const std::vector<float> g(model->grads().begin(), model->grads().end());
  absl::StatusOr<BatchResult> first = model->TrainStep(data.images.data(), data.labels.data(), b);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::vector<float> g1(model->grads().begin(), model->grads().end());
  absl::StatusOr<BatchResult> second =
      model->TrainStep(data.images.data() + b * kImage, data.labels.data() + b, b);
  ASSERT_TRUE(second.ok()) << second.status();
  const std::vector<float> g2(model->grads().begin(), model->grads().end());

  EXPECT_NEAR(full->loss, (first->loss + second->loss) / 2, 1e-6 * full->loss);
  EXPECT_EQ(full->correct, first->correct + second->correct);
  for (const ParamInfo& p : model->params()) {
    double diff = 0, norm = 0;
    for (int64_t i = p.offset; i < p.offset + p.size; ++i) {
      const double avg = (double{g1[i]} + g2[i]) / 2;
      diff += (g[i] - avg) * (g[i] - avg);
      norm += double{g[i]} * g[i];
    }
    ASSERT_GT(norm, 0) << p.name;
    EXPECT_LE(std::sqrt(diff / norm), 1e-5) << p.name;
  }
}

// A few dozen plain SGD steps (w -= lr * g) on ten noisy prototypes cut the loss a lot. (LeNet's
// sigmoids keep it on the chance plateau for a while, as in d2l; it leaves it by step ~50 here.)
TEST_P(ModelGradientTest, SgdLearnsSeparableProblem) {
  auto model = MustCreate(GetParam(), 31);
  const float lr = GetParam() == "mlp" ? 0.1f : 0.9f;  // d2l's rates for these models.
  const int batch = 32, steps = 80;
  const Dataset train = MakeDataset(batch * 8, 41, 1.0f);
  const Dataset test = MakeDataset(200, 43, 1.0f);
  absl::StatusOr<BatchResult> before = model->Evaluate(test.images.data(), test.labels.data(), 200);
  ASSERT_TRUE(before.ok()) << before.status();
  for (int step = 0; step < steps; ++step) {
    const int start = (step % 8) * batch;
    ASSERT_TRUE(
        model->TrainStep(train.images.data() + start * kImage, train.labels.data() + start, batch)
            .ok());
    std::vector<float>& w = model->weights();
    const absl::Span<const float> g = model->grads();
    for (size_t i = 0; i < w.size(); ++i) w[i] -= lr * g[i];
  }
  absl::StatusOr<BatchResult> after = model->Evaluate(test.images.data(), test.labels.data(), 200);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_LT(after->loss, 0.25 * before->loss) << "before " << before->loss;
  EXPECT_GE(after->correct, 180) << "loss " << before->loss << " -> " << after->loss;
}

INSTANTIATE_TEST_SUITE_P(Models, ModelGradientTest, ::testing::Values("mlp", "lenet"));

}  // namespace
}  // namespace nn
}  // namespace dptrain
