#include "worker/cuda/caching_allocator.h"

#include <cstdlib>
#include <set>

#include "gtest/gtest.h"

namespace dptrain {
namespace cuda {
namespace {

// A raw allocator over malloc with a capacity, counting what it holds.
struct FakeDevice {
  size_t capacity = 1 << 20;
  size_t used = 0;
  std::map<void*, size_t> live;
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
  // 8 KiB does not fit beside the cached 6 KiB, and 6 KiB cannot serve it: the cache goes.
  auto y = a.Allocate(8 * 1024);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_EQ(a.stats().cached_bytes, 0u);
  auto z = a.Allocate(8 * 1024);  // Really out of memory now.
  EXPECT_EQ(z.status().code(), absl::StatusCode::kResourceExhausted);
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
