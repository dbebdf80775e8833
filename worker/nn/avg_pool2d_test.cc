#include "worker/nn/avg_pool2d.h"

#include <vector>

#include "gtest/gtest.h"
#include "worker/nn/layer_check.h"

namespace dptrain {
namespace nn {
namespace {

// Window sums over the zero-padded input divided as PyTorch's avg_pool2d divides: the window
// clipped to the padded input (count_include_pad), or to the input itself.
ReferenceForward DirectPool(const AvgPool2dOptions& o, const Dims& in) {
  return [o, in](const std::vector<double>& x, const std::vector<double>&, int batch) {
    const int oh = PooledLength(in.h, o.kernel_h, o.stride_h, o.pad_h, o.ceil_mode);
    const int ow = PooledLength(in.w, o.kernel_w, o.stride_w, o.pad_w, o.ceil_mode);
    std::vector<double> y;
    for (int plane = 0; plane < batch * in.c; ++plane) {
      for (int oy = 0; oy < oh; ++oy) {
        for (int ox = 0; ox < ow; ++ox) {
          double sum = 0;
          int padded = 0, inside = 0;
          for (int ki = 0; ki < o.kernel_h; ++ki) {
            for (int kj = 0; kj < o.kernel_w; ++kj) {
              const int iy = oy * o.stride_h - o.pad_h + ki;
              const int ix = ox * o.stride_w - o.pad_w + kj;
              if (iy >= in.h + o.pad_h || ix >= in.w + o.pad_w) continue;  // Past the padding.
              ++padded;
              if (iy < 0 || iy >= in.h || ix < 0 || ix >= in.w) continue;
              ++inside;
              sum += x[(plane * in.h + iy) * in.w + ix];
            }
          }
          y.push_back(sum / (o.count_include_pad ? padded : inside));
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

AvgPool2dOptions Ceil(AvgPool2dOptions o, bool count_include_pad) {
  o.ceil_mode = true;
  o.count_include_pad = count_include_pad;
  return o;
}

// ceil_mode (a last window past the input, partly in the padding) and count_include_pad=False
// (ResNet-D's shortcut pooling), against central differences.
TEST(AvgPool2dTest, CeilModeAndCountExcludePad) {
  for (bool include : {true, false}) {
    Check(Ceil(AvgPool2dOptions::Square(3, 2, 1), include), {2, 6, 6}, 2);
    Check(Ceil(AvgPool2dOptions::Square(2, 2), include), {2, 5, 7}, 1);
    AvgPool2dOptions plain = AvgPool2dOptions::Square(3, 2, 1);
    plain.count_include_pad = include;
    Check(plain, {1, 7, 6}, 2);
  }
}

// PyTorch 1.13's F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=...) on
// x = arange(36) * 0.5 - 3 as 6 x 6, and its input gradient for dy = 1..16.
TEST(AvgPool2dTest, CeilModeMatchesPyTorch) {
  std::vector<float> x(36);
  for (int i = 0; i < 36; ++i) x[i] = i * 0.5f - 3;
  std::vector<float> dy(16);
  for (int i = 0; i < 16; ++i) dy[i] = static_cast<float>(i + 1);
  struct Expected {
    bool include;
    std::vector<double> y, dx;
  };
  const Expected cases[] = {
      {true,
       {-0.555555556, -0.333333333, 0.333333333, 0.333333333, 2.16666667, 4, 5, 2.75, 6.16666667,
        10, 11, 5.75, 4.08333333, 6.5, 7, 3.625},
       {0.111111111, 0.333333333, 0.222222222, 0.555555556, 0.333333333, 1,
        0.666666667, 1.55555556,  0.888888889, 2,           1.11111111,  3.11111111,
        0.555555556, 1.22222222,  0.666666667, 1.44444444,  0.777777778, 2.11111111,
        1.55555556,  3.33333333,  1.77777778,  3.77777778,  2,           5.33333333,
        1,           2.11111111,  1.11111111,  2.33333333,  1.22222222,  3.22222222,
        3.16666667,  6.61111111,  3.44444444,  7.16666667,  3.72222222,  9.72222222}},
      {false,
       {-1.25, -0.5, 0.5, 1, 3.25, 4, 5, 5.5, 9.25, 10, 11, 11.5, 12.25, 13, 14, 14.5},
       {0.25,        0.583333333, 0.333333333, 0.833333333, 0.5,         2.5,
        1.08333333,  2.08333333,  1,           2.27777778,  1.27777778,  5.94444444,
        0.833333333, 1.5,         0.666666667, 1.44444444,  0.777777778, 3.44444444,
        2.33333333,  4.11111111,  1.77777778,  3.77777778,  2,           8.66666667,
        1.5,         2.61111111,  1.11111111,  2.33333333,  1.22222222,  5.22222222,
        8,           13.7777778,  5.77777778,  12,          6.22222222,  26.2222222}},
  };
  for (const Expected& e : cases) {
    SCOPED_TRACE(e.include ? "count_include_pad=True" : "count_include_pad=False");
    AvgPool2d<float> pool(Ceil(AvgPool2dOptions::Square(3, 2, 1), e.include));
    TensorRef<float> y = pool.Forward({}, {x.data(), 1, {1, 6, 6}}, true);
    ASSERT_EQ(y.dims, (Dims{1, 4, 4}));
    ExpectAllClose("y", std::vector<double>(y.data, y.data + 16), e.y, 1e-6);
    TensorRef<float> dx = pool.Backward({}, {dy.data(), 1, {1, 4, 4}}, true);
    ExpectAllClose("dx", std::vector<double>(dx.data, dx.data + 36), e.dx, 1e-6);
  }
}

TEST(AvgPool2dTest, KnownValues) {
  AvgPool2d<float> pool(AvgPool2dOptions::Square(2, 2));
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  TensorRef<float> y = pool.Forward({}, {x.data(), 1, {1, 4, 4}}, false);
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
