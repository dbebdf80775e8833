// Measures what over-limit gRPC messages cost a ps_server: sends --repeats unary PushPull
// requests of --megabytes MiB each (more than the server accepts) and prints the server's
// VmRSS (from /proc/<--server_pid>/status) before and after each. A measurement, not a test.
//   bazel-bin/server/ps_server --port_file=/tmp/p & \
//   bazel-bin/tests/bench/oversize_probe --address=127.0.0.1:$(cat /tmp/p) --server_pid=$!
#include <fstream>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "proto/ps.grpc.pb.h"

ABSL_FLAG(std::string, address, "127.0.0.1:0", "The ps_server to probe.");
ABSL_FLAG(int, server_pid, 0, "Its process id, to read its VmRSS.");
ABSL_FLAG(int, megabytes, 1100, "Size of each request's chunk, MiB.");
ABSL_FLAG(int, repeats, 3, "Requests to send.");
ABSL_FLAG(absl::Duration, settle, absl::ZeroDuration(),
          "Wait this long after each request before reading VmRSS.");

namespace {

std::string VmRss(int pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return line.substr(6);
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int pid = absl::GetFlag(FLAGS_server_pid);
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(absl::GetFlag(FLAGS_address),
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = dptrain::proto::ParameterServer::NewStub(channel);
  dptrain::proto::PushPullRequest request;
  request.mutable_caller()->set_job_id("probe");
  dptrain::proto::Chunk* chunk = request.add_chunks();
  chunk->set_dtype(dptrain::proto::FP32);
  chunk->mutable_data()->assign(static_cast<size_t>(absl::GetFlag(FLAGS_megabytes)) << 20, 'x');
  std::cout << "server VmRSS before:" << VmRss(pid) << std::endl;
  for (int i = 0; i < absl::GetFlag(FLAGS_repeats); ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    dptrain::proto::PullResponse response;
    grpc::Status s = stub->PushPull(&context, request, &response);
    absl::SleepFor(absl::GetFlag(FLAGS_settle));
    std::cout << "request " << i << " (" << absl::GetFlag(FLAGS_megabytes)
              << " MiB): " << s.error_code() << " " << s.error_message().substr(0, 80)
              << "; server VmRSS after:" << VmRss(pid) << std::endl;
  }
  return 0;
}
