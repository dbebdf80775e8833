// The caching allocator over real device memory. Skips (visibly) without a GPU.
#include "worker/cuda/cuda_raw_allocator.h"

#include <vector>

#include "gtest/gtest.h"
#include "worker/cuda/cuda_status.h"

namespace dptrain {
namespace cuda {
namespace {

TEST(CudaRawAllocatorTest, CachesDeviceMemoryAcrossSteps) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    GTEST_SKIP() << "no usable GPU here (" << cudaGetErrorString(e)
                 << "); device memory was not exercised";
  }
  CachingAllocator a(CudaRawAllocator());
  std::vector<float> host(1 << 20, 1.5f), back(1 << 20);
  for (int step = 0; step < 3; ++step) {
    auto p = a.Allocate(host.size() * sizeof(float));
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_EQ(cudaMemcpy(*p, host.data(), host.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(back.data(), *p, back.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(back, host);
    ASSERT_TRUE(a.Free(*p).ok());
  }
  EXPECT_EQ(a.stats().raw_allocations, 1u);
  // Far more than any GPU has: a clean ResourceExhausted, and the device still works.
  EXPECT_EQ(a.Allocate(size_t{1} << 50).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(a.Allocate(1024).ok());
}

}  // namespace
}  // namespace cuda
}  // namespace dptrain
