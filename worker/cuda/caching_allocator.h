// Device memory for the CUDA backend without a cudaMalloc per step (PyTorch's caching
// allocator idea, simplified): freed blocks stay cached and the next request of a size
// that fits reuses the smallest of them; only when none fits is the raw allocator called,
// and when that fails (out of memory) the device is synchronised, the cache released and
// the call retried once. A block that another stream still uses is freed with FreeWhen
// (PyTorch's recordStream): it is reused only once that use is done.
// The raw allocator is injected, so the logic builds and is tested without a GPU;
// CudaRawAllocator() (cuda_raw_allocator.h) gives cudaMalloc/cudaFree.
// Not thread-safe: one allocator per device and stream-ordered user.
#ifndef DPTRAIN_WORKER_CUDA_CACHING_ALLOCATOR_H_
#define DPTRAIN_WORKER_CUDA_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <functional>
#include <map>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dptrain {
namespace cuda {

struct RawAllocator {
  // Returns memory of at least `bytes` bytes, or a status (ResourceExhausted when out of
  // memory).
  std::function<absl::StatusOr<void*>(size_t bytes)> allocate;
  std::function<void(void*)> free;
  // Waits until no queued work can touch any block (cudaDeviceSynchronize); called before
  // cached blocks are returned to `free` and before deferred blocks are forced free.
  // Optional (tests without a device).
  std::function<absl::Status()> synchronize;
};

class CachingAllocator {
 public:
  // Requests are rounded up to a multiple of this (as PyTorch's small blocks).
  static constexpr size_t kRound = 512;
  // A cached block is reused for a request only if it is at most this many times larger:
  // a 1 GiB block should not serve a 1 KiB request.
  static constexpr size_t kMaxWaste = 2;

  explicit CachingAllocator(RawAllocator raw) : raw_(std::move(raw)) {}
  ~CachingAllocator();  // Returns every block, cached or not, to the raw allocator.
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // `bytes` > 0. ResourceExhausted (naming the size and what was cached) if even an empty
  // cache cannot make room.
  absl::StatusOr<void*> Allocate(size_t bytes);
  // InvalidArgument for a pointer this allocator did not hand out, or one freed already.
  absl::Status Free(void* p);
  // As Free, for a block that work on another stream may still use: it is not reused
  // until `done()` (polled, e.g. cudaEventQuery of an event recorded after that work)
  // returns true, or the device was synchronised.
  absl::Status FreeWhen(void* p, std::function<bool()> done);
  // Returns the cached (free) blocks to the raw allocator.
  void EmptyCache();

  struct Stats {
    size_t in_use_bytes = 0;   // Handed out, block sizes.
    size_t cached_bytes = 0;   // Free, kept for reuse.
    size_t pending_bytes = 0;  // Freed with FreeWhen, waiting for their `done`.
    size_t raw_allocations = 0;
    size_t cache_hits = 0;
  };
  Stats stats() const { return stats_; }

 private:
  RawAllocator raw_;
  std::multimap<size_t, void*> cached_;       // Free blocks by size.
  std::unordered_map<void*, size_t> in_use_;  // Handed-out blocks and their sizes.
  struct Pending {
    void* p;
    size_t size;
    std::function<bool()> done;
  };
  std::vector<Pending> pending_;  // FreeWhen's blocks, oldest first.

  // Moves the pending blocks whose use is done (all of them if `all`) into the cache.
  void Reclaim(bool all);
  // Synchronises the device (RawAllocator::synchronize), then returns every cached and
  // pending block to the raw allocator.
  absl::Status ReleaseAll();
  Stats stats_;
};

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_CACHING_ALLOCATOR_H_
