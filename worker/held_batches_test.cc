// The training set on the model's device (held_batches.h, nn::HeldValue): a held sample's values
// equal GatherBatch + AugmentBatch's bit for bit (gray and RGB, normalised or not, crops past
// the image's size, flips, fill values), the trainer hands the same batches to a model that holds
// the data as to one that does not, and when the set cannot be held: nothing under off, a
// line under auto, an error naming why under on.
#include "worker/held_batches.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/data/batch.h"
#include "worker/data/transforms.h"
#include "worker/trainer.h"

namespace dptrain {
namespace {

// `size` images of channels x rows x cols random bytes held as bytes, labels i % 3.
Dataset Bytes(int64_t size, int channels, int rows, int cols, uint64_t seed = 7) {
  Dataset d;
  d.size = size;
  d.channels = channels;
  d.rows = rows;
  d.cols = cols;
  d.num_classes = 3;
  d.byte_storage = true;
  d.bytes.resize(static_cast<size_t>(size * d.image_size()));
  uint64_t x = seed;
  for (uint8_t& b : d.bytes) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    b = static_cast<uint8_t>(x >> 56);
  }
  for (int64_t i = 0; i < size; ++i) d.labels.push_back(static_cast<nn::Label>(i % 3));
  return d;
}

// The batch of `indices` as a model holding `data` makes it: nn::HeldValue of each sample.
std::vector<float> HeldBatch(const Dataset& data, const std::vector<nn::HeldSample>& samples,
                             const std::vector<float>& fill) {
  const int64_t image = data.image_size();
  std::vector<float> out;
  const bool norm = !data.norm_mean.empty();
  for (const nn::HeldSample& s : samples) {
    for (int c = 0; c < data.channels; ++c) {
      for (int y = 0; y < data.rows; ++y) {
        for (int x = 0; x < data.cols; ++x) {
          out.push_back(nn::HeldValue(data.bytes.data() + s.index * image, data.rows, data.cols, c,
                                      y, x, s, norm ? data.norm_mean.data() : nullptr,
                                      norm ? data.norm_inv_std.data() : nullptr,
                                      fill.empty() ? nullptr : fill.data()));
        }
      }
    }
  }
  return out;
}

TEST(HeldBatchesTest, HeldValuesAreTheGatheredAndAugmentedBatch) {
  const std::vector<int64_t> indices = {4, 0, 9, 4, 2, 7, 1};
  for (int channels : {1, 3}) {
    for (bool normalised : {false, true}) {
      Dataset data = Bytes(10, channels, 6, 5);
      if (normalised) {
        const std::vector<float> mean = {0.49f, 0.48f, 0.45f}, std = {0.25f, 0.24f, 0.26f};
        ASSERT_TRUE(Normalize(data, absl::MakeConstSpan(mean).first(channels),
                              absl::MakeConstSpan(std).first(channels))
                        .ok());
      }
      for (int padding : {0, 2, 7}) {
        for (bool flip : {false, true}) {
          for (bool filled : {false, true}) {
            SCOPED_TRACE(absl::StrCat(channels, " channels, normalised ", normalised, ", padding ",
                                      padding, ", flip ", flip, ", fill ", filled));
            AugmentOptions augment;
            augment.crop_padding = padding;
            augment.horizontal_flip = flip;
            if (filled) augment.fill = std::vector<float>(channels, -1.75f);
            for (int64_t epoch = 0; epoch < 3; ++epoch) {
              const uint64_t key = AugmentKey(11, epoch);
              std::vector<float> host(indices.size() * data.image_size());
              std::vector<nn::Label> labels(indices.size());
              ASSERT_TRUE(
                  GatherBatch(data, indices, absl::MakeSpan(host), absl::MakeSpan(labels)).ok());
              ASSERT_TRUE(AugmentBatch(absl::MakeSpan(host), static_cast<int>(indices.size()),
                                       {channels, 6, 5}, augment, key, indices)
                              .ok());
              const std::vector<float> held =
                  HeldBatch(data, HeldSamples(augment, key, indices), augment.fill);
              ASSERT_EQ(held.size(), host.size());
              for (size_t k = 0; k < host.size(); ++k) {
                // Bit for bit: the same operations in the same order.
                ASSERT_EQ(held[k], host[k]) << "value " << k << ", epoch " << epoch;
              }
            }
          }
        }
      }
    }
  }
}

// A model that records every batch it trains on; with `holds`, it keeps the set given to
// HoldTrainingData and makes each held step's batch with nn::HeldValue, as a GPU's kernel does.
class RecordingModel final : public nn::Model {
 public:
  RecordingModel(nn::Dims dims, bool holds, absl::Status hold_status = absl::OkStatus(),
                 bool defers = false)
      : dims_(dims), holds_(holds), defers_(defers), hold_status_(std::move(hold_status)) {}
  const std::vector<nn::ParamInfo>& params() const override { return params_; }
  std::vector<float>& weights() override { return weights_; }
  absl::Span<const float> grads() const override { return absl::MakeConstSpan(grads_).first(1); }
  absl::Span<float> gradient_exchange() override { return absl::MakeSpan(grads_); }
  absl::Status ApplyUpdate(float) override { return absl::OkStatus(); }
  absl::StatusOr<nn::BatchResult> TrainStep(const float* images, nn::Targets targets,
                                            int n) override {
    pixels.insert(pixels.end(), images, images + n * dims_.size());
    labels.insert(labels.end(), targets.labels, targets.labels + n);
    // A loss and count that differ from step to step: the batch's mean value, its label-0s.
    double sum = 0;
    for (int64_t k = 0; k < n * dims_.size(); ++k) sum += images[k];
    nn::BatchResult r{sum / (n * dims_.size()), 0};
    for (int i = 0; i < n; ++i) r.correct += targets.labels[i] == 0;
    if (!deferring_) return r;
    pending_.push_back(r);
    max_pending = std::max(max_pending, static_cast<int>(pending_.size()));
    nn::BatchResult deferred{0, 0};
    deferred.deferred = true;
    return deferred;
  }
  bool DeferResults(bool on) override {
    deferring_ = on && defers_;
    return deferring_;
  }
  absl::StatusOr<std::vector<nn::BatchResult>> TakeResults() override {
    ++takes;
    return std::move(pending_);
  }
  absl::StatusOr<nn::BatchResult> Evaluate(const float*, nn::Targets, int) override {
    return nn::BatchResult{1.0, 0};
  }
  bool CanHoldData() const override { return holds_; }
  absl::Status HoldTrainingData(const nn::HeldData& data) override {
    if (!hold_status_.ok()) return hold_status_;
    held_ = Dataset{};
    held_.size = data.size;
    held_.channels = data.channels;
    held_.rows = data.rows;
    held_.cols = data.cols;
    held_.byte_storage = true;
    held_.bytes.assign(data.bytes.begin(), data.bytes.end());
    held_.labels.assign(data.labels.begin(), data.labels.end());
    held_.norm_mean = data.mean;
    held_.norm_inv_std = data.inv_std;
    fill_ = data.fill;
    return absl::OkStatus();
  }
  absl::StatusOr<nn::BatchResult> TrainStepHeld(absl::Span<const nn::HeldSample> samples) override {
    ++held_steps;
    const std::vector<nn::HeldSample> s(samples.begin(), samples.end());
    const std::vector<float> batch = HeldBatch(held_, s, fill_);
    std::vector<nn::Label> batch_labels;
    for (const nn::HeldSample& h : s) batch_labels.push_back(held_.labels[h.index]);
    return TrainStep(batch.data(), nn::Targets(batch_labels.data()), static_cast<int>(s.size()));
  }
  std::string name() const override { return "recording"; }
  nn::Dims input_dims() const override { return dims_; }
  int num_classes() const override { return 3; }

  std::vector<float> pixels;
  std::vector<nn::Label> labels;
  int held_steps = 0;
  int max_pending = 0;  // Deferred steps waiting at most.
  int takes = 0;

 private:
  const nn::Dims dims_;
  const bool holds_, defers_;
  const absl::Status hold_status_;
  bool deferring_ = false;
  std::vector<nn::BatchResult> pending_;
  const std::vector<nn::ParamInfo> params_ = {{"w", {1}, 0, 1}};
  std::vector<float> weights_ = {0};
  std::vector<float> grads_ = {0, 0};
  Dataset held_;
  std::vector<float> fill_;
};

// A lone replica: nothing to exchange.
class LoneReducer final : public GradientReducer {
 public:
  absl::Status Start(absl::Span<float>) override { return absl::OkStatus(); }
  int world_size() const override { return 1; }
  absl::StatusOr<StepOutcome> Reduce(int64_t, absl::Span<float>) override {
    return StepOutcome{false};
  }
  absl::Status AverageBuffers(int64_t, absl::Span<float>) override { return absl::OkStatus(); }
  CommStats stats() const override { return {}; }
};

TrainerOptions TwoEpochs(DataOnDevice mode) {
  TrainerOptions o;
  o.batch_size = 4;
  o.epochs = 2;
  o.seed = 5;
  o.evaluate = false;
  o.log_every = absl::ZeroDuration();
  o.augment.crop_padding = 2;
  o.augment.horizontal_flip = true;
  o.augment.fill = {-2, -1, 0.5};
  o.data_on_device = mode;
  return o;
}

// The trainer gives a model that holds the set the batches it gathers for one that does not.
TEST(HeldBatchesTest, TheTrainerSendsTheSameBatchesEitherWay) {
  Dataset data = Bytes(11, 3, 6, 5);
  ASSERT_TRUE(Normalize(data, {0.5f, 0.4f, 0.3f}, {0.2f, 0.25f, 0.3f}).ok());
  RecordingModel gathered({3, 6, 5}, /*holds=*/false), held({3, 6, 5}, /*holds=*/true);
  LoneReducer a, b;
  ASSERT_TRUE(Train(TwoEpochs(DataOnDevice::kOff), gathered, &a, data, nullptr, nullptr).ok());
  ASSERT_TRUE(Train(TwoEpochs(DataOnDevice::kOn), held, &b, data, nullptr, nullptr).ok());
  EXPECT_EQ(held.held_steps, 6);  // 11 samples in batches of 4, two epochs.
  EXPECT_EQ(held.labels, gathered.labels);
  ASSERT_EQ(held.pixels.size(), gathered.pixels.size());
  EXPECT_TRUE(held.pixels == gathered.pixels);  // Bit for bit.
}

// Every step's loss as the observer hears it.
class LossObserver final : public StepObserver {
 public:
  void OnStep(const StepReport& step) override {
    steps.push_back(step.step);
    losses.push_back(step.loss);
    correct.push_back(step.correct);
  }
  void OnEpoch(const EpochMetrics&) override {}
  std::vector<int64_t> steps;
  std::vector<double> losses;
  std::vector<int64_t> correct;
};

// A lone replica whose model holds the data and defers its results (a GPU's steps then never
// wait for it): the observer hears every step, in order, with the results of a model that
// does not defer, and the epochs' metrics are the same; at most 64 steps wait.
TEST(HeldBatchesTest, DeferredResultsArriveInOrderWithTheSameMetrics) {
  Dataset data = Bytes(300, 1, 4, 4);
  std::vector<std::vector<EpochMetrics>> history(2);
  std::vector<LossObserver> observers(2);
  std::vector<std::unique_ptr<RecordingModel>> models;
  for (int defers = 0; defers < 2; ++defers) {
    models.push_back(
        std::make_unique<RecordingModel>(nn::Dims{1, 4, 4}, true, absl::OkStatus(), defers == 1));
    TrainerOptions o = TwoEpochs(DataOnDevice::kOn);
    o.batch_size = 2;  // 150 steps an epoch.
    o.augment = {};
    o.observer = &observers[defers];
    LoneReducer reducer;
    ASSERT_TRUE(Train(o, *models.back(), &reducer, data, nullptr, &history[defers]).ok());
  }
  EXPECT_EQ(models[0]->takes, 0);
  EXPECT_GE(models[1]->takes, 2 * 150 / 64);
  EXPECT_LE(models[1]->max_pending, 64);
  EXPECT_EQ(observers[1].steps, observers[0].steps);
  EXPECT_EQ(observers[1].losses, observers[0].losses);
  EXPECT_EQ(observers[1].correct, observers[0].correct);
  ASSERT_EQ(history[1].size(), 2u);
  for (int e = 0; e < 2; ++e) {
    EXPECT_EQ(history[1][e].loss, history[0][e].loss);
    EXPECT_EQ(history[1][e].train_acc, history[0][e].train_acc);
    EXPECT_EQ(history[1][e].images, history[0][e].images);
  }
}

TEST(HeldBatchesTest, WhenTheSetIsNotHeld) {
  const Dataset bytes = Bytes(6, 1, 4, 4);
  Dataset floats = bytes;
  floats.byte_storage = false;
  floats.bytes.clear();
  floats.images.assign(static_cast<size_t>(6 * 16), 0.5f);
  AugmentOptions none, resized;
  resized.resized_crop_min_scale = 0.5;
  std::ostringstream progress;
  RecordingModel cpu({1, 4, 4}, /*holds=*/false), gpu({1, 4, 4}, /*holds=*/true);
  // off: never; auto: never for a model that cannot, silently.
  EXPECT_EQ(HoldTrainingSet(DataOnDevice::kOff, none, bytes, gpu, &progress).value(), false);
  EXPECT_EQ(HoldTrainingSet(DataOnDevice::kAuto, none, bytes, cpu, &progress).value(), false);
  EXPECT_EQ(progress.str(), "");
  EXPECT_EQ(HoldTrainingSet(DataOnDevice::kAuto, none, bytes, gpu, &progress).value(), true);
  EXPECT_EQ(progress.str(),
            "training set held in the model's device memory: 6 images of 16 bytes; each step "
            "sends only its samples' indices\n");
  progress.str("");
  // auto: one line why; on: the error.
  EXPECT_EQ(HoldTrainingSet(DataOnDevice::kAuto, none, floats, gpu, &progress).value(), false);
  EXPECT_EQ(progress.str(),
            "training batches are gathered on the host: the training set holds images as "
            "floats, not image bytes\n");
  absl::StatusOr<bool> on = HoldTrainingSet(DataOnDevice::kOn, resized, bytes, gpu, nullptr);
  EXPECT_EQ(on.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(on.status().message(),
            "--data_on_device=on: the random resized crop runs on the host only "
            "(--data_on_device=auto or off)");
  on = HoldTrainingSet(DataOnDevice::kOn, none, bytes, cpu, nullptr);
  EXPECT_EQ(on.status().message(),
            "--data_on_device=on: recording on this device reads batches the host gathers "
            "(--data_on_device=auto or off)");
  Dataset targets = bytes;
  targets.labels.clear();
  targets.num_classes = 0;
  targets.targets_per_sample = 1;
  targets.targets.assign(6, 0.5f);
  EXPECT_EQ(HoldTrainingSet(DataOnDevice::kOn, none, targets, gpu, nullptr).status().message(),
            "--data_on_device=on: the training set holds target values (regression) "
            "(--data_on_device=auto or off)");
  // A set that does not fit: auto gathers on the host, on fails; the model's refusal of the
  // data itself is an error either way.
  RecordingModel full({1, 4, 4}, true, absl::ResourceExhaustedError("6 MiB would not fit"));
  progress.str("");
  EXPECT_EQ(HoldTrainingSet(DataOnDevice::kAuto, none, bytes, full, &progress).value(), false);
  EXPECT_EQ(progress.str(), "training batches are gathered on the host: 6 MiB would not fit\n");
  EXPECT_EQ(HoldTrainingSet(DataOnDevice::kOn, none, bytes, full, nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
  RecordingModel refusing({1, 4, 4}, true, absl::InvalidArgumentError("label 7"));
  EXPECT_EQ(HoldTrainingSet(DataOnDevice::kAuto, none, bytes, refusing, nullptr).status().message(),
            "label 7");
}

TEST(HeldBatchesTest, FlagValues) {
  EXPECT_EQ(ParseDataOnDevice("off").value(), DataOnDevice::kOff);
  EXPECT_EQ(ParseDataOnDevice("auto").value(), DataOnDevice::kAuto);
  EXPECT_EQ(ParseDataOnDevice("on").value(), DataOnDevice::kOn);
  EXPECT_EQ(ParseDataOnDevice("gpu").status().message(),
            "--data_on_device=gpu: expected auto, on or off");
}

}  // namespace
}  // namespace dptrain
