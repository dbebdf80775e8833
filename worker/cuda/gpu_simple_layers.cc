// GpuBatchNorm2d, GpuActivation, GpuPool2d and GpuFlatten.
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/cuda/gpu_layers.h"
#include "worker/cuda/graph_kernels.h"
#include "worker/cuda/kernels.h"
#include "worker/cuda/library_status.h"
#include "worker/nn/avg_pool2d.h"

namespace dptrain {
namespace cuda {
namespace {

constexpr float kOne = 1.0f;
constexpr float kZero = 0.0f;

}  // namespace

// ---- BatchNorm2d --------------------------------------------------------------------------

std::string GpuBatchNorm2d::ToString() const {
  return absl::StrCat("BatchNorm2d(", c_, ", eps=", eps_, ", momentum=", momentum_, ")");
}

std::vector<nn::TensorSpec> GpuBatchNorm2d::ParamSpecs() const {
  return {{"weight", {c_}}, {"bias", {c_}}};
}

void GpuBatchNorm2d::BindParams(const float* params, float* grads) {
  params_ = params;
  grads_ = grads;
}

std::vector<nn::TensorSpec> GpuBatchNorm2d::BufferSpecs() const {
  return {{"running_mean", {c_}}, {"running_var", {c_}}, {"num_batches_tracked", {}}};
}

void GpuBatchNorm2d::BindBuffers(float* buffers) { buffers_ = buffers; }

absl::StatusOr<DeviceTensor> GpuBatchNorm2d::Forward(DeviceContext& ctx, DeviceTensor input,
                                                     bool training) {
  input_ = input;
  DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, input.size()));
  DPTRAIN_RETURN_IF_ERROR(x_desc_.Set(input.batch, input.dims));
  DPTRAIN_RETURN_IF_ERROR(param_desc_.Set(1, c_, 1, 1));
  float* running_mean = buffers_;
  float* running_var = buffers_ + c_;
  if (training) {
    if (int64_t{input.batch} * input.dims.h * input.dims.w < 2) {
      // cuDNN's unbiased variance would divide by zero; PyTorch refuses this too.
      return absl::InvalidArgumentError(absl::StrCat(
          "BatchNorm2d: expected more than 1 value per channel when training, got input [",
          input.batch, ", ", input.dims.c, ", ", input.dims.h, ", ", input.dims.w,
          "] (one sample, one pixel: a batch of 2 or more trains)"));
    }
    DPTRAIN_ASSIGN_OR_RETURN(float* saved, saved_.Ensure(ctx, 2 * int64_t{c_}));
    // cuDNN updates the running variance with the unbiased batch variance, as PyTorch.
    DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnBatchNormalizationForwardTraining(
        ctx.cudnn(), CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, x_desc_.get(), input.data,
        x_desc_.get(), y, param_desc_.get(), params_, params_ + c_, momentum_, running_mean,
        running_var, eps_, saved, saved + c_));
  } else {
    DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnBatchNormalizationForwardInference(
        ctx.cudnn(), CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, x_desc_.get(), input.data,
        x_desc_.get(), y, param_desc_.get(), params_, params_ + c_, running_mean, running_var,
        eps_));
  }
  return DeviceTensor{y, input.batch, input.dims};
}

absl::StatusOr<DeviceTensor> GpuBatchNorm2d::Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                      bool need_input_grad) {
  // cuDNN always computes the input gradient; it is returned only if asked for.
  DPTRAIN_ASSIGN_OR_RETURN(float* dx, grad_input_.Ensure(ctx, grad_output.size()));
  const float* saved = saved_.data();
  DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnBatchNormalizationBackward(
      ctx.cudnn(), CUDNN_BATCHNORM_SPATIAL, &kOne, &kZero, &kOne, &kZero, x_desc_.get(),
      input_.data, x_desc_.get(), grad_output.data, x_desc_.get(), dx, param_desc_.get(), params_,
      grads_, grads_ + c_, eps_, saved, saved + c_));
  if (!need_input_grad) return DeviceTensor{};
  return DeviceTensor{dx, grad_output.batch, input_.dims};
}

// ---- Activations --------------------------------------------------------------------------

GpuActivation::~GpuActivation() {
  if (act_ != nullptr) cudnnDestroyActivationDescriptor(act_);
}

std::string GpuActivation::ToString() const {
  return kind_ == Kind::kRelu ? "ReLU()" : "Sigmoid()";
}

absl::StatusOr<DeviceTensor> GpuActivation::Forward(DeviceContext& ctx, DeviceTensor input,
                                                    bool training) {
  input_ = input;
  DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, input.size()));
  if (kind_ == Kind::kRelu) {
    DPTRAIN_RETURN_IF_ERROR(ReluForward(input.data, y, input.size(), ctx.stream()));
  } else {
    if (act_ == nullptr) {
      DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnCreateActivationDescriptor(&act_));
      DPTRAIN_CUDNN_RETURN_IF_ERROR(
          cudnnSetActivationDescriptor(act_, CUDNN_ACTIVATION_SIGMOID, CUDNN_PROPAGATE_NAN, 0.0));
    }
    // The real shape: cuDNN kernels may not take more than 65535 in one dimension.
    DPTRAIN_RETURN_IF_ERROR(desc_.Set(input.batch, input.dims));
    DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnActivationForward(ctx.cudnn(), act_, &kOne, desc_.get(),
                                                         input.data, &kZero, desc_.get(), y));
  }
  output_view_ = DeviceTensor{y, input.batch, input.dims};
  return output_view_;
}

absl::StatusOr<DeviceTensor> GpuActivation::Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                     bool need_input_grad) {
  if (!need_input_grad) return DeviceTensor{};
  const int64_t n = grad_output.size();
  DPTRAIN_ASSIGN_OR_RETURN(float* dx, grad_input_.Ensure(ctx, n));
  if (kind_ == Kind::kRelu) {
    DPTRAIN_RETURN_IF_ERROR(ReluBackward(output_view_.data, grad_output.data, dx, n, ctx.stream()));
  } else {
    DPTRAIN_RETURN_IF_ERROR(desc_.Set(grad_output.batch, grad_output.dims));
    DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnActivationBackward(
        ctx.cudnn(), act_, &kOne, desc_.get(), output_view_.data, desc_.get(), grad_output.data,
        desc_.get(), input_.data, &kZero, desc_.get(), dx));
  }
  return DeviceTensor{dx, grad_output.batch, input_.dims};
}

// ---- Pooling ------------------------------------------------------------------------------

GpuPool2d::~GpuPool2d() {
  if (pool_ != nullptr) cudnnDestroyPoolingDescriptor(pool_);
}

std::string GpuPool2d::ToString() const {
  switch (kind_) {
    case Kind::kMax:
      return nn::PoolToString("MaxPool2d", o_);
    case Kind::kAvg:
      return nn::PoolToString("AvgPool2d", o_);
    case Kind::kGlobalAvg:
      break;
  }
  return "AdaptiveAvgPool2d(output_size=(1, 1))";
}

absl::StatusOr<DeviceTensor> GpuPool2d::Forward(DeviceContext& ctx, DeviceTensor input,
                                                bool training) {
  input_ = input;
  if (pool_ == nullptr) {
    DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnCreatePoolingDescriptor(&pool_));
    if (kind_ == Kind::kGlobalAvg) {
      DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnSetPooling2dDescriptor(
          pool_, CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING, CUDNN_PROPAGATE_NAN, in_dims_.h,
          in_dims_.w, 0, 0, in_dims_.h, in_dims_.w));
    } else {
      DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnSetPooling2dDescriptor(
          pool_,
          kind_ == Kind::kMax ? CUDNN_POOLING_MAX_DETERMINISTIC
                              : CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
          CUDNN_PROPAGATE_NAN, o_.kernel_h, o_.kernel_w, o_.pad_h, o_.pad_w, o_.stride_h,
          o_.stride_w));
    }
  }
  DPTRAIN_RETURN_IF_ERROR(x_desc_.Set(input.batch, in_dims_));
  DPTRAIN_RETURN_IF_ERROR(y_desc_.Set(input.batch, out_dims_));
  DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, int64_t{input.batch} * out_dims_.size()));
  DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnPoolingForward(ctx.cudnn(), pool_, &kOne, x_desc_.get(),
                                                    input.data, &kZero, y_desc_.get(), y));
  return DeviceTensor{y, input.batch, out_dims_};
}

absl::StatusOr<DeviceTensor> GpuPool2d::Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                 bool need_input_grad) {
  if (!need_input_grad) return DeviceTensor{};
  DPTRAIN_ASSIGN_OR_RETURN(float* dx, grad_input_.Ensure(ctx, input_.size()));
  DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnPoolingBackward(
      ctx.cudnn(), pool_, &kOne, y_desc_.get(), output_.data(), y_desc_.get(), grad_output.data,
      x_desc_.get(), input_.data, &kZero, x_desc_.get(), dx));
  return DeviceTensor{dx, grad_output.batch, in_dims_};
}

// ---- Pooling by our kernels (ceil_mode, count_include_pad=False) --------------------------

GpuDirectPool2d::GpuDirectPool2d(Kind kind, const nn::Pool2dOptions& options, const nn::Dims& input,
                                 const nn::Dims& output)
    : kind_(kind), o_(options), in_dims_(input), out_dims_(output) {
  if (kind_ != Kind::kAvg) return;
  for (int oy = 0; oy < out_dims_.h; ++oy) {
    for (int ox = 0; ox < out_dims_.w; ++ox) {
      scale_.push_back(1.0f /
                       static_cast<float>(nn::AvgPoolDivisor(o_, in_dims_.h, in_dims_.w, oy, ox)));
    }
  }
}

std::string GpuDirectPool2d::ToString() const {
  return nn::PoolToString(kind_ == Kind::kMax ? "MaxPool2d" : "AvgPool2d", o_);
}

PoolGeometry GpuDirectPool2d::Geometry(int batch) const {
  return {int64_t{batch} * in_dims_.c,
          in_dims_.h,
          in_dims_.w,
          out_dims_.h,
          out_dims_.w,
          o_.kernel_h,
          o_.kernel_w,
          o_.stride_h,
          o_.stride_w,
          o_.pad_h,
          o_.pad_w};
}

absl::StatusOr<DeviceTensor> GpuDirectPool2d::Forward(DeviceContext& ctx, DeviceTensor input,
                                                      bool training) {
  batch_ = input.batch;
  const PoolGeometry g = Geometry(input.batch);
  const int64_t n = g.planes * g.out_h * g.out_w;
  DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, n));
  if (kind_ == Kind::kMax) {
    DPTRAIN_ASSIGN_OR_RETURN(int32_t * argmax, argmax_.Ensure(ctx, n));
    DPTRAIN_RETURN_IF_ERROR(MaxPoolForward(input.data, y, argmax, g, ctx.stream()));
    return DeviceTensor{y, input.batch, out_dims_};
  }
  if (scale_on_device_.data() == nullptr) {  // Once: the divisors depend on the dims only.
    DPTRAIN_ASSIGN_OR_RETURN(float* scale,
                             scale_on_device_.Ensure(ctx, static_cast<int64_t>(scale_.size())));
    DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        scale, scale_.data(), scale_.size() * sizeof(float), cudaMemcpyHostToDevice, ctx.stream()));
  }
  DPTRAIN_RETURN_IF_ERROR(AvgPoolForward(input.data, y, scale_on_device_.data(), g, ctx.stream()));
  return DeviceTensor{y, input.batch, out_dims_};
}

absl::StatusOr<DeviceTensor> GpuDirectPool2d::Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                       bool need_input_grad) {
  if (!need_input_grad) return DeviceTensor{};
  const PoolGeometry g = Geometry(batch_);
  DPTRAIN_ASSIGN_OR_RETURN(float* dx, grad_input_.Ensure(ctx, g.planes * g.in_h * g.in_w));
  if (kind_ == Kind::kMax) {
    DPTRAIN_RETURN_IF_ERROR(MaxPoolBackward(grad_output.data, argmax_.data(), dx, g, ctx.stream()));
  } else {
    DPTRAIN_RETURN_IF_ERROR(
        AvgPoolBackward(grad_output.data, scale_on_device_.data(), dx, g, ctx.stream()));
  }
  return DeviceTensor{dx, batch_, in_dims_};
}

// ---- Flatten ------------------------------------------------------------------------------

absl::StatusOr<DeviceTensor> GpuFlatten::Forward(DeviceContext& ctx, DeviceTensor input,
                                                 bool training) {
  in_dims_ = input.dims;
  return DeviceTensor{input.data, input.batch, {static_cast<int>(input.dims.size()), 1, 1}};
}

absl::StatusOr<DeviceTensor> GpuFlatten::Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                  bool need_input_grad) {
  if (!need_input_grad) return DeviceTensor{};
  return DeviceTensor{grad_output.data, grad_output.batch, in_dims_};
}

}  // namespace cuda
}  // namespace dptrain
