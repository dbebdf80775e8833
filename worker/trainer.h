// The training loop of one worker: its shard of every epoch, forward/backward on its model,
// the gradient through the step contract (worker/comm/step_sync.h), evaluation on the test set
// after each epoch.
#ifndef DPTRAIN_WORKER_TRAINER_H_
#define DPTRAIN_WORKER_TRAINER_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/lr_schedule.h"
#include "worker/comm/step_sync.h"
#include "worker/data/dataset.h"
#include "worker/data/transforms.h"
#include "worker/held_batches.h"
#include "worker/nn/model.h"

namespace dptrain {

struct EpochMetrics;

// One training step as the trainer saw it: its phases back to back, [start, data_end) the
// batch gather, [data_end, compute_end) forward + backward, [compute_end, sync_end) the
// synchronisation (push/pull or all-reduce, waiting for the others included),
// [sync_end, end) the optimizer's update in this process (none in ps mode).
struct StepReport {
  int64_t step = 0;
  int epoch = 0;  // 0-based.
  int images = 0;
  double loss = 0;
  int64_t correct = 0;
  bool regression = false;  // Target values: `correct` means nothing.
  bool skipped = false;
  float learning_rate = 0;                             // 0 if unknown (ps mode without --lr).
  double forward_seconds = -1, backward_seconds = -1;  // Of compute, if the model measured.
  float loss_scale = 1;                                // Of the next step (mixed precision).
  int64_t device_memory_bytes = -1;  // The model's device memory in use (-1: none).
  absl::Time start, data_end, compute_end, sync_end, end;
  CommStats comm;  // Cumulative.
};

// Told about every step and epoch (metrics, traces); called on the training thread.
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void OnStep(const StepReport& step) = 0;
  virtual void OnEpoch(const EpochMetrics& epoch) = 0;
};

// Told, on every rank, when a step is complete: after the step's update or, for the last step
// of an epoch, after the epoch's end (batch-norm averaging, evaluation). For checkpoints
// (gpu_worker --save_dir in all-reduce mode); called on the training thread.
class StepCheckpointer {
 public:
  virtual ~StepCheckpointer() = default;
  // `next_step`: the step to compute next (steps [0, next_step) are done). An error stops
  // training with it.
  virtual absl::Status AfterStep(int64_t next_step, nn::Model& model) = 0;
};

struct TrainerOptions {
  int rank = 0;
  int world_size = 1;
  int batch_size = 256;  // Per worker.
  int epochs = 1;
  uint64_t seed = 0;                // Shuffling; the same on every rank.
  int64_t max_steps_per_epoch = 0;  // > 0: stop each epoch early (tests, smoke runs).
  bool evaluate = true;             // Test accuracy after each epoch.
  int eval_batch_size = 500;
  std::ostream* progress = nullptr;  // One human-readable line per epoch, if set.
  std::ostream* metrics = nullptr;   // One JSON line per epoch and a final one, if set.
  // A progress line on `progress` at most this often within an epoch: step / steps, images/s,
  // the phase split and an ETA. Zero: none.
  absl::Duration log_every = absl::Seconds(10);
  StepObserver* observer = nullptr;          // Not owned; may be null.
  StepCheckpointer* checkpointer = nullptr;  // Not owned; may be null.
  // The learning rate of each step (a pure function of it): what the model's ApplyUpdate
  // gets through a reducer, and what the metrics report (a parameter store computes the
  // same itself). base_lr <= 0: unknown here (ps mode without --lr), not reported.
  LrScheduleOptions lr_schedule;
  // Training-time augmentation of each gathered batch (random crop, flip), a pure function of
  // (seed, epoch, sample index): worker/data/transforms.h. Disabled by default.
  AugmentOptions augment;
  // Whether the training set goes to the model's device once and each step sends only its
  // samples' indices and augmentation choices (held_batches.h); off by default.
  DataOnDevice data_on_device = DataOnDevice::kOff;
};

struct EpochMetrics {
  int epoch = 0;  // 1-based.
  int64_t steps = 0;
  // Steps that no replica applied because some worker's gradient overflowed (mixed
  // precision), or had inf/NaN.
  int64_t skipped_steps = 0;
  double loss = 0;           // Mean training loss over this worker's batches.
  // Regression (target values): no accuracies (-1); the losses are the scores.
  bool regression = false;
  double train_acc = 0;      // On this worker's shard, with the weights of each step.
  double test_acc = 0;       // On the whole test set after the epoch (-1 if not evaluated).
  double test_loss = -1;     // The mean loss on the whole test set (-1 if not evaluated).
  double learning_rate = 0;  // Of the epoch's last step (0 if unknown).
  int64_t images = 0;        // Training images this worker processed.
  // Time of the training steps (no evaluation), and images / that time; both from the end of
  // the process's first step, which waits for every worker to join, in its epoch (unless it
  // was that epoch's only step), so that every rank measures alike.
  double train_seconds = 0;
  double images_per_s = 0;
  double seconds = 0;  // Whole epoch including evaluation.
  // Of this epoch's steps (as kept after any rewind): the time spent getting their batches
  // (gather, reading or decoding a streamed set, augmentation), and their whole time.
  double data_seconds = 0;
  double step_seconds = 0;
  CommStats comm;      // Cumulative.
};

// Runs `options.epochs` epochs. The sync's Start is called first so all replicas begin
// equal. Each step: model.TrainStep, then
//   - through a GradientReducer: Reduce(model.gradient_exchange()) and, unless the step is
//     skipped, model.ApplyUpdate(the schedule's rate of the step); a lone replica (world size 1)
//     exchanges nothing, its own overflow flag decides, and a GPU model's gradient never leaves the
//     device;
//   - through a ParameterStore: PushPull(model.gradient_exchange()) into model.weights().
// Then model.RecordStepOutcome with the global decision. Returns the first error of the
// model, the sync or the data; `history` (if not null) receives one entry per epoch. Images of
// another shape than model.input_dims() are InvalidArgument before Start (nothing is sent).
absl::Status Train(const TrainerOptions& options, nn::Model& model, StepSync sync,
                   const Dataset& train, const Dataset* test, std::vector<EpochMetrics>* history);

// A model's scores on a data set (forward only, evaluation mode).
struct Evaluation {
  double accuracy = 0;  // -1 for a regression set (target values, no classes).
  double loss = 0;      // The mean loss over the set.
};
// Evaluates `model` on `data`, or an error (InvalidArgument for images of another shape than the
// model's input, or target values per sample other than its outputs).
absl::StatusOr<Evaluation> EvaluateModel(nn::Model& model, const Dataset& data, int batch_size);

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_TRAINER_H_
