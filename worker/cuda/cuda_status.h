// Every CUDA runtime call is checked and turned into a Status that names the call
// (NCCL's CUDACHECK idea, with a real Status). Only worker/cuda/ includes CUDA headers.
#ifndef DPTRAIN_WORKER_CUDA_CUDA_STATUS_H_
#define DPTRAIN_WORKER_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dptrain {

inline absl::Status CudaStatus(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat(call, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error)));
}

}  // namespace dptrain

// Returns from the enclosing function with a Status naming `call` if it fails.
#define DPTRAIN_CUDA_RETURN_IF_ERROR(call)                                  \
  do {                                                                      \
    if (::absl::Status _s = ::dptrain::CudaStatus((call), #call); !_s.ok()) \
      return _s;                                                            \
  } while (0)

#endif  // DPTRAIN_WORKER_CUDA_CUDA_STATUS_H_
