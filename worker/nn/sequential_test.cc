#include "worker/nn/sequential.h"

#include <memory>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/nn/activations.h"
#include "worker/nn/avg_pool2d.h"
#include "worker/nn/conv2d.h"
#include "worker/nn/layer_check.h"
#include "worker/nn/linear.h"
#include "worker/nn/softmax_cross_entropy.h"

namespace dptrain {
namespace nn {
namespace {

// A small network touching every layer type: conv (stride 2, padding), sigmoid, pooling,
// flatten, linear, relu.
template <typename T>
absl::StatusOr<Sequential<T>> SmallNet() {
  std::vector<std::unique_ptr<Layer<T>>> layers;
  layers.push_back(std::make_unique<Flatten<T>>());  // Param-free layer before the first conv.
  layers.push_back(std::make_unique<Linear<T>>(2 * 9 * 9, 2 * 9 * 9));
  layers.push_back(std::make_unique<Sigmoid<T>>());
  return Sequential<T>::Create({2, 9, 9}, std::move(layers));
}

TEST(SequentialTest, LayoutAndDims) {
  std::vector<std::unique_ptr<Layer<float>>> layers;
  layers.push_back(std::make_unique<Conv2d<float>>(Conv2dOptions::Square(2, 3, 3, 2, 1)));
  layers.push_back(std::make_unique<ReLU<float>>());
  layers.push_back(std::make_unique<AvgPool2d<float>>(AvgPool2dOptions::Square(2, 2)));
  layers.push_back(std::make_unique<Flatten<float>>());
  layers.push_back(std::make_unique<Linear<float>>(12, 4));
  absl::StatusOr<Sequential<float>> net = Sequential<float>::Create({2, 9, 9}, std::move(layers));
  ASSERT_TRUE(net.ok()) << net.status();
  EXPECT_EQ(net->dims(1), (Dims{3, 5, 5}));
  EXPECT_EQ(net->dims(3), (Dims{3, 2, 2}));
  EXPECT_EQ(net->output_dims(), (Dims{4, 1, 1}));
  EXPECT_EQ(net->param_offset(0), 0);
  EXPECT_EQ(net->param_offset(1), 3 * 2 * 9 + 3);
  EXPECT_EQ(net->param_offset(4), 3 * 2 * 9 + 3);
  EXPECT_EQ(net->num_params(), 3 * 2 * 9 + 3 + 12 * 4 + 4);
}

TEST(SequentialTest, RejectsMismatchedLayers) {
  std::vector<std::unique_ptr<Layer<float>>> layers;
  layers.push_back(std::make_unique<Flatten<float>>());
  layers.push_back(std::make_unique<Linear<float>>(10, 4));
  absl::StatusOr<Sequential<float>> net = Sequential<float>::Create({1, 3, 3}, std::move(layers));
  ASSERT_FALSE(net.ok());
  EXPECT_EQ(net.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(net.status().message().find("layer 1"), absl::string_view::npos) << net.status();
  EXPECT_FALSE(Sequential<float>::Create({1, 3, 3}, {}).ok());
}

// Whole-network gradient of the mean cross-entropy against finite differences (double).
TEST(SequentialTest, NetworkGradientMatchesFiniteDifferences) {
  std::vector<std::unique_ptr<Layer<double>>> layers;
  layers.push_back(std::make_unique<Conv2d<double>>(Conv2dOptions::Square(2, 3, 3, 2, 1)));
  layers.push_back(std::make_unique<Sigmoid<double>>());
  layers.push_back(std::make_unique<AvgPool2d<double>>(AvgPool2dOptions::Square(2, 1)));
  layers.push_back(std::make_unique<Flatten<double>>());
  layers.push_back(std::make_unique<Linear<double>>(48, 6));
  layers.push_back(std::make_unique<ReLU<double>>());
  layers.push_back(std::make_unique<Linear<double>>(6, 5));
  absl::StatusOr<Sequential<double>> net = Sequential<double>::Create({2, 9, 9}, std::move(layers));
  ASSERT_TRUE(net.ok()) << net.status();
  const int batch = 3;
  std::vector<double> params = RandomVector(net->num_params(), 0.5, 3);
  std::vector<double> grads(net->num_params());
  const std::vector<double> x = RandomVector(batch * 2 * 9 * 9, 1.0, 4);
  const std::vector<nn::Label> labels = {4, 0, 2};
  net->BindParams(params.data(), grads.data());
  auto loss = [&](double* grad_logits) {
    TensorRef<double> logits = net->Forward(x.data(), batch, true);
    return SoftmaxCrossEntropy(logits.data, labels.data(), batch, 5, grad_logits).loss;
  };
  std::vector<double> grad_logits(batch * 5);
  loss(grad_logits.data());
  net->Backward({grad_logits.data(), batch, {5, 1, 1}});
  std::vector<double> numeric;
  for (double& p : params) {
    const double saved = p;
    p = saved + 1e-6;
    const double plus = loss(nullptr);
    p = saved - 1e-6;
    const double minus = loss(nullptr);
    p = saved;
    numeric.push_back((plus - minus) / 2e-6);
  }
  ExpectAllClose("network gradient", grads, numeric, 1e-6);
}

TEST(SequentialTest, LeadingParameterFreeLayersAreSkippedInBackward) {
  absl::StatusOr<Sequential<float>> net = SmallNet<float>();
  ASSERT_TRUE(net.ok()) << net.status();
  std::vector<float> params(net->num_params(), 0.01f), grads(net->num_params(), -1.0f);
  net->BindParams(params.data(), grads.data());
  const std::vector<float> x(2 * 2 * 9 * 9, 1.0f);
  TensorRef<float> y = net->Forward(x.data(), 2, true);
  const std::vector<float> g(y.size(), 1.0f);
  net->Backward({g.data(), y.batch, y.dims});
  for (float v : grads) ASSERT_NE(v, -1.0f);
}

}  // namespace
}  // namespace nn
}  // namespace dptrain
