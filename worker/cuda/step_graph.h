// One training step captured as a CUDA graph and replayed (issue 28's "CUDA graphs"): the
// launches of a step (gather, forward, loss, backward: hundreds of kernels and cuDNN/cuBLAS
// calls for a ResNet) become one cudaGraphLaunch, so the host no longer pays each launch.
//
// A replay runs exactly the captured work on exactly the captured addresses and arguments.
// The caller therefore captures only a step whose work is the same every time (nothing read
// back to the host, no per-step value such as a dropout seed: GpuLayer::Replayable), after an
// eager step of the same batch has grown every buffer and chosen every algorithm, and drops
// the graph (Reset) before anything may move a buffer the graph reads or writes (an eager
// step, which may grow buffers or the cuDNN workspace; new held data).
#ifndef DPTRAIN_WORKER_CUDA_STEP_GRAPH_H_
#define DPTRAIN_WORKER_CUDA_STEP_GRAPH_H_

#include <cuda_runtime_api.h>

#include <functional>

#include "absl/status/status.h"

namespace dptrain {
namespace cuda {

class StepGraph {
 public:
  StepGraph() = default;
  ~StepGraph() { Reset(); }
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Captures what `enqueue` puts on `stream` (nothing runs: Launch runs it) and instantiates
  // it. On any failure (`enqueue`'s, or a call that capture does not allow, e.g. a copy read
  // back and waited for) the stream is out of capture again, nothing is kept, and the error is
  // returned; the caller then runs the step eagerly.
  absl::Status Capture(cudaStream_t stream, const std::function<absl::Status()>& enqueue);
  // Enqueues the captured work on `stream`. FailedPrecondition before a Capture.
  absl::Status Launch(cudaStream_t stream);
  bool ready() const { return exec_ != nullptr; }
  // Drops the graph (a Launch already enqueued still runs).
  void Reset();

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_STEP_GRAPH_H_
