// The trainer's step contract, with a fake model and fake synchronisers: a step whose
// gradient overflowed travels flagged in the model's exchange slot, is applied by nobody,
// counted in the epoch's skipped_steps, and the model hears every step's global outcome
// (RecordStepOutcome) in order; a lone replica exchanges nothing; a store that sends the job
// back also brings back batch norm's running statistics.
#include "worker/trainer.h"

#include <algorithm>
#include <memory>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace dptrain {
namespace {

// Two weights; TrainStep's gradient is all ones, and it reports an overflow on the steps
// listed in `overflow_steps` (counted from 0). ApplyUpdate is w -= g.
class FakeModel final : public nn::Model {
 public:
  // with_buffer: one batch-norm-like buffer that counts the TrainSteps it has seen.
  explicit FakeModel(std::vector<int> overflow_steps, bool with_buffer = false)
      : overflow_steps_(overflow_steps) {
    if (with_buffer) {
      buffers_ = {{"seen", {1}, 0, 1}};
      buffer_values_ = {0};
    }
  }
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
  absl::StatusOr<nn::BatchResult> TrainStep(const float* images, nn::Targets targets,
                                            int n) override {
    for (int i = 0; i < n; ++i) first_pixels.push_back(images[i * 784]);
    for (int i = 0; targets.values != nullptr && i < n * 10; ++i) {
      trained_targets.push_back(targets.values[i]);
    }
    bool overflow = false;
    for (int s : overflow_steps_) overflow = overflow || s == steps_;
    ++steps_;
    if (!buffer_values_.empty()) buffer_values_[0] += 1;
    grads_ = {1, 1, overflow ? 1.0f : 0.0f};
    return nn::BatchResult{1.0, 0, overflow};
  }
  // The loss: the mean of the batch's target values (1 for labels).
  absl::StatusOr<nn::BatchResult> Evaluate(const float*, nn::Targets targets, int n) override {
    if (targets.values == nullptr) return nn::BatchResult{1.0, 0};
    double sum = 0;
    for (int i = 0; i < n * 10; ++i) sum += targets.values[i];
    return nn::BatchResult{sum / (n * 10), 0};
  }
  void RecordStepOutcome(bool skipped) override { outcomes.push_back(skipped); }
  std::string name() const override { return "fake"; }
  nn::Dims input_dims() const override { return {1, 28, 28}; }
  int num_classes() const override { return 10; }
  const std::vector<nn::ParamInfo>& buffers() const override { return buffers_; }
  std::vector<float>& buffer_values() override { return buffer_values_; }

  std::vector<bool> outcomes;
  std::vector<float> first_pixels;     // Of every sample trained on, in order.
  std::vector<float> trained_targets;  // Every target value trained on, in order.
  int exchanges = 0;
  int updates = 0;

 private:
  const std::vector<int> overflow_steps_;
  int steps_ = 0;
  std::vector<nn::ParamInfo> params_ = {{"w", {2}, 0, 2}};
  std::vector<float> weights_ = {0, 0};
  std::vector<float> grads_ = {0, 0, 0};
  std::vector<nn::ParamInfo> buffers_;
  std::vector<float> buffer_values_;
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
  absl::Status Start(absl::Span<float>) override {
    ++starts;
    return absl::OkStatus();
  }
  int starts = 0;
  absl::StatusOr<StepOutcome> PushPull(int64_t, absl::Span<float> g, absl::Span<float> w) override {
    const bool skipped = g.back() != 0;
    if (!skipped) {
      for (size_t i = 0; i < w.size(); ++i) w[i] -= g[i];
    }
    return StepOutcome{skipped};
  }
  absl::Status AverageBuffers(int64_t, absl::Span<float>) override { return absl::OkStatus(); }
  CommStats stats() const override { return {}; }
};

// A one-rank BSP store (w -= g) whose checkpoints are every `interval` steps and which, the
// first time step `fail_at` is pushed, goes back to step `back_to` as a shard restarted from
// that checkpoint would: that step's weights, rewind_to = back_to.
class RewindingStore final : public ParameterStore {
 public:
  RewindingStore(int64_t interval, int64_t fail_at, int64_t back_to)
      : interval_(interval), fail_at_(fail_at), back_to_(back_to) {}
  absl::Status Start(absl::Span<float> w) override {
    history_.assign(1, std::vector<float>(w.begin(), w.end()));
    return absl::OkStatus();
  }
  absl::StatusOr<StepOutcome> PushPull(int64_t step, absl::Span<float> g,
                                       absl::Span<float> w) override {
    if (step == fail_at_ && !failed_) {
      failed_ = true;
      std::copy(history_[back_to_].begin(), history_[back_to_].end(), w.begin());
      history_.resize(back_to_ + 1);
      StepOutcome outcome;
      outcome.rewind_to = back_to_;
      return outcome;
    }
    for (size_t i = 0; i < w.size(); ++i) w[i] -= g[i];
    history_.emplace_back(w.begin(), w.end());
    return StepOutcome{};
  }
  absl::Status AverageBuffers(int64_t, absl::Span<float>) override { return absl::OkStatus(); }
  CommStats stats() const override { return {}; }
  int64_t rewind_interval() const override { return interval_; }

 private:
  const int64_t interval_, fail_at_, back_to_;
  bool failed_ = false;
  std::vector<std::vector<float>> history_;  // Index: the step whose weights these are.
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

// GreyImages(n) as a regression set: 10 target values per sample (the fake model's outputs),
// sample i's all i.
Dataset GreyTargets(int n) {
  Dataset data = GreyImages(n);
  data.labels.clear();
  data.num_classes = 0;
  data.targets_per_sample = 10;
  for (int i = 0; i < n; ++i) data.targets.insert(data.targets.end(), 10, static_cast<float>(i));
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
  EXPECT_EQ(model.weights(), (std::vector<float>{-5, -5})) << "8 steps, 3 skipped";
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

// Issue 30 item 2: 8x8 or 32x32 images used to be read misaligned or past the batch buffer
// (loss nan, exit 0). Now they are one clear error before anything is sent or trained.
TEST(TrainerTest, ImagesOfAnotherShapeFailBeforeAnyStep) {
  for (int side : {8, 32}) {
    Dataset data = GreyImages(8);
    data.rows = data.cols = side;
    data.images.assign(8 * side * side, 0.5f);
    std::ostringstream metrics;
    FakeModel model({});
    FakeStore store;
    const absl::Status s = Train(EightSteps(&metrics), model, &store, data, nullptr, nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(s.message(), absl::StrCat("the training set holds 1x", side, "x", side,
                                        " images but model fake takes 1x28x28 inputs"));
    EXPECT_EQ(model.exchanges, 0);
    EXPECT_EQ(store.starts, 0) << "nothing was sent";
  }
  Dataset test = GreyImages(4);
  test.rows = 8;
  test.images.assign(4 * 8 * 28, 0.5f);
  std::ostringstream metrics;
  FakeModel model({});
  FakeStore store;
  const absl::Status s = Train(EightSteps(&metrics), model, &store, GreyImages(8), &test, nullptr);
  EXPECT_EQ(s.message(), "the test set holds 1x8x28 images but model fake takes 1x28x28 inputs");
  EXPECT_EQ(EvaluateModel(model, test, 2).status().code(), absl::StatusCode::kInvalidArgument);
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

// Going back from step 5 to the checkpoint of step 4 redoes steps 4 and 5: 10 TrainSteps for
// an 8-step job. The weights come from the store; the running statistics from the trainer's
// own record of step 4, so they too are those of 8 steps.
TEST(TrainerTest, GoingBackRestoresTheRunningStatisticsOfThatStep) {
  const Dataset data = GreyImages(8);
  std::ostringstream metrics, progress;
  FakeModel model({}, /*with_buffer=*/true);
  RewindingStore store(/*interval=*/2, /*fail_at=*/5, /*back_to=*/4);
  TrainerOptions options = EightSteps(&metrics);
  options.progress = &progress;
  std::vector<EpochMetrics> history;
  ASSERT_TRUE(Train(options, model, &store, data, nullptr, &history).ok());
  EXPECT_EQ(model.weights(), (std::vector<float>{-8, -8}));
  EXPECT_EQ(model.buffer_values(), (std::vector<float>{8})) << progress.str();
  EXPECT_EQ(progress.str().find("not rewound"), std::string::npos) << progress.str();
}

// A step the trainer holds no statistics of (here: not a multiple of the interval it was
// told) cannot be restored: the job goes on, and the worker says so.
TEST(TrainerTest, GoingBackWithoutARecordOfThatStepSaysSo) {
  const Dataset data = GreyImages(8);
  std::ostringstream metrics, progress;
  FakeModel model({}, /*with_buffer=*/true);
  RewindingStore store(/*interval=*/3, /*fail_at=*/5, /*back_to=*/4);
  TrainerOptions options = EightSteps(&metrics);
  options.progress = &progress;
  std::vector<EpochMetrics> history;
  ASSERT_TRUE(Train(options, model, &store, data, nullptr, &history).ok());
  EXPECT_EQ(model.weights(), (std::vector<float>{-8, -8}));
  EXPECT_EQ(model.buffer_values(), (std::vector<float>{10}));
  EXPECT_NE(progress.str().find("not rewound"), std::string::npos) << progress.str();
}

// 28x28 images held as bytes, image i all (i + 1).
Dataset NumberedImages(int n) {
  Dataset data;
  data.size = n;
  data.rows = 28;
  data.cols = 28;
  data.byte_storage = true;
  for (int i = 0; i < n; ++i) data.bytes.insert(data.bytes.end(), 784, static_cast<uint8_t>(i + 1));
  data.labels.assign(n, 1);
  return data;
}

// The images of a byte store, read as needed: records each plan and the reads that follow it
// and fails the read numbered fail_at (from 0).
class FakeSource final : public ImageSource {
 public:
  FakeSource(const Dataset& held, int fail_at) : held_(held), fail_at_(fail_at) {}
  void Plan(absl::Span<const int64_t> order) override {
    plans.emplace_back(order.begin(), order.end());
    at_ = 0;
  }
  absl::Status Read(int64_t index, uint8_t* out) override {
    if (reads++ == fail_at_) return absl::DataLossError("img.png: truncated");
    if (read_delay > absl::ZeroDuration()) absl::SleepFor(read_delay);
    const bool planned = !plans.empty() && at_ < plans.back().size() && plans.back()[at_] == index;
    if (planned) ++at_;
    ++(planned ? planned_reads : unplanned_reads);
    std::copy_n(held_.bytes.begin() + index * 784, 784, out);
    return absl::OkStatus();
  }
  std::vector<std::vector<int64_t>> plans;
  int reads = 0, planned_reads = 0, unplanned_reads = 0;
  absl::Duration read_delay;  // Each read takes this long (a slow disk or decoder).

 private:
  const Dataset held_;
  const int fail_at_;
  size_t at_ = 0;
};

Dataset FromSource(const Dataset& held, std::shared_ptr<ImageSource> source) {
  Dataset d = held;
  d.bytes.clear();
  d.source = std::move(source);
  return d;
}

// A data set read as needed trains on the same batches as the same images held, and its
// source hears the order ahead: each epoch's rest and the next epoch's, at each epoch's start
// and after the job goes back; every read then comes in the planned order.
TEST(TrainerTest, ImagesReadAsNeededTrainTheSameBatchesInThePlannedOrder) {
  const Dataset held = NumberedImages(8);
  for (bool rewind : {false, true}) {
    std::ostringstream metrics;
    FakeModel held_model({}), source_model({});
    auto source = std::make_shared<FakeSource>(held, /*fail_at=*/-1);
    const Dataset streamed = FromSource(held, source);
    ASSERT_TRUE(streamed.consistent());
    if (rewind) {
      RewindingStore a(/*interval=*/2, /*fail_at=*/5, /*back_to=*/2);
      RewindingStore b(/*interval=*/2, /*fail_at=*/5, /*back_to=*/2);
      ASSERT_TRUE(Train(EightSteps(&metrics), held_model, &a, held, nullptr, nullptr).ok());
      ASSERT_TRUE(Train(EightSteps(&metrics), source_model, &b, streamed, nullptr, nullptr).ok());
    } else {
      FakeStore a, b;
      ASSERT_TRUE(Train(EightSteps(&metrics), held_model, &a, held, nullptr, nullptr).ok());
      ASSERT_TRUE(Train(EightSteps(&metrics), source_model, &b, streamed, nullptr, nullptr).ok());
    }
    const size_t samples = rewind ? 2 * 12 : 2 * 8;  // Steps 2-5 are done twice.
    ASSERT_EQ(held_model.first_pixels.size(), samples);
    EXPECT_EQ(source_model.first_pixels, held_model.first_pixels);
    std::vector<float> distinct = held_model.first_pixels;
    std::sort(distinct.begin(), distinct.end());
    EXPECT_EQ(std::unique(distinct.begin(), distinct.end()) - distinct.begin(), 8);
    EXPECT_EQ(source->unplanned_reads, 0) << "rewind " << rewind;
    EXPECT_EQ(source->planned_reads, static_cast<int>(samples));
    // Step 0: epochs 0 and 1 (16); step 4: epoch 1 (8); [back to step 2: the rest of epoch 0
    // and epoch 1 (12), then epoch 1 again (8)].
    std::vector<size_t> sizes;
    for (const auto& plan : source->plans) sizes.push_back(plan.size());
    EXPECT_EQ(sizes, rewind ? std::vector<size_t>({16, 8, 12, 8}) : std::vector<size_t>({16, 8}));
    EXPECT_TRUE(std::equal(source->plans.back().begin(), source->plans.back().end(),
                           source->plans.front().begin() + 8));
  }
}

// Steps that wait for their batches say so: the epoch's data time (here nearly all of it: the
// reads take 3 ms, the fake model nothing) in the metrics and a note on the epoch line.
TEST(TrainerTest, TheEpochLineSaysWhenTheStepsWaitForTheirData) {
  const Dataset held = NumberedImages(8);
  std::ostringstream metrics, progress;
  FakeModel model({});
  FakeStore store;
  auto source = std::make_shared<FakeSource>(held, /*fail_at=*/-1);
  source->read_delay = absl::Milliseconds(3);
  TrainerOptions options = EightSteps(&metrics);
  options.progress = &progress;
  std::vector<EpochMetrics> history;
  ASSERT_TRUE(Train(options, model, &store, FromSource(held, source), nullptr, &history).ok());
  ASSERT_EQ(history.size(), 2u);
  for (const EpochMetrics& m : history) {
    EXPECT_GE(m.data_seconds, 8 * 0.003) << "8 reads of 3 ms an epoch";
    EXPECT_LE(m.data_seconds, m.step_seconds);
  }
  EXPECT_NE(progress.str().find("% of the step time (reading, decoding, augmenting)"),
            std::string::npos)
      << progress.str();
  EXPECT_NE(metrics.str().find("\"data_seconds\":"), std::string::npos);
}

TEST(TrainerTest, AFailedReadOfASourceEndsTrainingWithItsError) {
  const Dataset held = NumberedImages(8);
  std::ostringstream metrics;
  FakeModel model({});
  FakeStore store;
  const Dataset streamed = FromSource(held, std::make_shared<FakeSource>(held, /*fail_at=*/5));
  const absl::Status s = Train(EightSteps(&metrics), model, &store, streamed, nullptr, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(s.message(), "img.png: truncated");
  EXPECT_EQ(model.first_pixels.size(), 4u) << "two steps trained before the failed read";
  const absl::StatusOr<Evaluation> eval =
      EvaluateModel(model, FromSource(held, std::make_shared<FakeSource>(held, 0)), 4);
  EXPECT_EQ(eval.status().code(), absl::StatusCode::kDataLoss);
}

// A regression set: each step gets its samples' target values (no labels), the epoch reports
// the test set's mean loss and no accuracy; target values per sample other than the model's
// outputs are refused before any step.
TEST(TrainerTest, RegressionTrainsOnTargetValuesAndReportsTheTestLoss) {
  const Dataset train = GreyTargets(4);
  const Dataset test = GreyTargets(3);  // Mean target value 1.
  std::ostringstream metrics, progress;
  TrainerOptions options = EightSteps(&metrics);
  options.epochs = 1;
  options.world_size = 1;
  options.evaluate = true;
  options.progress = &progress;
  FakeModel model({});
  FakeStore store;
  std::vector<EpochMetrics> history;
  ASSERT_TRUE(Train(options, model, &store, train, &test, &history).ok());
  ASSERT_EQ(model.trained_targets.size(), 40u);
  std::vector<float> seen = model.trained_targets;
  std::sort(seen.begin(), seen.end());
  for (int i = 0; i < 40; ++i) EXPECT_EQ(seen[i], i / 10) << "every sample once, its own values";
  for (int i = 0; i < 40; i += 10) {  // A sample's ten values stay together.
    EXPECT_EQ(std::count(model.trained_targets.begin() + i, model.trained_targets.begin() + i + 10,
                         model.trained_targets[i]),
              10);
  }
  ASSERT_EQ(history.size(), 1u);
  EXPECT_TRUE(history[0].regression);
  EXPECT_EQ(history[0].train_acc, -1);
  EXPECT_EQ(history[0].test_acc, -1);
  EXPECT_DOUBLE_EQ(history[0].test_loss, 1.0);
  EXPECT_NE(progress.str().find("loss 1.0000  test_loss 1.0000  images/s"), std::string::npos)
      << progress.str();
  EXPECT_EQ(progress.str().find("acc"), std::string::npos) << progress.str();
  EXPECT_NE(metrics.str().find("\"test_loss\":1.0"), std::string::npos) << metrics.str();

  Dataset three = GreyTargets(4);
  three.targets_per_sample = 3;
  three.targets.resize(12);
  const absl::Status s = Train(options, model, &store, three, nullptr, nullptr);
  EXPECT_EQ(s.message(),
            "the training set has 3 target value(s) per sample (regression), but model fake has 10 "
            "output(s)");
  EXPECT_EQ(EvaluateModel(model, three, 2).status().message(),
            "the evaluation set has 3 target value(s) per sample (regression), but model fake has "
            "10 output(s)");
}

}  // namespace
}  // namespace dptrain
