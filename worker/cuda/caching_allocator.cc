#include "worker/cuda/caching_allocator.h"

#include "absl/strings/str_cat.h"

namespace dptrain {
namespace cuda {

CachingAllocator::~CachingAllocator() {
  EmptyCache();
  for (auto& [p, size] : in_use_) raw_.free(p);
}

absl::StatusOr<void*> CachingAllocator::Allocate(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("CachingAllocator: zero-byte request");
  const size_t size = (bytes + kRound - 1) / kRound * kRound;
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
  if (!p.ok() && !cached_.empty()) {  // Out of memory: give the cache back, try once more.
    const size_t had = stats_.cached_bytes;
    EmptyCache();
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

absl::Status CachingAllocator::Free(void* p) {
  auto it = in_use_.find(p);
  if (it == in_use_.end()) {
    return absl::InvalidArgumentError(
        "CachingAllocator: Free of a pointer that is not in use (never allocated here, or "
        "freed already)");
  }
  stats_.in_use_bytes -= it->second;
  stats_.cached_bytes += it->second;
  cached_.emplace(it->second, p);
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
