#include "worker/trainer.h"

#include <cmath>
#include <cstring>
#include <deque>
#include <utility>
#include <variant>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/data/batch.h"
#include "worker/data/sampler.h"
#include "worker/nn/batch_sample.h"

namespace dptrain {
namespace {

// A regression set's target values per sample must be the model's outputs (class labels are
// checked by each step: nn::CheckBatch).
absl::Status CheckTargets(const Dataset& data, const nn::Model& model, absl::string_view what) {
  if (!data.regression() || data.targets_per_sample == model.num_classes()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " has ", data.targets_per_sample,
                   " target value(s) per sample (regression), but model ", model.name(), " has ",
                   model.num_classes(), " output(s)"));
}

// When the steps waited for their batches (reading, decoding, augmenting) a tenth of their
// time or more, says so: the input, not the model, then limits the pace.
std::string DataShareNote(const EpochMetrics& m) {
  if (m.step_seconds <= 0 || m.data_seconds < 0.1 * m.step_seconds) return "";
  return absl::StrFormat("  data %.0f%% of the step time (reading, decoding, augmenting)",
                         100.0 * m.data_seconds / m.step_seconds);
}

void WriteEpochLine(const TrainerOptions& o, const EpochMetrics& m) {
  if (o.progress != nullptr) {
    // A regression's scores are its losses (no accuracy).
    const std::string scores =
        m.regression ? absl::StrFormat("loss %.4f  test_loss %.4f", m.loss, m.test_loss)
                     : absl::StrFormat("loss %.4f  train_acc %.4f  test_acc %.4f", m.loss,
                                       m.train_acc, m.test_acc);
    *o.progress << absl::StrFormat("rank %d epoch %d/%d  %s  images/s %.0f  time %.1fs%s", o.rank,
                                   m.epoch, o.epochs, scores, m.images_per_s, m.seconds,
                                   m.skipped_steps > 0
                                       ? absl::StrFormat("  skipped %d steps (inf/NaN gradient)",
                                                         m.skipped_steps)
                                       : "")
                << DataShareNote(m) << std::endl;
  }
  if (o.metrics != nullptr) {
    const nlohmann::ordered_json line = {{"event", "epoch"},
                                         {"rank", o.rank},
                                         {"world_size", o.world_size},
                                         {"epoch", m.epoch},
                                         {"steps", m.steps},
                                         {"skipped_steps", m.skipped_steps},
                                         {"loss", m.loss},
                                         {"train_acc", m.train_acc},
                                         {"test_acc", m.test_acc},
                                         {"test_loss", m.test_loss},
                                         {"images_per_s", m.images_per_s},
                                         {"data_seconds", m.data_seconds},
                                         {"seconds", m.seconds},
                                         {"bytes_pushed", m.comm.bytes_pushed},
                                         {"bytes_pulled", m.comm.bytes_pulled},
                                         {"learning_rate", m.learning_rate}};
    *o.metrics << line.dump() << std::endl;
  }
}

void WriteFinalLine(const TrainerOptions& o, const std::vector<EpochMetrics>& h, double seconds) {
  if (h.empty()) return;
  const EpochMetrics& last = h.back();
  int64_t steps = 0, images = 0;
  double train_s = 0;
  double timed_images = 0;  // Those train_seconds saw (EpochMetrics::train_seconds).
  for (const EpochMetrics& m : h) {
    steps += m.steps;
    images += m.images;
    train_s += m.train_seconds;
    timed_images += m.images_per_s * m.train_seconds;
  }
  const double images_per_s = train_s > 0 ? timed_images / train_s : 0;
  if (o.progress != nullptr) {
    const std::string score = last.regression ? absl::StrFormat("test_loss %.4f", last.test_loss)
                                              : absl::StrFormat("test_acc %.4f", last.test_acc);
    *o.progress << absl::StrFormat(
                       "rank %d done: %d epochs, %d steps, final loss %.4f, %s, "
                       "%.0f images/s, %.1fs, pushed %.1f MB, pulled %.1f MB",
                       o.rank, static_cast<int>(h.size()), steps, last.loss, score, images_per_s,
                       seconds, last.comm.bytes_pushed / 1e6, last.comm.bytes_pulled / 1e6)
                << std::endl;
  }
  if (o.metrics != nullptr) {
    const CommStats& c = last.comm;
    const nlohmann::ordered_json line = {
        {"event", "final"},
        {"rank", o.rank},
        {"world_size", o.world_size},
        {"epochs", static_cast<int>(h.size())},
        {"steps", steps},
        {"loss", last.loss},
        {"train_acc", last.train_acc},
        {"test_acc", last.test_acc},
        {"test_loss", last.test_loss},
        {"images_per_s", images_per_s},
        {"seconds", seconds},
        {"bytes_pushed", c.bytes_pushed},
        {"bytes_pulled", c.bytes_pulled},
        {"max_staleness", c.max_staleness},
        {"mean_staleness",
         c.staleness_count > 0 ? static_cast<double>(c.staleness_sum) / c.staleness_count : 0.0}};
    *o.metrics << line.dump() << std::endl;
  }
}

// "17s", "3m05s", "2h04m".
std::string FormatEta(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(seconds, 0.0)));
  if (s < 60) return absl::StrFormat("%ds", s);
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
}

// The progress line within an epoch (TrainerOptions::log_every): over the steps since the
// last line, images/s and where the time went; an ETA from that pace.
class ProgressLine {
 public:
  explicit ProgressLine(const TrainerOptions& o) : o_(o), last_(absl::Now()) {}

  void Add(const StepReport& r, int64_t steps_per_epoch, int64_t total_steps) {
    if (o_.progress == nullptr || o_.log_every <= absl::ZeroDuration()) return;
    images_ += r.images;
    ++steps_;
    data_ += r.data_end - r.start;
    compute_ += r.compute_end - r.data_end;
    sync_ += r.sync_end - r.compute_end;
    apply_ += r.end - r.sync_end;
    const absl::Duration window = r.end - last_;
    if (window < o_.log_every) return;
    const double seconds = absl::ToDoubleSeconds(window);
    const double total = std::max(absl::ToDoubleSeconds(data_ + compute_ + sync_ + apply_), 1e-9);
    auto pct = [total](absl::Duration d) { return 100.0 * absl::ToDoubleSeconds(d) / total; };
    const double step_seconds = seconds / steps_;
    const int64_t left = total_steps - (r.step + 1);
    *o_.progress << absl::StrFormat(
                        "rank %d epoch %d/%d step %d/%d  loss %.4f  images/s %.0f  data %.0f%% "
                        "compute %.0f%% sync %.0f%% apply %.0f%%  ETA %s",
                        o_.rank, r.epoch + 1, o_.epochs, r.step % steps_per_epoch + 1,
                        steps_per_epoch, r.loss, images_ / seconds, pct(data_), pct(compute_),
                        pct(sync_), pct(apply_), FormatEta(step_seconds * left))
                 << std::endl;
    Reset(r.end);
  }

 private:
  void Reset(absl::Time now) {
    last_ = now;
    images_ = steps_ = 0;
    data_ = compute_ = sync_ = apply_ = absl::ZeroDuration();
  }

  const TrainerOptions& o_;
  absl::Time last_;
  int64_t images_ = 0, steps_ = 0;
  absl::Duration data_, compute_, sync_, apply_;
};

// One step taken in the current epoch, for its metrics (going back drops exactly the steps
// undone).
struct StepRecord {
  double loss_sum = 0, loss_weight = 0;  // The batch's loss times its weight, and the weight.
  int64_t correct = 0, seen = 0;
  bool skipped = false;
  double data_seconds = 0, step_seconds = 0;
};

// Steps whose loss and correct count the model gives later (nn::Model::DeferResults: a lone
// replica on a GPU with its data held, whose steps then never wait for the device): their
// records and reports wait here until Flush fills them in and hands the reports, in order, to
// `deliver` (the observer and the progress line). Due every kFlushSteps steps and every
// log_every; the caller flushes at each epoch's end too.
class DeferredSteps {
 public:
  DeferredSteps(const TrainerOptions& o, nn::Model& model) : o_(o), model_(model) {}

  void Add(size_t record, StepReport report) { pending_.push_back({record, std::move(report)}); }
  bool Due(absl::Time now) const {
    return pending_.size() >= kFlushSteps ||
           (o_.log_every > absl::ZeroDuration() && now - last_ >= o_.log_every);
  }
  template <typename Deliver>
  absl::Status Flush(std::vector<StepRecord>& records, Deliver deliver) {
    last_ = absl::Now();
    if (pending_.empty()) return absl::OkStatus();
    DPTRAIN_ASSIGN_OR_RETURN(const std::vector<nn::BatchResult> results, model_.TakeResults());
    if (results.size() != pending_.size()) {
      return absl::InternalError(absl::StrCat(model_.name(), " gave ", results.size(),
                                              " deferred results for ", pending_.size(), " steps"));
    }
    for (size_t i = 0; i < results.size(); ++i) {
      auto& [record, report] = pending_[i];
      StepRecord& r = records[record];
      const double weight = nn::LossWeight(results[i], static_cast<int>(r.seen));
      r.loss_sum = results[i].loss * weight;
      r.loss_weight = weight;
      r.correct = results[i].correct;
      report.loss = results[i].loss;
      report.correct = results[i].correct;
      deliver(report);
    }
    pending_.clear();
    return absl::OkStatus();
  }

 private:
  // Enough to keep a GPU busy, few enough to keep the per-step metrics current.
  static constexpr size_t kFlushSteps = 64;
  static_assert(kFlushSteps <= nn::Model::kMaxDeferredSteps, "the model holds them all");
  const TrainerOptions& o_;
  nn::Model& model_;
  absl::Time last_ = absl::Now();
  std::vector<std::pair<size_t, StepReport>> pending_;
};

// Batch norm's running statistics at the steps the job may be sent back to (multiples of
// ReplicaSync::rewind_interval()). A parameter server's checkpoint holds the weights but not
// these (every worker has its own until the epoch's average), so going back restores them
// from here: a worker that goes back then ends with the statistics of an uninterrupted run.
class BufferHistory {
 public:
  explicit BufferHistory(int64_t interval) : interval_(interval) {}

  // Called before step `step` is computed. Reads the model's statistics only at a multiple of
  // the interval (on a GPU each read is a copy from the device).
  void Record(int64_t step, nn::Model& model) {
    if (interval_ <= 0 || model.buffers().empty() || step % interval_ != 0) return;
    while (!kept_.empty() && kept_.back().first >= step) kept_.pop_back();
    kept_.emplace_back(step, model.buffer_values());
    if (kept_.size() > kKept) kept_.pop_front();
  }

  // Puts back the statistics of `step` and forgets later ones; false if there are none (a
  // worker that joined after it, or a step that is no multiple of the interval).
  bool Restore(int64_t step, std::vector<float>& values) {
    while (!kept_.empty() && kept_.back().first > step) kept_.pop_back();
    if (kept_.empty() || kept_.back().first != step ||
        kept_.back().second.size() != values.size()) {
      return false;
    }
    values = kept_.back().second;
    return true;
  }

 private:
  // A shard keeps its newest 3 checkpoints by default; the job goes back to the newest
  // valid one of the shard that restarted, so a few more than that is plenty.
  static constexpr size_t kKept = 8;
  const int64_t interval_;
  std::deque<std::pair<int64_t, std::vector<float>>> kept_;
};

// One step's synchronisation and update, after model.TrainStep reported `overflow`.
// `sync_end` receives the end of the exchange (before this process's optimizer update).
absl::StatusOr<StepOutcome> Synchronise(int64_t step, bool overflow, float learning_rate,
                                        nn::Model& model, StepSync sync, absl::Time* sync_end) {
  if (auto* store = std::get_if<ParameterStore*>(&sync)) {
    auto outcome =
        (*store)->PushPull(step, model.gradient_exchange(), absl::MakeSpan(model.weights()));
    *sync_end = absl::Now();
    return outcome;
  }
  GradientReducer& reducer = *std::get<GradientReducer*>(sync);
  StepOutcome outcome;
  outcome.skipped = overflow;
  if (reducer.world_size() > 1) {
    absl::StatusOr<StepOutcome> reduced = reducer.Reduce(step, model.gradient_exchange());
    if (!reduced.ok()) return reduced.status();
    outcome = *reduced;
  }
  *sync_end = absl::Now();
  if (!outcome.skipped) {
    if (absl::Status s = model.ApplyUpdate(learning_rate); !s.ok()) return s;
  }
  return outcome;
}

// Before the push of step - 1: hands this replica's batch-norm statistics as they are before
// `step` to a store that checkpoints `step` (a multiple of `interval`), so the checkpoint
// holds them. `epoch_end`: `step` begins an epoch, whose statistics are the replicas' mean.
// A failure costs that checkpoint its statistics only: it is reported, training goes on.
void KeepBuffersFor(const TrainerOptions& o, int64_t step, bool epoch_end, int64_t interval,
                    nn::Model& model, ParameterStore* store) {
  if (store == nullptr || interval <= 0 || step % interval != 0 || model.buffers().empty()) return;
  const absl::Status kept = store->KeepBuffers(step, model.buffer_values(), epoch_end);
  if (!kept.ok() && o.progress != nullptr) {
    *o.progress << "rank " << o.rank << ": batch-norm running statistics of step " << step
                << " not kept with its checkpoint: " << kept << std::endl;
  }
}

absl::Status AfterStep(const TrainerOptions& o, int64_t next_step, nn::Model& model) {
  return o.checkpointer == nullptr ? absl::OkStatus() : o.checkpointer->AfterStep(next_step, model);
}

// What a data set whose images are read as needed (Dataset::source) reads ahead of the step
// at `begin` of `epoch` (whose sample order is `indices`): the samples of the rest of the epoch,
// then those of the next one, if any. An epoch's steps read its first `epoch_samples` indices.
std::vector<int64_t> ReadOrder(const DistributedSampler& sampler,
                               const std::vector<int64_t>& indices, int epoch, int64_t begin,
                               int64_t epoch_samples, int epochs) {
  auto used = [epoch_samples](const std::vector<int64_t>& v) {
    return std::min<int64_t>(static_cast<int64_t>(v.size()), epoch_samples);
  };
  std::vector<int64_t> order(indices.begin() + begin, indices.begin() + used(indices));
  if (epoch + 1 < epochs) {
    const std::vector<int64_t> next = sampler.EpochIndices(epoch + 1);
    order.insert(order.end(), next.begin(), next.begin() + used(next));
  }
  return order;
}

}  // namespace

absl::StatusOr<Evaluation> EvaluateModel(nn::Model& model, const Dataset& data, int batch_size) {
  if (data.size < 1) return absl::InvalidArgumentError("evaluation set is empty");
  const nn::Dims input = model.input_dims();
  if (auto s = CheckImageShape(
          data, {input.c, input.h, input.w, model.input_is_ids(), model.input_id_limit()},
          model.name(), "the evaluation set");
      !s.ok()) {
    return s;
  }
  DPTRAIN_RETURN_IF_ERROR(CheckTargets(data, model, "the evaluation set"));
  if (!data.scores_consistent() || !data.consistent()) {
    return absl::InvalidArgumentError("the evaluation set's arrays do not match its size");
  }
  int64_t correct = 0;
  double loss_sum = 0, weight_sum = 0;  // Batches' mean losses by their weights.
  std::vector<float> images;  // A byte store's images as floats, one batch at a time.
  std::vector<uint8_t> scratch;
  std::vector<int64_t> order;
  if (data.source != nullptr) {
    order.resize(static_cast<size_t>(data.size));
    for (int64_t i = 0; i < data.size; ++i) order[i] = i;
    data.source->Plan(order);
  }
  for (int64_t begin = 0; begin < data.size; begin += batch_size) {
    const int n = static_cast<int>(std::min<int64_t>(batch_size, data.size - begin));
    const float* batch = data.byte_storage ? nullptr : data.image(begin);
    if (data.source != nullptr) {  // Read in the planned order; the labels are held.
      images.resize(static_cast<size_t>(n * data.image_size()));
      for (int i = 0; i < n; ++i) {
        if (absl::Status s =
                data.ReadImage(begin + i, images.data() + i * data.image_size(), scratch);
            !s.ok()) {
          return s;
        }
      }
      batch = images.data();
    } else if (data.byte_storage) {
      images.resize(static_cast<size_t>(n * data.image_size()));
      data.CopyImages(begin, n, images.data());
      batch = images.data();
    }
    auto result = model.Evaluate(batch, data.targets_from(begin), n);
    if (!result.ok()) {
      return nn::NameDataSample(
          result.status(), [begin](int64_t k) { return begin + k; }, "the evaluated set");
    }
    correct += result->correct;
    const double weight = nn::LossWeight(*result, n);
    loss_sum += result->loss * weight;
    weight_sum += weight;
  }
  const double size = static_cast<double>(data.size);
  return Evaluation{data.regression() ? -1 : static_cast<double>(correct) / size,
                    weight_sum > 0 ? loss_sum / weight_sum : 0.0};
}

absl::Status Train(const TrainerOptions& o, nn::Model& model, StepSync step_sync,
                   const Dataset& train, const Dataset* test, std::vector<EpochMetrics>* history) {
  if (o.batch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("batch size must be >= 1, got ", o.batch_size));
  }
  if (o.epochs < 0) return absl::InvalidArgumentError("epochs must be >= 0");
  auto sampler = DistributedSampler::Create({train.size, o.world_size, o.rank, o.seed, true});
  if (!sampler.ok()) return sampler.status();

  // Images of another shape than the model's input would be read misaligned or past the
  // batch buffer: one clear error before anything is sent.
  const nn::Dims input = model.input_dims();
  const ImageShape shape{input.c, input.h, input.w, model.input_is_ids(), model.input_id_limit()};
  if (auto s = CheckImageShape(train, shape, model.name(), "the training set"); !s.ok()) return s;
  if ((train.ids || train.features()) && o.augment.enabled()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "crop and flip augmentation apply to images; the training set holds ", train.kind()));
  }
  DPTRAIN_RETURN_IF_ERROR(CheckTargets(train, model, "the training set"));
  if (test != nullptr) {
    if (auto s = CheckImageShape(*test, shape, model.name(), "the test set"); !s.ok()) return s;
    DPTRAIN_RETURN_IF_ERROR(CheckTargets(*test, model, "the test set"));
  }

  // The set on the model's device (before Start: a refusal sends nothing).
  DPTRAIN_ASSIGN_OR_RETURN(const bool held,
                           HoldTrainingSet(o.data_on_device, o.augment, train, model, o.progress));
  // A lone replica whose data the model holds need not wait for each step's results: nothing
  // leaves the device, nothing can send the job back.
  const auto* reducer = std::get_if<GradientReducer*>(&step_sync);
  const bool deferred =
      held && reducer != nullptr && (*reducer)->world_size() == 1 && model.DeferResults(true);

  ReplicaSync& sync = Common(step_sync);
  const absl::Time start = absl::Now();
  std::vector<float>& weights = model.weights();
  if (auto s = sync.Start(absl::MakeSpan(weights)); !s.ok()) return s;

  const int64_t pixels = train.image_size();
  std::vector<float> batch_images(held ? 0 : static_cast<size_t>(o.batch_size) * pixels);
  std::vector<nn::HeldSample> held_samples;  // A step's, when the set is held.
  std::vector<nn::Label> batch_labels(train.regression() ? 0 : o.batch_size);
  std::vector<float> batch_targets(static_cast<size_t>(o.batch_size) * train.targets_per_sample);
  const nn::Targets batch_scored = train.regression() ? nn::Targets::Values(batch_targets.data())
                                                      : nn::Targets(batch_labels.data());
  std::vector<EpochMetrics> local_history;
  std::vector<EpochMetrics>& h = history != nullptr ? *history : local_history;
  // Every epoch has the same number of steps (each rank's share of an epoch is the same
  // size), so a step names an epoch and a batch: the data order is a function of the step,
  // and a worker that rejoins or goes back (StepOutcome::rewind_to) sees exactly the
  // batches of an uninterrupted run.
  int64_t steps_per_epoch = NumBatches(sampler->num_samples(), o.batch_size);
  if (o.max_steps_per_epoch > 0) steps_per_epoch = std::min(steps_per_epoch, o.max_steps_per_epoch);
  const int64_t total_steps = steps_per_epoch * o.epochs;
  int64_t step = std::min(sync.resume_step(), total_steps);
  if (step > 0 && o.progress != nullptr) {
    *o.progress << "rank " << o.rank << " joins the job at step " << step << " (epoch "
                << step / std::max<int64_t>(steps_per_epoch, 1) + 1 << ")" << std::endl;
  }
  ParameterStore* const store = std::holds_alternative<ParameterStore*>(step_sync)
                                    ? std::get<ParameterStore*>(step_sync)
                                    : nullptr;
  if (step > 0 && store != nullptr && !model.buffers().empty()) {
    // A job resumed from a checkpoint of this step (master mode --resume) continues with
    // each replica's own batch-norm statistics of it.
    const absl::Status restored =
        store->RestoreBuffers(step, absl::MakeSpan(model.buffer_values()));
    if (o.progress != nullptr) {
      if (restored.ok()) {
        *o.progress << "rank " << o.rank << ": batch-norm running statistics of step " << step
                    << " restored" << std::endl;
      } else {
        *o.progress << "rank " << o.rank << ": no batch-norm running statistics of step " << step
                    << " (" << restored.message()
                    << "): they start afresh, so evaluation may differ slightly from an "
                       "uninterrupted run"
                    << std::endl;
      }
    }
  }
  // The current epoch's indices and, per step taken in it, its loss sum, correct count and
  // images, so that going back drops exactly the steps undone.
  int current_epoch = -1;
  std::vector<int64_t> indices;
  int64_t planned_next = -1;  // The step whose batch the source's plan reads next.
  std::vector<StepRecord> records;
  absl::Time epoch_start = absl::Now();
  // The process's first step waits for every worker to join (a rank that started first waits
  // for the others' start): images/s is counted from its end, alike on every rank, unless it
  // was its epoch's only step.
  bool first_step = true;
  absl::Time timed_start = epoch_start;
  int64_t untimed_images = 0;
  BufferHistory buffer_history(sync.rewind_interval());
  ProgressLine progress(o);
  DeferredSteps deferred_steps(o, model);
  auto deliver = [&](const StepReport& report) {
    if (o.observer != nullptr) o.observer->OnStep(report);
    progress.Add(report, steps_per_epoch, total_steps);
  };
  // However training ends (an error too), the steps taken are reported and the model waits
  // for each step again.
  absl::Cleanup end_deferral = [&] {
    if (!deferred) return;
    (void)deferred_steps.Flush(records, deliver);
    model.DeferResults(false);
  };
  while (step < total_steps) {
    const int epoch = static_cast<int>(step / steps_per_epoch);
    const int64_t b = step % steps_per_epoch;
    if (epoch != current_epoch) {
      current_epoch = epoch;
      indices = sampler->EpochIndices(epoch);
      records.clear();
      epoch_start = timed_start = absl::Now();
      untimed_images = 0;
    }
    records.resize(b);  // Steps before b of this epoch were taken (a rewind may drop some).
    buffer_history.Record(step, model);
    StepReport report;
    report.start = absl::Now();
    const int64_t begin = b * o.batch_size;
    const int n = static_cast<int>(
        std::min<int64_t>(o.batch_size, static_cast<int64_t>(indices.size()) - begin));
    const auto batch_indices = absl::MakeConstSpan(indices).subspan(begin, n);
    if (train.source != nullptr && (planned_next != step || b == 0)) {
      // Planned again at each epoch's start and after a rewind or a join (they start elsewhere).
      train.source->Plan(
          ReadOrder(*sampler, indices, epoch, begin, steps_per_epoch * o.batch_size, o.epochs));
    }
    planned_next = step + 1;
    if (held) {
      held_samples = HeldSamples(o.augment, AugmentKey(o.seed, epoch), batch_indices);
    } else {
      if (auto s = GatherBatch(train, batch_indices, absl::MakeSpan(batch_images),
                               absl::MakeSpan(batch_labels), absl::MakeSpan(batch_targets));
          !s.ok()) {
        return s;
      }
      if (o.augment.enabled()) {
        if (auto s = AugmentBatch(absl::MakeSpan(batch_images), n, shape, o.augment,
                                  AugmentKey(o.seed, epoch), batch_indices);
            !s.ok()) {
          return s;
        }
      }
    }
    report.data_end = absl::Now();
    auto result = held ? model.TrainStepHeld(held_samples)
                       : model.TrainStep(batch_images.data(), batch_scored, n);
    if (!result.ok()) {
      return nn::NameDataSample(
          result.status(),
          [&](int64_t k) { return k >= 0 && k < n ? batch_indices[k] : int64_t{-1}; },
          "the training set");
    }
    report.compute_end = absl::Now();
    // Mixed precision: an overflow anywhere skips the step everywhere, and every replica's
    // loss scale hears the global outcome.
    const float learning_rate = LearningRateAt(o.lr_schedule, step);
    KeepBuffersFor(o, step + 1, (step + 1) % steps_per_epoch == 0, sync.rewind_interval(), model,
                   store);
    absl::StatusOr<StepOutcome> outcome =
        Synchronise(step, result->overflow, learning_rate, model, step_sync, &report.sync_end);
    if (!outcome.ok()) return outcome.status();
    report.end = absl::Now();
    if (outcome->rewind_to >= 0) {
      // The job went back (a shard restarted from an older checkpoint); the weights of that
      // step are in place. Epochs after it are undone too.
      if (outcome->rewind_to > step) {
        return absl::InternalError(
            absl::StrCat("step ", step, ": the store went forward to ", outcome->rewind_to));
      }
      step = outcome->rewind_to;
      const int back_to = static_cast<int>(step / steps_per_epoch);
      while (!h.empty() && h.back().epoch > back_to) h.pop_back();
      if (back_to != current_epoch) current_epoch = -1;
      if (!model.buffers().empty() && !buffer_history.Restore(step, model.buffer_values()) &&
          (store == nullptr ||
           !store->RestoreBuffers(step, absl::MakeSpan(model.buffer_values())).ok()) &&
          o.progress != nullptr) {
        *o.progress << "rank " << o.rank << ": went back to step " << step
                    << "; neither this worker (it joined later) nor the store has its "
                       "batch-norm running statistics of that step, so they are not rewound: "
                       "evaluation may differ slightly from an uninterrupted run"
                    << std::endl;
      }
      continue;
    }
    model.RecordStepOutcome(outcome->skipped);
    const double weight = nn::LossWeight(*result, n);
    records.push_back({result->loss * weight, weight, result->correct, n, outcome->skipped,
                       absl::ToDoubleSeconds(report.data_end - report.start),
                       absl::ToDoubleSeconds(report.end - report.start)});
    const bool was_first = first_step;
    if (first_step) {
      first_step = false;
      timed_start = absl::Now();
      untimed_images = n;
    }
    report.step = step;
    report.epoch = epoch;
    report.images = n;
    report.loss = result->loss;
    report.regression = train.regression();
    report.correct = result->correct;
    report.skipped = outcome->skipped;
    report.learning_rate = o.lr_schedule.base_lr > 0 ? learning_rate : 0;
    report.forward_seconds = result->forward_seconds;
    report.backward_seconds = result->backward_seconds;
    if (o.observer != nullptr) {
      report.comm = sync.stats();
      report.loss_scale = model.loss_scale();
      report.device_memory_bytes = model.device_memory_bytes();
    }
    if (result->deferred) {
      // Under deferral a step's phases are its enqueueing; a flush waits for the device. The
      // first step is flushed at once, so that the timed part starts after its work.
      deferred_steps.Add(records.size() - 1, report);
      if (was_first || (step + 1) % steps_per_epoch == 0 || deferred_steps.Due(report.end)) {
        DPTRAIN_RETURN_IF_ERROR(deferred_steps.Flush(records, deliver));
        if (was_first) timed_start = absl::Now();
      }
    } else {
      deliver(report);
    }
    ++step;
    if (step % steps_per_epoch != 0) {
      if (auto s = AfterStep(o, step, model); !s.ok()) return s;
      continue;
    }

    // The end of an epoch.
    EpochMetrics m;
    m.epoch = epoch + 1;
    double loss_sum = 0, weight_sum = 0;
    int64_t correct = 0, seen = 0;
    for (const StepRecord& r : records) {
      loss_sum += r.loss_sum;
      weight_sum += r.loss_weight;
      correct += r.correct;
      seen += r.seen;
      m.skipped_steps += r.skipped ? 1 : 0;
      m.data_seconds += r.data_seconds;
      m.step_seconds += r.step_seconds;
    }
    double train_seconds = absl::ToDoubleSeconds(absl::Now() - timed_start);
    int64_t timed_images = seen - untimed_images;
    if (timed_images <= 0) {  // The epoch was the first step alone.
      train_seconds = absl::ToDoubleSeconds(absl::Now() - epoch_start);
      timed_images = seen;
    }
    // Batch-norm running statistics drift apart per worker during the epoch (each sees its
    // own batches); averaging them makes every replica evaluate and save the same model.
    if (!model.buffer_values().empty()) {
      if (auto s = sync.AverageBuffers(epoch, absl::MakeSpan(model.buffer_values())); !s.ok()) {
        return s;
      }
    }
    m.steps = static_cast<int64_t>(records.size());
    m.learning_rate = o.lr_schedule.base_lr > 0 ? LearningRateAt(o.lr_schedule, step - 1) : 0;
    m.loss = weight_sum > 0 ? loss_sum / weight_sum : 0;
    m.regression = train.regression();
    m.train_acc = m.regression ? -1 : seen > 0 ? static_cast<double>(correct) / seen : 0;
    m.images = seen;
    m.train_seconds = train_seconds;
    m.images_per_s = train_seconds > 0 ? timed_images / train_seconds : 0;
    m.test_acc = -1;
    if (o.evaluate && test != nullptr) {
      DPTRAIN_ASSIGN_OR_RETURN(const Evaluation evaluation,
                               EvaluateModel(model, *test, o.eval_batch_size));
      m.test_acc = evaluation.accuracy;
      m.test_loss = evaluation.loss;
    }
    m.seconds = absl::ToDoubleSeconds(absl::Now() - epoch_start);
    m.comm = sync.stats();
    h.push_back(m);
    WriteEpochLine(o, m);
    if (o.observer != nullptr) o.observer->OnEpoch(m);
    if (auto s = AfterStep(o, step, model); !s.ok()) return s;
  }
  WriteFinalLine(o, h, absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

}  // namespace dptrain
