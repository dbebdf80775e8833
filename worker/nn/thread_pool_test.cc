#include "worker/nn/thread_pool.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"

namespace dptrain {
namespace nn {
namespace {

TEST(ThreadPoolTest, ParallelForCoversEveryIndexOnceInStaticChunks) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 2, 3, 7, 100}) {
    std::vector<int> hits(n, 0), owner(n, -1);
    ParallelFor(&pool, n, [&](int64_t begin, int64_t end, int t) {
      for (int64_t i = begin; i < end; ++i) {
        ++hits[i];
        owner[i] = t;
      }
    });
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(hits[i], 1) << "n " << n << " i " << i;
      EXPECT_GE(owner[i], 0);
      EXPECT_LT(owner[i], 3);
    }
  }
}

TEST(ThreadPoolTest, RunsEveryChunkOnceRepeatedly) {
  ThreadPool pool(4);
  for (int round = 0; round < 500; ++round) {
    std::vector<std::atomic<int>> hits(1 + round % 17);
    pool.Run(static_cast<int64_t>(hits.size()), [&](int64_t c, int t) {
      ASSERT_GE(t, 0);
      ASSERT_LT(t, 4);
      hits[c].fetch_add(1);
    });
    for (size_t c = 0; c < hits.size(); ++c) ASSERT_EQ(hits[c].load(), 1) << "round " << round;
  }
}

TEST(ThreadPoolTest, NestedRegionRunsSerially) {
  ThreadPool pool(2);
  std::atomic<int> inner{0};
  pool.Run(2, [&](int64_t, int) {
    ParallelFor(&pool, 10, [&](int64_t begin, int64_t end, int) {
      inner.fetch_add(static_cast<int>(end - begin));
    });
  });
  EXPECT_EQ(inner.load(), 20);
}

TEST(ThreadPoolTest, NullPoolRunsOnCaller) {
  int calls = 0;
  ParallelFor(nullptr, 5, [&](int64_t begin, int64_t end, int t) {
    EXPECT_EQ(begin, 0);
    EXPECT_EQ(end, 5);
    EXPECT_EQ(t, 0);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace nn
}  // namespace dptrain
