#include "worker/cuda/caching_allocator.h"

#include "absl/strings/str_cat.h"

namespace dptrain {
namespace cuda {

CachingAllocator::~CachingAllocator() {
  (void)ReleaseAll();
  for (auto& [p, size] : in_use_) raw_.free(p);
}

void CachingAllocator::Reclaim(bool all) {
  size_t kept = 0;
  for (Pending& b : pending_) {
    if (all || b.done()) {
      stats_.pending_bytes -= b.size;
      stats_.cached_bytes += b.size;
      cached_.emplace(b.size, b.p);
    } else {
      pending_[kept++] = std::move(b);
    }
  }
  pending_.resize(kept);
}

absl::Status CachingAllocator::ReleaseAll() {
  // Queued kernels may still read or write a free block (freed in stream order): wait for
  // them before the memory goes back.
  absl::Status synced = raw_.synchronize ? raw_.synchronize() : absl::OkStatus();
  if (!synced.ok()) return synced;
  Reclaim(/*all=*/true);
  EmptyCache();
  return absl::OkStatus();
}

absl::StatusOr<void*> CachingAllocator::Allocate(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("CachingAllocator: zero-byte request");
  const size_t size = (bytes + kRound - 1) / kRound * kRound;
  if (!pending_.empty()) Reclaim(/*all=*/false);
  // The smallest cached block that fits without wasting more than kMaxWaste x.
  auto it = cached_.lower_bound(size);
  if (it != cached_.end() && it->first <= size * kMaxWaste) {
    void* p = it->second;
    const size_t block = it->first;
    cached_.erase(it);
    stats_.cached_bytes -= block;
    stats_.in_use_bytes += block;
    ++stats_.cache_hits;
    in_use_[p] = block;
    return p;
  }
  absl::StatusOr<void*> p = raw_.allocate(size);
  if (!p.ok() && (!cached_.empty() || !pending_.empty())) {
    // Out of memory: give the cache back, once nothing queued can use it; try once more.
    const size_t had = stats_.cached_bytes + stats_.pending_bytes;
    if (absl::Status s = ReleaseAll(); !s.ok()) return s;
    p = raw_.allocate(size);
    if (!p.ok()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "CachingAllocator: cannot allocate ", size, " bytes even after releasing ", had,
          " cached bytes (", stats_.in_use_bytes, " in use): ", p.status().message()));
    }
  }
  if (!p.ok()) return p.status();
  ++stats_.raw_allocations;
  stats_.in_use_bytes += size;
  in_use_[*p] = size;
  return *p;
}

absl::Status CachingAllocator::Free(void* p) { return FreeWhen(p, nullptr); }

absl::Status CachingAllocator::FreeWhen(void* p, std::function<bool()> done) {
  auto it = in_use_.find(p);
  if (it == in_use_.end()) {
    return absl::InvalidArgumentError(
        "CachingAllocator: Free of a pointer that is not in use (never allocated here, or "
        "freed already)");
  }
  stats_.in_use_bytes -= it->second;
  if (done) {
    stats_.pending_bytes += it->second;
    pending_.push_back({p, it->second, std::move(done)});
  } else {
    stats_.cached_bytes += it->second;
    cached_.emplace(it->second, p);
  }
  in_use_.erase(it);
  return absl::OkStatus();
}

void CachingAllocator::EmptyCache() {
  for (auto& [size, p] : cached_) raw_.free(p);
  cached_.clear();
  stats_.cached_bytes = 0;
}

}  // namespace cuda
}  // namespace dptrain
