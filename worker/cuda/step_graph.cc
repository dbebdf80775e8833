#include "worker/cuda/step_graph.h"

#include "worker/cuda/cuda_status.h"

namespace dptrain {
namespace cuda {

absl::Status StepGraph::Capture(cudaStream_t stream, const std::function<absl::Status()>& enqueue) {
  Reset();
  // Thread-local: another thread's CUDA calls (a second model in the process) cannot break
  // this capture, while a call of this thread that capture does not allow fails it.
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status enqueued = enqueue();
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  (void)cudaGetLastError();  // A launch refused during the capture is reported below.
  if (!enqueued.ok() || ended != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return enqueued.ok() ? CudaStatus(ended, "cudaStreamEndCapture") : enqueued;
  }
  cudaGraphExec_t exec = nullptr;
  if (const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0); made != cudaSuccess) {
    cudaGraphDestroy(graph);
    return CudaStatus(made, "cudaGraphInstantiate");
  }
  graph_ = graph;
  exec_ = exec;
  return absl::OkStatus();
}

absl::Status StepGraph::Launch(cudaStream_t stream) {
  if (exec_ == nullptr) return absl::FailedPreconditionError("no step graph captured");
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec_, stream));
  return absl::OkStatus();
}

void StepGraph::Reset() {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  if (graph_ != nullptr) cudaGraphDestroy(graph_);
  exec_ = nullptr;
  graph_ = nullptr;
}

}  // namespace cuda
}  // namespace dptrain
