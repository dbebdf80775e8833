// The CUDA backend as gpu_worker sees it: an interface with no CUDA in it, implemented by
// the shared library libdptrain_cuda.so (backend_plugin.cc), which gpu_worker loads with
// dlopen only when it looks for a GPU (worker/gpu_backend.h). So the same gpu_worker binary
// starts on a machine without CUDA's libraries, and a CPU run never maps cuBLAS or cuDNN.
#ifndef DPTRAIN_WORKER_CUDA_BACKEND_H_
#define DPTRAIN_WORKER_CUDA_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/nn/model.h"

namespace dptrain {
namespace cuda {

struct BackendOptions {
  std::string precision = "fp32";  // "fp32" | "fp16" | "bf16"
  bool tf32 = false;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "GPU 0 is a NVIDIA H100 80GB HBM3 (sm_90)" after a kernel ran on it; Unavailable (naming
  // the failing CUDA call) without a usable GPU.
  virtual absl::StatusOr<std::string> Probe() = 0;

  // A CudaModel (cuda_model.h). InvalidArgument for a bad model name, init or precision.
  virtual absl::StatusOr<std::unique_ptr<nn::Model>> CreateModel(
      const nn::ModelOptions& model, const BackendOptions& options) = 0;
};

}  // namespace cuda
}  // namespace dptrain

// The plugin's one entry point (C linkage, so that dlsym finds it by this name). The caller
// owns the result.
extern "C" dptrain::cuda::Backend* DptrainCreateCudaBackend();
inline constexpr char kDptrainCudaBackendSymbol[] = "DptrainCreateCudaBackend";

#endif  // DPTRAIN_WORKER_CUDA_BACKEND_H_
