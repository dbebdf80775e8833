// In-process parameter-server shards on port 0, for tests that need real gRPC.
#ifndef DPTRAIN_TESTS_TEST_CLUSTER_H_
#define DPTRAIN_TESTS_TEST_CLUSTER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "proto/ps.grpc.pb.h"
#include "server/ps_server.h"

namespace dptrain {

struct TestShards {
  std::vector<std::unique_ptr<PsServer>> servers;
  std::vector<std::string> addresses;
};

inline TestShards StartShards(int num_shards, int num_workers, OptimizerOptions optimizer,
                              absl::Duration step_timeout = absl::Seconds(30),
                              std::optional<LrScheduleOptions> lr_schedule = std::nullopt) {
  TestShards shards;
  for (int s = 0; s < num_shards; ++s) {
    PsServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.shard.shard = s;
    o.shard.num_shards = num_shards;
    o.shard.num_workers = num_workers;
    o.shard.optimizer = optimizer;
    o.shard.lr_schedule = lr_schedule;
    o.shard.step_timeout = step_timeout;
    auto server = PsServer::Start(o);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) continue;
    shards.addresses.push_back(absl::StrCat("127.0.0.1:", (*server)->port()));
    shards.servers.push_back(*std::move(server));
  }
  return shards;
}

// The tiny model of the gRPC tests: "w" with 6 elements in chunks of <= 4 (3 + 3) and "b"
// with 2, over 2 shards: shard 0 owns (0,0) and (1,0), shard 1 owns (0,1).
template <typename Request>
void DescribeTinyModel(Request& r, int rank, const std::string& job = "job") {
  r.mutable_caller()->set_job_id(job);
  r.mutable_caller()->set_rank(rank);
  r.set_num_shards(2);
  r.set_max_chunk_elements(4);
  auto* w = r.add_tensors();
  w->set_name("w");
  w->set_num_elements(6);
  auto* b = r.add_tensors();
  b->set_name("b");
  b->set_num_elements(2);
}

// The weights a shard serves (as rank 1 of the tiny model), chunks back to back.
inline std::vector<float> PullTinyModel(proto::ParameterServer::Stub& stub) {
  proto::PullRequest r;
  DescribeTinyModel(r, 1);
  grpc::ClientContext context;
  proto::PullResponse response;
  EXPECT_TRUE(stub.Pull(&context, r, &response).ok());
  std::vector<float> out;
  for (const auto& c : response.chunks()) {
    const float* f = reinterpret_cast<const float*>(c.data().data());
    out.insert(out.end(), f, f + c.data().size() / 4);
  }
  return out;
}

}  // namespace dptrain

#endif  // DPTRAIN_TESTS_TEST_CLUSTER_H_
