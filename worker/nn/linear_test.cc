#include "worker/nn/linear.h"

#include <vector>

#include "gtest/gtest.h"
#include "worker/nn/layer_check.h"

namespace dptrain {
namespace nn {
namespace {

ReferenceForward DirectLinear(int in, int out) {
  return [in, out](const std::vector<double>& x, const std::vector<double>& p, int batch) {
    std::vector<double> y;
    for (int n = 0; n < batch; ++n) {
      for (int o = 0; o < out; ++o) {
        double sum = p[out * in + o];
        for (int i = 0; i < in; ++i) sum += p[o * in + i] * x[n * in + i];
        y.push_back(sum);
      }
    }
    return y;
  };
}

void Check(int in, int out, const Dims& dims, int batch) {
  Linear<double> d(in, out);
  Linear<float> f(in, out);
  LayerCheckOptions options;
  options.batch = batch;
  options.input = dims;
  SCOPED_TRACE(d.ToString());
  CheckLayer(d, f, options, DirectLinear(in, out));
}

TEST(LinearTest, OddSizes) { Check(7, 5, {7, 1, 1}, 3); }

TEST(LinearTest, BatchOneFromImageDims) { Check(12, 1, {3, 2, 2}, 1); }

TEST(LinearTest, SingleInputFeature) { Check(1, 4, {1, 1, 1}, 5); }

TEST(LinearTest, WideLayer) { Check(130, 33, {130, 1, 1}, 4); }

TEST(LinearTest, OutputDimsAndParamSpecs) {
  Linear<float> layer(784, 256);
  EXPECT_EQ(*layer.OutputDims({1, 28, 28}), (Dims{256, 1, 1}));
  EXPECT_FALSE(layer.OutputDims({1, 28, 27}).ok());
  EXPECT_FALSE(Linear<float>(0, 3).OutputDims({0, 1, 1}).ok());
  const std::vector<TensorSpec> specs = layer.ParamSpecs();
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].name, "weight");
  EXPECT_EQ(specs[0].shape, (std::vector<int64_t>{256, 784}));
  EXPECT_EQ(specs[1].name, "bias");
  EXPECT_EQ(specs[1].shape, (std::vector<int64_t>{256}));
  EXPECT_EQ(layer.ToString(), "Linear(784, 256)");
}

}  // namespace
}  // namespace nn
}  // namespace dptrain
