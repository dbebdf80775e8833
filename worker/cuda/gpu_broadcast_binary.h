// The twin of Add, Sub, Mul, Div, Max and Min on values of any shape with NumPy broadcasting
// (graph/any_shape_ops.h; the CPU node's OperandIndices and TwinSpec): the other operand is a
// computed value (same shape, or broadcast along its size-1 axes, or without a batch), a tensor
// of the model (learned, a buffer, held) or a scalar. The arithmetic is graph/binary_elements.h,
// the CPU node's; the operand's gradient is summed over its readers in the CPU's order.
#ifndef DPTRAIN_WORKER_CUDA_GPU_BROADCAST_BINARY_H_
#define DPTRAIN_WORKER_CUDA_GPU_BROADCAST_BINARY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/cuda/gpu_graph.h"

namespace dptrain {
namespace cuda {

absl::StatusOr<std::unique_ptr<GpuNode>> MakeBroadcastBinaryTwin(const GpuNodeContext& ctx);

// Where (cond ? a : b; masked_fill): the computed inputs share the output's shape, the
// constants are broadcast to it once per batch size (the CPU node's BroadcastConstants) and kept
// on the device; the gradient goes to a computed a where cond holds, to a computed b elsewhere.
absl::StatusOr<std::unique_ptr<GpuNode>> MakeWhereTwin(const GpuNodeContext& ctx);

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_GPU_BROADCAST_BINARY_H_
