#include "worker/nn/thread_pool.h"

namespace dptrain {
namespace nn {
namespace {

thread_local bool in_parallel_region = false;

// Idle workers spin this many times before blocking on the condition variable: a step starts a
// new region every few hundred microseconds, and a futex wake-up costs tens of them. Kept short
// so that on a loaded machine spinning does not steal much from useful work.
constexpr int kSpins = 4000;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

ThreadPool::ThreadPool(int num_threads)
    : num_threads_(num_threads < 1 ? 1 : num_threads),
      scratch_(num_threads_ * kSlots) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1);
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunChunks(int thread) {
  for (;;) {
    const int64_t c = next_chunk_.fetch_add(1);
    if (c >= chunks_) return;
    (*job_)(c, thread);
  }
}

void ThreadPool::Run(int64_t chunks, const std::function<void(int64_t, int)>& fn) {
  if (num_threads_ == 1 || in_parallel_region || chunks <= 1) {
    for (int64_t c = 0; c < chunks; ++c) fn(c, 0);
    return;
  }
  in_parallel_region = true;
  job_ = &fn;
  chunks_ = chunks;
  next_chunk_.store(0);
  active_.store(0);  // Open: workers may join.
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1);
  }
  start_cv_.notify_all();
  RunChunks(0);
  // Every chunk is claimed; close the job once the workers that joined have finished theirs.
  for (int spins = 0;; ++spins) {
    int expected = 0;
    if (active_.compare_exchange_weak(expected, -1)) break;
    if (spins < kSpins) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
  job_ = nullptr;
  in_parallel_region = false;
}

void ThreadPool::WorkerLoop(int index) {
  in_parallel_region = true;
  uint64_t seen = 0;
  for (;;) {
    for (int i = 0; i < kSpins && generation_.load() == seen; ++i) CpuRelax();
    if (generation_.load() == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return generation_.load() != seen; });
    }
    seen = generation_.load();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    // Join the current job unless the caller has closed it already.
    int a = active_.load();
    while (a >= 0 && !active_.compare_exchange_weak(a, a + 1)) {
    }
    if (a < 0) continue;
    RunChunks(index);
    active_.fetch_sub(1);
  }
}

}  // namespace nn
}  // namespace dptrain
