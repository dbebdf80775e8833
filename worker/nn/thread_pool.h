// An intra-op thread pool for the CPU layers: a model owns one (nn::PlanMathThreads makes it
// from ModelOptions.threads) and passes it to its layers with every call (LayerContext), and
// they split their work over samples, channels or element ranges with ParallelFor.
//
// Work is cut into chunks whose boundaries depend only on the problem size and the pool's size,
// and the threads claim chunks as they come: a thread that the OS runs late (a shared machine)
// does not hold the others up, it finds less or nothing left to do. A layer that sums across
// chunks keeps one partial sum per chunk and adds them in chunk order, so results depend on the
// number of threads but never on scheduling.
//
// The pool also lends per-thread scratch memory (Scratch) for use inside one parallel region:
// layers run one after another, so they share it instead of each keeping its own.
//
// One thread drives a pool at a time (as it drives the model). A region started from inside a
// region runs serially on the calling thread, with the usual thread indices, so such nested
// code must not use Scratch (the layers never nest regions).
#ifndef DPTRAIN_WORKER_NN_THREAD_POOL_H_
#define DPTRAIN_WORKER_NN_THREAD_POOL_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dptrain {
namespace nn {

// How a model uses its math threads (ModelOptions::threads > 1). kPoolSplit: the model owns a
// pool; every layer splits its batch over it (each GEMM piece single-threaded in BLAS, BLAS
// set to 1 thread). kBlasThreads: no pool; every GEMM runs whole on the calling thread with
// BLAS's own threads, the rest of the step on the caller. Measured on 2 cores
// (tools/compute_bench.sh, docs/benchmarks/compute.md): BLAS threads win on a model of Linear
// layers only (mlp: the step is a few large GEMMs, and a pool's idle threads beside BLAS's spinning
// ones oversubscribe the cores), the pool wins where there are convolutions (LeNet: many small
// im2col GEMMs). kByModel picks by that rule (model.h's PlanMathThreads).
enum class DenseGemm { kPoolSplit, kBlasThreads, kByModel };

class ThreadPool {
 public:
  // `num_threads` >= 1 in all, the calling thread included (num_threads - 1 are started).
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Runs fn(chunk, thread) once for every chunk in [0, chunks), each on some thread of the pool
  // (`thread` in [0, num_threads()) names it; the caller is thread 0), and returns when all
  // have returned. Serial on the caller if called from inside a parallel region.
  void Run(int64_t chunks, const std::function<void(int64_t chunk, int thread)>& fn);

  // Per-thread scratch: at least n elements of U (suitably aligned for float and double) in
  // slot `slot` (< kSlots) of thread `thread`. Valid until the next Scratch call for the same
  // thread and slot; contents are unspecified. Only one thread at a time may use a given
  // (thread, slot): normally thread `thread` itself.
  static constexpr int kSlots = 8;
  template <typename U>
  U* Scratch(int thread, int slot, int64_t n) {
    std::vector<double>& v = scratch_[thread * kSlots + slot];
    const size_t words = static_cast<size_t>((n * int64_t{sizeof(U)} + 7) / 8);
    if (v.size() < words) v.resize(words);
    return reinterpret_cast<U*>(v.data());
  }

 private:
  void WorkerLoop(int index);
  // Claims and runs chunks of the current job until none is left.
  void RunChunks(int thread);

  const int num_threads_;
  std::vector<std::thread> workers_;
  std::vector<std::vector<double>> scratch_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::atomic<uint64_t> generation_{0};
  // Workers inside the current job; -1 once the caller has closed it (late workers stay out).
  std::atomic<int> active_{-1};
  std::atomic<int64_t> next_chunk_{0};
  int64_t chunks_ = 0;
  bool stop_ = false;  // Guarded by mu_.
  const std::function<void(int64_t, int)>* job_ = nullptr;
};

// The c-th of `chunks` near-equal contiguous pieces of [0, n) is
// [ChunkBegin(n, chunks, c), ChunkBegin(n, chunks, c + 1)).
inline int64_t ChunkBegin(int64_t n, int64_t chunks, int64_t c) { return n * c / chunks; }

// Number of threads of `pool` (1 for null).
inline int NumThreads(const ThreadPool* pool) { return pool == nullptr ? 1 : pool->num_threads(); }

// fn(begin, end, thread) over contiguous pieces of [0, n) (about kChunksPerThread per thread,
// never empty), on the pool's threads; or fn(0, n, 0) on the caller when pool is null, has one
// thread or n < min_parallel. For work without sums across pieces: which thread runs which
// piece varies from call to call. `chunks_per_thread` trades load balance (more pieces: a
// thread the OS runs late holds up less) against per-piece overhead (a GEMM piece packs its
// shared operand again).
inline constexpr int kChunksPerThread = 4;
template <typename Fn>
void ParallelFor(ThreadPool* pool, int64_t n, Fn&& fn, int64_t min_parallel = 2,
                 int chunks_per_thread = kChunksPerThread) {
  if (pool == nullptr || pool->num_threads() == 1 || n < min_parallel) {
    if (n > 0) fn(int64_t{0}, n, 0);
    return;
  }
  const int64_t chunks = std::min<int64_t>(n, int64_t{pool->num_threads()} * chunks_per_thread);
  pool->Run(chunks, [&](int64_t c, int t) {
    fn(ChunkBegin(n, chunks, c), ChunkBegin(n, chunks, c + 1), t);
  });
}

// Element-wise loops shorter than this run on one thread (a parallel region costs a few
// microseconds).
inline constexpr int64_t kMinParallelElements = int64_t{1} << 14;

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_THREAD_POOL_H_
