#include "worker/nn/activations.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "worker/nn/layer_check.h"

namespace dptrain {
namespace nn {
namespace {

ReferenceForward Elementwise(double (*fn)(double)) {
  return [fn](const std::vector<double>& x, const std::vector<double>&, int) {
    std::vector<double> y;
    for (double v : x) y.push_back(fn(v));
    return y;
  };
}

double ReferenceRelu(double x) { return x > 0 ? x : 0; }
double ReferenceSigmoid(double x) { return 1 / (1 + std::exp(-x)); }

TEST(ActivationsTest, ReLU) {
  ReLU<double> d;
  ReLU<float> f;
  LayerCheckOptions options;
  options.batch = 3;
  options.input = {3, 5, 7};
  CheckLayer(d, f, options, Elementwise(ReferenceRelu));
}

TEST(ActivationsTest, SigmoidBatchOne) {
  Sigmoid<double> d;
  Sigmoid<float> f;
  LayerCheckOptions options;
  options.batch = 1;
  options.input = {2, 3, 3};
  options.input_scale = 4.0;
  CheckLayer(d, f, options, Elementwise(ReferenceSigmoid));
}

TEST(ActivationsTest, SigmoidSaturatesWithoutNaN) {
  Sigmoid<float> f;
  const std::vector<float> x = {-1e4f, -100.0f, -88.8f, 0.0f, 88.8f, 100.0f, 1e4f};
  TensorRef<float> y = f.Forward({}, {x.data(), 1, {7, 1, 1}}, true);
  EXPECT_LT(y.data[0], 1e-37f);
  EXPECT_GE(y.data[0], 0.0f);
  EXPECT_EQ(y.data[3], 0.5f);
  EXPECT_EQ(y.data[6], 1.0f);
  for (int i = 0; i < 7; ++i) EXPECT_TRUE(std::isfinite(y.data[i])) << i;
  const std::vector<float> g(7, 1.0f);
  TensorRef<float> dx = f.Backward({}, {g.data(), 1, {7, 1, 1}}, true);
  for (int i = 0; i < 7; ++i) EXPECT_TRUE(std::isfinite(dx.data[i])) << i;
  EXPECT_EQ(dx.data[3], 0.25f);
}

// The float path uses its own exp; it must stay within a few ulp of the exact sigmoid.
TEST(ActivationsTest, FloatSigmoidIsAccurate) {
  std::vector<float> x;
  for (float v = -110.0f; v <= 110.0f; v += 0.0137f) x.push_back(v);
  x.push_back(std::nanf(""));
  Sigmoid<float> f;
  TensorRef<float> y = f.Forward({}, {x.data(), 1, {static_cast<int>(x.size()), 1, 1}}, false);
  double worst = 0;
  for (size_t i = 0; i + 1 < x.size(); ++i) {
    const double exact = 1 / (1 + std::exp(-double{x[i]}));
    if (exact < 1e-37) continue;  // Deep in the denormals, where only "tiny" matters.
    worst = std::max(worst, std::abs(y.data[i] - exact) / exact);
  }
  EXPECT_LT(worst, 4e-7);  // A few float ulp.
  EXPECT_TRUE(std::isnan(y.data[x.size() - 1]));
}

TEST(ActivationsTest, FlattenAliasesBuffers) {
  Flatten<double> d;
  Flatten<float> f;
  LayerCheckOptions options;
  options.batch = 2;
  options.input = {2, 3, 4};
  CheckLayer(d, f, options, Elementwise([](double v) { return v; }));
  EXPECT_EQ(*f.OutputDims({16, 5, 5}), (Dims{400, 1, 1}));
  const std::vector<float> x(24);
  TensorRef<float> y = f.Forward({}, {x.data(), 1, {2, 3, 4}}, true);
  EXPECT_EQ(y.data, x.data());
  EXPECT_EQ(y.dims, (Dims{24, 1, 1}));
}

}  // namespace
}  // namespace nn
}  // namespace dptrain
