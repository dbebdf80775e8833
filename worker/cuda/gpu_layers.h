// The CUDA layers, one per CPU layer of worker/nn (same options, names and layouts):
// Linear (cuBLAS), Conv2d (cuDNN, algorithms found once per batch size), BatchNorm2d,
// activations and pooling (cuDNN; ReLU by our kernel), Flatten, and the blocks
// (SequentialBlock, d2l's Residual).
#ifndef DPTRAIN_WORKER_CUDA_GPU_LAYERS_H_
#define DPTRAIN_WORKER_CUDA_GPU_LAYERS_H_

#include <cudnn.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/cuda/gpu_layer.h"
#include "worker/cuda/graph_kernels.h"
#include "worker/nn/conv2d.h"
#include "worker/nn/pool2d_options.h"
#include "worker/nn/residual.h"

namespace dptrain {
namespace cuda {

// y = x W^T + b over flattened samples; W is [out, in] as nn.Linear's. In fp16/bf16 the
// products take 16-bit copies of x, W and dy (cublasGemmEx) and write fp32.
class GpuLinear final : public GpuLayer {
 public:
  GpuLinear(int in_features, int out_features) : in_(in_features), out_(out_features) {}
  std::string ToString() const override;
  std::vector<nn::TensorSpec> ParamSpecs() const override;
  void BindParams(const float* params, float* grads) override;
  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, DeviceTensor input,
                                       bool training) override;
  absl::StatusOr<DeviceTensor> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                        bool need_input_grad) override;

 private:
  const int in_;
  const int out_;
  const float* w_ = nullptr;
  float* dw_ = nullptr;
  absl::Status Gemm(DeviceContext& ctx, bool trans_a, bool trans_b, int m, int n, int k,
                    const void* a, int lda, const void* b, int ldb, float* c, int ldc);

  DeviceTensor input_;
  DeviceBuffer<float> output_;
  DeviceBuffer<float> grad_input_;
  DeviceBuffer<uint16_t> x_half_, w_half_, dy_half_;  // fp16/bf16 only
  TensorDescriptor y_desc_;                           // batch x out x 1 x 1
  TensorDescriptor bias_desc_;                        // 1 x out x 1 x 1
};

// Cross-correlation with bias, as nn.Conv2d; weight [out, in, kh, kw]. In fp16/bf16 the
// convolutions run on 16-bit copies of x, W and dy with fp32 accumulation (cuDNN's
// pseudo-half configurations need every tensor in one type, so y, dx and dW come out in 16
// bits, as under PyTorch's autocast) and are widened to fp32; the bias stays fp32. An fp16
// dW overflows when scale * |dW| > 65504: the loss scaler's business.
class GpuConv2d final : public GpuLayer {
 public:
  // `groups` > 1: grouped (depthwise when groups == in_channels) as nn.Conv2d(groups=g), by
  // cuDNN's group count; the weight is then [out, in / groups, kh, kw].
  GpuConv2d(const nn::Conv2dOptions& options, const nn::Dims& input, const nn::Dims& output,
            int groups = 1)
      : o_(options), in_dims_(input), out_dims_(output), groups_(groups) {}
  ~GpuConv2d() override;
  std::string ToString() const override;
  std::vector<nn::TensorSpec> ParamSpecs() const override;
  void BindParams(const float* params, float* grads) override;
  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, DeviceTensor input,
                                       bool training) override;
  absl::StatusOr<DeviceTensor> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                        bool need_input_grad) override;

 private:
  // The descriptors and the algorithms (with their workspace sizes) for one batch size.
  struct Plan {
    cudnnConvolutionFwdAlgo_t fwd;
    cudnnConvolutionBwdDataAlgo_t bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter;
    size_t fwd_bytes = 0, bwd_data_bytes = 0, bwd_filter_bytes = 0;
    cudnnMathType_t fwd_math, bwd_data_math, bwd_filter_math;
  };
  absl::Status Describe(DeviceContext& ctx);  // Once: filter, convolution, bias descriptors.
  absl::StatusOr<const Plan*> PlanFor(DeviceContext& ctx, int batch);

  int64_t weight_size() const {
    return int64_t{o_.out_channels} * (o_.in_channels / groups_) * o_.kernel_h * o_.kernel_w;
  }

  const nn::Conv2dOptions o_;
  const nn::Dims in_dims_;
  const nn::Dims out_dims_;
  const int groups_;
  const float* w_ = nullptr;
  float* dw_ = nullptr;
  DeviceTensor input_;
  DeviceBuffer<float> output_;
  DeviceBuffer<float> grad_input_;
  // fp16/bf16 only: the 16-bit operands and results.
  DeviceBuffer<uint16_t> x_half_, w_half_, y_half_, dy_half_, dw_half_, dx_half_;
  TensorDescriptor y32_desc_;  // The fp32 output, for the bias.
  cudnnFilterDescriptor_t filter_ = nullptr;
  // One convolution descriptor per direction: each carries the math type of its algorithm.
  cudnnConvolutionDescriptor_t conv_fwd_ = nullptr;
  cudnnConvolutionDescriptor_t conv_bwd_data_ = nullptr;
  cudnnConvolutionDescriptor_t conv_bwd_filter_ = nullptr;
  TensorDescriptor bias_desc_;
  TensorDescriptor x_desc_;
  TensorDescriptor y_desc_;
  int described_batch_ = 0;  // Batch x_desc_/y_desc_ are set to.
  std::map<int, Plan> plans_;
};

// nn.BatchNorm2d (eps 1e-5, momentum 0.1): batch statistics in training, running ones in
// evaluation. Buffers running_mean, running_var, num_batches_tracked as the CPU layer's;
// num_batches_tracked is counted by the model (host side), not here.
class GpuBatchNorm2d final : public GpuLayer {
 public:
  // eps and momentum as nn::BatchNorm2d's (PyTorch's meaning and defaults).
  explicit GpuBatchNorm2d(int channels, double eps = 1e-5, double momentum = 0.1)
      : c_(channels), eps_(eps), momentum_(momentum) {}
  std::string ToString() const override;
  std::vector<nn::TensorSpec> ParamSpecs() const override;
  void BindParams(const float* params, float* grads) override;
  std::vector<nn::TensorSpec> BufferSpecs() const override;
  void BindBuffers(float* buffers) override;
  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, DeviceTensor input,
                                       bool training) override;
  absl::StatusOr<DeviceTensor> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                        bool need_input_grad) override;

 private:
  const int c_;
  const double eps_;
  const double momentum_;
  const float* params_ = nullptr;  // weight [c], bias [c]
  float* grads_ = nullptr;
  float* buffers_ = nullptr;  // running_mean [c], running_var [c], num_batches_tracked []
  DeviceTensor input_;
  DeviceBuffer<float> output_;
  DeviceBuffer<float> grad_input_;
  DeviceBuffer<float> saved_;  // mean [c], inverse std [c] of the last training batch
  TensorDescriptor x_desc_;
  TensorDescriptor param_desc_;  // 1 x c x 1 x 1
};

// ReLU (our kernel) or Sigmoid (cuDNN).
class GpuActivation final : public GpuLayer {
 public:
  enum class Kind { kRelu, kSigmoid };
  explicit GpuActivation(Kind kind) : kind_(kind) {}
  ~GpuActivation() override;
  std::string ToString() const override;
  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, DeviceTensor input,
                                       bool training) override;
  absl::StatusOr<DeviceTensor> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                        bool need_input_grad) override;

 private:
  const Kind kind_;
  DeviceTensor input_;
  DeviceTensor output_view_;
  DeviceBuffer<float> output_;
  DeviceBuffer<float> grad_input_;
  TensorDescriptor desc_;
  cudnnActivationDescriptor_t act_ = nullptr;
};

// MaxPool2d, AvgPool2d (count_include_pad, as PyTorch's default) and AdaptiveAvgPool2d((1, 1))
// (a window over the whole plane) through cuDNN pooling.
class GpuPool2d final : public GpuLayer {
 public:
  enum class Kind { kMax, kAvg, kGlobalAvg };
  GpuPool2d(Kind kind, const nn::Pool2dOptions& options, const nn::Dims& input,
            const nn::Dims& output)
      : kind_(kind), o_(options), in_dims_(input), out_dims_(output) {}
  ~GpuPool2d() override;
  std::string ToString() const override;
  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, DeviceTensor input,
                                       bool training) override;
  absl::StatusOr<DeviceTensor> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                        bool need_input_grad) override;

 private:
  const Kind kind_;
  const nn::Pool2dOptions o_;
  const nn::Dims in_dims_;
  const nn::Dims out_dims_;
  DeviceTensor input_;
  DeviceBuffer<float> output_;
  DeviceBuffer<float> grad_input_;
  TensorDescriptor x_desc_;
  TensorDescriptor y_desc_;
  cudnnPoolingDescriptor_t pool_ = nullptr;
};

// MaxPool2d and AvgPool2d of any output size by our kernels (graph_kernels.h): what
// ceil_mode and AvgPool2d's count_include_pad=False need, which cuDNN's floor-rounding pooling
// cannot give. The same values and gradients as the CPU layers, summed in their order.
class GpuDirectPool2d final : public GpuLayer {
 public:
  enum class Kind { kMax, kAvg };
  GpuDirectPool2d(Kind kind, const nn::Pool2dOptions& options, const nn::Dims& input,
                  const nn::Dims& output);
  std::string ToString() const override;
  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, DeviceTensor input,
                                       bool training) override;
  absl::StatusOr<DeviceTensor> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                        bool need_input_grad) override;

 private:
  PoolGeometry Geometry(int batch) const;

  const Kind kind_;
  const nn::Pool2dOptions o_;
  const nn::Dims in_dims_;
  const nn::Dims out_dims_;
  std::vector<float> scale_;  // kAvg: 1 / each window's divisor (nn::AvgPoolDivisor).
  int batch_ = 0;
  DeviceBuffer<float> output_;
  DeviceBuffer<int32_t> argmax_;
  DeviceBuffer<float> scale_on_device_;
  DeviceBuffer<float> grad_input_;
};

// Per-sample dims c x h x w become (c*h*w) x 1 x 1; no data moves.
class GpuFlatten final : public GpuLayer {
 public:
  std::string ToString() const override { return "Flatten()"; }
  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, DeviceTensor input,
                                       bool training) override;
  absl::StatusOr<DeviceTensor> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                        bool need_input_grad) override;

 private:
  nn::Dims in_dims_;
};

// A whole network as the model drives it (the built-ins' GpuSequentialBlock, a graph's
// GpuGraph): a layer that says during Backward which ranges of the bound gradients are final,
// so that the model can copy them out while the rest still computes.
class GpuNetwork : public GpuLayer {
 public:
  // Called during Backward as soon as part `part`'s parameter gradients are enqueued:
  // elements [offset, offset + size) of the bound gradients.
  using GradsReady = std::function<absl::Status(int part, int64_t offset, int64_t size)>;
  void set_grads_ready(GradsReady f) { grads_ready_ = std::move(f); }
  // How many parts there are (`part` is below this).
  virtual int num_parts() const = 0;

 protected:
  GradsReady grads_ready_;
};

// Layers in order, parameters and buffers back to back, names prefixed "<index>." (as
// nn.Sequential's; the model's top level uses the same class). Its parts are its layers
// (layers without parameters report nothing).
class GpuSequentialBlock final : public GpuNetwork {
 public:
  explicit GpuSequentialBlock(std::vector<std::unique_ptr<GpuLayer>> layers);
  std::string ToString() const override;
  std::vector<nn::TensorSpec> ParamSpecs() const override;
  void BindParams(const float* params, float* grads) override;
  std::vector<nn::TensorSpec> BufferSpecs() const override;
  void BindBuffers(float* buffers) override;
  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, DeviceTensor input,
                                       bool training) override;
  // Stops at the first layer with parameters when !need_input_grad.
  absl::StatusOr<DeviceTensor> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                        bool need_input_grad) override;

  int num_parts() const override { return num_layers(); }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  bool Replayable() const override;

 private:
  std::vector<std::unique_ptr<GpuLayer>> layers_;
  std::vector<int64_t> param_offsets_;  // Per layer, into the bound buffers; then the total.
  int first_with_params_ = 0;
};

// d2l's Residual: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), laid out as
// nn::Residual (conv1, conv2, conv3 parameters, then bn1, bn2).
class GpuResidual final : public GpuLayer {
 public:
  GpuResidual(const nn::ResidualOptions& options, const nn::Dims& input, const nn::Dims& output);
  std::string ToString() const override;
  std::vector<nn::TensorSpec> ParamSpecs() const override;
  void BindParams(const float* params, float* grads) override;
  std::vector<nn::TensorSpec> BufferSpecs() const override;
  void BindBuffers(float* buffers) override;
  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, DeviceTensor input,
                                       bool training) override;
  absl::StatusOr<DeviceTensor> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                        bool need_input_grad) override;

 private:
  std::vector<GpuLayer*> ParamLayers();

  const nn::ResidualOptions o_;
  GpuConv2d conv1_;
  GpuConv2d conv2_;
  std::unique_ptr<GpuConv2d> conv3_;
  GpuBatchNorm2d bn1_;
  GpuBatchNorm2d bn2_;
  GpuActivation relu1_{GpuActivation::Kind::kRelu};
  DeviceTensor input_;
  DeviceBuffer<float> output_;    // relu(bn2(...) + shortcut(x))
  DeviceBuffer<float> grad_sum_;  // d(loss)/d(bn2(...) + shortcut(x))
  TensorDescriptor out_desc_;     // The block's output (batch x out x h' x w').
  TensorDescriptor in_desc_;      // Its input.
};

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_GPU_LAYERS_H_
