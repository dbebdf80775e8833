// What the backend's .cu files share to launch element-wise kernels: the block size, a grid
// big enough for n elements (capped: the grid-stride loops cover the rest), the loop, and the
// Status of a launch. Included by .cu files only.
#ifndef DPTRAIN_WORKER_CUDA_KERNEL_LAUNCH_H_
#define DPTRAIN_WORKER_CUDA_KERNEL_LAUNCH_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "worker/cuda/cuda_status.h"

namespace dptrain {
namespace cuda {

constexpr int kThreads = 256;

inline int Blocks(int64_t n) {
  return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
}

// The Status of the launch just enqueued.
inline absl::Status Launched(const char* what) { return CudaStatus(cudaGetLastError(), what); }

#define DPTRAIN_GRID_STRIDE(i, n)                                           \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{blockDim.x} * gridDim.x)

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_KERNEL_LAUNCH_H_
