// Measures what over-limit gRPC messages cost a ps_server: sends --repeats times
// --concurrent unary PushPull requests of --megabytes MiB each at once (more than the server
// accepts; each on a connection of its own) and prints the server's VmRSS and peak VmHWM
// (from /proc/<--server_pid>/status) before and after each. A measurement, not a test.
//   bazel-bin/server/ps_server --port_file=/tmp/p & \
//   bazel-bin/tests/bench/oversize_probe --address=127.0.0.1:$(cat /tmp/p) --server_pid=$!
// Many at once against gRPC's memory quota (ps_server --max_receive_memory; -1: none):
//   bazel-bin/server/ps_server --port_file=/tmp/p --max_model_bytes=8388608 \
//     --max_receive_memory=-1 & \
//   bazel-bin/tests/bench/oversize_probe --address=127.0.0.1:$(cat /tmp/p) --server_pid=$! \
//     --megabytes=64 --concurrent=16 --repeats=1
#include <algorithm>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

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
ABSL_FLAG(int, repeats, 3, "Rounds of requests to send.");
ABSL_FLAG(int, concurrent, 1, "Requests sent at once in each round.");
ABSL_FLAG(absl::Duration, settle, absl::ZeroDuration(),
          "Wait this long after each request before reading VmRSS.");

namespace {

// A field of /proc/<pid>/status ("VmRSS", "VmHWM"), as written there.
std::string Status(int pid, const std::string& field) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return line.substr(field.size() + 1);
  }
  return "?";
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int pid = absl::GetFlag(FLAGS_server_pid);
  const int concurrent = std::max(1, absl::GetFlag(FLAGS_concurrent));
  std::vector<std::unique_ptr<dptrain::proto::ParameterServer::Stub>> stubs;
  for (int c = 0; c < concurrent; ++c) {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // A connection of its own.
    stubs.push_back(dptrain::proto::ParameterServer::NewStub(grpc::CreateCustomChannel(
        absl::GetFlag(FLAGS_address), grpc::InsecureChannelCredentials(), args)));
  }
  dptrain::proto::PushPullRequest request;
  request.mutable_caller()->set_job_id("probe");
  dptrain::proto::Chunk* chunk = request.add_chunks();
  chunk->set_dtype(dptrain::proto::FP32);
  chunk->mutable_data()->assign(static_cast<size_t>(absl::GetFlag(FLAGS_megabytes)) << 20, 'x');
  std::cout << "server VmRSS before:" << Status(pid, "VmRSS") << ", VmHWM:" << Status(pid, "VmHWM")
            << std::endl;
  for (int i = 0; i < absl::GetFlag(FLAGS_repeats); ++i) {
    std::vector<grpc::Status> statuses(concurrent);
    std::vector<std::thread> senders;
    for (int c = 0; c < concurrent; ++c) {
      senders.emplace_back([&, c] {
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
        dptrain::proto::PullResponse response;
        statuses[c] = stubs[c]->PushPull(&context, request, &response);
      });
    }
    for (std::thread& t : senders) t.join();
    absl::SleepFor(absl::GetFlag(FLAGS_settle));
    std::cout << "round " << i << " (" << concurrent << " x " << absl::GetFlag(FLAGS_megabytes)
              << " MiB):";
    for (const grpc::Status& s : statuses) {
      std::cout << " " << s.error_code() << " (" << s.error_message().substr(0, 40) << ")";
    }
    std::cout << "; server VmRSS after:" << Status(pid, "VmRSS")
              << ", VmHWM:" << Status(pid, "VmHWM") << std::endl;
  }
  return 0;
}
