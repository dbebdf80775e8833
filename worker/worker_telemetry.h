// A worker's Prometheus metrics and step trace, fed by the trainer (a StepObserver).
//
// Metrics (see README "Watching a job"):
//   dptrain_worker_steps_total, dptrain_worker_images_total, dptrain_worker_skipped_steps_total
//   dptrain_worker_step_phase_seconds{phase="data|compute|sync|apply"}
//   dptrain_worker_loss, dptrain_worker_train_accuracy (the last step's batch),
//   dptrain_worker_test_accuracy, dptrain_worker_test_loss, dptrain_worker_epoch (the last
//   epoch's),
//   dptrain_worker_learning_rate, dptrain_worker_pushed_bytes_total,
//   dptrain_worker_pulled_bytes_total, dptrain_worker_loss_scale, and on a GPU
//   dptrain_worker_gpu_memory_bytes (what the model's caching allocator handed out)
// Trace track "step": data, forward, backward (or forward+backward where the model does not
// split them), sync, apply.
#ifndef DPTRAIN_WORKER_WORKER_TELEMETRY_H_
#define DPTRAIN_WORKER_WORKER_TELEMETRY_H_

#include "common/metrics.h"
#include "common/trace.h"
#include "worker/trainer.h"

namespace dptrain {

class WorkerTelemetry final : public StepObserver {
 public:
  // Either may be null (nothing recorded there); both must outlive this.
  WorkerTelemetry(MetricsRegistry* registry, TraceRecorder* trace);

  void OnStep(const StepReport& step) override;
  void OnEpoch(const EpochMetrics& epoch) override;

 private:
  TraceRecorder* const trace_;
  Counter* steps_ = nullptr;
  Counter* images_ = nullptr;
  Counter* skipped_ = nullptr;
  Counter* pushed_ = nullptr;
  Counter* pulled_ = nullptr;
  Histogram* data_ = nullptr;
  Histogram* compute_ = nullptr;
  Histogram* sync_ = nullptr;
  Histogram* apply_ = nullptr;
  Gauge* loss_ = nullptr;
  Gauge* train_accuracy_ = nullptr;
  Gauge* test_accuracy_ = nullptr;
  Gauge* test_loss_ = nullptr;
  Gauge* epoch_ = nullptr;
  Gauge* learning_rate_ = nullptr;
  Gauge* loss_scale_ = nullptr;
  MetricsRegistry* const registry_;
  Gauge* gpu_memory_ = nullptr;  // Registered at the first step that reports device memory.
  CommStats last_comm_;  // The cumulative counts already added to pushed_/pulled_.
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_WORKER_TELEMETRY_H_
