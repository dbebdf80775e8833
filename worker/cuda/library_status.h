// cuBLAS and cuDNN calls checked like the runtime's (cuda_status.h): a failure becomes a
// Status that names the call and the library's own name for the error.
#ifndef DPTRAIN_WORKER_CUDA_LIBRARY_STATUS_H_
#define DPTRAIN_WORKER_CUDA_LIBRARY_STATUS_H_

#include <cublas_v2.h>
#include <cudnn.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
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

// Any Status-returning expression.
#define DPTRAIN_RETURN_IF_ERROR(expr)                   \
  do {                                                  \
    if (::absl::Status _s = (expr); !_s.ok()) return _s; \
  } while (0)

// For StatusOr-returning helpers: `lhs` = value or return its status.
#define DPTRAIN_ASSIGN_OR_RETURN(lhs, expr)         \
  auto DPTRAIN_CONCAT(_statusor_, __LINE__) = (expr); \
  if (!DPTRAIN_CONCAT(_statusor_, __LINE__).ok())   \
    return DPTRAIN_CONCAT(_statusor_, __LINE__).status(); \
  lhs = *std::move(DPTRAIN_CONCAT(_statusor_, __LINE__))
#define DPTRAIN_CONCAT_INNER(a, b) a##b
#define DPTRAIN_CONCAT(a, b) DPTRAIN_CONCAT_INNER(a, b)

#endif  // DPTRAIN_WORKER_CUDA_LIBRARY_STATUS_H_
