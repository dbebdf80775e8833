// MaxPool2d and GlobalAvgPool2d (nn.AdaptiveAvgPool2d((1, 1))).
#include <algorithm>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "worker/nn/global_avg_pool2d.h"
#include "worker/nn/layer_check.h"
#include "worker/nn/max_pool2d.h"

namespace dptrain {
namespace nn {
namespace {

// Window maxima over the input, padding (and, in ceil mode, the part of the last window past
// it) ignored; `out` overrides the floor-mode output size.
ReferenceForward DirectMaxPool(const MaxPool2dOptions& o, const Dims& in, Dims out = {0, 0, 0}) {
  return [o, in, out](const std::vector<double>& x, const std::vector<double>&, int batch) {
    const int oh = out.h > 0 ? out.h : (in.h + 2 * o.pad_h - o.kernel_h) / o.stride_h + 1;
    const int ow = out.w > 0 ? out.w : (in.w + 2 * o.pad_w - o.kernel_w) / o.stride_w + 1;
    std::vector<double> y;
    for (int plane = 0; plane < batch * in.c; ++plane) {
      for (int oy = 0; oy < oh; ++oy) {
        for (int ox = 0; ox < ow; ++ox) {
          double best = -std::numeric_limits<double>::infinity();
          for (int ki = 0; ki < o.kernel_h; ++ki) {
            for (int kj = 0; kj < o.kernel_w; ++kj) {
              const int iy = oy * o.stride_h - o.pad_h + ki;
              const int ix = ox * o.stride_w - o.pad_w + kj;
              if (iy < 0 || iy >= in.h || ix < 0 || ix >= in.w) continue;
              best = std::max(best, x[(plane * in.h + iy) * in.w + ix]);
            }
          }
          y.push_back(best);
        }
      }
    }
    return y;
  };
}

void CheckMax(const MaxPool2dOptions& o, const Dims& in, int batch, Dims out = {0, 0, 0}) {
  MaxPool2d<double> d(o);
  MaxPool2d<float> f(o);
  LayerCheckOptions options;
  options.batch = batch;
  options.input = in;
  SCOPED_TRACE(d.ToString() + " on " + in.ToString());
  CheckLayer(d, f, options, DirectMaxPool(o, in, out));
}

// ceil_mode=True: the sizes PyTorch 1.13 gives (F.max_pool2d(..., ceil_mode=True) on H x H:
// 16, k3 s2 -> 8 (floor 7); 7, k2 s2 -> 4 (3); 6, k3 s2 p1 -> 4 (3); 5, k3 s2 p1 -> 3 and
// 8, k3 s3 p1 -> 3, where a last window would start in the right padding and is dropped),
// and the partial windows' maxima and gradients.
TEST(MaxPool2dTest, CeilMode) {
  struct Case {
    int h, k, s, p, want;
  };
  for (const Case& c : {Case{16, 3, 2, 0, 8}, Case{7, 2, 2, 0, 4}, Case{6, 3, 2, 1, 4},
                        Case{5, 3, 2, 1, 3}, Case{8, 3, 3, 1, 3}}) {
    MaxPool2dOptions o = MaxPool2dOptions::Square(c.k, c.s, c.p);
    o.ceil_mode = true;
    EXPECT_EQ(*MaxPool2d<float>(o).OutputDims({2, c.h, c.h}), (Dims{2, c.want, c.want}))
        << c.h << " " << c.k << " " << c.s << " " << c.p;
    CheckMax(o, {2, c.h, c.h}, 2, {2, c.want, c.want});
  }
}

TEST(MaxPool2dTest, TwoByTwo) { CheckMax(MaxPool2dOptions::Square(2), {3, 6, 6}, 2); }

TEST(MaxPool2dTest, OddInputStrideTwo) { CheckMax(MaxPool2dOptions::Square(2, 2), {2, 7, 5}, 1); }

TEST(MaxPool2dTest, ResNetStemOverlappingWithPadding) {
  CheckMax(MaxPool2dOptions::Square(3, 2, 1), {2, 7, 9}, 2);
}

TEST(MaxPool2dTest, RectangularKernelAndStride) { CheckMax({2, 3, 1, 2, 1, 1}, {2, 5, 8}, 3); }

TEST(MaxPool2dTest, KnownValuesAndTies) {
  MaxPool2d<float> pool(MaxPool2dOptions::Square(2));
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 1, 16, 16};
  TensorRef<float> y = pool.Forward({}, {x.data(), 1, {1, 4, 4}}, true);
  ASSERT_EQ(y.dims, (Dims{1, 2, 2}));
  EXPECT_EQ(std::vector<float>(y.data, y.data + 4), (std::vector<float>{6, 8, 10, 16}));
  const std::vector<float> g = {1, 2, 3, 4};
  TensorRef<float> dx = pool.Backward({}, {g.data(), 1, {1, 2, 2}}, true);
  // The tie 16, 16 sends its gradient to the first.
  EXPECT_EQ(std::vector<float>(dx.data, dx.data + 16),
            (std::vector<float>{0, 0, 0, 0, 0, 1, 0, 2, 0, 3, 0, 0, 0, 0, 4, 0}));
}

TEST(MaxPool2dTest, RejectsBadConfiguration) {
  EXPECT_FALSE(MaxPool2d<float>(MaxPool2dOptions::Square(2, 2, 2)).OutputDims({1, 8, 8}).ok());
  EXPECT_FALSE(MaxPool2d<float>(MaxPool2dOptions::Square(5, 1)).OutputDims({1, 4, 8}).ok());
  EXPECT_EQ(*MaxPool2d<float>(MaxPool2dOptions::Square(3, 2, 1)).OutputDims({64, 28, 28}),
            (Dims{64, 14, 14}));
}

ReferenceForward DirectGlobalAvg(const Dims& in) {
  return [in](const std::vector<double>& x, const std::vector<double>&, int batch) {
    std::vector<double> y;
    for (int plane = 0; plane < batch * in.c; ++plane) {
      double sum = 0;
      for (int i = 0; i < in.h * in.w; ++i) sum += x[plane * in.h * in.w + i];
      y.push_back(sum / (in.h * in.w));
    }
    return y;
  };
}

void CheckGlobalAvg(const Dims& in, int batch) {
  GlobalAvgPool2d<double> d;
  GlobalAvgPool2d<float> f;
  LayerCheckOptions options;
  options.batch = batch;
  options.input = in;
  SCOPED_TRACE(in.ToString());
  CheckLayer(d, f, options, DirectGlobalAvg(in));
}

TEST(GlobalAvgPool2dTest, OddPlanes) { CheckGlobalAvg({3, 5, 7}, 2); }

TEST(GlobalAvgPool2dTest, BatchOne) { CheckGlobalAvg({4, 4, 4}, 1); }

TEST(GlobalAvgPool2dTest, OneByOnePlane) { CheckGlobalAvg({5, 1, 1}, 3); }

TEST(GlobalAvgPool2dTest, Shape) {
  GlobalAvgPool2d<float> pool;
  EXPECT_EQ(*pool.OutputDims({512, 4, 4}), (Dims{512, 1, 1}));
  EXPECT_EQ(pool.ToString(), "AdaptiveAvgPool2d(output_size=(1, 1))");
}

}  // namespace
}  // namespace nn
}  // namespace dptrain
