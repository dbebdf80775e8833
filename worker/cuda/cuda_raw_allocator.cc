#include "worker/cuda/cuda_raw_allocator.h"

#include "worker/cuda/cuda_status.h"

namespace dptrain {
namespace cuda {

RawAllocator CudaRawAllocator() {
  return {[](size_t bytes) -> absl::StatusOr<void*> {
            void* p = nullptr;
            const cudaError_t e = cudaMalloc(&p, bytes);
            if (e == cudaErrorMemoryAllocation) {
              cudaGetLastError();  // Reset the last-error state for later checks.
              return absl::ResourceExhaustedError(
                  absl::StrCat("cudaMalloc(", bytes, " bytes): out of device memory"));
            }
            if (absl::Status s = CudaStatus(e, "cudaMalloc"); !s.ok()) return s;
            return p;
          },
          [](void* p) { cudaFree(p); },
          [] { return CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }};
}

}  // namespace cuda
}  // namespace dptrain
