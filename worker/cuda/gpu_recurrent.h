// The twin of one nn.LSTM or nn.GRU layer (TorchLSTM, TorchGRU: graph/recurrent_ops.h), one or
// two directions, with or without biases and each sample's length, any of its outputs. Per
// direction: the input's product with W_ih for every time step in one cuBLAS product; then step
// by step the previous h's product with W_hh and a kernel running the cell (graph/
// recurrent_cells.h, as the CPU node). Backward runs back through time the same way and takes
// the weights' gradients, d(input) and the biases' in one product each over all steps. With
// lengths, each Forward copies them to the host and refuses them with the CPU node's message
// (CheckInputs): one wait for the stream per step.
#ifndef DPTRAIN_WORKER_CUDA_GPU_RECURRENT_H_
#define DPTRAIN_WORKER_CUDA_GPU_RECURRENT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/cuda/gpu_graph.h"

namespace dptrain {
namespace cuda {

absl::StatusOr<std::unique_ptr<GpuNode>> MakeRecurrentTwin(const GpuNodeContext& ctx);

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_GPU_RECURRENT_H_
