#include "worker/nn/conv2d.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "worker/nn/layer_check.h"
#include "worker/nn/onednn_conv.h"
#include "worker/nn/thread_pool.h"

namespace dptrain {
namespace nn {
namespace {

// Direct convolution from the definition, zero padding read as zeros.
ReferenceForward DirectConv(const Conv2dOptions& o, const Dims& in) {
  return [o, in](const std::vector<double>& x, const std::vector<double>& p, int batch) {
    const int oh = (in.h + 2 * o.pad_h - o.kernel_h) / o.stride_h + 1;
    const int ow = (in.w + 2 * o.pad_w - o.kernel_w) / o.stride_w + 1;
    const double* bias = p.data() + o.out_channels * in.c * o.kernel_h * o.kernel_w;
    std::vector<double> y;
    for (int n = 0; n < batch; ++n) {
      for (int oc = 0; oc < o.out_channels; ++oc) {
        for (int oy = 0; oy < oh; ++oy) {
          for (int ox = 0; ox < ow; ++ox) {
            double sum = bias[oc];
            for (int c = 0; c < in.c; ++c) {
              for (int ki = 0; ki < o.kernel_h; ++ki) {
                for (int kj = 0; kj < o.kernel_w; ++kj) {
                  const int iy = oy * o.stride_h - o.pad_h + ki;
                  const int ix = ox * o.stride_w - o.pad_w + kj;
                  if (iy < 0 || iy >= in.h || ix < 0 || ix >= in.w) continue;
                  sum += p[((oc * in.c + c) * o.kernel_h + ki) * o.kernel_w + kj] *
                         x[((n * in.c + c) * in.h + iy) * in.w + ix];
                }
              }
            }
            y.push_back(sum);
          }
        }
      }
    }
    return y;
  };
}

// Every shape runs on both algorithms of the float layer (the double one, checked against
// finite differences and the direct convolution, is always im2col).
class Conv2dTest : public ::testing::TestWithParam<ConvAlgorithm> {
 protected:
  void Check(const Conv2dOptions& o, const Dims& in, int batch) {
    Conv2d<double> d(o);
    Conv2d<float> f(o);
    LayerCheckOptions options;
    options.float_context.conv_algorithm = GetParam();
    options.batch = batch;
    options.input = in;
    SCOPED_TRACE(d.ToString() + " on " + in.ToString());
    CheckLayer(d, f, options, DirectConv(o, in));
    EXPECT_EQ(f.last_used_onednn(), GetParam() == ConvAlgorithm::kOneDnn);
  }
};

INSTANTIATE_TEST_SUITE_P(Algorithms, Conv2dTest,
                         ::testing::Values(ConvAlgorithm::kIm2col, ConvAlgorithm::kOneDnn),
                         [](const auto& info) {
                           return info.param == ConvAlgorithm::kOneDnn ? "OneDnn" : "Im2col";
                         });

TEST_P(Conv2dTest, LeNetFirstLayerShape) {
  Check(Conv2dOptions::Square(1, 6, 5, 1, 2), {1, 12, 12}, 2);
}

TEST_P(Conv2dTest, LeNetSecondLayerShape) { Check(Conv2dOptions::Square(6, 16, 5), {6, 14, 14}, 1); }

TEST_P(Conv2dTest, ResNetFirstStageShape) {
  Check(Conv2dOptions::Square(16, 16, 3, 1, 1), {16, 6, 6}, 2);
}

TEST_P(Conv2dTest, OddSizesRectangularKernelMixedStrideAndPadding) {
  Check({3, 4, 3, 2, 2, 1, 1, 0}, {3, 7, 6}, 3);
}

TEST_P(Conv2dTest, StrideTwoWithPadding) {
  Check(Conv2dOptions::Square(2, 3, 5, 2, 2), {2, 9, 9}, 1);
}

TEST_P(Conv2dTest, StrideLargerThanKernel) {
  Check(Conv2dOptions::Square(1, 2, 2, 3, 0), {1, 8, 7}, 2);
}

TEST_P(Conv2dTest, PaddingAsLargeAsKernel) {
  Check(Conv2dOptions::Square(2, 2, 3, 1, 3), {2, 4, 5}, 2);
}

TEST_P(Conv2dTest, KernelCoversPaddedInput) {
  Check(Conv2dOptions::Square(2, 3, 5, 1, 1), {2, 3, 3}, 2);
}

TEST_P(Conv2dTest, Pointwise) { Check(Conv2dOptions::Square(5, 3, 1), {5, 4, 3}, 2); }

// One forward and backward of `conv` on fixed data: the output, the input gradient and the
// parameter gradients, back to back.
std::vector<float> Step(Conv2d<float>& conv, const LayerContext<float>& ctx, const Dims& in,
                        int batch, const std::vector<float>& params) {
  const Dims out = *conv.OutputDims(in);
  std::vector<float> grads(params.size());
  conv.BindParams(params.data(), grads.data());
  std::vector<float> x(batch * in.size()), dy(batch * out.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 7919) % 113) / 113 - 0.5f;
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = static_cast<float>((i * 104729) % 97) / 97 - 0.5f;
  TensorRef<float> y = conv.Forward(ctx, {x.data(), batch, in}, true);
  std::vector<float> result(y.data, y.data + y.size());
  TensorRef<float> dx = conv.Backward(ctx, {dy.data(), batch, out}, true);
  result.insert(result.end(), dx.data, dx.data + dx.size());
  result.insert(result.end(), grads.begin(), grads.end());
  return result;
}

// On a pool of 2 (oneDNN on 2 OpenMP threads, the scratch the pool's): the same as im2col
// within float rounding, bit-identical when repeated, and a batch of another size (an epoch's
// last) gets primitives of its own.
TEST(Conv2dOneDnnTest, OnAPoolMatchesIm2colAndRepeatsBitIdentically) {
  const Conv2dOptions o = Conv2dOptions::Square(64, 64, 3, 1, 1);
  const Dims in{64, 10, 10};
  std::vector<float> params(64 * 64 * 9 + 64);
  for (size_t i = 0; i < params.size(); ++i) {
    params[i] = static_cast<float>((i * 31) % 101) / 101 * 0.1f - 0.05f;
  }
  ThreadPool pool(2);
  for (int batch : {5, 3}) {
    Conv2d<float> reference(o), onednn(o);
    const LayerContext<float> im2col_ctx{&pool, ConvAlgorithm::kIm2col, nullptr};
    const LayerContext<float> onednn_ctx{&pool, ConvAlgorithm::kOneDnn, nullptr};
    const std::vector<float> expected = Step(reference, im2col_ctx, in, batch, params);
    const std::vector<float> first = Step(onednn, onednn_ctx, in, batch, params);
    EXPECT_TRUE(onednn.last_used_onednn());
    EXPECT_FALSE(reference.last_used_onednn());
    ASSERT_EQ(first.size(), expected.size());
    double worst = 0, scale = 0;
    for (size_t i = 0; i < first.size(); ++i) {
      worst = std::max(worst, std::abs(double{first[i]} - expected[i]));
      scale = std::max(scale, std::abs(double{expected[i]}));
    }
    EXPECT_LE(worst, 1e-5 * scale) << "batch " << batch;
    EXPECT_EQ(Step(onednn, onednn_ctx, in, batch, params), first) << "batch " << batch;
  }
}

// The measured rule (onednn_conv.h): on one thread oneDNN for kernels larger than 1x1 on 6+
// input channels and outputs of 7x7 or more; im2col for the rest and on more threads.
TEST(Conv2dOneDnnTest, PreferOneDnnFollowsTheMeasuredRule) {
  EXPECT_TRUE(PreferOneDnn(Conv2dOptions::Square(64, 64, 3, 1, 1), {64, 28, 28}, 1));
  EXPECT_TRUE(PreferOneDnn(Conv2dOptions::Square(64, 128, 3, 2, 1), {64, 28, 28}, 1));
  EXPECT_TRUE(PreferOneDnn(Conv2dOptions::Square(6, 16, 5), {6, 14, 14}, 1));
  EXPECT_TRUE(PreferOneDnn(Conv2dOptions::Square(256, 256, 3, 1, 1), {256, 7, 7}, 1));
  EXPECT_FALSE(PreferOneDnn(Conv2dOptions::Square(512, 512, 3, 1, 1), {512, 4, 4}, 1));
  EXPECT_FALSE(PreferOneDnn(Conv2dOptions::Square(1, 6, 5, 1, 2), {1, 28, 28}, 1));
  EXPECT_FALSE(PreferOneDnn(Conv2dOptions::Square(1, 64, 3, 1, 1), {1, 28, 28}, 1));
  EXPECT_FALSE(PreferOneDnn(Conv2dOptions::Square(64, 128, 1, 2), {64, 28, 28}, 1));
  EXPECT_FALSE(PreferOneDnn(Conv2dOptions::Square(64, 64, 3, 1, 1), {64, 28, 28}, 2));
  EXPECT_FALSE(PreferOneDnn(Conv2dOptions::Square(6, 16, 5), {6, 14, 14}, 2));
}

// Without a pool, kAuto stays on im2col (oneDNN's scratch would be the layer's own).
TEST(Conv2dOneDnnTest, AutoWithoutAPoolIsIm2col) {
  const Conv2dOptions o = Conv2dOptions::Square(64, 64, 3, 1, 1);
  std::vector<float> params(64 * 64 * 9 + 64, 0.01f);
  Conv2d<float> conv(o);
  Step(conv, {}, {64, 28, 28}, 1, params);
  EXPECT_FALSE(conv.last_used_onednn());
  ThreadPool pool(1);
  Step(conv, {&pool, ConvAlgorithm::kAuto, nullptr}, {64, 28, 28}, 1, params);
  EXPECT_TRUE(conv.last_used_onednn());
}

TEST(Conv2dTest, OutputDims) {
  Conv2d<float> conv(Conv2dOptions::Square(1, 6, 5, 1, 2));
  absl::StatusOr<Dims> out = conv.OutputDims({1, 28, 28});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, (Dims{6, 28, 28}));
  EXPECT_EQ(*Conv2d<float>(Conv2dOptions::Square(6, 16, 5)).OutputDims({6, 14, 14}),
            (Dims{16, 10, 10}));
  EXPECT_EQ(*Conv2d<float>(Conv2dOptions::Square(1, 1, 3, 2, 1)).OutputDims({1, 8, 7}),
            (Dims{1, 4, 4}));
}

TEST(Conv2dTest, RejectsBadConfigurationAndInput) {
  EXPECT_FALSE(Conv2d<float>(Conv2dOptions::Square(2, 3, 3)).OutputDims({1, 8, 8}).ok());
  EXPECT_FALSE(Conv2d<float>(Conv2dOptions::Square(1, 3, 9)).OutputDims({1, 8, 8}).ok());
  EXPECT_FALSE(Conv2d<float>(Conv2dOptions::Square(1, 3, 3, 0)).OutputDims({1, 8, 8}).ok());
  EXPECT_FALSE(Conv2d<float>(Conv2dOptions::Square(1, 3, 3, 1, -1)).OutputDims({1, 8, 8}).ok());
}

TEST(Conv2dTest, ParamSpecsMatchPyTorch) {
  const std::vector<TensorSpec> specs = Conv2d<float>(Conv2dOptions::Square(6, 16, 5)).ParamSpecs();
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].name, "weight");
  EXPECT_EQ(specs[0].shape, (std::vector<int64_t>{16, 6, 5, 5}));
  EXPECT_EQ(specs[1].name, "bias");
  EXPECT_EQ(specs[1].shape, (std::vector<int64_t>{16}));
}

}  // namespace
}  // namespace nn
}  // namespace dptrain
