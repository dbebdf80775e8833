// The twin of MatMul of two computed values [..., m, k] x [..., k, n] with the same leading axes
// (attention's q k^T and its product with v; graph/any_shape_ops.h): one strided batched cuBLAS
// product forward, two backward, in fp32 (TF32 where the device context allows it) whatever
// the model's precision.
#ifndef DPTRAIN_WORKER_CUDA_GPU_BATCHED_MATMUL_H_
#define DPTRAIN_WORKER_CUDA_GPU_BATCHED_MATMUL_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/cuda/gpu_graph.h"

namespace dptrain {
namespace cuda {

absl::StatusOr<std::unique_ptr<GpuNode>> MakeBatchedMatMulTwin(const GpuNodeContext& ctx);

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_GPU_BATCHED_MATMUL_H_
