// cudaMalloc / cudaFree as the CachingAllocator's raw allocator (current device).
#ifndef DPTRAIN_WORKER_CUDA_CUDA_RAW_ALLOCATOR_H_
#define DPTRAIN_WORKER_CUDA_CUDA_RAW_ALLOCATOR_H_

#include "worker/cuda/caching_allocator.h"

namespace dptrain {
namespace cuda {

// Out of device memory is ResourceExhausted (so the caching allocator releases its cache
// and retries); any other failure is the Status naming cudaMalloc.
RawAllocator CudaRawAllocator();

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_CUDA_RAW_ALLOCATOR_H_
