#include "worker/cuda/device_context.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/cuda/cuda_raw_allocator.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/library_status.h"

namespace dptrain {
namespace cuda {

const char* PrecisionName(Precision p) {
  switch (p) {
    case Precision::kFp16:
      return "fp16";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp32:
      break;
  }
  return "fp32";
}

absl::StatusOr<std::unique_ptr<DeviceContext>> DeviceContext::Create(
    const DeviceOptions& options) {
  std::unique_ptr<DeviceContext> ctx(new DeviceContext(options));
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  cudaDeviceProp prop;
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, options.device));
  ctx->device_name_ = absl::StrCat(prop.name, " (sm_", prop.major, prop.minor, ")");
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&ctx->stream_, cudaStreamNonBlocking));
  DPTRAIN_CUBLAS_RETURN_IF_ERROR(cublasCreate(&ctx->cublas_));
  DPTRAIN_CUBLAS_RETURN_IF_ERROR(cublasSetStream(ctx->cublas_, ctx->stream_));
  // Strict fp32 unless TF32 was asked for: cuBLAS's default math does not round fp32
  // through TF32 (PyTorch's allow_tf32 = False).
  DPTRAIN_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(
      ctx->cublas_, options.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnCreate(&ctx->cudnn_));
  DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnSetStream(ctx->cudnn_, ctx->stream_));
  ctx->allocator_ = std::make_unique<CachingAllocator>(CudaRawAllocator());
  return ctx;
}

DeviceContext::~DeviceContext() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (workspace_ != nullptr) (void)allocator_->Free(workspace_);
  allocator_.reset();
  if (cudnn_ != nullptr) cudnnDestroy(cudnn_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::StatusOr<void*> DeviceContext::Workspace(size_t bytes) {
  if (bytes <= workspace_bytes_) return workspace_;
  if (workspace_ != nullptr) DPTRAIN_RETURN_IF_ERROR(allocator_->Free(workspace_));
  workspace_ = nullptr;
  workspace_bytes_ = 0;
  absl::StatusOr<void*> p = allocator_->Allocate(bytes);
  if (!p.ok()) return p.status();
  workspace_ = *p;
  workspace_bytes_ = bytes;
  return workspace_;
}

absl::Status DeviceContext::Synchronize() {
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CopyOnDevice(DeviceContext& ctx, float* to, const float* from, int64_t count) {
  if (count <= 0 || to == from) return absl::OkStatus();
  DPTRAIN_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(to, from, count * sizeof(float), cudaMemcpyDeviceToDevice, ctx.stream()));
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace dptrain
