// The twin of a node applied to each row of its input's last axis (graph::TwinSpec::rowwise:
// Gemm/MatMul of a weight, LayerNormalization, Softmax and LogSoftmax over the last axis of a
// [B, T, D] or sequence-first value): the registry's twin of the node built for one row, run on
// the value viewed as [rows, D] (the rows as its batch), the output seen in its whole shape.
#ifndef DPTRAIN_WORKER_CUDA_GPU_ROWWISE_H_
#define DPTRAIN_WORKER_CUDA_GPU_ROWWISE_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "worker/cuda/gpu_graph.h"

namespace dptrain {
namespace cuda {

// `ctx.cpu` is the rowwise node; `row` its input's last axis.
absl::StatusOr<std::unique_ptr<GpuNode>> MakeRowwiseTwin(const GpuNodeContext& ctx, int64_t row,
                                                         const GpuOpRegistry& registry);

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_GPU_ROWWISE_H_
