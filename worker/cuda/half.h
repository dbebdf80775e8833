// The 16-bit side of mixed precision: library type tags and float <-> fp16/bf16 casts for a
// Precision (device_context.h). 16-bit values are raw uint16_t patterns in device memory.
#ifndef DPTRAIN_WORKER_CUDA_HALF_H_
#define DPTRAIN_WORKER_CUDA_HALF_H_

#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <library_types.h>

#include <cstdint>

#include "absl/status/status.h"
#include "worker/cuda/device_context.h"
#include "worker/cuda/kernels.h"

namespace dptrain {
namespace cuda {

inline bool IsHalf(Precision p) { return p != Precision::kFp32; }

inline cudnnDataType_t CudnnType(Precision p) {
  return p == Precision::kFp16   ? CUDNN_DATA_HALF
         : p == Precision::kBf16 ? CUDNN_DATA_BFLOAT16
                                 : CUDNN_DATA_FLOAT;
}

inline cudaDataType_t CublasType(Precision p) {
  return p == Precision::kFp16 ? CUDA_R_16F : p == Precision::kBf16 ? CUDA_R_16BF : CUDA_R_32F;
}

// y = x rounded to `p` (fp16 or bf16), n elements.
inline absl::Status ToHalf(Precision p, const float* x, uint16_t* y, int64_t n,
                           cudaStream_t stream) {
  return p == Precision::kBf16 ? FloatToBf16(x, y, n, stream) : FloatToHalf(x, y, n, stream);
}

// y = x widened to fp32.
inline absl::Status FromHalf(Precision p, const uint16_t* x, float* y, int64_t n,
                             cudaStream_t stream) {
  return p == Precision::kBf16 ? Bf16ToFloat(x, y, n, stream) : HalfToFloat(x, y, n, stream);
}

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_HALF_H_
