// What one parameter-server shard moves for row-sparse embedding tables (server/sparse_table.h):
// `--clients` workers (threads, each its own SparseClient and connection) pull `--ids`
// random unique rows of a `--rows` x `--dim` table and push their gradients, every step, on
// one shard (BSP, or each push at once with --sync=async); rows and bytes per second through
// the shard, against one TCP stream on loopback measured in the same run, the rounds
// interleaved, medians reported; and the CPU time each spends per byte (getrusage: clients and shard, both ends of the stream), which depends
// far less than the rates on how the scheduler shares the cores. Only C++ on
// both sides: the shard's capacity, not a Python worker's step rate
// (tests/bench/sparse_bench.py measures the latter).
//
//   bazel run -c opt //tests/bench:sparse_shard_bench -- --rounds=5
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/malloc_tuning.h"
#include "server/ps_server.h"
#include "worker/comm/sparse_client.h"

ABSL_FLAG(int64_t, rows, 2000000, "Rows of the table.");
ABSL_FLAG(int, dim, 64, "Values per row (fp32).");
ABSL_FLAG(int, ids, 20000, "Unique rows each client pulls and pushes per step.");
ABSL_FLAG(int, clients, 2, "Workers (threads) on the shard.");
ABSL_FLAG(int, steps, 30,
          "Timed steps per round, after 8 warm-up steps that touch every batch's rows once "
          "(the shard then holds them: row creation is not timed).");
ABSL_FLAG(int, rounds, 3, "Rounds (shard, then TCP stream, interleaved); medians reported.");
ABSL_FLAG(int, tcp_mb, 512, "MiB sent through the TCP stream per round.");
ABSL_FLAG(std::string, sync, "bsp",
          "The shard's policy: bsp (each step applied once every client pushed it) or async "
          "(each push applied at once).");

namespace dptrain {
namespace {

// CPU seconds (user + system) this process has used so far, all threads.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto seconds = [](const timeval& t) { return t.tv_sec + 1e-6 * t.tv_usec; };
  return seconds(u.ru_utime) + seconds(u.ru_stime);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct StreamRound {
  double bytes_per_s = 0, cpu_ns_per_byte = 0;
};

// One TCP stream on loopback: `mib` MiB in 4 MiB writes; bytes per second, and the CPU time of
// both ends per byte.
StreamRound TcpStream(int mib) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("tcp stream");
    std::exit(1);
  }
  const size_t chunk = 4 << 20, total = static_cast<size_t>(mib) << 20;
  std::thread receiver([listener, total, chunk] {
    const int fd = accept(listener, nullptr, nullptr);
    std::vector<char> buffer(chunk);
    size_t got = 0;
    while (got < total) {
      const ssize_t n = read(fd, buffer.data(), buffer.size());
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    close(fd);
  });
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::perror("connect");
    std::exit(1);
  }
  std::vector<char> data(chunk, 1);
  const absl::Time start = absl::Now();
  const double cpu_start = CpuSeconds();
  for (size_t sent = 0; sent < total;) {
    const ssize_t n = write(fd, data.data(), std::min(chunk, total - sent));
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  close(fd);
  receiver.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const double cpu = CpuSeconds() - cpu_start;
  close(listener);
  return {static_cast<double>(total) / seconds, 1e9 * cpu / static_cast<double>(total)};
}

constexpr int kBatches = 8;  // Distinct batches per client, reused round-robin.
constexpr int kWarmup = kBatches;

struct ShardRound {
  double rows_per_s = 0, bytes_per_s = 0, step_ms = 0;
  double cpu_ns_per_byte = 0;  // Clients and shard together, per byte of rows moved.
};

ShardRound ShardRoundTrip(const std::vector<std::vector<std::vector<int64_t>>>& ids) {
  const int clients = absl::GetFlag(FLAGS_clients), dim = absl::GetFlag(FLAGS_dim);
  const int steps = absl::GetFlag(FLAGS_steps);
  PsServerOptions o;
  o.listen_address = "127.0.0.1:0";
  o.shard.num_shards = 1;
  o.shard.num_workers = clients;
  o.shard.optimizer.name = "none";
  o.shard.policy = absl::GetFlag(FLAGS_sync) == "async" ? SyncPolicy::kAsync : SyncPolicy::kBsp;
  o.max_receive_memory_bytes = -1;
  auto server = PsServer::Start(o);
  if (!server.ok()) {
    std::cerr << server.status() << "\n";
    std::exit(1);
  }
  proto::SparseTableSpec spec;
  spec.set_name("bench");
  spec.set_rows(absl::GetFlag(FLAGS_rows));
  spec.set_dim(dim);
  spec.set_optimizer("sgd");
  spec.set_lr(0.01f);
  spec.set_eps(1e-10);
  spec.set_beta1(0.9);
  spec.set_beta2(0.999);
  std::vector<std::unique_ptr<SparseClient>> client(clients);
  for (int r = 0; r < clients; ++r) {
    SparseClientOptions c;
    c.shard_addresses = {absl::StrCat("127.0.0.1:", (*server)->port())};
    c.rank = r;
    client[r] = *SparseClient::Create(c);
    if (auto s = client[r]->Declare(spec); !s.ok()) {
      std::cerr << s.status() << "\n";
      std::exit(1);
    }
  }
  absl::Time start;
  double cpu_start = 0;
  std::vector<std::thread> threads;
  std::vector<absl::Status> failed(clients);
  for (int r = 0; r < clients; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> rows;
      // A worker's gradients come from its backward pass: made once here, not timed.
      size_t most = 0;
      for (const std::vector<int64_t>& batch : ids[r]) most = std::max(most, batch.size());
      const std::vector<float> all_grads(most * dim, 1e-3f);
      for (int k = 0; k < steps + kWarmup; ++k) {
        if (k == kWarmup && r == 0) {  // After every rank's warm-up.
          start = absl::Now();
          cpu_start = CpuSeconds();
        }
        const std::vector<int64_t>& mine = ids[r][k % ids[r].size()];
        rows.resize(mine.size() * dim);
        const auto grads = absl::MakeConstSpan(all_grads).subspan(0, mine.size() * dim);
        absl::Status s = client[r]->Pull("bench", dim, mine, absl::MakeSpan(rows));
        if (s.ok()) s = client[r]->Push("bench", dim, k, mine, grads);
        if (!s.ok()) {
          failed[r] = s;
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const double cpu = CpuSeconds() - cpu_start;
  for (const absl::Status& s : failed) {
    if (!s.ok()) {
      std::cerr << s << "\n";
      std::exit(1);
    }
  }
  double rows = 0;  // Pulled and pushed through the shard in the timed steps.
  for (int r = 0; r < clients; ++r) {
    for (int k = kWarmup; k < steps + kWarmup; ++k) {
      rows += 2.0 * ids[r][k % ids[r].size()].size();
    }
  }
  return {rows / seconds, rows * dim * 4 / seconds, 1e3 * seconds / steps,
          1e9 * cpu / (rows * dim * 4)};
}

int Main() {
  if (absl::GetFlag(FLAGS_sync) != "bsp" && absl::GetFlag(FLAGS_sync) != "async") {
    std::cerr << "sparse_shard_bench: --sync must be bsp or async\n";
    return 2;
  }
  const int clients = absl::GetFlag(FLAGS_clients), n = absl::GetFlag(FLAGS_ids);
  const int64_t table_rows = absl::GetFlag(FLAGS_rows);
  // Each client's steps: `n` unique rows drawn uniformly from the table (8 batches reused).
  std::mt19937_64 rng(1);
  std::vector<std::vector<std::vector<int64_t>>> ids(clients);
  for (auto& batches : ids) {
    for (int b = 0; b < kBatches; ++b) {
      std::vector<int64_t> batch;
      std::uniform_int_distribution<int64_t> pick(0, table_rows - 1);
      while (static_cast<int>(batch.size()) < n) {
        batch.push_back(pick(rng));
        if (static_cast<int>(batch.size()) == n) {
          std::sort(batch.begin(), batch.end());
          batch.erase(std::unique(batch.begin(), batch.end()), batch.end());
        }
      }
      batches.push_back(std::move(batch));
    }
  }
  std::ifstream loadavg("/proc/loadavg");
  std::string load;
  std::getline(loadavg, load);
  std::cout << absl::StrFormat(
      "# sparse_shard_bench: 1 shard (in process, %s), %d client(s), table %d x %d fp32, "
      "%d unique rows per client and step (pull + push), %d steps per round, %d rounds; "
      "load before: %s; nproc %u\n",
      absl::GetFlag(FLAGS_sync), clients, table_rows, absl::GetFlag(FLAGS_dim), n,
      absl::GetFlag(FLAGS_steps),
      absl::GetFlag(FLAGS_rounds), load, std::thread::hardware_concurrency());
  std::vector<double> rows, bytes, steps, tcp, shard_cpu, tcp_cpu;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    const ShardRound r = ShardRoundTrip(ids);
    const StreamRound t = TcpStream(absl::GetFlag(FLAGS_tcp_mb));
    std::cout << absl::StrFormat(
        "round %d: shard %.0f rows/s, %.1f MB/s (step %.2f ms, %.2f CPU ns/byte); TCP stream "
        "%.1f MB/s (%.2f CPU ns/byte); ratio %.3f\n",
        round + 1, r.rows_per_s, r.bytes_per_s / 1e6, r.step_ms, r.cpu_ns_per_byte,
        t.bytes_per_s / 1e6, t.cpu_ns_per_byte, r.bytes_per_s / t.bytes_per_s);
    rows.push_back(r.rows_per_s);
    bytes.push_back(r.bytes_per_s);
    steps.push_back(r.step_ms);
    tcp.push_back(t.bytes_per_s);
    shard_cpu.push_back(r.cpu_ns_per_byte);
    tcp_cpu.push_back(t.cpu_ns_per_byte);
  }
  std::ifstream after("/proc/loadavg");
  std::getline(after, load);
  std::vector<double> ratios;
  for (size_t i = 0; i < bytes.size(); ++i) ratios.push_back(bytes[i] / tcp[i]);
  std::cout << absl::StrFormat(
      "median: shard %.0f rows/s, %.1f MB/s of rows (pulled + pushed), step %.2f ms; one TCP "
      "stream %.1f MB/s; shard / TCP %.3f (target >= 0.5)\n"
      "# CPU time per byte moved (this process, all threads: clients and shard; both ends of "
      "the stream), median: shard %.2f ns, TCP stream %.2f ns\n# load after: %s\n",
      Median(rows), Median(bytes) / 1e6, Median(steps), Median(tcp) / 1e6, Median(ratios),
      Median(shard_cpu), Median(tcp_cpu), load);
  return 0;
}

}  // namespace
}  // namespace dptrain

int main(int argc, char** argv) {
  dptrain::KeepTensorBuffersInHeap();  // As ps_server does.
  absl::ParseCommandLine(argc, argv);
  return dptrain::Main();
}
