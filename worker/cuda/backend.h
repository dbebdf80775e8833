// The CUDA backend as gpu_worker sees it: an interface with no CUDA in it, implemented by
// the shared library libdptrain_cuda.so (backend_plugin.cc), which gpu_worker loads with
// dlopen only when it looks for a GPU (worker/gpu_backend.h). So the same gpu_worker binary
// starts on a machine without CUDA's libraries, and a CPU run never maps cuBLAS or cuDNN.
#ifndef DPTRAIN_WORKER_CUDA_BACKEND_H_
#define DPTRAIN_WORKER_CUDA_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/graph/graph.h"
#include "worker/graph/graph_model.h"
#include "worker/nn/model.h"

namespace dptrain {
namespace cuda {

struct BackendOptions {
  std::string precision = "fp32";  // "fp32" | "fp16" | "bf16"
  bool tf32 = false;
  // Only deterministic cuDNN algorithms (PyTorch's cudnn.deterministic): the same inputs give
  // bitwise the same gradients every run, at some cost in speed.
  bool deterministic = false;
  // Held-data steps captured once as a CUDA graph and replayed (DeviceOptions::cuda_graphs).
  bool cuda_graphs = false;
  // The GPU to compute on: CUDA's index among the visible ones (after CUDA_VISIBLE_DEVICES),
  // as Probe and DeviceCount number them.
  int device = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // How many GPUs this process sees (cudaGetDeviceCount; 0 when the driver reports none).
  // Unavailable (naming the CUDA call) when CUDA cannot answer, e.g. with no or too old a
  // driver. Creates no context on any GPU.
  virtual absl::StatusOr<int> DeviceCount() = 0;

  // "GPU 1 is a NVIDIA H100 80GB HBM3 (sm_90)" after a kernel ran on GPU `device` (which it
  // leaves the calling thread's current device); Unavailable (naming the failing CUDA call)
  // when that GPU is not usable, InvalidArgument when there is no such GPU.
  virtual absl::StatusOr<std::string> Probe(int device) = 0;

  // A CudaModel (cuda_model.h). InvalidArgument for a bad model name, init or precision.
  virtual absl::StatusOr<std::unique_ptr<nn::Model>> CreateModel(const nn::ModelOptions& model,
                                                                 const BackendOptions& options) = 0;

  // A graph model (an ONNX file's, worker/graph/) on the GPU (CudaModel::CreateFromGraph):
  // one line naming the node for one without a CUDA version yet.
  virtual absl::StatusOr<std::unique_ptr<nn::Model>> CreateGraphModel(
      const graph::Graph& graph, const graph::GraphModelOptions& model,
      const BackendOptions& options) = 0;
};

}  // namespace cuda
}  // namespace dptrain

// The plugin's one entry point (C linkage, so that dlsym finds it by this name). The caller
// owns the result.
extern "C" dptrain::cuda::Backend* DptrainCreateCudaBackend();
inline constexpr char kDptrainCudaBackendSymbol[] = "DptrainCreateCudaBackend";

#endif  // DPTRAIN_WORKER_CUDA_BACKEND_H_
