#include "common/telemetry_flags.h"

#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/net.h"

ABSL_FLAG(int, metrics_port, -1,
          "Serve Prometheus metrics at http://HOST:PORT/metrics (and a JSON status at /status); "
          "0 picks a free port (printed, see --metrics_port_file); -1: off.");
ABSL_FLAG(std::string, metrics_port_file, "", "If set, the metrics port is written to this file.");
ABSL_FLAG(std::string, metrics_bind_address, "",
          "Where --metrics_port listens (plain HTTP). Default: 127.0.0.1 for a process with "
          "--tls_cert (a secured job: its status and counters stay off the network), 0.0.0.0 "
          "otherwise. Set 0.0.0.0 for a scraper on another host, and restrict the port "
          "(deploy/k8s: a NetworkPolicy).");
ABSL_FLAG(std::string, trace_out, "",
          "If set, a Chrome trace (JSON; Perfetto, chrome://tracing) of the first --trace_steps "
          "steps is written to this file.");
ABSL_FLAG(int64_t, trace_steps, 20, "Steps recorded in --trace_out.");

namespace dptrain {

absl::StatusOr<std::unique_ptr<Telemetry>> TelemetryFromFlags(const std::string& process) {
  auto telemetry = std::make_unique<Telemetry>();
  const int port = absl::GetFlag(FLAGS_metrics_port);
  if (port < -1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_port must be -1 (off) or in [0, 65535], got ", port));
  }
  if (port < 0 && !absl::GetFlag(FLAGS_metrics_port_file).empty()) {
    return absl::InvalidArgumentError("--metrics_port_file needs --metrics_port");
  }
  const std::string trace_out = absl::GetFlag(FLAGS_trace_out);
  if (!trace_out.empty()) {
    auto trace = TraceRecorder::Create(trace_out, absl::GetFlag(FLAGS_trace_steps), process);
    if (!trace.ok()) {
      return absl::Status(trace.status().code(),
                          absl::StrCat("--trace_out/--trace_steps: ", trace.status().message()));
    }
    telemetry->trace = *std::move(trace);
  }
  return telemetry;
}

absl::Status ServeMetrics(Telemetry& telemetry, const std::string& who, bool secured,
                          std::function<std::string()> status) {
  const int port = absl::GetFlag(FLAGS_metrics_port);
  if (port < 0) return absl::OkStatus();
  MetricsHttpOptions options;
  options.port = port;
  options.registry = &telemetry.registry;
  options.status = std::move(status);
  options.bind_address = absl::GetFlag(FLAGS_metrics_bind_address);
  if (options.bind_address.empty()) options.bind_address = secured ? "127.0.0.1" : "0.0.0.0";
  if (secured && options.bind_address != "127.0.0.1" && options.bind_address != "localhost") {
    std::cerr << who << ": warning: --metrics_bind_address=" << options.bind_address
              << " serves this secured job's /metrics and /status (job id included) over plain "
                 "HTTP to whoever reaches the port: restrict it (deploy/k8s: a NetworkPolicy)"
              << std::endl;
  }
  auto http = MetricsHttpServer::Start(options);
  if (!http.ok()) {
    return absl::Status(http.status().code(),
                        absl::StrCat("--metrics_port: ", http.status().message()));
  }
  telemetry.http = *std::move(http);
  std::cout << who << ": metrics on port " << telemetry.http->port() << " (" << options.bind_address
            << ")" << std::endl;
  const std::string path = absl::GetFlag(FLAGS_metrics_port_file);
  return path.empty() ? absl::OkStatus() : WritePortFile(path, telemetry.http->port());
}

}  // namespace dptrain
