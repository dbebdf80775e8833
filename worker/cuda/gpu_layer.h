// The CUDA backend's layer interface: worker/nn/layer.h's contract (same parameter and buffer
// layout, same Forward/Backward protocol) over device memory, every step returning a Status
// that names the CUDA, cuBLAS or cuDNN call that failed. Layers are made from the CPU
// network (gpu_network.h), so the models are defined once; constructing one touches no GPU.
//
// Buffers: a layer owns its output and input-gradient buffers (device memory from the
// context's caching allocator), grown to the largest batch seen and then reused.
#ifndef DPTRAIN_WORKER_CUDA_GPU_LAYER_H_
#define DPTRAIN_WORKER_CUDA_GPU_LAYER_H_

#include <cudnn.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/cuda/device_context.h"
#include "worker/nn/tensor.h"

namespace dptrain {
namespace cuda {

// `batch` samples of `dims` each, NCHW, in device memory. Not owned.
struct DeviceTensor {
  const float* data = nullptr;
  int batch = 0;
  nn::Dims dims;

  int64_t size() const { return int64_t{batch} * dims.size(); }
};

class GpuLayer {
 public:
  virtual ~GpuLayer() = default;

  virtual std::string ToString() const = 0;
  // As nn::Layer: what the parameters and buffers are and where they lie (device pointers).
  virtual std::vector<nn::TensorSpec> ParamSpecs() const { return {}; }
  virtual void BindParams(const float* params, float* grads) {}
  virtual std::vector<nn::TensorSpec> BufferSpecs() const { return {}; }
  virtual void BindBuffers(float* buffers) {}

  // As nn::Layer::Forward: the output is owned by the layer and valid until its next Forward;
  // `input` must stay valid until Backward returns.
  virtual absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, DeviceTensor input,
                                               bool training) = 0;
  // As nn::Layer::Backward: overwrites the bound gradients, returns d(loss)/d(input) (an empty
  // tensor when !need_input_grad).
  virtual absl::StatusOr<DeviceTensor> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                bool need_input_grad) = 0;
  // Forward and Backward on batches of one size enqueue the same work with the same arguments
  // every time (nothing read back to the host, no per-step value such as a dropout seed), so
  // a CUDA graph captured once may replay the step (step_graph.h).
  virtual bool Replayable() const { return true; }
};

// An NCHW float tensor descriptor, set to one shape at a time.
class TensorDescriptor {
 public:
  TensorDescriptor() = default;
  ~TensorDescriptor();
  TensorDescriptor(const TensorDescriptor&) = delete;
  TensorDescriptor& operator=(const TensorDescriptor&) = delete;

  absl::Status Set(int n, int c, int h, int w, cudnnDataType_t type = CUDNN_DATA_FLOAT);
  absl::Status Set(int batch, const nn::Dims& dims, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
    return Set(batch, dims.c, dims.h, dims.w, type);
  }
  cudnnTensorDescriptor_t get() const { return desc_; }

 private:
  cudnnTensorDescriptor_t desc_ = nullptr;
};

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_GPU_LAYER_H_
