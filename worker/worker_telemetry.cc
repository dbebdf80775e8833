#include "worker/worker_telemetry.h"

namespace dptrain {

WorkerTelemetry::WorkerTelemetry(MetricsRegistry* registry, TraceRecorder* trace)
    : trace_(trace), registry_(registry) {
  if (registry != nullptr) {
    steps_ = &registry->AddCounter("dptrain_worker_steps_total", "Training steps taken.").Get();
    images_ = &registry->AddCounter("dptrain_worker_images_total", "Training images processed.")
                   .Get();
    skipped_ = &registry
                    ->AddCounter("dptrain_worker_skipped_steps_total",
                                 "Steps no replica applied (an inf/NaN gradient somewhere).")
                    .Get();
    pushed_ = &registry->AddCounter("dptrain_worker_pushed_bytes_total",
                                    "Message bytes this worker sent to synchronise.")
                   .Get();
    pulled_ = &registry->AddCounter("dptrain_worker_pulled_bytes_total",
                                    "Message bytes this worker received to synchronise.")
                   .Get();
    auto& phases = registry->AddHistogram(
        "dptrain_worker_step_phase_seconds",
        "Time of each phase of a step: data (batch gather), compute (forward + backward), sync "
        "(push/pull or all-reduce, waiting included), apply (this process's optimizer).",
        LatencyBuckets(), {"phase"});
    data_ = &phases.WithLabels({"data"});
    compute_ = &phases.WithLabels({"compute"});
    sync_ = &phases.WithLabels({"sync"});
    apply_ = &phases.WithLabels({"apply"});
    loss_ = &registry->AddGauge("dptrain_worker_loss", "The last step's mean batch loss.").Get();
    train_accuracy_ =
        &registry->AddGauge("dptrain_worker_train_accuracy", "The last step's batch accuracy.")
             .Get();
    test_accuracy_ = &registry
                          ->AddGauge("dptrain_worker_test_accuracy",
                                     "Test accuracy after the last epoch (-1 if not evaluated).")
                          .Get();
    test_loss_ = &registry
                      ->AddGauge("dptrain_worker_test_loss",
                                 "The mean test loss after the last epoch (-1 if not evaluated): "
                                 "a regression's score.")
                      .Get();
    epoch_ = &registry->AddGauge("dptrain_worker_epoch", "Epochs completed.").Get();
    learning_rate_ = &registry
                          ->AddGauge("dptrain_worker_learning_rate",
                                     "The last step's learning rate (0 if the servers apply it "
                                     "and this worker has no --lr).")
                          .Get();
    loss_scale_ = &registry
                       ->AddGauge("dptrain_worker_loss_scale",
                                  "The loss scale of the next step (1 without mixed precision).")
                       .Get();
    test_accuracy_->Set(-1);
    test_loss_->Set(-1);
  }
  if (trace_ != nullptr) trace_->NameTrack(0, "step");
}

void WorkerTelemetry::OnStep(const StepReport& r) {
  if (steps_ != nullptr) {
    steps_->Increment();
    images_->Increment(r.images);
    if (r.skipped) skipped_->Increment();
    pushed_->Increment(static_cast<double>(r.comm.bytes_pushed - last_comm_.bytes_pushed));
    pulled_->Increment(static_cast<double>(r.comm.bytes_pulled - last_comm_.bytes_pulled));
    last_comm_ = r.comm;
    data_->ObserveDuration(r.data_end - r.start);
    compute_->ObserveDuration(r.compute_end - r.data_end);
    sync_->ObserveDuration(r.sync_end - r.compute_end);
    apply_->ObserveDuration(r.end - r.sync_end);
    loss_->Set(r.loss);
    train_accuracy_->Set(r.regression   ? -1
                         : r.images > 0 ? static_cast<double>(r.correct) / r.images
                                        : 0);
    learning_rate_->Set(r.learning_rate);
    loss_scale_->Set(r.loss_scale);
    if (r.device_memory_bytes >= 0) {
      if (gpu_memory_ == nullptr) {
        gpu_memory_ = &registry_
                           ->AddGauge("dptrain_worker_gpu_memory_bytes",
                                      "Device memory the model's allocator handed out.")
                           .Get();
      }
      gpu_memory_->Set(static_cast<double>(r.device_memory_bytes));
    }
  }
  if (trace_ != nullptr && trace_->Recording(r.step)) {
    trace_->Span(0, "data", r.step, r.start, r.data_end);
    if (r.forward_seconds >= 0 && r.backward_seconds >= 0) {
      const absl::Time forward_end = r.data_end + absl::Seconds(r.forward_seconds);
      trace_->Span(0, "forward", r.step, r.data_end, forward_end);
      trace_->Span(0, "backward", r.step, forward_end, r.compute_end);
    } else {
      trace_->Span(0, "forward+backward", r.step, r.data_end, r.compute_end);
    }
    trace_->Span(0, "sync", r.step, r.compute_end, r.sync_end);
    trace_->Span(0, "apply", r.step, r.sync_end, r.end);
    trace_->MarkStepDone(r.step);
  }
}

void WorkerTelemetry::OnEpoch(const EpochMetrics& m) {
  if (epoch_ == nullptr) return;
  epoch_->Set(m.epoch);
  test_accuracy_->Set(m.test_acc);
  test_loss_->Set(m.test_loss);
}

}  // namespace dptrain
