// The CUDA twin of a CPU network: every layer of an nn::Sequential<float> (the models of
// worker/nn/architectures.h, defined once) becomes the GpuLayer with the same options, so
// the parameter and buffer layouts, names included, are the CPU model's. Touches no GPU.
#ifndef DPTRAIN_WORKER_CUDA_GPU_NETWORK_H_
#define DPTRAIN_WORKER_CUDA_GPU_NETWORK_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/cuda/gpu_layers.h"
#include "worker/nn/layer.h"
#include "worker/nn/sequential.h"

namespace dptrain {
namespace cuda {

// The GpuLayer for `layer` taking per-sample `input` dims. Unimplemented naming the layer
// for a kind the CUDA backend lacks.
absl::StatusOr<std::unique_ptr<GpuLayer>> ToGpu(const nn::Layer<float>& layer,
                                                const nn::Dims& input);

// The whole network as one GpuSequentialBlock; its ParamSpecs()/BufferSpecs() list the
// CPU network's tensors in the same order (names "<layer>.<name>").
absl::StatusOr<std::unique_ptr<GpuSequentialBlock>> ToGpu(const nn::Sequential<float>& net);

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_GPU_NETWORK_H_
