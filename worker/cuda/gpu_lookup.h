// The twin of an embedding lookup (Gather of a table of the model by computed ids: nn.Embedding;
// graph/any_shape_ops.h): each step copies the ids to the host, refuses ids that are not rows
// of the table with the CPU node's own message (CheckInputs), and lists each distinct row's
// lookups (graph::ReadersOfRows); the forward is a gather of rows, the backward zeroes the
// table's gradient and writes each looked-up row's, summed in the CPU's order (the padding row
// left at zero). Each step waits for the stream: to copy the ids down and the readers up.
#ifndef DPTRAIN_WORKER_CUDA_GPU_LOOKUP_H_
#define DPTRAIN_WORKER_CUDA_GPU_LOOKUP_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/cuda/gpu_graph.h"

namespace dptrain {
namespace cuda {

absl::StatusOr<std::unique_ptr<GpuNode>> MakeLookupTwin(const GpuNodeContext& ctx);

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_GPU_LOOKUP_H_
