// One rank of a communication measurement across real processes and hosts (the comm
// benchmark runs all ranks as threads of one process): times `--reps` synchronisations of a
// synthetic `--size_mib` fp32 gradient through the PS shards (--mode=ps) or the ring
// (--mode=allreduce), and prints one JSON line with the median time, algbw and busbw.
// Used by tests/netns_test.sh to show a shaped link behaving like a real network.
#include <algorithm>
#include <iostream>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/net.h"
#include "worker/comm/allreduce_group.h"
#include "worker/comm/allreduce_sync.h"
#include "worker/comm/ps_client.h"

ABSL_FLAG(std::string, mode, "allreduce", "ps or allreduce.");
ABSL_FLAG(int, rank, 0, "This rank.");
ABSL_FLAG(int, world_size, 1, "Number of ranks.");
ABSL_FLAG(std::string, ps, "", "ps mode: shard addresses (servers started with --num_workers).");
ABSL_FLAG(std::string, master_addr, "127.0.0.1", "allreduce: rank 0's host.");
ABSL_FLAG(int, master_port, 0, "allreduce: rank 0's port (rank 0: 0 picks one).");
ABSL_FLAG(std::string, port_file, "", "allreduce rank 0: write the chosen port here.");
ABSL_FLAG(std::string, advertise_host, "", "allreduce: where peers reach this rank.");
ABSL_FLAG(int, size_mib, 16, "Gradient size in MiB of fp32.");
ABSL_FLAG(int, reps, 5, "Timed synchronisations (after one warm-up).");

namespace dptrain {
namespace {

absl::Status Run() {
  const int rank = absl::GetFlag(FLAGS_rank), n = absl::GetFlag(FLAGS_world_size);
  const int64_t elements = int64_t{absl::GetFlag(FLAGS_size_mib)} << 18;
  const std::string mode = absl::GetFlag(FLAGS_mode);
  std::unique_ptr<AllReduceGroup> group;
  OwnedStepSync sync;
  if (mode == "ps") {
    PsClientOptions o;
    o.shard_addresses = absl::StrSplit(absl::GetFlag(FLAGS_ps), ',', absl::SkipEmpty());
    o.rank = rank;
    o.world_size = n;
    o.tensors = {{"grad", elements}};
    auto client = PsClient::Connect(o);
    if (!client.ok()) return client.status();
    sync = std::unique_ptr<ParameterStore>(*std::move(client));
  } else if (mode == "allreduce") {
    AllReduceGroupOptions o;
    o.rank = rank;
    o.world_size = n;
    o.master_addr = absl::GetFlag(FLAGS_master_addr);
    o.master_port = absl::GetFlag(FLAGS_master_port);
    o.advertise_host = absl::GetFlag(FLAGS_advertise_host);
    auto g = AllReduceGroup::Listen(o);
    if (!g.ok()) return g.status();
    group = *std::move(g);
    if (rank == 0 && !absl::GetFlag(FLAGS_port_file).empty()) {
      if (auto s = WritePortFile(absl::GetFlag(FLAGS_port_file), group->master_port()); !s.ok()) {
        return s;
      }
    }
    if (auto s = group->Join(); !s.ok()) return s;
    sync = std::unique_ptr<GradientReducer>(
        std::make_unique<AllReduceSync>(&group->link(), AllReduceSyncOptions{int64_t{1} << 18}));
  } else {
    return absl::InvalidArgumentError("--mode must be ps or allreduce");
  }
  // The gradient followed by the overflow flag's slot, as a model exchanges it.
  std::vector<float> weights(elements), grads(elements + 1, 0.0f);
  std::mt19937 gen(rank);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < elements; ++i) grads[i] = u(gen);
  ReplicaSync& common = Common(Borrow(sync));
  if (auto s = common.Start(absl::MakeSpan(weights)); !s.ok()) return s;
  std::vector<double> times;
  CommStats before;
  const int reps = absl::GetFlag(FLAGS_reps);
  for (int rep = 0; rep <= reps; ++rep) {
    if (rep == 1) before = common.stats();
    const absl::Time start = absl::Now();
    // The synchronisation alone (a reducer's replicas would then apply the average).
    absl::StatusOr<StepOutcome> outcome =
        std::holds_alternative<std::unique_ptr<ParameterStore>>(sync)
            ? std::get<std::unique_ptr<ParameterStore>>(sync)->PushPull(rep, absl::MakeSpan(grads),
                                                                          absl::MakeSpan(weights))
            : std::get<std::unique_ptr<GradientReducer>>(sync)->Reduce(rep, absl::MakeSpan(grads));
    if (!outcome.ok()) return outcome.status();
    if (rep > 0) times.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  const CommStats after = common.stats();
  std::sort(times.begin(), times.end());
  const double t = times[times.size() / 2], bytes = 4.0 * elements;
  std::cout << absl::StrFormat(
                   "{\"mode\":\"%s\",\"rank\":%d,\"world_size\":%d,\"bytes\":%.0f,"
                   "\"median_s\":%.6f,\"algbw_GBps\":%.4f,\"busbw_GBps\":%.4f,"
                   "\"sent_per_sync\":%.0f,\"received_per_sync\":%.0f}",
                   mode, rank, n, bytes, t, bytes / t / 1e9, bytes / t / 1e9 * 2 * (n - 1) / n,
                   double(after.bytes_pushed - before.bytes_pushed) / reps,
                   double(after.bytes_pulled - before.bytes_pulled) / reps)
            << std::endl;
  return absl::OkStatus();
}

}  // namespace
}  // namespace dptrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = dptrain::Run(); !s.ok()) {
    std::cerr << "comm_probe: error: " << s.message() << std::endl;
    return 1;
  }
  return 0;
}
