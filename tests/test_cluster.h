// In-process parameter-server shards on port 0, for tests that need real gRPC.
#ifndef DPTRAIN_TESTS_TEST_CLUSTER_H_
#define DPTRAIN_TESTS_TEST_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/ps_server.h"

namespace dptrain {

struct TestShards {
  std::vector<std::unique_ptr<PsServer>> servers;
  std::vector<std::string> addresses;
};

inline TestShards StartShards(int num_shards, int num_workers, OptimizerOptions optimizer,
                              absl::Duration step_timeout = absl::Seconds(30)) {
  TestShards shards;
  for (int s = 0; s < num_shards; ++s) {
    PsServerOptions o;
    o.listen_address = "127.0.0.1:0";
    o.shard.shard = s;
    o.shard.num_shards = num_shards;
    o.shard.num_workers = num_workers;
    o.shard.optimizer = optimizer;
    o.shard.step_timeout = step_timeout;
    auto server = PsServer::Start(o);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) continue;
    shards.addresses.push_back(absl::StrCat("127.0.0.1:", (*server)->port()));
    shards.servers.push_back(*std::move(server));
  }
  return shards;
}

}  // namespace dptrain

#endif  // DPTRAIN_TESTS_TEST_CLUSTER_H_
