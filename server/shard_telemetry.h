// A shard's metrics and step trace: the ShardObserver the shard reports to, plus the counts
// the gRPC services make (requests by method and result code).
//
// Metrics (registered in the binary's MetricsRegistry; see README "Watching a job"):
//   dptrain_ps_requests_total{method,code}       calls answered, by gRPC code
//   dptrain_ps_step_seconds                      first push of a step to its completion (BSP)
//   dptrain_ps_staleness_steps                   staleness of each counted push
//   dptrain_ps_gradient_sum_seconds, dptrain_ps_optimizer_apply_seconds   per chunk
//   dptrain_ps_wait_seconds                      a worker's wait for the others, per chunk
// and, read at scrape time by PsServer: version, workers waited for, active streams, bytes.
// Trace tracks: "steps" (first push to completion), "optimizer" (sum, apply per chunk),
// and one per rank (wait, send per chunk).
#ifndef DPTRAIN_SERVER_SHARD_TELEMETRY_H_
#define DPTRAIN_SERVER_SHARD_TELEMETRY_H_

#include <atomic>
#include <string>

#include "common/metrics.h"
#include "common/trace.h"
#include "grpcpp/support/status.h"
#include "server/shard_observer.h"

namespace dptrain {

class ShardTelemetry final : public ShardObserver {
 public:
  // Either may be null (nothing recorded there); both must outlive this.
  ShardTelemetry(MetricsRegistry* registry, TraceRecorder* trace, int num_workers);

  // A gRPC call of `method` (e.g. "push_pull") ended with `status`. Also writes the trace
  // once its last step completed (the observer calls run under the shard's lock).
  void CountRequest(const char* method, const grpc::Status& status);

  void OnPush(int64_t staleness) override;
  void OnApply(int64_t step, absl::Time sum_start, absl::Time apply_start,
               absl::Time end) override;
  void OnStepComplete(int64_t step, absl::Time first_push, absl::Time end) override;
  void OnWait(int rank, int64_t step, absl::Time start, absl::Time end) override;
  void OnSend(int rank, int64_t step, absl::Time start, absl::Time end) override;

 private:
  TraceRecorder* const trace_;
  std::atomic<bool> flush_due_{false};  // The last traced step completed; not written yet.
  MetricFamily<Counter>* requests_ = nullptr;
  Histogram* step_seconds_ = nullptr;
  Histogram* staleness_ = nullptr;
  Histogram* sum_seconds_ = nullptr;
  Histogram* apply_seconds_ = nullptr;
  Histogram* wait_seconds_ = nullptr;
};

// "OK", "DEADLINE_EXCEEDED", ...: the label of a gRPC code.
const char* GrpcCodeName(grpc::StatusCode code);

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_SHARD_TELEMETRY_H_
