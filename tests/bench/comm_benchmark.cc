// Communication benchmark: the time of one gradient synchronisation for each mode (sharded
// PS, master reducer, ring all-reduce; and `ring`: the bare all-reduce of the allreduce
// mode, without its copy and optimizer, to set beside Gloo), world size, shard count and
// gradient size, with the
// bytes each process and each shard moved, written as CSV, a Markdown table and an SVG
// plot. Every rank is a thread of this process with its own TCP connections on loopback.
//
//   bazel run -c opt //tests/bench:comm_benchmark -- --out=$PWD/results/comm
#include <algorithm>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/malloc_tuning.h"
#include "common/optimizer.h"
#include "server/ps_server.h"
#include "tests/bench/comm_report.h"
#include "worker/comm/allreduce_group.h"
#include "worker/comm/allreduce_sync.h"
#include "common/ring_allreduce.h"
#include "worker/comm/ps_client.h"
#include "worker/comm/sharded_ring_store.h"

ABSL_FLAG(std::string, modes, "ps,master,allreduce,allreduce_replicated,ring",
          "Modes to measure.");
ABSL_FLAG(std::string, workers, "1,2,4,8", "World sizes.");
ABSL_FLAG(std::string, shards, "1,2,4", "Shard counts for ps mode.");
ABSL_FLAG(std::string, sizes_mib, "1,16,64", "Gradient sizes in MiB of fp32.");
ABSL_FLAG(std::string, models, "mlp=203530,lenet=61706,resnet18=11175818",
          "Real models as name=parameters (measured at world size 2 and 4).");
ABSL_FLAG(int, ring_chunk_kib, 1024, "Message size of the ring (allreduce and ring modes).");
ABSL_FLAG(int, reps, 5, "Timed repetitions per point (after one warm-up); the median is kept.");
ABSL_FLAG(std::string, out, "results/comm", "Folder for comm.csv, comm.md and comm.svg.");
ABSL_FLAG(std::string, from_csv, "",
          "If set, measure nothing: rewrite the report (into --out) from this comm.csv.");

namespace dptrain {
namespace {

// A reusable barrier for the rank threads.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void Wait() {
    absl::MutexLock lock(&mu_);
    const int64_t generation = generation_;
    if (++count_ == n_) {
      count_ = 0;
      ++generation_;
      return;
    }
    auto next = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return generation_ != generation;
    };
    mu_.Await(absl::Condition(&next));
  }

 private:
  const int n_;
  absl::Mutex mu_;
  int count_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

// Tags of the bare ring's collectives: apart from the sync's own (initial broadcast, steps).
constexpr uint64_t kBenchTagBase = uint64_t{3} << 22;

int64_t RingChunkElements() {
  return std::max<int64_t>(1, int64_t{absl::GetFlag(FLAGS_ring_chunk_kib)} * 1024 / 4);
}

OptimizerOptions Sgd() {
  OptimizerOptions o;
  o.learning_rate = 1e-6f;  // Keeps the weights finite over many repetitions.
  return o;
}

// The sync of one rank plus whatever it runs over.
// allreduce: the CPU worker's step (ShardedRingStore: reduce-scatter, skip vote, the
// optimizer on 1/N, all-gather of the weights); allreduce_replicated: AllReduceSync then
// the whole optimizer on every replica (the GPU worker's path, here on the host).
struct Rank {
  std::unique_ptr<AllReduceGroup> group;
  std::unique_ptr<AllReduceSync> reducer;  // allreduce_replicated
  std::unique_ptr<ParameterStore> store;   // ps, master, allreduce
  ReplicaSync* sync = nullptr;             // whichever it is
};

// Measures one point; returns false (and prints why) if a sync failed.
bool Measure(const Point& p, int reps, Result& result) {
  const int n = p.workers;
  const int64_t elements = p.elements;
  std::vector<std::unique_ptr<PsServer>> servers;
  std::vector<std::string> addresses;
  const bool peers =
      p.mode == "allreduce" || p.mode == "allreduce_replicated" || p.mode == "ring";
  if (!peers) {
    for (int s = 0; s < p.shards; ++s) {
      PsServerOptions o;
      o.listen_address = "127.0.0.1:0";
      o.shard.shard = s;
      o.shard.num_shards = p.shards;
      o.shard.num_workers = n;
      o.shard.optimizer = Sgd();
      auto server = PsServer::Start(o);
      if (!server.ok()) {
        std::cerr << server.status() << "\n";
        return false;
      }
      addresses.push_back(absl::StrCat("127.0.0.1:", (*server)->port()));
      servers.push_back(*std::move(server));
    }
  }
  std::vector<Rank> ranks(n);
  int master_port = 0;
  if (peers) {
    AllReduceGroupOptions o;
    o.world_size = n;
    o.advertise_host = "127.0.0.1";
    auto g = AllReduceGroup::Listen(o);
    if (!g.ok()) return false;
    master_port = (*g)->master_port();
    ranks[0].group = *std::move(g);
  }
  // Tensors: the gradient as chunks of <= 4 MiB of one flat tensor.
  const std::vector<TensorInfo> tensors = {{"grad", elements}};
  std::vector<absl::Status> statuses(n);
  std::vector<double> start(reps + 1);
  std::vector<std::vector<double>> ends(n, std::vector<double>(reps + 1));
  std::vector<CommStats> before(n), after(n);
  int64_t shard_in_before = 0, shard_out_before = 0;
  Barrier barrier(n);
  auto body = [&](int r) {
    Rank& me = ranks[r];
    absl::Status s;
    if (peers) {
      if (r > 0) {
        AllReduceGroupOptions o;
        o.rank = r;
        o.world_size = n;
        o.master_port = master_port;
        o.advertise_host = "127.0.0.1";
        auto g = AllReduceGroup::Listen(o);
        if (!g.ok()) s = g.status();
        else me.group = *std::move(g);
      }
      if (s.ok()) s = me.group->Join();
      if (s.ok() && p.mode == "allreduce") {
        auto store = ShardedRingStore::Create(&me.group->link(), {RingChunkElements(), Sgd()});
        if (store.ok()) {
          me.store = *std::move(store);
          me.sync = me.store.get();
        } else {
          s = store.status();
        }
      } else if (s.ok()) {
        me.reducer = std::make_unique<AllReduceSync>(&me.group->link(),
                                                     AllReduceSyncOptions{RingChunkElements()});
        me.sync = me.reducer.get();
      }
    } else {
      PsClientOptions o;
      o.shard_addresses = addresses;
      o.rank = r;
      o.world_size = n;
      o.tensors = tensors;
      auto client = PsClient::Connect(o);
      if (client.ok()) {
        me.store = *std::move(client);
        me.sync = me.store.get();
      } else {
        s = client.status();
      }
    }
    // The gradient followed by the overflow flag's slot, as a model exchanges it.
    std::vector<float> weights(elements), grads(elements + 1, 0.0f);
    std::mt19937 gen(r);
    std::uniform_real_distribution<float> u(-1, 1);
    for (int64_t i = 0; i < elements; ++i) grads[i] = u(gen);
    // The replica's own update in allreduce_replicated mode (the model's ApplyUpdate).
    std::unique_ptr<Optimizer> optimizer = *CreateOptimizer(Sgd());
    OptimizerState optimizer_state;
    if (s.ok()) s = me.sync->Start(absl::MakeSpan(weights));
    barrier.Wait();
    RingOptions ring;
    ring.chunk_elements = RingChunkElements();
    ring.average = true;
    for (int rep = 0; rep <= reps && s.ok(); ++rep) {  // rep 0 warms up.
      if (rep == 1) before[r] = me.sync->stats();
      barrier.Wait();
      if (r == 0) {
        if (rep == 1 && !servers.empty()) {
          shard_in_before = servers[0]->bytes_received();
          shard_out_before = servers[0]->bytes_sent();
        }
        start[rep] = absl::ToUnixMicros(absl::Now()) / 1e6;
      }
      barrier.Wait();
      if (p.mode == "ring") {
        ring.tag_base = kBenchTagBase + static_cast<uint64_t>(rep);
        s = RingAllReduce(me.group->link(), absl::MakeSpan(grads).first(elements), ring);
      } else if (me.reducer != nullptr) {  // The whole step: reduce, then apply.
        absl::StatusOr<StepOutcome> outcome = me.reducer->Reduce(rep, absl::MakeSpan(grads));
        s = outcome.status();
        if (s.ok() && !outcome->skipped) {
          optimizer->Apply(absl::MakeSpan(weights), absl::MakeConstSpan(grads).first(elements),
                           optimizer_state);
        }
      } else {
        s = me.store->PushPull(rep, absl::MakeSpan(grads), absl::MakeSpan(weights)).status();
      }
      ends[r][rep] = absl::ToUnixMicros(absl::Now()) / 1e6;
    }
    if (me.sync != nullptr) after[r] = me.sync->stats();
    statuses[r] = s;
    barrier.Wait();  // Nobody tears down its link while others still receive.
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (!statuses[r].ok()) {
      std::cerr << p.Label() << ": rank " << r << ": " << statuses[r] << "\n";
      return false;
    }
  }
  std::vector<double> times;
  for (int rep = 1; rep <= reps; ++rep) {
    double last = 0;
    for (int r = 0; r < n; ++r) last = std::max(last, ends[r][rep]);
    times.push_back(last - start[rep]);
  }
  std::sort(times.begin(), times.end());
  result.point = p;
  result.seconds = times[times.size() / 2];
  // Per synchronisation, per process: the busiest worker, and shard 0 (the master's link in
  // master mode).
  for (int r = 0; r < n; ++r) {
    result.worker_sent = std::max<double>(
        result.worker_sent, (after[r].bytes_pushed - before[r].bytes_pushed) / double(reps));
    result.worker_received = std::max<double>(
        result.worker_received, (after[r].bytes_pulled - before[r].bytes_pulled) / double(reps));
  }
  if (!servers.empty()) {
    result.shard_received = (servers[0]->bytes_received() - shard_in_before) / double(reps);
    result.shard_sent = (servers[0]->bytes_sent() - shard_out_before) / double(reps);
  }
  return true;
}

std::vector<int> Ints(const std::string& list) {
  std::vector<int> out;
  for (absl::string_view v : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    int x;
    if (absl::SimpleAtoi(v, &x) && x > 0) out.push_back(x);
  }
  return out;
}

int Main() {
  if (const std::string csv = absl::GetFlag(FLAGS_from_csv); !csv.empty()) {
    const std::vector<Result> results = ReadCsv(csv);
    if (results.empty()) {
      std::cerr << "no results in " << csv << "\n";
      return 1;
    }
    return WriteReport(absl::GetFlag(FLAGS_out), results) ? 0 : 1;
  }
  std::vector<Point> points;
  const std::vector<std::string> modes = absl::StrSplit(absl::GetFlag(FLAGS_modes), ',');
  for (const std::string& mode : modes) {
    for (int n : Ints(absl::GetFlag(FLAGS_workers))) {
      for (int mib : Ints(absl::GetFlag(FLAGS_sizes_mib))) {
        const int64_t elements = int64_t{mib} << 18;
        if (mode == "ps") {
          for (int s : Ints(absl::GetFlag(FLAGS_shards))) {
            points.push_back({mode, n, s, elements, absl::StrCat(mib, " MiB")});
          }
        } else {
          points.push_back({mode, n, 1, elements, absl::StrCat(mib, " MiB")});
        }
      }
    }
  }
  for (absl::string_view m : absl::StrSplit(absl::GetFlag(FLAGS_models), ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(m, '=');
    int64_t params = 0;
    if (!absl::SimpleAtoi(kv.second, &params)) continue;
    for (const std::string& mode : modes) {
      for (int n : {2, 4}) points.push_back({mode, n, mode == "ps" ? 2 : 1, params, kv.first});
    }
  }
  std::vector<Result> results;
  for (const Point& p : points) {
    Result r;
    const int reps = p.elements * 4 * p.workers > (int64_t{256} << 20) ? std::max(3, absl::GetFlag(FLAGS_reps) / 2)
                                                                       : absl::GetFlag(FLAGS_reps);
    if (!Measure(p, reps, r)) return 1;
    std::cout << FormatRow(r) << std::endl;
    results.push_back(r);
  }
  return WriteReport(absl::GetFlag(FLAGS_out), results) ? 0 : 1;
}

}  // namespace
}  // namespace dptrain

int main(int argc, char** argv) {
  dptrain::KeepTensorBuffersInHeap();
  absl::ParseCommandLine(argc, argv);
  return dptrain::Main();
}
