#include "common/optimizer.h"

#include <vector>

#include "gtest/gtest.h"

namespace dptrain {
namespace {

// Reference: torch.optim.SGD step by step in double precision.
std::vector<double> ReferenceSgd(std::vector<double> w, const std::vector<std::vector<double>>& gs,
                                 double lr, double mu, double wd) {
  std::vector<double> buf;
  for (const auto& g : gs) {
    std::vector<double> d(w.size());
    for (size_t i = 0; i < w.size(); ++i) d[i] = g[i] + wd * w[i];
    if (mu != 0) {
      if (buf.empty()) {
        buf = d;
      } else {
        for (size_t i = 0; i < w.size(); ++i) buf[i] = mu * buf[i] + d[i];
      }
      d = buf;
    }
    for (size_t i = 0; i < w.size(); ++i) w[i] -= lr * d[i];
  }
  return w;
}

void CheckAgainstReference(float lr, float mu, float wd) {
  OptimizerOptions options;
  options.learning_rate = lr;
  options.momentum = mu;
  options.weight_decay = wd;
  auto opt = CreateOptimizer(options);
  ASSERT_TRUE(opt.ok()) << opt.status();
  std::vector<float> w = {1.0f, -2.0f, 0.5f};
  std::vector<std::vector<double>> gs = {{0.1, 0.2, -0.3}, {-0.5, 0.25, 1.0}, {0.0, 1.0, 2.0}};
  OptimizerState state;
  for (const auto& g : gs) {
    std::vector<float> gf(g.begin(), g.end());
    (*opt)->Apply(absl::MakeSpan(w), gf, state);
  }
  std::vector<double> ref = ReferenceSgd({1.0, -2.0, 0.5}, gs, lr, mu, wd);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(w[i], ref[i], 1e-6) << i;
  EXPECT_EQ(state.steps, 3);
}

TEST(OptimizerTest, PlainSgd) { CheckAgainstReference(0.1f, 0.0f, 0.0f); }
TEST(OptimizerTest, SgdWithMomentum) { CheckAgainstReference(0.05f, 0.9f, 0.0f); }
TEST(OptimizerTest, SgdWithMomentumAndWeightDecay) { CheckAgainstReference(0.05f, 0.9f, 0.01f); }

TEST(OptimizerTest, RejectsBadOptions) {
  OptimizerOptions o;
  o.name = "adagrad";
  EXPECT_EQ(CreateOptimizer(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.learning_rate = -1;
  EXPECT_EQ(CreateOptimizer(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.momentum = std::nanf("");
  EXPECT_EQ(CreateOptimizer(o).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dptrain
