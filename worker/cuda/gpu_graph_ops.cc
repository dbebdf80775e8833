// The graph ops' GPU twins (one per op of worker/graph's registry) and their registry,
// GpuOps(); GpuGraph (gpu_graph.cc) runs them in the CPU graph's order.
#include <array>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/mix.h"
#include "common/status_macros.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/gpu_graph.h"
#include "worker/cuda/gpu_movement_ops.h"
#include "worker/cuda/gpu_network.h"
#include "worker/cuda/graph_kernels.h"
#include "worker/cuda/graph_operand.h"
#include "worker/cuda/kernels.h"
#include "worker/nn/sequential_block.h"

namespace dptrain {
namespace cuda {
namespace {

using Part = graph::TwinSpec<float>::Part;

// How a layer's tensors (in its order) lie among the graph's (tensor_block.h on the device):
// bound directly where the graph keeps them back to back, else through a stage that takes
// the values before each Forward and gives back the gradients after each Backward (and a
// training Forward's buffers). A part the graph lacks is `fill` in the stage; one the graph
// holds transposed (MatMul's [in, out] weight) is transposed on the way in and out.
class DeviceBlock {
 public:
  explicit DeviceBlock(std::vector<Part> parts) : parts_(std::move(parts)) {
    for (const Part& p : parts_) total_ += p.size;
  }

  // One pointer per provided part (grads empty for buffers).
  void Bind(absl::Span<const float* const> values, absl::Span<float* const> grads) {
    values_.assign(parts_.size(), nullptr);
    grads_.assign(parts_.size(), nullptr);
    size_t next = 0;
    direct_ = true;
    const float* expect_value = nullptr;
    const float* expect_grad = nullptr;
    for (size_t i = 0; i < parts_.size(); ++i) {
      if (!parts_[i].provided) {
        direct_ = false;
        continue;
      }
      if (parts_[i].transposed_rows > 0) direct_ = false;
      values_[i] = values[next];
      if (!grads.empty()) grads_[i] = grads[next];
      ++next;
      if (i > 0 &&
          (values_[i] != expect_value || (grads_[i] != nullptr && grads_[i] != expect_grad))) {
        direct_ = false;
      }
      expect_value = values_[i] + parts_[i].size;
      if (grads_[i] != nullptr) expect_grad = grads_[i] + parts_[i].size;
    }
  }

  bool empty() const { return parts_.empty(); }
  bool direct() const { return direct_; }
  // The layer's block: the caller's tensors (direct) or the stage, filled now.
  absl::StatusOr<float*> ValuesIn(DeviceContext& ctx) {
    if (direct_) return const_cast<float*>(values_.empty() ? nullptr : values_[0]);
    DPTRAIN_ASSIGN_OR_RETURN(float* stage, stage_.Ensure(ctx, total_));
    int64_t at = 0;
    for (size_t i = 0; i < parts_.size(); ++i) {
      const Part& p = parts_[i];
      if (p.provided && p.transposed_rows > 0) {
        // The graph's [cols, rows] into the layer's [rows, cols].
        DPTRAIN_RETURN_IF_ERROR(Transpose(values_[i], stage + at, p.size / p.transposed_rows,
                                          p.transposed_rows, ctx.stream()));
      } else if (p.provided) {
        DPTRAIN_RETURN_IF_ERROR(CopyOnDevice(ctx, stage + at, values_[i], p.size));
      } else {
        DPTRAIN_RETURN_IF_ERROR(Fill(stage + at, parts_[i].size, parts_[i].fill, ctx.stream()));
      }
      at += parts_[i].size;
    }
    return stage;
  }
  absl::StatusOr<float*> GradsIn(DeviceContext& ctx) {
    if (direct_) return grads_.empty() ? nullptr : grads_[0];
    return grad_stage_.Ensure(ctx, total_);
  }
  // Staged only: the stage's values (buffers) or gradients back where the graph keeps them.
  absl::Status ValuesOut(DeviceContext& ctx) { return Out(ctx, stage_.data(), values_); }
  absl::Status GradsOut(DeviceContext& ctx) {
    std::vector<const float*> to(grads_.begin(), grads_.end());
    return Out(ctx, grad_stage_.data(), to);
  }

 private:
  absl::Status Out(DeviceContext& ctx, const float* stage, const std::vector<const float*>& to) {
    if (direct_ || stage == nullptr) return absl::OkStatus();
    int64_t at = 0;
    for (size_t i = 0; i < parts_.size(); ++i) {
      const Part& p = parts_[i];
      float* out = const_cast<float*>(to[i]);
      if (p.provided && out != nullptr && p.transposed_rows > 0) {
        // The layer's [rows, cols] back into the graph's [cols, rows].
        DPTRAIN_RETURN_IF_ERROR(Transpose(stage + at, out, p.transposed_rows,
                                          p.size / p.transposed_rows, ctx.stream()));
      } else if (p.provided && out != nullptr) {
        DPTRAIN_RETURN_IF_ERROR(CopyOnDevice(ctx, out, stage + at, p.size));
      }
      at += parts_[i].size;
    }
    return absl::OkStatus();
  }

  const std::vector<Part> parts_;
  int64_t total_ = 0;
  std::vector<const float*> values_;
  std::vector<float*> grads_;
  bool direct_ = true;
  DeviceBuffer<float> stage_;
  DeviceBuffer<float> grad_stage_;
};

// A node that runs one nn::Layer: the layer's CUDA twin (gpu_network.h), its tensors bound
// through DeviceBlocks.
class LayerTwin final : public GpuNode {
 public:
  LayerTwin(std::unique_ptr<GpuLayer> layer, std::vector<Part> params, std::vector<Part> buffers)
      : layer_(std::move(layer)), params_(std::move(params)), buffers_(std::move(buffers)) {}

  void BindParams(absl::Span<const float* const> params, absl::Span<float* const> grads) override {
    params_.Bind(params, grads);
  }
  void BindBuffers(absl::Span<float* const> buffers) override {
    const std::vector<const float*> values(buffers.begin(), buffers.end());
    buffers_.Bind(values, {});
  }

  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, absl::Span<const DeviceTensor> inputs,
                                       bool training) override {
    if (!params_.empty()) {
      DPTRAIN_ASSIGN_OR_RETURN(float* values, params_.ValuesIn(ctx));
      DPTRAIN_ASSIGN_OR_RETURN(float* grads, params_.GradsIn(ctx));
      layer_->BindParams(values, grads);
    }
    if (!buffers_.empty()) {
      DPTRAIN_ASSIGN_OR_RETURN(float* values, buffers_.ValuesIn(ctx));
      layer_->BindBuffers(values);
    }
    DPTRAIN_ASSIGN_OR_RETURN(DeviceTensor y, layer_->Forward(ctx, inputs[0], training));
    if (training && !buffers_.empty()) DPTRAIN_RETURN_IF_ERROR(buffers_.ValuesOut(ctx));
    return y;
  }

  absl::StatusOr<std::vector<DeviceTensor>> Backward(
      DeviceContext& ctx, DeviceTensor grad_output,
      const std::vector<bool>& need_input_grad) override {
    DPTRAIN_ASSIGN_OR_RETURN(DeviceTensor dx,
                             layer_->Backward(ctx, grad_output, need_input_grad[0]));
    if (!params_.empty()) DPTRAIN_RETURN_IF_ERROR(params_.GradsOut(ctx));
    return std::vector<DeviceTensor>{dx};
  }
  bool Replayable() const override { return layer_->Replayable(); }

 private:
  std::unique_ptr<GpuLayer> layer_;
  DeviceBlock params_;
  DeviceBlock buffers_;
};

// The twin of a layer node, once its CUDA layer is known to take exactly the tensors the CPU
// node stages for its layer (else the stage would be read past its end).
absl::StatusOr<std::unique_ptr<GpuNode>> LayerTwinOf(const GpuNodeContext& ctx,
                                                     std::unique_ptr<GpuLayer> layer,
                                                     const graph::TwinSpec<float>& spec) {
  auto total = [](const std::vector<Part>& parts) {
    int64_t n = 0;
    for (const Part& p : parts) n += p.size;
    return n;
  };
  if (nn::SpecsSize(layer->ParamSpecs()) != total(spec.params) ||
      nn::SpecsSize(layer->BufferSpecs()) != total(spec.buffers)) {
    return absl::InternalError(absl::StrCat("node '", ctx.name, "' (", ctx.op, "): its CUDA layer ",
                                            layer->ToString(),
                                            " holds other tensors than its CPU layer"));
  }
  return std::unique_ptr<GpuNode>(
      std::make_unique<LayerTwin>(std::move(layer), spec.params, spec.buffers));
}

absl::StatusOr<std::unique_ptr<GpuNode>> MakeLayerTwin(const GpuNodeContext& ctx) {
  const graph::TwinSpec<float> spec = ctx.cpu.twin();
  if (spec.grouped_conv.has_value() && ctx.input_dims.size() == 1) {
    // Grouped and depthwise: one cuDNN convolution with a group count.
    return LayerTwinOf(ctx,
                       std::make_unique<GpuConv2d>(*spec.grouped_conv, ctx.input_dims[0],
                                                   ctx.cpu.output_dims(), spec.groups),
                       spec);
  }
  if (spec.layer == nullptr || ctx.input_dims.size() != 1) {
    return ctx.Error("this form of the op");
  }
  absl::StatusOr<std::unique_ptr<GpuLayer>> layer = ToGpu(*spec.layer, ctx.input_dims[0]);
  if (!layer.ok()) return ctx.Error(layer.status().message());
  return LayerTwinOf(ctx, *std::move(layer), spec);
}

// The same elements seen with other per-sample dims (Identity, Reshape, Flatten, Dropout in
// evaluation or with ratio 0).
class ViewTwin final : public GpuNode {
 public:
  ViewTwin(nn::Dims in, nn::Dims out) : in_(in), out_(out) {}
  absl::StatusOr<DeviceTensor> Forward(DeviceContext&, absl::Span<const DeviceTensor> inputs,
                                       bool) override {
    return DeviceTensor{inputs[0].data, inputs[0].batch, out_};
  }
  absl::StatusOr<std::vector<DeviceTensor>> Backward(DeviceContext&, DeviceTensor grad_output,
                                                     const std::vector<bool>& need) override {
    if (!need[0]) return std::vector<DeviceTensor>{DeviceTensor{}};
    return std::vector<DeviceTensor>{DeviceTensor{grad_output.data, grad_output.batch, in_}};
  }

 private:
  const nn::Dims in_, out_;
};

absl::StatusOr<std::unique_ptr<GpuNode>> MakeViewTwin(const GpuNodeContext& ctx) {
  if (ctx.input_dims.size() != 1) return ctx.Error("more than one computed input");
  const nn::Dims out = ctx.cpu.output_dims();
  if (out.size() != ctx.input_dims[0].size()) return ctx.Error("a view that changes the size");
  return std::unique_ptr<GpuNode>(std::make_unique<ViewTwin>(ctx.input_dims[0], out));
}

// Dropout with the CPU node's masks: the k-th training Forward draws from
// Mix64(seed ^ Mix64(k)) (shape_ops.cc's SplitMix64 is common/mix.h's Mix64).
class DropoutTwin final : public GpuNode {
 public:
  DropoutTwin(nn::Dims dims, double ratio, uint64_t seed)
      : dims_(dims), ratio_(ratio), seed_(seed), scale_(static_cast<float>(1.0 / (1.0 - ratio))) {}

  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, absl::Span<const DeviceTensor> inputs,
                                       bool training) override {
    const DeviceTensor& x = inputs[0];
    dropped_ = training && ratio_ > 0;
    if (!dropped_) return x;
    const int64_t n = x.size();
    DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, n));
    DPTRAIN_ASSIGN_OR_RETURN(uint8_t * keep, keep_.Ensure(ctx, n));
    const uint64_t key = Mix64(seed_ ^ Mix64(step_++));
    DPTRAIN_RETURN_IF_ERROR(DropoutForward(x.data, y, keep, n, key, ratio_, scale_, ctx.stream()));
    return DeviceTensor{y, x.batch, dims_};
  }

  absl::StatusOr<std::vector<DeviceTensor>> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                     const std::vector<bool>& need) override {
    if (!need[0]) return std::vector<DeviceTensor>{DeviceTensor{}};
    if (!dropped_) return std::vector<DeviceTensor>{grad_output};
    const int64_t n = grad_output.size();
    DPTRAIN_ASSIGN_OR_RETURN(float* dx, grad_input_.Ensure(ctx, n));
    DPTRAIN_RETURN_IF_ERROR(
        DropoutBackward(grad_output.data, keep_.data(), dx, n, scale_, ctx.stream()));
    return std::vector<DeviceTensor>{DeviceTensor{dx, grad_output.batch, dims_}};
  }
  // Each training step draws its masks from a new key.
  bool Replayable() const override { return ratio_ == 0; }

 private:
  const nn::Dims dims_;
  const double ratio_;
  const uint64_t seed_;
  const float scale_;
  uint64_t step_ = 0;
  bool dropped_ = false;
  DeviceBuffer<float> output_;
  DeviceBuffer<uint8_t> keep_;
  DeviceBuffer<float> grad_input_;
};

absl::StatusOr<std::unique_ptr<GpuNode>> MakeDropoutTwin(const GpuNodeContext& ctx) {
  if (ctx.input_dims.size() != 1) return ctx.Error("more than one computed input");
  const graph::TwinSpec<float> spec = ctx.cpu.twin();
  return std::unique_ptr<GpuNode>(
      std::make_unique<DropoutTwin>(ctx.input_dims[0], spec.dropout_ratio, spec.dropout_seed));
}

// Add, Sub, Mul, Div, PRelu: the CPU node's forms (multi_input_ops.h), the same element loops:
// the other operand a computed value (same dims, per channel, per pixel), the node's scalar,
// or a tensor of the model (learned: its gradient summed as the CPU sums it).
class BinaryTwin final : public GpuNode {
 public:
  BinaryTwin(const graph::TwinSpec<float>& spec, nn::Dims dims, nn::Dims other_dims)
      : op_(static_cast<int>(*spec.binary)),
        source_(spec.operand_source),
        swapped_(spec.swapped),
        scalar_(static_cast<float>(spec.scalar)),
        dims_(dims),
        other_dims_(other_dims),
        operand_(spec.operand_source, spec.held_operand, spec.operand_size),
        operand_size_(spec.operand_size),
        // The runtime inputs' positions (a constant is left out of them).
        full_(computed() && spec.swapped ? 1 : 0),
        other_(computed() && spec.swapped ? 0 : 1) {
    layout_.broadcast = static_cast<int>(spec.broadcast);
    layout_.batched = computed();
    layout_.channels = dims.c;
    layout_.plane = int64_t{dims.h} * dims.w;
  }

  void BindParams(absl::Span<const float* const> params, absl::Span<float* const> grads) override {
    operand_.BindParams(params, grads);
  }
  void BindBuffers(absl::Span<float* const> buffers) override { operand_.BindBuffers(buffers); }

  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, absl::Span<const DeviceTensor> inputs,
                                       bool) override {
    full_in_ = inputs[full_];
    if (computed()) {
      other_in_ = inputs[other_];
      other_data_ = other_in_.data;
    } else if (source_ == graph::OperandSource::kScalar) {
      other_data_ = nullptr;  // The kernels take scalar_.
    } else {
      DPTRAIN_ASSIGN_OR_RETURN(other_data_, operand_.Values(ctx));
    }
    const int64_t n = full_in_.size();
    DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, n));
    DPTRAIN_RETURN_IF_ERROR(BinaryForward(op_, layout_, swapped_, full_in_.data, other_data_,
                                          scalar_, y, n, ctx.stream()));
    return DeviceTensor{y, full_in_.batch, dims_};
  }

  absl::StatusOr<std::vector<DeviceTensor>> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                     const std::vector<bool>& need) override {
    std::vector<DeviceTensor> grads(need.size());
    const int64_t n = grad_output.size();
    // Add and Sub pass the gradient of the full operand through unchanged (aliased).
    const bool identity_full = op_ == 0 || (op_ == 1 && !swapped_);
    if (need[full_]) {
      if (identity_full) {
        grads[full_] = grad_output;
      } else {
        DPTRAIN_ASSIGN_OR_RETURN(float* d, grad_full_.Ensure(ctx, n));
        DPTRAIN_RETURN_IF_ERROR(BinaryBackwardFull(op_, layout_, swapped_, full_in_.data,
                                                   other_data_, scalar_, grad_output.data, d, n,
                                                   ctx.stream()));
        grads[full_] = DeviceTensor{d, grad_output.batch, dims_};
      }
    }
    if (computed() && other_ < need.size() && need[other_]) {
      const int64_t m = other_in_.size();
      DPTRAIN_ASSIGN_OR_RETURN(float* d, grad_other_.Ensure(ctx, m));
      DPTRAIN_RETURN_IF_ERROR(BinaryBackwardOther(op_, layout_, swapped_, full_in_.data,
                                                  other_data_, grad_output.data, d, m, n,
                                                  ctx.stream()));
      grads[other_] = DeviceTensor{d, other_in_.batch, other_dims_};
    } else if (operand_.grad() != nullptr) {
      DPTRAIN_RETURN_IF_ERROR(BinaryBackwardOther(op_, layout_, swapped_, full_in_.data,
                                                  other_data_, grad_output.data, operand_.grad(),
                                                  operand_size_, n, ctx.stream()));
    }
    return grads;
  }

 private:
  bool computed() const { return source_ == graph::OperandSource::kComputed; }

  const int op_;
  const graph::OperandSource source_;
  const bool swapped_;
  const float scalar_;
  const nn::Dims dims_, other_dims_;
  GraphOperand operand_;
  const int64_t operand_size_;
  const size_t full_, other_;
  OperandLayout layout_;
  DeviceTensor full_in_, other_in_;
  const float* other_data_ = nullptr;
  DeviceBuffer<float> output_, grad_full_, grad_other_;
};

absl::StatusOr<std::unique_ptr<GpuNode>> MakeBinaryTwin(const GpuNodeContext& ctx) {
  const graph::TwinSpec<float> spec = ctx.cpu.twin();
  const bool computed = spec.operand_source == graph::OperandSource::kComputed;
  if (!spec.binary.has_value() || ctx.input_dims.size() != (computed ? 2u : 1u)) {
    return ctx.Error("this form of the op");
  }
  const nn::Dims out = ctx.cpu.output_dims();
  const nn::Dims other = computed ? ctx.input_dims[spec.swapped ? 0 : 1] : out;
  return std::unique_ptr<GpuNode>(std::make_unique<BinaryTwin>(spec, out, other));
}

// ReduceMean over the channels, kept as one channel.
class ChannelMeanTwin final : public GpuNode {
 public:
  explicit ChannelMeanTwin(nn::Dims in) : in_(in) {}

  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, absl::Span<const DeviceTensor> inputs,
                                       bool) override {
    const DeviceTensor& x = inputs[0];
    const int64_t plane = int64_t{in_.h} * in_.w;
    DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, x.batch * plane));
    DPTRAIN_RETURN_IF_ERROR(ChannelMeanForward(x.data, y, x.batch, in_.c, plane, ctx.stream()));
    return DeviceTensor{y, x.batch, nn::Dims{1, in_.h, in_.w}};
  }

  absl::StatusOr<std::vector<DeviceTensor>> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                     const std::vector<bool>& need) override {
    if (!need[0]) return std::vector<DeviceTensor>{DeviceTensor{}};
    const int batch = grad_output.batch;
    DPTRAIN_ASSIGN_OR_RETURN(float* dx, grad_input_.Ensure(ctx, batch * in_.size()));
    DPTRAIN_RETURN_IF_ERROR(ChannelMeanBackward(grad_output.data, dx, batch, in_.c,
                                                int64_t{in_.h} * in_.w, ctx.stream()));
    return std::vector<DeviceTensor>{DeviceTensor{dx, batch, in_}};
  }

 private:
  const nn::Dims in_;
  DeviceBuffer<float> output_, grad_input_;
};

// InstanceNormalization over each (sample, channel) plane; scale and B learned, buffers or
// held constants (graph::OperandSource), scale then B.
class InstanceNormTwin final : public GpuNode {
 public:
  InstanceNormTwin(const graph::TwinSpec<float>& spec, nn::Dims dims)
      : dims_(dims),
        eps_(spec.instance_norm_eps),
        source_(spec.operand_source),
        held_(spec.operand_source, spec.held_operand, spec.operand_size) {}

  void BindParams(absl::Span<const float* const> params, absl::Span<float* const> grads) override {
    if (source_ != graph::OperandSource::kParam) return;
    scale_ = params[0];
    bias_ = params[1];
    scale_grad_ = grads[0];
    bias_grad_ = grads[1];
  }
  void BindBuffers(absl::Span<float* const> buffers) override {
    if (source_ != graph::OperandSource::kBuffer) return;
    scale_ = buffers[0];
    bias_ = buffers[1];
  }

  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, absl::Span<const DeviceTensor> inputs,
                                       bool) override {
    const DeviceTensor& x = inputs[0];
    if (source_ == graph::OperandSource::kHeld) {
      DPTRAIN_ASSIGN_OR_RETURN(scale_, held_.Values(ctx));
      bias_ = scale_ + dims_.c;
    }
    if (scale_ == nullptr || bias_ == nullptr) {
      return absl::FailedPreconditionError("InstanceNormalization: scale and B were not bound");
    }
    const int64_t plane = int64_t{dims_.h} * dims_.w;
    DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, x.size()));
    DPTRAIN_ASSIGN_OR_RETURN(float* xhat, xhat_.Ensure(ctx, x.size()));
    DPTRAIN_ASSIGN_OR_RETURN(float* inv, inv_std_.Ensure(ctx, int64_t{x.batch} * dims_.c));
    DPTRAIN_RETURN_IF_ERROR(InstanceNormForward(x.data, scale_, bias_, y, xhat, inv, x.batch,
                                                dims_.c, plane, eps_, ctx.stream()));
    return DeviceTensor{y, x.batch, dims_};
  }

  absl::StatusOr<std::vector<DeviceTensor>> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                     const std::vector<bool>& need) override {
    const int batch = grad_output.batch;
    float* dx = nullptr;
    if (need[0]) {
      DPTRAIN_ASSIGN_OR_RETURN(dx, grad_input_.Ensure(ctx, grad_output.size()));
    }
    DPTRAIN_RETURN_IF_ERROR(InstanceNormBackward(
        grad_output.data, xhat_.data(), inv_std_.data(), scale_, scale_grad_, bias_grad_, dx, batch,
        dims_.c, int64_t{dims_.h} * dims_.w, ctx.stream()));
    if (!need[0]) return std::vector<DeviceTensor>{DeviceTensor{}};
    return std::vector<DeviceTensor>{DeviceTensor{dx, batch, dims_}};
  }

 private:
  const nn::Dims dims_;
  const double eps_;
  const graph::OperandSource source_;
  GraphOperand held_;
  const float* scale_ = nullptr;
  const float* bias_ = nullptr;
  float* scale_grad_ = nullptr;
  float* bias_grad_ = nullptr;
  DeviceBuffer<float> output_, xhat_, inv_std_, grad_input_;
};

// ReduceMean: over H and W as the layer (GlobalAvgPool2d), or over the channels.
absl::StatusOr<std::unique_ptr<GpuNode>> MakeReduceMeanTwin(const GpuNodeContext& ctx) {
  if (!ctx.cpu.twin().channel_mean) return MakeLayerTwin(ctx);
  if (ctx.input_dims.size() != 1) return ctx.Error("more than one computed input");
  return std::unique_ptr<GpuNode>(std::make_unique<ChannelMeanTwin>(ctx.input_dims[0]));
}

absl::StatusOr<std::unique_ptr<GpuNode>> MakeInstanceNormTwin(const GpuNodeContext& ctx) {
  if (ctx.input_dims.size() != 1) return ctx.Error("more than one computed input");
  return std::unique_ptr<GpuNode>(
      std::make_unique<InstanceNormTwin>(ctx.cpu.twin(), ctx.input_dims[0]));
}

// Tanh, Erf, HardSigmoid, HardSwish, LeakyRelu, Clip, Elu, Selu, Softplus, Softsign, Exp,
// Log, Sqrt, Neg, Abs, Reciprocal, Pow: one element-wise kernel each way.
class FunctionTwin final : public GpuNode {
 public:
  FunctionTwin(const graph::TwinSpec<float>& spec, nn::Dims dims)
      : function_(static_cast<int>(spec.function)),
        a_(static_cast<float>(spec.a)),
        b_(static_cast<float>(spec.b)),
        c_(static_cast<float>(spec.c)),
        dims_(dims) {}

  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, absl::Span<const DeviceTensor> inputs,
                                       bool) override {
    input_ = inputs[0];
    DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, input_.size()));
    DPTRAIN_RETURN_IF_ERROR(
        ElementwiseForward(function_, input_.data, y, input_.size(), a_, b_, c_, ctx.stream()));
    return DeviceTensor{y, input_.batch, dims_};
  }

  absl::StatusOr<std::vector<DeviceTensor>> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                     const std::vector<bool>& need) override {
    if (!need[0]) return std::vector<DeviceTensor>{DeviceTensor{}};
    const int64_t n = grad_output.size();
    DPTRAIN_ASSIGN_OR_RETURN(float* dx, grad_input_.Ensure(ctx, n));
    DPTRAIN_RETURN_IF_ERROR(ElementwiseBackward(function_, input_.data, output_.data(),
                                                grad_output.data, dx, n, a_, b_, c_, ctx.stream()));
    return std::vector<DeviceTensor>{DeviceTensor{dx, grad_output.batch, dims_}};
  }

 private:
  const int function_;
  const float a_, b_, c_;
  const nn::Dims dims_;
  DeviceTensor input_;
  DeviceBuffer<float> output_, grad_input_;
};

absl::StatusOr<std::unique_ptr<GpuNode>> MakeFunctionTwin(const GpuNodeContext& ctx) {
  const graph::TwinSpec<float> spec = ctx.cpu.twin();
  if (spec.function == graph::ElementFunction::kNone || ctx.input_dims.size() != 1) {
    return ctx.Error("this form of the op");
  }
  return std::unique_ptr<GpuNode>(std::make_unique<FunctionTwin>(spec, ctx.input_dims[0]));
}

// Zero padding over H and W.
class PadTwin final : public GpuNode {
 public:
  PadTwin(nn::Dims in, nn::Dims out, int top, int left)
      : in_(in), out_(out), top_(top), left_(left) {}

  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, absl::Span<const DeviceTensor> inputs,
                                       bool) override {
    const DeviceTensor& x = inputs[0];
    DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, x.batch * out_.size()));
    DPTRAIN_RETURN_IF_ERROR(PadForward(x.data, y, int64_t{x.batch} * in_.c, in_.h, in_.w, out_.h,
                                       out_.w, top_, left_, ctx.stream()));
    return DeviceTensor{y, x.batch, out_};
  }

  absl::StatusOr<std::vector<DeviceTensor>> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                     const std::vector<bool>& need) override {
    if (!need[0]) return std::vector<DeviceTensor>{DeviceTensor{}};
    const int batch = grad_output.batch;
    DPTRAIN_ASSIGN_OR_RETURN(float* dx, grad_input_.Ensure(ctx, batch * in_.size()));
    DPTRAIN_RETURN_IF_ERROR(PadBackward(grad_output.data, dx, int64_t{batch} * in_.c, in_.h, in_.w,
                                        out_.h, out_.w, top_, left_, ctx.stream()));
    return std::vector<DeviceTensor>{DeviceTensor{dx, batch, in_}};
  }

 private:
  const nn::Dims in_, out_;
  const int top_, left_;
  DeviceBuffer<float> output_, grad_input_;
};

absl::StatusOr<std::unique_ptr<GpuNode>> MakePadTwin(const GpuNodeContext& ctx) {
  if (ctx.input_dims.size() != 1) return ctx.Error("more than one computed input");
  const graph::TwinSpec<float> spec = ctx.cpu.twin();
  return std::unique_ptr<GpuNode>(std::make_unique<PadTwin>(
      ctx.input_dims[0], ctx.cpu.output_dims(), spec.pad_top, spec.pad_left));
}

// Softmax and LogSoftmax over the channels.
class SoftmaxTwin final : public GpuNode {
 public:
  SoftmaxTwin(nn::Dims dims, bool log) : dims_(dims), log_(log) {}

  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, absl::Span<const DeviceTensor> inputs,
                                       bool) override {
    const DeviceTensor& x = inputs[0];
    DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, x.size()));
    DPTRAIN_RETURN_IF_ERROR(
        SoftmaxChannelsForward(x.data, y, x.batch, dims_.c, plane(), log_, ctx.stream()));
    return DeviceTensor{y, x.batch, dims_};
  }

  absl::StatusOr<std::vector<DeviceTensor>> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                     const std::vector<bool>& need) override {
    if (!need[0]) return std::vector<DeviceTensor>{DeviceTensor{}};
    DPTRAIN_ASSIGN_OR_RETURN(float* dx, grad_input_.Ensure(ctx, grad_output.size()));
    DPTRAIN_RETURN_IF_ERROR(SoftmaxChannelsBackward(output_.data(), grad_output.data, dx,
                                                    grad_output.batch, dims_.c, plane(), log_,
                                                    ctx.stream()));
    return std::vector<DeviceTensor>{DeviceTensor{dx, grad_output.batch, dims_}};
  }

 private:
  int64_t plane() const { return int64_t{dims_.h} * dims_.w; }
  const nn::Dims dims_;
  const bool log_;
  DeviceBuffer<float> output_, grad_input_;
};

absl::StatusOr<std::unique_ptr<GpuNode>> MakeSoftmaxTwin(const GpuNodeContext& ctx) {
  const graph::TwinSpec<float> spec = ctx.cpu.twin();
  if (!(spec.softmax || spec.log_softmax) || ctx.input_dims.size() != 1) {
    return ctx.Error("this form of the op");
  }
  return std::unique_ptr<GpuNode>(
      std::make_unique<SoftmaxTwin>(ctx.input_dims[0], spec.log_softmax));
}

// LayerNormalization over each whole sample (norm_ops.h): its scale and optional bias bound
// where the graph keeps them.
class LayerNormTwin final : public GpuNode {
 public:
  LayerNormTwin(nn::Dims dims, double eps) : dims_(dims), eps_(eps) {}

  void BindParams(absl::Span<const float* const> params, absl::Span<float* const> grads) override {
    scale_ = params[0];
    scale_grad_ = grads[0];
    bias_ = params.size() > 1 ? params[1] : nullptr;
    bias_grad_ = grads.size() > 1 ? grads[1] : nullptr;
  }

  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, absl::Span<const DeviceTensor> inputs,
                                       bool) override {
    const DeviceTensor& x = inputs[0];
    batch_ = x.batch;
    DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, x.size()));
    DPTRAIN_ASSIGN_OR_RETURN(float* xhat, xhat_.Ensure(ctx, x.size()));
    DPTRAIN_ASSIGN_OR_RETURN(float* inv, inv_std_.Ensure(ctx, x.batch));
    DPTRAIN_RETURN_IF_ERROR(LayerNormForward(x.data, scale_, bias_, y, xhat, inv, x.batch,
                                             dims_.size(), eps_, ctx.stream()));
    return DeviceTensor{y, x.batch, dims_};
  }

  absl::StatusOr<std::vector<DeviceTensor>> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                     const std::vector<bool>& need) override {
    float* dx = nullptr;
    if (need[0]) {
      DPTRAIN_ASSIGN_OR_RETURN(dx, grad_input_.Ensure(ctx, grad_output.size()));
    }
    DPTRAIN_RETURN_IF_ERROR(LayerNormBackward(grad_output.data, xhat_.data(), inv_std_.data(),
                                              scale_, scale_grad_, bias_grad_, dx, batch_,
                                              dims_.size(), ctx.stream()));
    if (!need[0]) return std::vector<DeviceTensor>{DeviceTensor{}};
    return std::vector<DeviceTensor>{DeviceTensor{dx, batch_, dims_}};
  }

 private:
  const nn::Dims dims_;
  const double eps_;
  const float* scale_ = nullptr;
  const float* bias_ = nullptr;
  float* scale_grad_ = nullptr;
  float* bias_grad_ = nullptr;
  int batch_ = 0;
  DeviceBuffer<float> output_, xhat_, inv_std_, grad_input_;
};

absl::StatusOr<std::unique_ptr<GpuNode>> MakeLayerNormTwin(const GpuNodeContext& ctx) {
  const graph::TwinSpec<float> spec = ctx.cpu.twin();
  if (!(spec.layer_norm_eps > 0) || ctx.input_dims.size() != 1) {
    return ctx.Error("this form of the op");
  }
  return std::unique_ptr<GpuNode>(
      std::make_unique<LayerNormTwin>(ctx.input_dims[0], spec.layer_norm_eps));
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuNode>> MakeElementFunctionTwin(const GpuNodeContext& ctx) {
  return MakeFunctionTwin(ctx);
}

absl::Status GpuNodeContext::Error(absl::string_view what) const {
  return absl::InvalidArgumentError(absl::StrCat("node '", name, "' (", op, "): ", what,
                                                 " (no CUDA version yet; --device=cpu trains it)"));
}

absl::StatusOr<std::unique_ptr<GpuNode>> GpuOpRegistry::Create(
    const GpuNodeContext& context) const {
  auto it = ops_.find(context.op);
  if (it == ops_.end()) {
    return absl::UnimplementedError(absl::StrCat("node '", context.name, "' (", context.op,
                                                 "): no CUDA version yet; --device=cpu trains it"));
  }
  return it->second(context);
}

GpuOpRegistry GpuOps() {
  GpuOpRegistry r;
  for (const char* op : {"Conv", "Gemm", "MatMul", "BatchNormalization", "MaxPool", "AveragePool",
                         "GlobalAveragePool", "Flatten", "Residual"}) {
    r.Register(op, &MakeLayerTwin);
  }
  // Twins of the elements alone: any shape.
  for (const char* op : {"Relu", "Sigmoid"}) r.Register(op, &MakeLayerTwin, true);
  for (const char* op : {"Identity", "Reshape", "Cast", "Squeeze", "Unsqueeze"}) {
    r.Register(op, &MakeViewTwin, true);
  }
  for (const char* op :
       {"Tanh", "Erf", "HardSigmoid", "HardSwish", "LeakyRelu", "Clip", "Elu", "Selu", "Softplus",
        "Softsign", "Exp", "Log", "Sqrt", "Neg", "Abs", "Reciprocal", "Pow", "Sin", "Cos"}) {
    r.Register(op, &MakeFunctionTwin, true);
  }
  for (const char* op : {"Add", "Sub", "Mul", "Div", "PRelu"}) r.Register(op, &MakeBinaryTwin);
  r.Register("Pad", &MakePadTwin);
  r.Register("Softmax", &MakeSoftmaxTwin);
  r.Register("LogSoftmax", &MakeSoftmaxTwin);
  r.Register("Dropout", &MakeDropoutTwin, true);
  r.Register("Concat", &MakeConcatTwin);
  r.Register("LayerNormalization", &MakeLayerNormTwin);
  r.Register("Slice", &MakeSliceTwin);
  r.Register("ChannelShuffle", &MakeChannelShuffleTwin);
  r.Register("InstanceNormalization", &MakeInstanceNormTwin);
  r.Register("ReduceMean", &MakeReduceMeanTwin);
  return r;
}

}  // namespace cuda
}  // namespace dptrain
