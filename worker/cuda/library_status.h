// cuBLAS and cuDNN calls checked like the runtime's (cuda_status.h): a failure becomes a
// Status that names the call and the library's own name for the error.
#ifndef DPTRAIN_WORKER_CUDA_LIBRARY_STATUS_H_
#define DPTRAIN_WORKER_CUDA_LIBRARY_STATUS_H_

#include <cublas_v2.h>
#include <cudnn.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/cuda/cuda_status.h"

namespace dptrain {

inline absl::Status CublasStatus(cublasStatus_t status, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": ", cublasGetStatusName(status), ": ",
                                          cublasGetStatusString(status)));
}

inline absl::Status CudnnStatus(cudnnStatus_t status, const char* call) {
  if (status == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": ", cudnnGetErrorString(status)));
}

}  // namespace dptrain

#define DPTRAIN_CUBLAS_RETURN_IF_ERROR(call)                                  \
  do {                                                                        \
    if (::absl::Status _s = ::dptrain::CublasStatus((call), #call); !_s.ok()) \
      return _s;                                                              \
  } while (0)

#define DPTRAIN_CUDNN_RETURN_IF_ERROR(call)                                  \
  do {                                                                       \
    if (::absl::Status _s = ::dptrain::CudnnStatus((call), #call); !_s.ok()) \
      return _s;                                                             \
  } while (0)

#endif  // DPTRAIN_WORKER_CUDA_LIBRARY_STATUS_H_
