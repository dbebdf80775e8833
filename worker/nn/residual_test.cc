// Residual and SequentialBlock: gradients against finite differences, and the output against the
// same computation done with separately run layers (which checks the parameter layout).
#include "worker/nn/residual.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/nn/activations.h"
#include "worker/nn/batch_norm2d.h"
#include "worker/nn/conv2d.h"
#include "worker/nn/layer_check.h"
#include "worker/nn/sequential_block.h"

namespace dptrain {
namespace nn {
namespace {

// Binds `layer` to the parameters at `params` (advancing it past them) and fresh buffers, and runs
// it in training mode.
std::vector<double> Run(Layer<double>& layer, const double*& params, TensorRef<double> x) {
  std::vector<double> unused_grads(1 << 16), buffers(1 << 12);
  layer.BindParams(params, unused_grads.data());
  layer.InitBuffers(buffers.data());
  layer.BindBuffers(buffers.data());
  for (const TensorSpec& spec : layer.ParamSpecs()) params += spec.size();
  TensorRef<double> y = layer.Forward({}, x, true);
  return std::vector<double>(y.data, y.data + y.size());
}

// relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)) with fresh layers, parameters taken in
// d2l's state_dict order: conv1, conv2, conv3, bn1, bn2.
ReferenceForward ComposedResidual(const ResidualOptions& o, const Dims& in) {
  return [o, in](const std::vector<double>& x, const std::vector<double>& p, int batch) {
    Conv2d<double> conv1(Conv2dOptions::Square(o.in_channels, o.out_channels, 3, o.stride, 1));
    Conv2d<double> conv2(Conv2dOptions::Square(o.out_channels, o.out_channels, 3, 1, 1));
    Conv2d<double> conv3(Conv2dOptions::Square(o.in_channels, o.out_channels, 1, o.stride));
    BatchNorm2d<double> bn1(o.out_channels), bn2(o.out_channels);
    const Dims mid = *conv1.OutputDims(in);
    const double* conv_params[3];
    const double* next = p.data();
    conv_params[0] = next;
    for (const TensorSpec& spec : conv1.ParamSpecs()) next += spec.size();
    conv_params[1] = next;
    for (const TensorSpec& spec : conv2.ParamSpecs()) next += spec.size();
    conv_params[2] = next;
    if (o.use_1x1conv) {
      for (const TensorSpec& spec : conv3.ParamSpecs()) next += spec.size();
    }
    const double* bn_params = next;

    std::vector<double> a = Run(conv1, conv_params[0], {x.data(), batch, in});
    a = Run(bn1, bn_params, {a.data(), batch, mid});
    for (double& v : a) v = std::max(v, 0.0);
    std::vector<double> b = Run(conv2, conv_params[1], {a.data(), batch, mid});
    b = Run(bn2, bn_params, {b.data(), batch, mid});
    const std::vector<double> s =
        o.use_1x1conv ? Run(conv3, conv_params[2], {x.data(), batch, in}) : x;
    for (size_t i = 0; i < b.size(); ++i) b[i] = std::max(b[i] + s[i], 0.0);
    return b;
  };
}

void Check(const ResidualOptions& o, const Dims& in, int batch) {
  Residual<double> d(o);
  Residual<float> f(o);
  LayerCheckOptions options;
  options.batch = batch;
  options.input = in;
  options.float_tolerance = 5e-5;
  SCOPED_TRACE(d.ToString() + " on " + in.ToString());
  CheckLayer(d, f, options, ComposedResidual(o, in));
}

TEST(ResidualTest, IdentityShortcutOddSizes) { Check({3, 3, false, 1}, {3, 5, 7}, 2); }

TEST(ResidualTest, ProjectionShortcutStrideTwo) { Check({2, 4, true, 2}, {2, 7, 5}, 2); }

TEST(ResidualTest, ProjectionShortcutBatchOne) { Check({3, 2, true, 2}, {3, 6, 6}, 1); }

TEST(ResidualTest, ProjectionShortcutStrideOne) { Check({2, 3, true, 1}, {2, 4, 5}, 2); }

TEST(ResidualTest, NamesAsD2l) {
  std::vector<std::string> names;
  for (const TensorSpec& s : Residual<float>({64, 128, true, 2}).ParamSpecs()) {
    names.push_back(s.name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"conv1.weight", "conv1.bias", "conv2.weight",
                                             "conv2.bias", "conv3.weight", "conv3.bias",
                                             "bn1.weight", "bn1.bias", "bn2.weight", "bn2.bias"}));
  names.clear();
  for (const TensorSpec& s : Residual<float>({8, 8, false, 1}).ParamSpecs()) {
    names.push_back(s.name);
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                                      "bn1.weight", "bn1.bias", "bn2.weight", "bn2.bias"}));
  names.clear();
  for (const TensorSpec& s : Residual<float>({8, 8, false, 1}).BufferSpecs()) {
    names.push_back(s.name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"bn1.running_mean", "bn1.running_var",
                                             "bn1.num_batches_tracked", "bn2.running_mean",
                                             "bn2.running_var", "bn2.num_batches_tracked"}));
}

TEST(ResidualTest, RejectsMismatchedShortcut) {
  EXPECT_FALSE(Residual<float>({3, 4, false, 1}).OutputDims({3, 8, 8}).ok());
  EXPECT_FALSE(Residual<float>({4, 4, false, 2}).OutputDims({4, 8, 8}).ok());
  EXPECT_FALSE(Residual<float>({4, 4, false, 1}).OutputDims({3, 8, 8}).ok());
  EXPECT_EQ(*Residual<float>({4, 8, true, 2}).OutputDims({4, 7, 7}), (Dims{8, 4, 4}));
}

template <typename T>
std::unique_ptr<Layer<T>> Stem(int in, int out) {
  std::vector<std::unique_ptr<Layer<T>>> layers;
  layers.push_back(std::make_unique<Conv2d<T>>(Conv2dOptions::Square(in, out, 3, 1, 1)));
  layers.push_back(std::make_unique<BatchNorm2d<T>>(out));
  layers.push_back(std::make_unique<ReLU<T>>());
  layers.push_back(std::make_unique<Residual<T>>(ResidualOptions{out, out, false, 1}));
  return std::make_unique<SequentialBlock<T>>(std::move(layers));
}

TEST(SequentialBlockTest, GradientsAndNames) {
  std::unique_ptr<Layer<double>> d = Stem<double>(2, 3);
  std::unique_ptr<Layer<float>> f = Stem<float>(2, 3);
  LayerCheckOptions options;
  options.batch = 2;
  options.input = {2, 5, 6};
  options.float_tolerance = 5e-5;
  CheckLayer(*d, *f, options, nullptr);
  const std::vector<TensorSpec> params = d->ParamSpecs();
  ASSERT_EQ(params.size(), 12u);
  EXPECT_EQ(params[0].name, "0.weight");
  EXPECT_EQ(params[3].name, "1.bias");
  EXPECT_EQ(params[4].name, "3.conv1.weight");
  const std::vector<TensorSpec> buffers = d->BufferSpecs();
  ASSERT_EQ(buffers.size(), 9u);
  EXPECT_EQ(buffers[0].name, "1.running_mean");
  EXPECT_EQ(buffers[8].name, "3.bn2.num_batches_tracked");
  EXPECT_EQ(d->ToString().substr(0, 18), "Sequential(Conv2d(");
  EXPECT_FALSE(d->OutputDims({3, 5, 6}).ok());
}

}  // namespace
}  // namespace nn
}  // namespace dptrain
