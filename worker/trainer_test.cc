// The trainer's mixed-precision wiring, with a fake model and a fake sync: a step whose
// gradient overflowed is flagged to the sync (SetOverflow), not applied, counted in the
// epoch's skipped_steps, and the model hears every step's global outcome
// (RecordStepOutcome) in order.
#include "worker/trainer.h"

#include <sstream>
#include <vector>

#include "gtest/gtest.h"

namespace dptrain {
namespace {

// Two weights; TrainStep's gradient is all ones, and it reports an overflow on the steps
// listed in `overflow_steps` (counted from 0).
class FakeModel final : public nn::Model {
 public:
  explicit FakeModel(std::vector<int> overflow_steps) : overflow_steps_(overflow_steps) {}
  const std::vector<nn::ParamInfo>& params() const override { return params_; }
  std::vector<float>& weights() override { return weights_; }
  const std::vector<float>& grads() const override { return grads_; }
  absl::StatusOr<nn::BatchResult> TrainStep(const float*, const uint8_t*, int) override {
    bool overflow = false;
    for (int s : overflow_steps_) overflow = overflow || s == steps_;
    ++steps_;
    return nn::BatchResult{1.0, 0, overflow};
  }
  absl::StatusOr<nn::BatchResult> Evaluate(const float*, const uint8_t*, int) override {
    return nn::BatchResult{1.0, 0};
  }
  void RecordStepOutcome(bool skipped) override { outcomes.push_back(skipped); }
  std::string name() const override { return "fake"; }

  std::vector<bool> outcomes;

 private:
  const std::vector<int> overflow_steps_;
  int steps_ = 0;
  std::vector<nn::ParamInfo> params_ = {{"w", {2}, 0, 2}};
  std::vector<float> weights_ = {0, 0};
  std::vector<float> grads_ = {1, 1};
};

// w -= g unless the step was flagged (one rank: the flag is the global decision).
class FakeSync final : public GradientSync {
 public:
  absl::Status Start(absl::Span<float>) override { return absl::OkStatus(); }
  absl::Status Step(int64_t, absl::Span<const float> grads, absl::Span<float> w) override {
    weights_seen = w.size();
    skipped_ = overflow_;
    overflow_ = false;
    if (!skipped_) {
      for (size_t i = 0; i < w.size(); ++i) w[i] -= grads[i];
    }
    return absl::OkStatus();
  }
  void SetOverflow(bool overflow) override { overflow_ = overflow; }
  bool last_step_skipped() const override { return skipped_; }
  absl::Status AverageBuffers(int64_t, absl::Span<float>) override { return absl::OkStatus(); }
  CommStats stats() const override { return {}; }

  size_t weights_seen = 0;  // Size of the weights the last Step got.

 private:
  bool overflow_ = false;
  bool skipped_ = false;
};

// `n` grey 28x28 images, all labelled 1.
Dataset GreyImages(int n) {
  Dataset data;
  data.size = n;
  data.rows = 28;
  data.cols = 28;
  data.images.assign(n * 784, 0.5f);
  data.labels.assign(n, 1);
  return data;
}

TEST(TrainerTest, OverflowedStepsAreSkippedCountedAndReported) {
  const Dataset data = GreyImages(8);
  TrainerOptions options;
  options.batch_size = 2;  // 4 steps per epoch.
  options.epochs = 2;
  options.evaluate = false;
  std::ostringstream metrics;
  options.metrics = &metrics;
  FakeModel model({1, 4, 5});
  FakeSync sync;
  std::vector<EpochMetrics> history;
  ASSERT_TRUE(Train(options, model, sync, data, nullptr, &history).ok());
  EXPECT_EQ(model.outcomes,
            (std::vector<bool>{false, true, false, false, true, true, false, false}));
  ASSERT_EQ(history.size(), 2u);
  EXPECT_EQ(history[0].skipped_steps, 1);
  EXPECT_EQ(history[1].skipped_steps, 2);
  EXPECT_EQ(model.weights(), (std::vector<float>{-5, -5})) << "8 steps, 3 skipped";
  EXPECT_NE(metrics.str().find("\"skipped_steps\":2"), std::string::npos) << metrics.str();
}

// optimizer_on_model: the sync's Step gets no host weights (the model updates its own).
TEST(TrainerTest, OptimizerOnModelPassesNoHostWeights) {
  const Dataset data = GreyImages(4);
  TrainerOptions options;
  options.batch_size = 2;
  options.evaluate = false;
  FakeModel model({});
  FakeSync sync;
  ASSERT_TRUE(Train(options, model, sync, data, nullptr, nullptr).ok());
  EXPECT_EQ(sync.weights_seen, 2u);
  options.optimizer_on_model = true;
  ASSERT_TRUE(Train(options, model, sync, data, nullptr, nullptr).ok());
  EXPECT_EQ(sync.weights_seen, 0u);
}

}  // namespace
}  // namespace dptrain
