// GpuSequentialBlock and GpuResidual.
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/cuda/gpu_layers.h"
#include "worker/cuda/kernels.h"
#include "worker/cuda/library_status.h"
#include "worker/nn/sequential_block.h"

namespace dptrain {
namespace cuda {
namespace {

constexpr float kOne = 1.0f;

}  // namespace

// ---- SequentialBlock ----------------------------------------------------------------------

GpuSequentialBlock::GpuSequentialBlock(std::vector<std::unique_ptr<GpuLayer>> layers)
    : layers_(std::move(layers)) {
  first_with_params_ = static_cast<int>(layers_.size());
  param_offsets_.push_back(0);
  for (int i = static_cast<int>(layers_.size()) - 1; i >= 0; --i) {
    if (!layers_[i]->ParamSpecs().empty()) first_with_params_ = i;
  }
  for (const auto& layer : layers_) {
    param_offsets_.push_back(param_offsets_.back() + nn::SpecsSize(layer->ParamSpecs()));
  }
}

std::string GpuSequentialBlock::ToString() const {
  std::vector<std::string> parts;
  for (const auto& layer : layers_) parts.push_back(layer->ToString());
  return absl::StrCat("Sequential(", absl::StrJoin(parts, ", "), ")");
}

bool GpuSequentialBlock::Replayable() const {
  for (const auto& layer : layers_) {
    if (!layer->Replayable()) return false;
  }
  return true;
}

std::vector<nn::TensorSpec> GpuSequentialBlock::ParamSpecs() const {
  std::vector<nn::TensorSpec> specs;
  for (int i = 0; i < static_cast<int>(layers_.size()); ++i) {
    for (nn::TensorSpec& s : nn::PrefixSpecs(absl::StrCat(i), layers_[i]->ParamSpecs())) {
      specs.push_back(std::move(s));
    }
  }
  return specs;
}

void GpuSequentialBlock::BindParams(const float* params, float* grads) {
  for (auto& layer : layers_) {
    layer->BindParams(params, grads);
    const int64_t size = nn::SpecsSize(layer->ParamSpecs());
    params += size;
    grads += size;
  }
}

std::vector<nn::TensorSpec> GpuSequentialBlock::BufferSpecs() const {
  std::vector<nn::TensorSpec> specs;
  for (int i = 0; i < static_cast<int>(layers_.size()); ++i) {
    for (nn::TensorSpec& s : nn::PrefixSpecs(absl::StrCat(i), layers_[i]->BufferSpecs())) {
      specs.push_back(std::move(s));
    }
  }
  return specs;
}

void GpuSequentialBlock::BindBuffers(float* buffers) {
  for (auto& layer : layers_) {
    layer->BindBuffers(buffers);
    buffers += nn::SpecsSize(layer->BufferSpecs());
  }
}

absl::StatusOr<DeviceTensor> GpuSequentialBlock::Forward(DeviceContext& ctx, DeviceTensor input,
                                                         bool training) {
  for (auto& layer : layers_) {
    absl::StatusOr<DeviceTensor> out = layer->Forward(ctx, input, training);
    if (!out.ok()) {
      return absl::Status(out.status().code(),
                          absl::StrCat(layer->ToString(), ": ", out.status().message()));
    }
    input = *out;
  }
  return input;
}

absl::StatusOr<DeviceTensor> GpuSequentialBlock::Backward(DeviceContext& ctx,
                                                          DeviceTensor grad_output,
                                                          bool need_input_grad) {
  const int last = need_input_grad ? 0 : first_with_params_;
  for (int i = static_cast<int>(layers_.size()) - 1; i >= last; --i) {
    absl::StatusOr<DeviceTensor> grad =
        layers_[i]->Backward(ctx, grad_output, need_input_grad || i > last);
    if (!grad.ok()) {
      return absl::Status(grad.status().code(),
                          absl::StrCat(layers_[i]->ToString(), " backward: ",
                                       grad.status().message()));
    }
    grad_output = *grad;
    const int64_t size = param_offsets_[i + 1] - param_offsets_[i];
    if (grads_ready_ && size > 0) DPTRAIN_RETURN_IF_ERROR(grads_ready_(i, param_offsets_[i], size));
  }
  return need_input_grad ? grad_output : DeviceTensor{};
}

// ---- Residual -----------------------------------------------------------------------------

namespace {

nn::Conv2dOptions Conv3x3(int in, int out, int stride) {
  return nn::Conv2dOptions::Square(in, out, 3, stride, 1);
}

}  // namespace

GpuResidual::GpuResidual(const nn::ResidualOptions& options, const nn::Dims& input,
                         const nn::Dims& output)
    : o_(options),
      conv1_(Conv3x3(options.in_channels, options.out_channels, options.stride), input, output),
      conv2_(Conv3x3(options.out_channels, options.out_channels, 1), output, output),
      bn1_(options.out_channels),
      bn2_(options.out_channels) {
  if (options.use_1x1conv) {
    conv3_ = std::make_unique<GpuConv2d>(
        nn::Conv2dOptions::Square(options.in_channels, options.out_channels, 1, options.stride),
        input, output);
  }
}

std::string GpuResidual::ToString() const {
  return absl::StrCat("Residual(", o_.in_channels, ", ", o_.out_channels,
                      ", use_1x1conv=", o_.use_1x1conv ? "True" : "False",
                      ", strides=", o_.stride, ")");
}

std::vector<GpuLayer*> GpuResidual::ParamLayers() {
  std::vector<GpuLayer*> layers = {&conv1_, &conv2_};
  if (conv3_) layers.push_back(conv3_.get());
  layers.push_back(&bn1_);
  layers.push_back(&bn2_);
  return layers;
}

std::vector<nn::TensorSpec> GpuResidual::ParamSpecs() const {
  std::vector<nn::TensorSpec> specs;
  auto add = [&specs](const char* prefix, const GpuLayer& layer) {
    for (nn::TensorSpec& s : nn::PrefixSpecs(prefix, layer.ParamSpecs())) {
      specs.push_back(std::move(s));
    }
  };
  add("conv1", conv1_);
  add("conv2", conv2_);
  if (conv3_) add("conv3", *conv3_);
  add("bn1", bn1_);
  add("bn2", bn2_);
  return specs;
}

void GpuResidual::BindParams(const float* params, float* grads) {
  for (GpuLayer* layer : ParamLayers()) {
    layer->BindParams(params, grads);
    const int64_t size = nn::SpecsSize(layer->ParamSpecs());
    params += size;
    grads += size;
  }
}

std::vector<nn::TensorSpec> GpuResidual::BufferSpecs() const {
  std::vector<nn::TensorSpec> specs = nn::PrefixSpecs("bn1", bn1_.BufferSpecs());
  for (nn::TensorSpec& s : nn::PrefixSpecs("bn2", bn2_.BufferSpecs())) {
    specs.push_back(std::move(s));
  }
  return specs;
}

void GpuResidual::BindBuffers(float* buffers) {
  bn1_.BindBuffers(buffers);
  bn2_.BindBuffers(buffers + nn::SpecsSize(bn1_.BufferSpecs()));
}

absl::StatusOr<DeviceTensor> GpuResidual::Forward(DeviceContext& ctx, DeviceTensor input,
                                                  bool training) {
  input_ = input;
  DPTRAIN_ASSIGN_OR_RETURN(DeviceTensor y1, conv1_.Forward(ctx, input, training));
  DPTRAIN_ASSIGN_OR_RETURN(DeviceTensor b1, bn1_.Forward(ctx, y1, training));
  DPTRAIN_ASSIGN_OR_RETURN(DeviceTensor a1, relu1_.Forward(ctx, b1, training));
  DPTRAIN_ASSIGN_OR_RETURN(DeviceTensor y2, conv2_.Forward(ctx, a1, training));
  DPTRAIN_ASSIGN_OR_RETURN(DeviceTensor b2, bn2_.Forward(ctx, y2, training));
  DeviceTensor shortcut = input;
  if (conv3_) {
    DPTRAIN_ASSIGN_OR_RETURN(shortcut, conv3_->Forward(ctx, input, training));
  }
  // b2 += shortcut in bn2's own output (its backward reads its input, not its output), then
  // the block's output = relu(b2).
  DPTRAIN_RETURN_IF_ERROR(out_desc_.Set(b2.batch, b2.dims));
  DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnAddTensor(ctx.cudnn(), &kOne, out_desc_.get(),
                                               shortcut.data, &kOne, out_desc_.get(),
                                               const_cast<float*>(b2.data)));
  DPTRAIN_ASSIGN_OR_RETURN(float* out, output_.Ensure(ctx, b2.size()));
  DPTRAIN_RETURN_IF_ERROR(ReluForward(b2.data, out, b2.size(), ctx.stream()));
  return DeviceTensor{out, b2.batch, b2.dims};
}

absl::StatusOr<DeviceTensor> GpuResidual::Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                   bool need_input_grad) {
  const int64_t n = grad_output.size();
  DPTRAIN_ASSIGN_OR_RETURN(float* gs, grad_sum_.Ensure(ctx, n));
  DPTRAIN_RETURN_IF_ERROR(ReluBackward(output_.data(), grad_output.data, gs, n, ctx.stream()));
  const DeviceTensor grad_sum{gs, grad_output.batch, grad_output.dims};
  DPTRAIN_ASSIGN_OR_RETURN(DeviceTensor g, bn2_.Backward(ctx, grad_sum, true));
  DPTRAIN_ASSIGN_OR_RETURN(g, conv2_.Backward(ctx, g, true));
  DPTRAIN_ASSIGN_OR_RETURN(g, relu1_.Backward(ctx, g, true));
  DPTRAIN_ASSIGN_OR_RETURN(g, bn1_.Backward(ctx, g, true));
  DPTRAIN_ASSIGN_OR_RETURN(DeviceTensor dx, conv1_.Backward(ctx, g, need_input_grad));
  DeviceTensor shortcut_grad = grad_sum;
  if (conv3_) {
    DPTRAIN_ASSIGN_OR_RETURN(shortcut_grad, conv3_->Backward(ctx, grad_sum, need_input_grad));
  }
  if (!need_input_grad) return DeviceTensor{};
  // dx (conv1's buffer, handed to our caller) += the shortcut's input gradient.
  DPTRAIN_RETURN_IF_ERROR(in_desc_.Set(dx.batch, dx.dims));
  DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnAddTensor(ctx.cudnn(), &kOne, in_desc_.get(),
                                               shortcut_grad.data, &kOne, in_desc_.get(),
                                               const_cast<float*>(dx.data)));
  return dx;
}

}  // namespace cuda
}  // namespace dptrain
