// The twin of ReduceMean, ReduceSum, ReduceMax, ReduceMin and ReduceL2 over axes other than the
// batch's (graph/any_shape_ops.h; the CPU node's ReducedIndices and TwinSpec::reduction): each
// output element over its inputs in the CPU's order (graph/reduce_elements.h), each input's
// gradient from the output it adds into. And TopK's.
#ifndef DPTRAIN_WORKER_CUDA_GPU_REDUCE_H_
#define DPTRAIN_WORKER_CUDA_GPU_REDUCE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/cuda/gpu_graph.h"
#include "worker/graph/value_shape.h"

namespace dptrain {
namespace cuda {

absl::StatusOr<std::unique_ptr<GpuNode>> MakeReduceTwin(const GpuNodeContext& ctx);

// TopK along an axis other than the batch's (TwinSpec::topk) of an input of shape `in`: one
// thread per row picks the k elements in PyTorch's order (graph/reduce_elements.h's TopKNext,
// O(k n) per row); the gradient goes to the elements taken.
absl::StatusOr<std::unique_ptr<GpuNode>> MakeTopKTwin(const GpuNodeContext& ctx,
                                                      const graph::ValueShape& in);

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_GPU_REDUCE_H_
