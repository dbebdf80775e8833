#include "worker/nn/init.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace dptrain {
namespace nn {
namespace {

TEST(InitTest, SameSeedSameValues) {
  InitRng a(42), b(42), c(43);
  EXPECT_NE(a.Normal(), c.Normal());
  b.Normal();
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(a.Normal(), b.Normal()) << i;
}

TEST(InitTest, UniformRange) {
  InitRng rng(1);
  for (int i = 0; i < 10000; ++i) {
    const double u = rng.Uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

TEST(InitTest, NormalMoments) {
  InitRng rng(7);
  const int n = 200000;
  std::vector<float> v(n);
  FillNormal(rng, 0.5, 2.0, v.data(), n);
  double sum = 0, sq = 0;
  for (float x : v) {
    ASSERT_TRUE(std::isfinite(x));
    sum += x;
    sq += (x - 0.5) * (x - 0.5);
  }
  EXPECT_NEAR(sum / n, 0.5, 0.02);
  EXPECT_NEAR(std::sqrt(sq / n), 2.0, 0.02);
}

TEST(InitTest, UniformFillBoundsAndMean) {
  InitRng rng(9);
  const int n = 100000;
  std::vector<float> v(n);
  FillUniform(rng, -0.3, 0.3, v.data(), n);
  double sum = 0;
  for (float x : v) {
    ASSERT_GE(x, -0.3f);
    ASSERT_LE(x, 0.3f);
    sum += x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.005);
}

TEST(InitTest, FansAsPyTorch) {
  int64_t in, out;
  ComputeFans({6, 1, 5, 5}, &in, &out);
  EXPECT_EQ(in, 25);
  EXPECT_EQ(out, 150);
  ComputeFans({120, 400}, &in, &out);
  EXPECT_EQ(in, 400);
  EXPECT_EQ(out, 120);
  EXPECT_DOUBLE_EQ(XavierUniformBound({120, 400}), std::sqrt(6.0 / 520));
}

}  // namespace
}  // namespace nn
}  // namespace dptrain
