#include "server/shard_telemetry.h"

#include "absl/strings/str_cat.h"

namespace dptrain {

const char* GrpcCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "UNKNOWN";
  }
}

ShardTelemetry::ShardTelemetry(MetricsRegistry* registry, TraceRecorder* trace, int num_workers)
    : trace_(trace) {
  if (registry != nullptr) {
    requests_ = &registry->AddCounter("dptrain_ps_requests_total",
                                      "Calls this shard answered, by method and gRPC code.",
                                      {"method", "code"});
    step_seconds_ = &registry
                         ->AddHistogram("dptrain_ps_step_seconds",
                                        "From a step's first push to its completion on every "
                                        "chunk of this shard (BSP).",
                                        LatencyBuckets())
                         .Get();
    staleness_ = &registry
                      ->AddHistogram("dptrain_ps_staleness_steps",
                                     "Other pushes applied to a chunk since the pushing worker "
                                     "last pulled it (0 under BSP).",
                                     StepBuckets())
                      .Get();
    sum_seconds_ = &registry
                        ->AddHistogram("dptrain_ps_gradient_sum_seconds",
                                       "Averaging the workers' gradients of one chunk.",
                                       LatencyBuckets())
                        .Get();
    apply_seconds_ = &registry
                          ->AddHistogram("dptrain_ps_optimizer_apply_seconds",
                                         "The optimizer's update of one chunk.", LatencyBuckets())
                          .Get();
    wait_seconds_ = &registry
                         ->AddHistogram("dptrain_ps_wait_seconds",
                                        "A worker's wait for the others (or the staleness bound) "
                                        "after pushing a chunk.",
                                        LatencyBuckets())
                         .Get();
  }
  if (trace_ != nullptr) {
    trace_->NameTrack(0, "steps");
    trace_->NameTrack(1, "optimizer");
    for (int r = 0; r < num_workers; ++r) trace_->NameTrack(2 + r, absl::StrCat("rank ", r));
  }
}

void ShardTelemetry::CountRequest(const char* method, const grpc::Status& status) {
  if (requests_ != nullptr) {
    requests_->WithLabels({method, GrpcCodeName(status.error_code())}).Increment();
  }
  // The trace file is written here, outside the shard's lock, once its last step completed.
  if (flush_due_.exchange(false)) trace_->Flush().IgnoreError();  // Flushed again at exit.
}

void ShardTelemetry::OnPush(int64_t staleness) {
  if (staleness_ != nullptr) staleness_->Observe(static_cast<double>(staleness));
}

void ShardTelemetry::OnApply(int64_t step, absl::Time sum_start, absl::Time apply_start,
                             absl::Time end) {
  if (sum_seconds_ != nullptr) {
    sum_seconds_->ObserveDuration(apply_start - sum_start);
    apply_seconds_->ObserveDuration(end - apply_start);
  }
  if (trace_ != nullptr) {
    trace_->Span(1, "sum", step, sum_start, apply_start);
    trace_->Span(1, "apply", step, apply_start, end);
  }
}

void ShardTelemetry::OnStepComplete(int64_t step, absl::Time first_push, absl::Time end) {
  if (step_seconds_ != nullptr) step_seconds_->ObserveDuration(end - first_push);
  if (trace_ != nullptr) {
    trace_->Span(0, absl::StrCat("step ", step), step, first_push, end);
    // Not MarkStepDone: that writes the file, and this runs under the shard's lock.
    if (step == trace_->max_steps() - 1) flush_due_ = true;
  }
}

void ShardTelemetry::OnWait(int rank, int64_t step, absl::Time start, absl::Time end) {
  if (wait_seconds_ != nullptr) wait_seconds_->ObserveDuration(end - start);
  if (trace_ != nullptr) trace_->Span(2 + rank, "wait for ranks", step, start, end);
}

void ShardTelemetry::OnSend(int rank, int64_t step, absl::Time start, absl::Time end) {
  if (trace_ != nullptr) trace_->Span(2 + rank, "send", step, start, end);
}

}  // namespace dptrain
