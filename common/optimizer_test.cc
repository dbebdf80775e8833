#include "common/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dptrain {
namespace {

// A trajectory of torch.optim.SGD / Adam / AdamW written by tools/make_optimizer_fixtures.py.
struct TorchTrajectory {
  const char* name;
  const char* optimizer;
  double learning_rate, momentum, weight_decay, beta1, beta2, eps;
  std::vector<float> initial;
  std::vector<std::vector<float>> gradients;  // Of each step.
  std::vector<double> rates;                  // The rate torch used at each step.
  std::vector<std::vector<float>> weights;    // After each step.
  bool nesterov = false;
};

const std::vector<TorchTrajectory>& Trajectories() {
  static const auto* trajectories = new std::vector<TorchTrajectory>{
#include "common/testdata/optimizer_fixtures.inc"
  };
  return *trajectories;
}

// Measured against torch 1.13 (float32, CPU; MatchesTorch prints it): Adam and AdamW at most
// 9.4e-8 relative, SGD at most 3.4e-7, Nesterov 6.8e-7 (torch's add_(x, alpha) rounds once, a
// fused multiply-add; our SGD, kept as it was, rounds the product and the sum).
constexpr double kRelativeTolerance = 1e-6;

double RelativeError(float ours, float reference) {
  const double diff = std::abs(static_cast<double>(ours) - reference);
  return diff == 0 ? 0 : diff / std::abs(static_cast<double>(reference));
}

OptimizerOptions OptionsOf(const TorchTrajectory& t) {
  OptimizerOptions o;
  o.name = t.optimizer;
  o.learning_rate = static_cast<float>(t.learning_rate);
  o.momentum = static_cast<float>(t.momentum);
  o.weight_decay = static_cast<float>(t.weight_decay);
  o.beta1 = t.beta1;
  o.beta2 = t.beta2;
  o.eps = t.eps;
  o.nesterov = t.nesterov;
  return o;
}

// Runs the trajectory's steps on `weights`, split into chunks of `chunk` elements with one
// state each, at the rates torch used; calls `after_step(step, weights)` after each step.
std::vector<OptimizerState> RunInChunks(
    const Optimizer& optimizer, const TorchTrajectory& t, size_t chunk, std::vector<float>& w,
    const std::function<void(size_t, const std::vector<float>&)>& after_step) {
  std::vector<OptimizerState> states((w.size() + chunk - 1) / chunk);
  for (size_t step = 0; step < t.gradients.size(); ++step) {
    for (size_t c = 0; c < states.size(); ++c) {
      const size_t begin = c * chunk, n = std::min(chunk, w.size() - begin);
      optimizer.Apply(absl::MakeSpan(w.data() + begin, n),
                      absl::MakeConstSpan(t.gradients[step].data() + begin, n), states[c],
                      static_cast<float>(t.rates[step]));
    }
    after_step(step, w);
  }
  return states;
}

class TorchTrajectoryTest : public ::testing::TestWithParam<size_t> {
 protected:
  const TorchTrajectory& trajectory() const { return Trajectories()[GetParam()]; }
};

TEST_P(TorchTrajectoryTest, MatchesTorch) {
  const TorchTrajectory& t = trajectory();
  auto optimizer = CreateOptimizer(OptionsOf(t));
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  std::vector<float> w = t.initial;
  double max_error = 0;
  auto states =
      RunInChunks(**optimizer, t, w.size(), w, [&](size_t step, const std::vector<float>& w) {
        for (size_t i = 0; i < w.size(); ++i) {
          const double e = RelativeError(w[i], t.weights[step][i]);
          max_error = std::max(max_error, e);
          EXPECT_LE(e, kRelativeTolerance) << "step " << step << " element " << i << ": " << w[i]
                                           << " vs torch " << t.weights[step][i];
        }
      });
  EXPECT_EQ(states[0].steps, static_cast<int64_t>(t.gradients.size()));
  RecordProperty("max_relative_error", std::to_string(max_error));
  std::printf("%s: max relative error vs torch %.3g\n", t.name, max_error);
}

// State is per chunk: a shard's chunks, each with its own state, step exactly like the whole
// vector with one state (every rule is element-wise).
TEST_P(TorchTrajectoryTest, ChunksWithTheirOwnStateMatchTheWholeVector) {
  const TorchTrajectory& t = trajectory();
  auto optimizer = CreateOptimizer(OptionsOf(t));
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  std::vector<std::vector<float>> whole;
  std::vector<float> w = t.initial;
  RunInChunks(**optimizer, t, w.size(), w,
              [&](size_t, const std::vector<float>& w) { whole.push_back(w); });
  std::vector<float> chunked = t.initial;
  auto states =
      RunInChunks(**optimizer, t, 3, chunked, [&](size_t step, const std::vector<float>& w) {
        EXPECT_EQ(w, whole[step]) << "step " << step;
      });
  ASSERT_EQ(states.size(), 3u);  // 7 elements: chunks of 3, 3 and 1.
  for (const OptimizerState& s : states) {
    EXPECT_EQ(s.steps, static_cast<int64_t>(t.gradients.size()));
  }
  const bool adam = std::string(t.optimizer) != "sgd";
  EXPECT_EQ(states[2].exp_avg.size(), adam ? 1u : 0u);
  EXPECT_EQ(states[2].exp_avg_sq.size(), adam ? 1u : 0u);
  EXPECT_EQ(states[2].momentum_buffer.size(), t.momentum != 0 ? 1u : 0u);
}

INSTANTIATE_TEST_SUITE_P(Torch, TorchTrajectoryTest,
                         ::testing::Range<size_t>(0, Trajectories().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return std::string(Trajectories()[info.param].name);
                         });

// A state that starts again (e.g. a fresh one per step) is not the same optimizer: Adam's
// moments and bias correction carry over between the calls with the same state.
TEST(OptimizerTest, AdamStateCarriesOverBetweenSteps) {
  const TorchTrajectory* adam = nullptr;
  for (const auto& t : Trajectories()) {
    if (std::string(t.name) == "adam") adam = &t;
  }
  ASSERT_NE(adam, nullptr);
  auto optimizer = CreateOptimizer(OptionsOf(*adam));
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  std::vector<float> w = adam->initial;
  for (size_t step = 0; step < 2; ++step) {
    OptimizerState fresh;
    (*optimizer)
        ->Apply(absl::MakeSpan(w), adam->gradients[step], fresh,
                static_cast<float>(adam->rates[step]));
  }
  EXPECT_GT(RelativeError(w[1], adam->weights[1][1]), 1e-3);
}

TEST(OptimizerTest, OverloadWithoutRateUsesOptionsLearningRate) {
  for (const char* name : {"sgd", "adam", "adamw"}) {
    OptimizerOptions o;
    o.name = name;
    o.learning_rate = 0.03f;
    o.momentum = 0.5f;
    o.weight_decay = 0.01f;
    auto optimizer = CreateOptimizer(o);
    ASSERT_TRUE(optimizer.ok()) << optimizer.status();
    std::vector<float> a = {1.0f, -2.0f, 0.5f}, b = a;
    const std::vector<float> g = {0.1f, 0.2f, -0.3f};
    OptimizerState sa, sb;
    for (int step = 0; step < 3; ++step) {
      (*optimizer)->Apply(absl::MakeSpan(a), g, sa);
      (*optimizer)->Apply(absl::MakeSpan(b), g, sb, 0.03f);
    }
    EXPECT_EQ(a, b) << name;
    EXPECT_NE(a[0], 1.0f) << name;
  }
}

TEST(OptimizerTest, ZeroRateLeavesAdamWWeightsUnchanged) {
  OptimizerOptions o;
  o.name = "adamw";
  o.weight_decay = 0.1f;
  auto optimizer = CreateOptimizer(o);
  ASSERT_TRUE(optimizer.ok()) << optimizer.status();
  std::vector<float> w = {1.0f, -2.0f};
  OptimizerState state;
  (*optimizer)->Apply(absl::MakeSpan(w), std::vector<float>{0.5f, 0.5f}, state, 0.0f);
  EXPECT_EQ(w, (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(state.steps, 1);
}

struct BadOptions {
  std::function<void(OptimizerOptions&)> change;
  std::string message;
};

TEST(OptimizerTest, RejectsBadOptionsNamingTheField) {
  const float nan = std::nanf(""), inf = INFINITY;
  const std::vector<BadOptions> cases = {
      {[](auto& o) { o.name = "adagrad"; },
       "unknown optimizer 'adagrad' (expected one of: sgd, adam, adamw, none)"},
      {[](auto& o) { o.learning_rate = -1; },
       "optimizer: learning_rate must be finite and >= 0, got -1"},
      {[&](auto& o) { o.learning_rate = inf; },
       "optimizer: learning_rate must be finite and >= 0, got inf"},
      {[&](auto& o) { o.momentum = nan; }, "optimizer: momentum must be finite and >= 0, got nan"},
      {[](auto& o) { o.weight_decay = -0.1f; }, "optimizer: weight_decay must be finite and >= 0"},
      {[](auto& o) { o.name = "adam", o.beta1 = 1; }, "optimizer: beta1 must be in [0, 1), got 1"},
      {[](auto& o) { o.name = "adamw", o.beta1 = -0.1; },
       "optimizer: beta1 must be in [0, 1), got -0.1"},
      {[&](auto& o) { o.name = "adam", o.beta2 = nan; },
       "optimizer: beta2 must be in [0, 1), got nan"},
      {[](auto& o) { o.name = "adam", o.eps = 0; },
       "optimizer: eps must be finite and > 0 for adam, got 0"},
      {[&](auto& o) { o.name = "adamw", o.eps = inf; },
       "optimizer: eps must be finite and > 0 for adamw, got inf"},
      {[](auto& o) { o.name = "adam", o.momentum = -1; },
       "optimizer: momentum must be finite and >= 0, got -1"},
      {[](auto& o) { o.nesterov = true; },
       "nesterov needs sgd with a momentum > 0 (as torch.optim.SGD)"},
      {[](auto& o) { o.name = "adam", o.momentum = 0.9f, o.nesterov = true; },
       "nesterov needs sgd with a momentum > 0 (as torch.optim.SGD)"},
  };
  for (const BadOptions& c : cases) {
    OptimizerOptions o;
    c.change(o);
    const absl::Status status = CreateOptimizer(o).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(status.message().substr(0, c.message.size()), c.message);
  }
}

// ps_server --optimizer=none: a shard's "weights" become the averaged gradient it was given,
// whatever the rate, momentum or weight decay say (the workers' optimizers apply it).
TEST(OptimizerTest, NoneReplacesTheWeightsWithTheAverage) {
  OptimizerOptions o;
  o.name = "none";
  o.learning_rate = 0.5f;
  o.momentum = 0.9f;
  o.weight_decay = 0.1f;
  auto none = CreateOptimizer(o);
  ASSERT_TRUE(none.ok()) << none.status();
  std::vector<float> w = {1, 2, 3};
  OptimizerState state;
  for (int i = 0; i < 2; ++i) {
    const std::vector<float> g = {0.25f * i, -1.0f, 1e30f};
    (*none)->Apply(absl::MakeSpan(w), g, state);
    EXPECT_EQ(w, g);
  }
  EXPECT_EQ(state.steps, 2);
  EXPECT_TRUE(state.momentum_buffer.empty());
}

TEST(OptimizerTest, SgdIgnoresAdamOnlyFields) {
  OptimizerOptions o;
  o.beta1 = 2;
  o.eps = 0;
  EXPECT_TRUE(CreateOptimizer(o).ok());
  o.name = "adam";
  o.momentum = 0.9f;  // Ignored by adam (e.g. a --momentum flag left at its default).
  o.beta1 = 0;
  o.eps = 1e-8;
  EXPECT_TRUE(CreateOptimizer(o).ok());
}

}  // namespace
}  // namespace dptrain
