// The telemetry flags of ps_server and gpu_worker (--metrics_port, --metrics_port_file,
// --trace_out, --trace_steps), defined once here and read only by each binary's main, and
// what they start: a metrics registry, an optional step trace, an optional HTTP endpoint.
#ifndef DPTRAIN_COMMON_TELEMETRY_FLAGS_H_
#define DPTRAIN_COMMON_TELEMETRY_FLAGS_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/trace.h"

namespace dptrain {

struct Telemetry {
  MetricsRegistry registry;
  std::unique_ptr<TraceRecorder> trace;     // --trace_out; null without it.
  std::unique_ptr<MetricsHttpServer> http;  // After ServeMetrics; null without --metrics_port.
};

// Validates the flags and opens the trace for `process` (e.g. "ps_server shard 0"); errors
// name the flag. Call before any work, so that a bad flag stops the binary at once.
absl::StatusOr<std::unique_ptr<Telemetry>> TelemetryFromFlags(const std::string& process);

// With --metrics_port >= 0: serves /metrics (and /status from `status`, if set) over plain
// HTTP on --metrics_bind_address, prints "<who>: metrics on ADDRESS:PORT" and writes
// --metrics_port_file. Without that flag a `secured` process (mutual TLS) listens on loopback
// only: its job id and counters are not for everyone on the network (common/metrics_http.h);
// a plaintext one on every interface. A secured process told to listen beyond loopback
// warns once on stderr that the port is plain HTTP. Unavailable naming the port if it is
// taken.
absl::Status ServeMetrics(Telemetry& telemetry, const std::string& who, bool secured,
                          std::function<std::string()> status = nullptr);

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_TELEMETRY_FLAGS_H_
