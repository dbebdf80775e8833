// The trainer's step contract, with a fake model and fake synchronisers: a step whose
// gradient overflowed travels flagged in the model's exchange slot, is applied by nobody,
// counted in the epoch's skipped_steps, and the model hears every step's global outcome
// (RecordStepOutcome) in order; a lone replica exchanges nothing.
#include "worker/trainer.h"

#include <sstream>
#include <vector>

#include "gtest/gtest.h"

namespace dptrain {
namespace {

// Two weights; TrainStep's gradient is all ones, and it reports an overflow on the steps
// listed in `overflow_steps` (counted from 0). ApplyUpdate is w -= g.
class FakeModel final : public nn::Model {
 public:
  explicit FakeModel(std::vector<int> overflow_steps) : overflow_steps_(overflow_steps) {}
  const std::vector<nn::ParamInfo>& params() const override { return params_; }
  std::vector<float>& weights() override { return weights_; }
  absl::Span<const float> grads() const override { return absl::MakeConstSpan(grads_).first(2); }
  absl::Span<float> gradient_exchange() override {
    ++exchanges;
    return absl::MakeSpan(grads_);
  }
  absl::Status ApplyUpdate(float) override {
    ++updates;
    for (int i = 0; i < 2; ++i) weights_[i] -= grads_[i];
    return absl::OkStatus();
  }
  absl::StatusOr<nn::BatchResult> TrainStep(const float*, const uint8_t*, int) override {
    bool overflow = false;
    for (int s : overflow_steps_) overflow = overflow || s == steps_;
    ++steps_;
    grads_ = {1, 1, overflow ? 1.0f : 0.0f};
    return nn::BatchResult{1.0, 0, overflow};
  }
  absl::StatusOr<nn::BatchResult> Evaluate(const float*, const uint8_t*, int) override {
    return nn::BatchResult{1.0, 0};
  }
  void RecordStepOutcome(bool skipped) override { outcomes.push_back(skipped); }
  std::string name() const override { return "fake"; }

  std::vector<bool> outcomes;
  int exchanges = 0;
  int updates = 0;

 private:
  const std::vector<int> overflow_steps_;
  int steps_ = 0;
  std::vector<nn::ParamInfo> params_ = {{"w", {2}, 0, 2}};
  std::vector<float> weights_ = {0, 0};
  std::vector<float> grads_ = {0, 0, 0};
};

// A reducer of `world` replicas that all computed the same gradient: the average is the
// gradient, and the flag slot decides.
class FakeReducer final : public GradientReducer {
 public:
  explicit FakeReducer(int world) : world_(world) {}
  absl::Status Start(absl::Span<float>) override { return absl::OkStatus(); }
  int world_size() const override { return world_; }
  absl::StatusOr<StepOutcome> Reduce(int64_t, absl::Span<float> g) override {
    ++reduces;
    return StepOutcome{g.back() != 0};
  }
  absl::Status AverageBuffers(int64_t, absl::Span<float>) override { return absl::OkStatus(); }
  CommStats stats() const override { return {}; }
  int reduces = 0;

 private:
  const int world_;
};

// A one-rank parameter store: w -= g unless the step was flagged.
class FakeStore final : public ParameterStore {
 public:
  absl::Status Start(absl::Span<float>) override { return absl::OkStatus(); }
  absl::StatusOr<StepOutcome> PushPull(int64_t, absl::Span<float> g,
                                       absl::Span<float> w) override {
    const bool skipped = g.back() != 0;
    if (!skipped) {
      for (size_t i = 0; i < w.size(); ++i) w[i] -= g[i];
    }
    return StepOutcome{skipped};
  }
  absl::Status AverageBuffers(int64_t, absl::Span<float>) override { return absl::OkStatus(); }
  CommStats stats() const override { return {}; }
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

TrainerOptions EightSteps(std::ostringstream* metrics) {
  TrainerOptions options;
  options.batch_size = 2;  // 4 steps per epoch.
  options.epochs = 2;
  options.evaluate = false;
  options.metrics = metrics;
  return options;
}

void ExpectThreeOfEightSkipped(FakeModel& model, const std::vector<EpochMetrics>& history,
                               const std::ostringstream& metrics) {
  EXPECT_EQ(model.outcomes,
            (std::vector<bool>{false, true, false, false, true, true, false, false}));
  ASSERT_EQ(history.size(), 2u);
  EXPECT_EQ(history[0].skipped_steps, 1);
  EXPECT_EQ(history[1].skipped_steps, 2);
  EXPECT_EQ(model.weights(), (std::vector<float>{-5, -5}))
      << "8 steps, 3 skipped";
  EXPECT_NE(metrics.str().find("\"skipped_steps\":2"), std::string::npos) << metrics.str();
}

TEST(TrainerTest, ReducerPathSkipsFlaggedStepsAndAppliesTheRestOnTheModel) {
  const Dataset data = GreyImages(8);
  std::ostringstream metrics;
  FakeModel model({1, 4, 5});
  FakeReducer reducer(/*world=*/2);
  std::vector<EpochMetrics> history;
  ASSERT_TRUE(Train(EightSteps(&metrics), model, &reducer, data, nullptr, &history).ok());
  ExpectThreeOfEightSkipped(model, history, metrics);
  EXPECT_EQ(reducer.reduces, 8);
  EXPECT_EQ(model.exchanges, 8);
  EXPECT_EQ(model.updates, 5);
}

TEST(TrainerTest, StorePathSendsTheFlagAndTakesTheWeights) {
  const Dataset data = GreyImages(8);
  std::ostringstream metrics;
  FakeModel model({1, 4, 5});
  FakeStore store;
  std::vector<EpochMetrics> history;
  ASSERT_TRUE(Train(EightSteps(&metrics), model, &store, data, nullptr, &history).ok());
  ExpectThreeOfEightSkipped(model, history, metrics);
  EXPECT_EQ(model.updates, 0) << "the store applies the optimizer, not the model";
}

// A lone replica needs no exchange: its gradient is never asked for (on a GPU it stays on
// the device), and its own flag decides.
TEST(TrainerTest, LoneReplicaExchangesNothing) {
  const Dataset data = GreyImages(8);
  std::ostringstream metrics;
  FakeModel model({1, 4, 5});
  FakeReducer reducer(/*world=*/1);
  std::vector<EpochMetrics> history;
  ASSERT_TRUE(Train(EightSteps(&metrics), model, &reducer, data, nullptr, &history).ok());
  ExpectThreeOfEightSkipped(model, history, metrics);
  EXPECT_EQ(reducer.reduces, 0);
  EXPECT_EQ(model.exchanges, 0);
}

}  // namespace
}  // namespace dptrain
