// Peer for the communication benchmark: the Gloo library (Debian's libgloo-dev) all-reducing
// fp32 sums over its TCP transport on loopback, timed the same way tools/bench_peers.py times
// torch.distributed gloo: one warm-up, then per rep barrier, start, all-reduce, barrier, stop;
// the median over reps is reported.
//
// usage: gloo_allreduce RANKS MIB [REPS]
// Forks RANKS processes; they rendezvous through a gloo::rendezvous::FileStore in a fresh
// temporary directory and connect a full mesh with gloo::transport::tcp on 127.0.0.1.
// Every algorithm this Gloo version offers for a host all-reduce is timed in turn:
//   ring               gloo::allreduce, AllreduceOptions::Algorithm::RING (what torch uses)
//   bcube              gloo::allreduce, AllreduceOptions::Algorithm::BCUBE
//   AllreduceRing, AllreduceRingChunked, AllreduceHalvingDoubling, AllreduceBcube
//                      the older algorithm classes (AllreduceLocal is single-process only)
// Every rep's result is checked (every element equals the expected sum).
// Output: "algo NAME SECONDS" per algorithm (from rank 0), then, from the parent,
// "check ok ..." when every rank exited cleanly, or "check FAILED ..." and exit status 1.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gloo/allreduce.h"
#include "gloo/allreduce_bcube.h"
#include "gloo/allreduce_halving_doubling.h"
#include "gloo/allreduce_ring.h"
#include "gloo/allreduce_ring_chunked.h"
#include "gloo/barrier.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"

namespace {

// Rank r holds (i % 13) + r, so the sum is N * (i % 13) + N(N-1)/2: exact in fp32.
void fill(std::vector<float>& buf, int rank) {
  for (size_t i = 0; i < buf.size(); i++) buf[i] = static_cast<float>(i % 13 + rank);
}

size_t count_wrong(const std::vector<float>& buf, int world) {
  size_t wrong = 0;
  for (size_t i = 0; i < buf.size(); i++) {
    float want = static_cast<float>(world * static_cast<int>(i % 13) + world * (world - 1) / 2);
    if (buf[i] != want) wrong++;
  }
  return wrong;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// One of the older algorithm classes, set up once on the buffer (outside the timed region).
template <typename A>
std::function<void()> legacy(const std::shared_ptr<gloo::Context>& context,
                             const std::vector<float*>& ptrs, int count) {
  auto algorithm = std::make_shared<A>(context, ptrs, count);
  return [algorithm] { algorithm->run(); };
}

int run_rank(int rank, int world, size_t elements, int reps, const std::string& dir) {
  gloo::transport::tcp::attr attr("127.0.0.1");
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(dir);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, world);
  context->setTimeout(std::chrono::seconds(300));
  context->connectFullMesh(store, dev);

  std::vector<float> buf(elements);
  std::vector<float*> ptrs{buf.data()};
  const int count = static_cast<int>(elements);

  auto barrier = [&] {
    gloo::BarrierOptions opts(context);
    gloo::barrier(opts);
  };
  auto new_api = [&](gloo::AllreduceOptions::Algorithm algorithm) {
    return [&, algorithm] {
      gloo::AllreduceOptions opts(context);
      opts.setAlgorithm(algorithm);
      opts.setOutput(buf.data(), elements);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      gloo::allreduce(opts);
    };
  };

  // name, factory of the all-reduce (called once per algorithm, outside the timed region).
  std::vector<std::pair<std::string, std::function<std::function<void()>()>>> algos;
  algos.push_back({"ring", [&] { return new_api(gloo::AllreduceOptions::Algorithm::RING); }});
  // BCUBE needs the rank count to be divisible by the base (2).
  if (world % context->base == 0) {
    algos.push_back({"bcube", [&] { return new_api(gloo::AllreduceOptions::Algorithm::BCUBE); }});
  }
  algos.push_back(
      {"AllreduceRing", [&] { return legacy<gloo::AllreduceRing<float>>(context, ptrs, count); }});
  algos.push_back({"AllreduceRingChunked", [&] {
                     return legacy<gloo::AllreduceRingChunked<float>>(context, ptrs, count);
                   }});
  algos.push_back({"AllreduceHalvingDoubling", [&] {
                     return legacy<gloo::AllreduceHalvingDoubling<float>>(context, ptrs, count);
                   }});
  if (world % context->base == 0) {
    algos.push_back({"AllreduceBcube",
                     [&] { return legacy<gloo::AllreduceBcube<float>>(context, ptrs, count); }});
  }

  size_t wrong_total = 0;
  for (auto& [name, make] : algos) {
    auto allreduce = make();
    std::vector<double> times;
    size_t wrong = 0;
    for (int i = 0; i <= reps; i++) {  // i == 0 is the warm-up
      fill(buf, rank);
      barrier();
      auto start = std::chrono::steady_clock::now();
      allreduce();
      barrier();
      std::chrono::duration<double> t = std::chrono::steady_clock::now() - start;
      if (i > 0) times.push_back(t.count());
      wrong += count_wrong(buf, world);
    }
    if (wrong != 0) {
      std::fprintf(stderr, "gloo_allreduce: rank %d: %s: %zu wrong elements\n", rank, name.c_str(),
                   wrong);
    }
    wrong_total += wrong;
    if (rank == 0) {
      std::printf("algo %s %.9f%s\n", name.c_str(), median(times), wrong ? " WRONG" : "");
      std::fflush(stdout);
    }
  }
  barrier();
  return wrong_total == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: gloo_allreduce RANKS MIB [REPS]\n");
    return 2;
  }
  const int world = std::atoi(argv[1]);
  const long mib = std::atol(argv[2]);
  const int reps = argc > 3 ? std::atoi(argv[3]) : 5;
  if (world < 1 || mib <= 0 || reps <= 0) return 2;
  const size_t elements = static_cast<size_t>(mib) << 18;  // fp32 elements in MIB MiB

  char tmpl[] = "/tmp/gloo_allreduce.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("mkdtemp");
    return 2;
  }
  const std::string dir = tmpl;
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < world; rank++) {
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return 2;
    }
    if (pid == 0) {
      int rc = 1;
      try {
        rc = run_rank(rank, world, elements, reps, dir);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "gloo_allreduce: rank %d: %s\n", rank, e.what());
      }
      std::fflush(nullptr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      failed++;
    }
  }
  std::system(("rm -rf '" + dir + "'").c_str());
  if (failed) {
    std::printf("check FAILED: %d of %d ranks failed\n", failed, world);
    return 1;
  }
  std::printf("check ok: %d ranks x %d reps per algorithm, every element equals the expected sum\n",
              world, reps + 1);
  return 0;
}
