// The CUDA twins of the graph ops that move elements without arithmetic (gpu_graph.h):
// Concat over the channels, Slice (one axis: cudaMemcpy2DAsync) and ChannelShuffle (a
// permutation kernel), registered by GpuOps() (gpu_graph_ops.cc); and the moves of values of
// any shape as one gather (MakeMoveTwin, chosen by GpuGraph::Create for such nodes).
#ifndef DPTRAIN_WORKER_CUDA_GPU_MOVEMENT_OPS_H_
#define DPTRAIN_WORKER_CUDA_GPU_MOVEMENT_OPS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/cuda/gpu_graph.h"

namespace dptrain {
namespace cuda {

absl::StatusOr<std::unique_ptr<GpuNode>> MakeConcatTwin(const GpuNodeContext& ctx);
absl::StatusOr<std::unique_ptr<GpuNode>> MakeSliceTwin(const GpuNodeContext& ctx);
absl::StatusOr<std::unique_ptr<GpuNode>> MakeChannelShuffleTwin(const GpuNodeContext& ctx);
// Any node whose CPU twin says where each output element comes from (NodeImpl::ElementSources:
// Transpose, Gather by constant indices, Slice, Concat, Pad, Expand of values of any shape).
absl::StatusOr<std::unique_ptr<GpuNode>> MakeMoveTwin(const GpuNodeContext& ctx);

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_GPU_MOVEMENT_OPS_H_
