#include <vector>

#include "worker/cuda/cuda_status.h"
#include "worker/cuda/device_probe.h"

namespace dptrain {
namespace {

__global__ void Saxpy(int n, float a, const float* x, float* y) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

// y = 2x + y on the device, compared with the same on the host.
absl::Status RunSmokeKernel() {
  constexpr int n = 1000;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = 1.0f;
  }
  float *dx = nullptr, *dy = nullptr;
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMalloc(&dx, n * sizeof(float)));
  absl::Status s = CudaStatus(cudaMalloc(&dy, n * sizeof(float)), "cudaMalloc(&dy)");
  if (s.ok()) {
    s = CudaStatus(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice),
                   "cudaMemcpy(x)");
  }
  if (s.ok()) {
    s = CudaStatus(cudaMemcpy(dy, y.data(), n * sizeof(float), cudaMemcpyHostToDevice),
                   "cudaMemcpy(y)");
  }
  if (s.ok()) {
    Saxpy<<<(n + 255) / 256, 256>>>(n, 2.0f, dx, dy);
    s = CudaStatus(cudaGetLastError(), "Saxpy<<<>>>");
  }
  if (s.ok()) {
    s = CudaStatus(cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost),
                   "cudaMemcpy(result)");
  }
  cudaFree(dx);
  cudaFree(dy);
  if (!s.ok()) return s;
  for (int i = 0; i < n; ++i) {
    if (y[i] != 2.0f * i + 1.0f) {
      return absl::InternalError(absl::StrCat("smoke kernel: y[", i, "] = ", y[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> VisibleGpuCount() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorNoDevice) {
    (void)cudaGetLastError();  // Not left for the next call's cudaGetLastError to report.
    return 0;
  }
  if (absl::Status s = CudaStatus(e, "cudaGetDeviceCount(&count)"); !s.ok()) return s;
  return count;
}

absl::StatusOr<GpuInfo> ProbeGpu(int device) {
  absl::StatusOr<int> count = VisibleGpuCount();
  if (!count.ok()) return count.status();
  if (*count < 1) return absl::UnavailableError("cudaGetDeviceCount: no CUDA device");
  if (device < 0 || device >= *count) {
    return absl::InvalidArgumentError(
        absl::StrCat("no GPU ", device, " (", *count, *count == 1 ? " GPU" : " GPUs", " visible)"));
  }
  cudaDeviceProp prop;
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device));
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  if (absl::Status s = RunSmokeKernel(); !s.ok()) return s;
  GpuInfo info;
  info.device = device;
  info.name = prop.name;
  info.compute_capability = prop.major * 10 + prop.minor;
  info.memory_bytes = prop.totalGlobalMem;
  return info;
}

}  // namespace dptrain
