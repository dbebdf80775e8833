// health_probe: asks a dptrain server (ps_server) for its grpc.health.v1.Health status, for
// docker-compose healthchecks and Kubernetes exec probes (Kubernetes >= 1.24 can also probe
// gRPC natively, but not over mutual TLS). Exit status: 0 iff the server answers SERVING, 1
// otherwise, 2 for bad usage. A server with TLS and a job token wants the same security
// flags as the process it probes (--tls_cert, --tls_key, --tls_ca, --job_token_file).
//
//   health_probe --addr=127.0.0.1:50051 --timeout=2s
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/time/time.h"
#include "common/health_client.h"
#include "common/security_flags.h"

ABSL_FLAG(std::string, addr, "127.0.0.1:50051", "host:port of the server to probe.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(2), "Deadline of the health call, e.g. 2s.");

namespace {

const char* StatusName(dptrain::ServingStatus s) {
  switch (s) {
    case dptrain::ServingStatus::kServing:
      return "SERVING";
    case dptrain::ServingStatus::kNotServing:
      return "NOT_SERVING";
    case dptrain::ServingStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
    case dptrain::ServingStatus::kUnknown:
      break;
  }
  return "UNKNOWN";
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Exits 0 iff the gRPC server at --addr reports SERVING (grpc.health.v1.Health/Check).");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::cerr << "health_probe: unexpected argument '" << rest[1] << "' (flags are --name=value)\n";
    return 2;
  }
  const std::string addr = absl::GetFlag(FLAGS_addr);
  const absl::Duration timeout = absl::GetFlag(FLAGS_timeout);
  if (addr.empty() || timeout <= absl::ZeroDuration()) {
    std::cerr << "health_probe: need --addr=host:port and a positive --timeout\n";
    return 2;
  }
  auto credentials = dptrain::CredentialsFromFlags();
  if (!credentials.ok()) {
    std::cerr << "health_probe: " << credentials.status().message() << "\n";
    return 2;
  }
  auto status = dptrain::CheckHealth(addr, timeout, **credentials);
  if (!status.ok()) {
    std::cerr << "health_probe: " << status.status().message() << "\n";
    return 1;
  }
  std::cout << "health_probe: " << addr << ": " << StatusName(*status) << "\n";
  return *status == dptrain::ServingStatus::kServing ? 0 : 1;
}
