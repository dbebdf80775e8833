#include "worker/nn/conv2d.h"

#include <vector>

#include "gtest/gtest.h"
#include "worker/nn/layer_check.h"

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

void Check(const Conv2dOptions& o, const Dims& in, int batch) {
  Conv2d<double> d(o);
  Conv2d<float> f(o);
  LayerCheckOptions options;
  options.batch = batch;
  options.input = in;
  SCOPED_TRACE(d.ToString() + " on " + in.ToString());
  CheckLayer(d, f, options, DirectConv(o, in));
}

TEST(Conv2dTest, LeNetFirstLayerShape) {
  Check(Conv2dOptions::Square(1, 6, 5, 1, 2), {1, 12, 12}, 2);
}

TEST(Conv2dTest, LeNetSecondLayerShape) { Check(Conv2dOptions::Square(6, 16, 5), {6, 14, 14}, 1); }

TEST(Conv2dTest, OddSizesRectangularKernelMixedStrideAndPadding) {
  Check({3, 4, 3, 2, 2, 1, 1, 0}, {3, 7, 6}, 3);
}

TEST(Conv2dTest, StrideTwoWithPadding) {
  Check(Conv2dOptions::Square(2, 3, 5, 2, 2), {2, 9, 9}, 1);
}

TEST(Conv2dTest, StrideLargerThanKernel) {
  Check(Conv2dOptions::Square(1, 2, 2, 3, 0), {1, 8, 7}, 2);
}

TEST(Conv2dTest, PaddingAsLargeAsKernel) {
  Check(Conv2dOptions::Square(2, 2, 3, 1, 3), {2, 4, 5}, 2);
}

TEST(Conv2dTest, KernelCoversPaddedInput) {
  Check(Conv2dOptions::Square(2, 3, 5, 1, 1), {2, 3, 3}, 2);
}

TEST(Conv2dTest, Pointwise) { Check(Conv2dOptions::Square(5, 3, 1), {5, 4, 3}, 2); }

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
