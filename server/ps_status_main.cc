// ps_status: one line per shard of a running job (GetShardInfo): its version, each rank's
// newest step, the slowest rank, staleness, optimizer and rate, the newest checkpoint; then
// a line per sparse embedding table the shard holds (its step, rows held, pulled, pushed).
// With --json, the same as JSON lines (the document /status serves on a metrics port).
// Exit status: 0 if every shard answered, 1 otherwise, 2 for bad usage. A server with TLS
// and a job token wants the same security flags as the workers.
//
//   ps_status --ps=127.0.0.1:50051,127.0.0.1:50052
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/net.h"
#include "common/security_flags.h"
#include "grpcpp/client_context.h"
#include "proto/ps.grpc.pb.h"
#include "server/shard_status.h"

ABSL_FLAG(std::string, ps, "", "Comma-separated host:port of every shard, in shard order.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(3), "Deadline of each shard's answer.");
ABSL_FLAG(bool, json, false, "Print each shard's status as one JSON object per line.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Prints the status of every shard of a dptrain job.");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::cerr << "ps_status: unexpected argument '" << rest[1] << "' (flags are --name=value)\n";
    return 2;
  }
  const std::vector<std::string> addresses =
      absl::StrSplit(absl::GetFlag(FLAGS_ps), ',', absl::SkipWhitespace());
  const absl::Duration timeout = absl::GetFlag(FLAGS_timeout);
  if (addresses.empty() || timeout <= absl::ZeroDuration()) {
    std::cerr << "ps_status: need --ps=host:port[,host:port...] and a positive --timeout\n";
    return 2;
  }
  auto credentials = dptrain::CredentialsFromFlags();
  if (!credentials.ok()) {
    std::cerr << "ps_status: " << credentials.status().message() << "\n";
    return 2;
  }
  int failed = 0;
  for (const std::string& address : addresses) {
    const auto channel = dptrain::MakeChannel(address, **credentials);
    auto stub = dptrain::proto::ParameterServer::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    dptrain::proto::ShardInfoResponse info;
    const grpc::Status status = stub->GetShardInfo(&context, {}, &info);
    if (!status.ok()) {
      std::cout << address << ": no answer (" << status.error_message() << ")" << std::endl;
      ++failed;
      continue;
    }
    // The sparse tables, on the same channel. A server older than them answers
    // UNIMPLEMENTED: it holds none. Any other failure is reported and counts as no answer.
    auto sparse_stub = dptrain::proto::SparseTables::NewStub(channel);
    grpc::ClientContext sparse_context;
    sparse_context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    dptrain::proto::SparseStatusResponse tables;
    const grpc::Status sparse = sparse_stub->Status(&sparse_context, {}, &tables);
    if (!sparse.ok() && sparse.error_code() != grpc::StatusCode::UNIMPLEMENTED) {
      std::cout << address << ": no answer about its sparse tables (" << sparse.error_message()
                << ")" << std::endl;
      ++failed;
    }
    if (absl::GetFlag(FLAGS_json)) {
      std::string line = dptrain::ShardInfoJson(info);
      line.pop_back();  // The object's closing brace: the tables join it.
      std::cout << line << ",\"sparse_tables\":" << dptrain::SparseTablesJson(tables) << "}"
                << std::endl;
      continue;
    }
    std::cout << address << "  " << dptrain::ShardStatusLine(info) << std::endl;
    for (const auto& table : tables.tables()) {
      std::cout << dptrain::SparseTableLine(table) << std::endl;
    }
  }
  return failed == 0 ? 0 : 1;
}
