#include "worker/cuda/caching_allocator.h"

#include <cstdlib>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace dptrain {
namespace cuda {
namespace {

// A raw allocator over malloc with a capacity, counting what it holds.
struct FakeDevice {
  size_t capacity = 1 << 20;
  size_t used = 0;
  std::map<void*, size_t> live;
  int synchronized = 0;
  std::vector<bool*> queued;  // Flags that a synchronisation sets (work done).
  RawAllocator raw() {
    return {[this](size_t bytes) -> absl::StatusOr<void*> {
              if (used + bytes > capacity) return absl::ResourceExhaustedError("out of memory");
              void* p = std::malloc(bytes);
              used += bytes;
              live[p] = bytes;
              return p;
            },
            [this](void* p) {
              used -= live.at(p);
              live.erase(p);
              std::free(p);
            },
            [this] {
              ++synchronized;
              for (bool* d : queued) *d = true;  // The queued work ran.
              return absl::OkStatus();
            }};
  }
};

TEST(CachingAllocatorTest, ReusesFreedBlocksInsteadOfAllocating) {
  FakeDevice dev;
  {
    CachingAllocator a(dev.raw());
    // A training step's pattern: the same sizes every step.
    for (int step = 0; step < 5; ++step) {
      auto x = a.Allocate(1000), y = a.Allocate(70000), z = a.Allocate(1000);
      ASSERT_TRUE(x.ok() && y.ok() && z.ok());
      EXPECT_NE(*x, *z);
      ASSERT_TRUE(a.Free(*x).ok());
      ASSERT_TRUE(a.Free(*y).ok());
      ASSERT_TRUE(a.Free(*z).ok());
    }
    EXPECT_EQ(a.stats().raw_allocations, 3u);  // Step 0 only.
    EXPECT_EQ(a.stats().cache_hits, 12u);
    EXPECT_EQ(a.stats().in_use_bytes, 0u);
    EXPECT_EQ(a.stats().cached_bytes, 2 * 1024 + 70144u);  // Rounded to 512 B.
  }
  EXPECT_TRUE(dev.live.empty()) << "the destructor returns every block";
}

TEST(CachingAllocatorTest, BestFitWithinBoundedWaste) {
  FakeDevice dev;
  CachingAllocator a(dev.raw());
  auto big = a.Allocate(100000), mid = a.Allocate(5000);
  ASSERT_TRUE(big.ok() && mid.ok());
  ASSERT_TRUE(a.Free(*big).ok());
  ASSERT_TRUE(a.Free(*mid).ok());
  auto fits = a.Allocate(4000);  // The 5120-byte block, not the 100 KB one.
  ASSERT_TRUE(fits.ok());
  EXPECT_EQ(*fits, *mid);
  auto small = a.Allocate(600);  // The big block would waste > 2x: a new block.
  ASSERT_TRUE(small.ok());
  EXPECT_NE(*small, *big);
  EXPECT_EQ(a.stats().raw_allocations, 3u);
}

TEST(CachingAllocatorTest, ReleasesTheCacheWhenOutOfMemory) {
  FakeDevice dev;
  dev.capacity = 10 * 1024;
  CachingAllocator a(dev.raw());
  auto x = a.Allocate(6 * 1024);
  ASSERT_TRUE(x.ok());
  ASSERT_TRUE(a.Free(*x).ok());
  EXPECT_EQ(dev.synchronized, 0);
  // 8 KiB does not fit beside the cached 6 KiB, and 6 KiB cannot serve it: the cache goes,
  // once queued work that may still use it is done.
  auto y = a.Allocate(8 * 1024);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(dev.synchronized, 1);
  EXPECT_EQ(a.stats().cached_bytes, 0u);
  auto z = a.Allocate(8 * 1024);  // Really out of memory now.
  EXPECT_EQ(z.status().code(), absl::StatusCode::kResourceExhausted);
}

// A block freed while another stream uses it is not handed out again until that use is
// done; out of memory, a synchronisation ends every use and the block can go.
TEST(CachingAllocatorTest, FreeWhenDefersReuseUntilDone) {
  FakeDevice dev;
  dev.capacity = 10 * 1024;
  CachingAllocator a(dev.raw());
  auto x = a.Allocate(4 * 1024);
  ASSERT_TRUE(x.ok());
  bool copy_done = false;
  dev.queued.push_back(&copy_done);
  ASSERT_TRUE(a.FreeWhen(*x, [&copy_done] { return copy_done; }).ok());
  EXPECT_EQ(a.stats().pending_bytes, 4u * 1024);
  auto y = a.Allocate(4 * 1024);  // Fits beside it: a new block, not the pending one.
  ASSERT_TRUE(y.ok());
  EXPECT_NE(*y, *x);
  ASSERT_TRUE(a.Free(*y).ok());
  copy_done = true;
  auto z = a.Allocate(4 * 1024);  // Now both are free; either serves.
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(a.stats().pending_bytes, 0u);
  EXPECT_EQ(a.stats().cache_hits, 1u);

  // Out of memory with a pending block: synchronise, then release it too.
  auto big = a.Allocate(1024);
  ASSERT_TRUE(big.ok());
  bool second_done = false;
  dev.queued = {&second_done};
  ASSERT_TRUE(a.FreeWhen(*big, [&second_done] { return second_done; }).ok());
  ASSERT_TRUE(a.Free(*z).ok());
  auto huge = a.Allocate(9 * 1024);
  ASSERT_TRUE(huge.ok()) << huge.status();
  EXPECT_TRUE(second_done) << "released only after a synchronisation";
  EXPECT_EQ(a.stats().pending_bytes, 0u);
}

TEST(CachingAllocatorTest, BadFreesAreErrors) {
  FakeDevice dev;
  CachingAllocator a(dev.raw());
  auto x = a.Allocate(10);
  ASSERT_TRUE(x.ok());
  ASSERT_TRUE(a.Free(*x).ok());
  EXPECT_EQ(a.Free(*x).code(), absl::StatusCode::kInvalidArgument);  // Double free.
  int local;
  EXPECT_EQ(a.Free(&local).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Allocate(0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cuda
}  // namespace dptrain
