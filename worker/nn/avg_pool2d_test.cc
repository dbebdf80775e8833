#include "worker/nn/avg_pool2d.h"

#include <vector>

#include "gtest/gtest.h"
#include "worker/nn/layer_check.h"

namespace dptrain {
namespace nn {
namespace {

// Window sums over the zero-padded input divided by the full window area (count_include_pad).
ReferenceForward DirectPool(const AvgPool2dOptions& o, const Dims& in) {
  return [o, in](const std::vector<double>& x, const std::vector<double>&, int batch) {
    const int oh = (in.h + 2 * o.pad_h - o.kernel_h) / o.stride_h + 1;
    const int ow = (in.w + 2 * o.pad_w - o.kernel_w) / o.stride_w + 1;
    std::vector<double> y;
    for (int plane = 0; plane < batch * in.c; ++plane) {
      for (int oy = 0; oy < oh; ++oy) {
        for (int ox = 0; ox < ow; ++ox) {
          double sum = 0;
          for (int ki = 0; ki < o.kernel_h; ++ki) {
            for (int kj = 0; kj < o.kernel_w; ++kj) {
              const int iy = oy * o.stride_h - o.pad_h + ki;
              const int ix = ox * o.stride_w - o.pad_w + kj;
              if (iy < 0 || iy >= in.h || ix < 0 || ix >= in.w) continue;
              sum += x[(plane * in.h + iy) * in.w + ix];
            }
          }
          y.push_back(sum / (o.kernel_h * o.kernel_w));
        }
      }
    }
    return y;
  };
}

void Check(const AvgPool2dOptions& o, const Dims& in, int batch) {
  AvgPool2d<double> d(o);
  AvgPool2d<float> f(o);
  LayerCheckOptions options;
  options.batch = batch;
  options.input = in;
  SCOPED_TRACE(d.ToString() + " on " + in.ToString());
  CheckLayer(d, f, options, DirectPool(o, in));
}

TEST(AvgPool2dTest, LeNetShape) { Check(AvgPool2dOptions::Square(2, 2), {3, 6, 6}, 2); }

TEST(AvgPool2dTest, OddInputDropsLastRowAndColumn) {
  Check(AvgPool2dOptions::Square(2, 2), {2, 7, 5}, 3);
}

TEST(AvgPool2dTest, PaddingCountsPaddedZeros) {
  Check(AvgPool2dOptions::Square(3, 2, 1), {2, 7, 7}, 1);
}

TEST(AvgPool2dTest, OverlappingWindows) { Check(AvgPool2dOptions::Square(3, 1), {1, 5, 6}, 2); }

TEST(AvgPool2dTest, RectangularKernelAndStride) { Check({2, 3, 1, 2, 1, 1}, {2, 5, 8}, 2); }

TEST(AvgPool2dTest, KnownValues) {
  AvgPool2d<float> pool(AvgPool2dOptions::Square(2, 2));
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  TensorRef<float> y = pool.Forward({x.data(), 1, {1, 4, 4}}, false);
  ASSERT_EQ(y.dims, (Dims{1, 2, 2}));
  EXPECT_EQ(std::vector<float>(y.data, y.data + 4), (std::vector<float>{3.5, 5.5, 11.5, 13.5}));
}

TEST(AvgPool2dTest, RejectsBadConfiguration) {
  EXPECT_FALSE(AvgPool2d<float>(AvgPool2dOptions::Square(2, 2, 2)).OutputDims({1, 8, 8}).ok());
  EXPECT_FALSE(AvgPool2d<float>(AvgPool2dOptions::Square(5, 1)).OutputDims({1, 4, 8}).ok());
  EXPECT_EQ(*AvgPool2d<float>(AvgPool2dOptions::Square(2, 2)).OutputDims({16, 10, 10}),
            (Dims{16, 5, 5}));
}

}  // namespace
}  // namespace nn
}  // namespace dptrain
