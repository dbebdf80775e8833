#include "worker/trainer.h"

#include <cstring>
#include <variant>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "worker/data/sampler.h"

namespace dptrain {
namespace {

void WriteEpochLine(const TrainerOptions& o, const EpochMetrics& m) {
  if (o.progress != nullptr) {
    *o.progress << absl::StrFormat(
                       "rank %d epoch %d/%d  loss %.4f  train_acc %.4f  test_acc %.4f  "
                       "images/s %.0f  time %.1fs%s",
                       o.rank, m.epoch, o.epochs, m.loss, m.train_acc, m.test_acc,
                       m.images_per_s, m.seconds,
                       m.skipped_steps > 0
                           ? absl::StrFormat("  skipped %d steps (inf/NaN gradient)", m.skipped_steps)
                           : "")
                << std::endl;
  }
  if (o.metrics != nullptr) {
    *o.metrics << absl::StrFormat(
                      "{\"event\":\"epoch\",\"rank\":%d,\"world_size\":%d,\"epoch\":%d,"
                      "\"steps\":%d,\"skipped_steps\":%d,\"loss\":%.6f,\"train_acc\":%.6f,"
                      "\"test_acc\":%.6f,\"images_per_s\":%.1f,\"seconds\":%.3f,"
                      "\"bytes_pushed\":%d,\"bytes_pulled\":%d,\"learning_rate\":%.6g}",
                      o.rank, o.world_size, m.epoch, m.steps, m.skipped_steps, m.loss,
                      m.train_acc, m.test_acc, m.images_per_s, m.seconds,
                      m.comm.bytes_pushed, m.comm.bytes_pulled, m.learning_rate)
               << std::endl;
  }
}

void WriteFinalLine(const TrainerOptions& o, const std::vector<EpochMetrics>& h,
                    double seconds) {
  if (h.empty()) return;
  const EpochMetrics& last = h.back();
  int64_t steps = 0, images = 0;
  double train_s = 0;
  for (const EpochMetrics& m : h) {
    steps += m.steps;
    images += m.images;
    train_s += m.train_seconds;
  }
  const double images_per_s = train_s > 0 ? images / train_s : 0;
  if (o.progress != nullptr) {
    *o.progress << absl::StrFormat(
                       "rank %d done: %d epochs, %d steps, final loss %.4f, test_acc %.4f, "
                       "%.0f images/s, %.1fs, pushed %.1f MB, pulled %.1f MB",
                       o.rank, static_cast<int>(h.size()), steps, last.loss, last.test_acc,
                       images_per_s, seconds, last.comm.bytes_pushed / 1e6,
                       last.comm.bytes_pulled / 1e6)
                << std::endl;
  }
  if (o.metrics != nullptr) {
    *o.metrics << absl::StrFormat(
                      "{\"event\":\"final\",\"rank\":%d,\"world_size\":%d,\"epochs\":%d,"
                      "\"steps\":%d,\"loss\":%.6f,\"train_acc\":%.6f,\"test_acc\":%.6f,"
                      "\"images_per_s\":%.1f,\"seconds\":%.3f,\"bytes_pushed\":%d,"
                      "\"bytes_pulled\":%d,\"max_staleness\":%d,\"mean_staleness\":%.3f}",
                      o.rank, o.world_size, static_cast<int>(h.size()), steps, last.loss,
                      last.train_acc, last.test_acc, images_per_s, seconds,
                      last.comm.bytes_pushed, last.comm.bytes_pulled, last.comm.max_staleness,
                      last.comm.staleness_count > 0
                          ? static_cast<double>(last.comm.staleness_sum) /
                                last.comm.staleness_count
                          : 0.0)
               << std::endl;
  }
}

// One step's synchronisation and update, after model.TrainStep reported `overflow`.
absl::StatusOr<StepOutcome> Synchronise(int64_t step, bool overflow, float learning_rate,
                                        nn::Model& model, StepSync sync) {
  if (auto* store = std::get_if<ParameterStore*>(&sync)) {
    return (*store)->PushPull(step, model.gradient_exchange(), absl::MakeSpan(model.weights()));
  }
  GradientReducer& reducer = *std::get<GradientReducer*>(sync);
  StepOutcome outcome;
  outcome.skipped = overflow;
  if (reducer.world_size() > 1) {
    absl::StatusOr<StepOutcome> reduced = reducer.Reduce(step, model.gradient_exchange());
    if (!reduced.ok()) return reduced.status();
    outcome = *reduced;
  }
  if (!outcome.skipped) {
    if (absl::Status s = model.ApplyUpdate(learning_rate); !s.ok()) return s;
  }
  return outcome;
}

}  // namespace

absl::StatusOr<double> EvaluateAccuracy(nn::Model& model, const Dataset& data, int batch_size) {
  if (data.size < 1) return absl::InvalidArgumentError("evaluation set is empty");
  int64_t correct = 0;
  for (int64_t begin = 0; begin < data.size; begin += batch_size) {
    const int n = static_cast<int>(std::min<int64_t>(batch_size, data.size - begin));
    auto result = model.Evaluate(data.image(begin), data.labels.data() + begin, n);
    if (!result.ok()) return result.status();
    correct += result->correct;
  }
  return static_cast<double>(correct) / static_cast<double>(data.size);
}

absl::Status Train(const TrainerOptions& o, nn::Model& model, StepSync step_sync,
                   const Dataset& train, const Dataset* test, std::vector<EpochMetrics>* history) {
  if (o.batch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("batch size must be >= 1, got ", o.batch_size));
  }
  if (o.epochs < 0) return absl::InvalidArgumentError("epochs must be >= 0");
  auto sampler = DistributedSampler::Create({train.size, o.world_size, o.rank, o.seed, true});
  if (!sampler.ok()) return sampler.status();

  ReplicaSync& sync = Common(step_sync);
  const absl::Time start = absl::Now();
  std::vector<float>& weights = model.weights();
  if (auto s = sync.Start(absl::MakeSpan(weights)); !s.ok()) return s;

  const int64_t pixels = train.image_size();
  std::vector<float> batch_images(static_cast<size_t>(o.batch_size) * pixels);
  std::vector<uint8_t> batch_labels(o.batch_size);
  std::vector<EpochMetrics> local_history;
  std::vector<EpochMetrics>& h = history != nullptr ? *history : local_history;
  int64_t step = 0;
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    const absl::Time epoch_start = absl::Now();
    const std::vector<int64_t> indices = sampler->EpochIndices(epoch);
    int64_t batches = NumBatches(static_cast<int64_t>(indices.size()), o.batch_size);
    if (o.max_steps_per_epoch > 0) batches = std::min(batches, o.max_steps_per_epoch);
    EpochMetrics m;
    m.epoch = epoch + 1;
    double loss_sum = 0;
    int64_t correct = 0, seen = 0;
    for (int64_t b = 0; b < batches; ++b, ++step) {
      const int64_t begin = b * o.batch_size;
      const int n = static_cast<int>(
          std::min<int64_t>(o.batch_size, static_cast<int64_t>(indices.size()) - begin));
      for (int i = 0; i < n; ++i) {
        const int64_t idx = indices[begin + i];
        std::memcpy(batch_images.data() + i * pixels, train.image(idx), pixels * sizeof(float));
        batch_labels[i] = train.labels[idx];
      }
      auto result = model.TrainStep(batch_images.data(), batch_labels.data(), n);
      if (!result.ok()) return result.status();
      // Mixed precision: an overflow anywhere skips the step everywhere, and every replica's
      // loss scale hears the global outcome.
      const float learning_rate = LearningRateAt(o.lr_schedule, step);
      absl::StatusOr<StepOutcome> outcome =
          Synchronise(step, result->overflow, learning_rate, model, step_sync);
      if (!outcome.ok()) return outcome.status();
      model.RecordStepOutcome(outcome->skipped);
      if (outcome->skipped) ++m.skipped_steps;
      loss_sum += result->loss * n;
      correct += result->correct;
      seen += n;
    }
    const double train_seconds = absl::ToDoubleSeconds(absl::Now() - epoch_start);
    // Batch-norm running statistics drift apart per worker during the epoch (each sees its
    // own batches); averaging them makes every replica evaluate and save the same model.
    if (!model.buffer_values().empty()) {
      if (auto s = sync.AverageBuffers(epoch, absl::MakeSpan(model.buffer_values())); !s.ok()) {
        return s;
      }
    }
    m.steps = batches;
    m.learning_rate =
        o.lr_schedule.base_lr > 0 && step > 0 ? LearningRateAt(o.lr_schedule, step - 1) : 0;
    m.loss = seen > 0 ? loss_sum / seen : 0;
    m.train_acc = seen > 0 ? static_cast<double>(correct) / seen : 0;
    m.images = seen;
    m.train_seconds = train_seconds;
    m.images_per_s = train_seconds > 0 ? seen / train_seconds : 0;
    m.test_acc = -1;
    if (o.evaluate && test != nullptr) {
      auto acc = EvaluateAccuracy(model, *test, o.eval_batch_size);
      if (!acc.ok()) return acc.status();
      m.test_acc = *acc;
    }
    m.seconds = absl::ToDoubleSeconds(absl::Now() - epoch_start);
    m.comm = sync.stats();
    h.push_back(m);
    WriteEpochLine(o, m);
  }
  WriteFinalLine(o, h, absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

}  // namespace dptrain
