// Multi-rank tests in one process (gloo's spawn(size, fn) harness): one thread per rank,
// bounded so that a hang fails the test at once instead of waiting for Bazel's timeout.
#ifndef DPTRAIN_COMMON_RANK_THREADS_H_
#define DPTRAIN_COMMON_RANK_THREADS_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace dptrain {

// Runs fn(rank) on one thread per rank and returns their statuses; `elapsed`, if set, gets
// the time until the last one returned. Aborts the process (naming the hang) if they have
// not all returned within `limit`.
template <typename Fn>
std::vector<absl::Status> RunRanks(int world_size, absl::Duration limit, Fn fn,
                                   absl::Duration* elapsed = nullptr) {
  std::vector<absl::Status> statuses(world_size);
  absl::Mutex mu;
  int done = 0;
  auto all_done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done == world_size; };
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      absl::Status s = fn(r);
      absl::MutexLock lock(&mu);
      statuses[r] = std::move(s);
      ++done;
    });
  }
  {
    absl::MutexLock lock(&mu);
    if (!mu.AwaitWithTimeout(absl::Condition(&all_done), limit)) {
      std::fprintf(stderr, "FATAL: %d of %d ranks still running after %s: a hang\n",
                   world_size - done, world_size, absl::FormatDuration(limit).c_str());
      std::abort();
    }
  }
  if (elapsed != nullptr) *elapsed = absl::Now() - start;
  for (auto& t : threads) t.join();
  return statuses;
}

// n floats uniform in [-1, 1), the same for the same seed.
inline std::vector<float> RandomFloats(int seed, int64_t n) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = u(gen);
  return v;
}

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_RANK_THREADS_H_
