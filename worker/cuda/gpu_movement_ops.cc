// Twins of the graph ops that move elements without arithmetic (gpu_movement_ops.h).
#include "worker/cuda/gpu_movement_ops.h"

#include <algorithm>
#include <array>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/graph_kernels.h"
#include "worker/cuda/graph_operand.h"
#include "worker/cuda/index_plan.h"
#include "worker/graph/element_sources.h"

namespace dptrain {
namespace cuda {
namespace {

// The inputs side by side along the channels: per sample, input k's c*h*w elements after
// those of inputs 0..k-1 (one strided copy per input and direction).
class ConcatTwin final : public GpuNode {
 public:
  ConcatTwin(std::vector<nn::Dims> inputs, nn::Dims output)
      : inputs_(std::move(inputs)), output_dims_(output) {}

  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, absl::Span<const DeviceTensor> inputs,
                                       bool) override {
    const int batch = inputs[0].batch;
    const int64_t out_sample = output_dims_.size();
    DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, batch * out_sample));
    int64_t at = 0;
    for (size_t k = 0; k < inputs.size(); ++k) {
      const int64_t in_sample = inputs_[k].size();
      DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
          y + at, out_sample * sizeof(float), inputs[k].data, in_sample * sizeof(float),
          in_sample * sizeof(float), batch, cudaMemcpyDeviceToDevice, ctx.stream()));
      at += in_sample;
    }
    return DeviceTensor{y, batch, output_dims_};
  }

  absl::StatusOr<std::vector<DeviceTensor>> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                     const std::vector<bool>& need) override {
    const int batch = grad_output.batch;
    const int64_t out_sample = output_dims_.size();
    grads_.resize(inputs_.size());
    std::vector<DeviceTensor> dx(inputs_.size());
    int64_t at = 0;
    for (size_t k = 0; k < inputs_.size(); ++k) {
      const int64_t in_sample = inputs_[k].size();
      if (need[k]) {
        DPTRAIN_ASSIGN_OR_RETURN(float* g, grads_[k].Ensure(ctx, batch * in_sample));
        DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
            g, in_sample * sizeof(float), grad_output.data + at, out_sample * sizeof(float),
            in_sample * sizeof(float), batch, cudaMemcpyDeviceToDevice, ctx.stream()));
        dx[k] = DeviceTensor{g, batch, inputs_[k]};
      }
      at += in_sample;
    }
    return dx;
  }

 private:
  const std::vector<nn::Dims> inputs_;
  const nn::Dims output_dims_;
  DeviceBuffer<float> output_;
  std::vector<DeviceBuffer<float>> grads_;
};

// Slice: the window of one axis (c, h or w) per sample; rows of `width` elements, `outer` of
// them, `pitch` apart in the full tensor, the window `offset` into each.
class SliceTwin final : public GpuNode {
 public:
  SliceTwin(nn::Dims in, nn::Dims out, int64_t outer_per_sample, int64_t width, int64_t pitch,
            int64_t offset)
      : in_(in),
        out_(out),
        outer_(outer_per_sample),
        width_(width),
        pitch_(pitch),
        offset_(offset) {}

  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, absl::Span<const DeviceTensor> inputs,
                                       bool) override {
    const DeviceTensor& x = inputs[0];
    DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, x.batch * out_.size()));
    DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
        y, width_ * sizeof(float), x.data + offset_, pitch_ * sizeof(float), width_ * sizeof(float),
        x.batch * outer_, cudaMemcpyDeviceToDevice, ctx.stream()));
    return DeviceTensor{y, x.batch, out_};
  }

  absl::StatusOr<std::vector<DeviceTensor>> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                     const std::vector<bool>& need) override {
    if (!need[0]) return std::vector<DeviceTensor>{DeviceTensor{}};
    const int batch = grad_output.batch;
    DPTRAIN_ASSIGN_OR_RETURN(float* dx, grad_input_.Ensure(ctx, batch * in_.size()));
    DPTRAIN_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(dx, 0, batch * in_.size() * sizeof(float), ctx.stream()));
    DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(
        dx + offset_, pitch_ * sizeof(float), grad_output.data, width_ * sizeof(float),
        width_ * sizeof(float), batch * outer_, cudaMemcpyDeviceToDevice, ctx.stream()));
    return std::vector<DeviceTensor>{DeviceTensor{dx, batch, in_}};
  }

 private:
  const nn::Dims in_, out_;
  const int64_t outer_, width_, pitch_, offset_;
  DeviceBuffer<float> output_, grad_input_;
};

// ChannelShuffle: the permutation kernel; backward is the shuffle of c / groups groups.
class ChannelShuffleTwin final : public GpuNode {
 public:
  ChannelShuffleTwin(nn::Dims dims, int groups) : dims_(dims), groups_(groups) {}

  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, absl::Span<const DeviceTensor> inputs,
                                       bool) override {
    const DeviceTensor& x = inputs[0];
    DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, x.size()));
    DPTRAIN_RETURN_IF_ERROR(ChannelShuffle(x.data, y, x.batch, dims_.c, groups_,
                                           int64_t{dims_.h} * dims_.w, ctx.stream()));
    return DeviceTensor{y, x.batch, dims_};
  }

  absl::StatusOr<std::vector<DeviceTensor>> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                     const std::vector<bool>& need) override {
    if (!need[0]) return std::vector<DeviceTensor>{DeviceTensor{}};
    DPTRAIN_ASSIGN_OR_RETURN(float* dx, grad_input_.Ensure(ctx, grad_output.size()));
    DPTRAIN_RETURN_IF_ERROR(ChannelShuffle(grad_output.data, dx, grad_output.batch, dims_.c,
                                           dims_.c / groups_, int64_t{dims_.h} * dims_.w,
                                           ctx.stream()));
    return std::vector<DeviceTensor>{DeviceTensor{dx, grad_output.batch, dims_}};
  }

 private:
  const nn::Dims dims_;
  const int groups_;
  DeviceBuffer<float> output_, grad_input_;
};

// A node that only moves elements, of any shape (graph/element_sources.h): the CPU node's
// sources and their readers, made on the host once per batch size and kept on the device
// (index_plan.h); the
// forward is one gather, the backward one readers' sum per input (and into a learned operand's
// gradient: the operand is the input after the runtime ones).
class MoveTwin final : public OperandNodeTwin {
 public:
  MoveTwin(const graph::NodeImpl<float>& cpu, std::vector<nn::Dims> inputs)
      : OperandNodeTwin(cpu.twin()), cpu_(cpu), inputs_(std::move(inputs)) {}

  // `inputs`: the runtime inputs, or the graph's input alone for a node without any (read for
  // the batch size, as the CPU node's Forward gets it).
  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, absl::Span<const DeviceTensor> inputs,
                                       bool) override {
    // The batch as the CPU node reads it; an output without a batch (rows of a table picked by
    // constant indices, whatever the graph's batch) is held once, as batch 1.
    const std::optional<graph::ValueShape> out_shape = cpu_.output_shape();
    const int batch = out_shape && out_shape->batch_axis < 0 ? 1 : inputs[0].batch;
    std::vector<int64_t> sizes;
    SourceInputs pointers;
    for (size_t i = 0; i < inputs.size(); ++i) {
      sizes.push_back(inputs[i].size());
      pointers.data[i] = inputs[i].data;
    }
    if (operand_) {
      if (inputs.size() >= static_cast<size_t>(graph::kMaxSourceInputs)) {
        return absl::InternalError("too many inputs for the gather");
      }
      DPTRAIN_ASSIGN_OR_RETURN(pointers.data[inputs.size()], operand_->Values(ctx));
      sizes.push_back(operand_->size());
    }
    plan_ = plans_.Find(batch);
    if (plan_ == nullptr) {
      std::vector<int64_t> sources;
      if (!cpu_.ElementSources(batch, sources)) {
        return absl::InternalError("the CPU node no longer describes its moves");
      }
      DPTRAIN_ASSIGN_OR_RETURN(std::unique_ptr<IndexPlan> made, MakeIndexPlan(ctx, sources, sizes));
      plan_ = plans_.Put(batch, std::move(made));
    }
    DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, plan_->outputs));
    DPTRAIN_RETURN_IF_ERROR(
        GatherSources(plan_->indices.data(), pointers, y, plan_->outputs, ctx.stream()));
    batches_.clear();
    for (const DeviceTensor& x : inputs) batches_.push_back(x.batch);
    return DeviceTensor{y, batch, cpu_.output_dims()};
  }

  absl::StatusOr<std::vector<DeviceTensor>> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                     const std::vector<bool>& need) override {
    if (plan_ == nullptr || grad_output.size() != plan_->outputs) {
      return absl::FailedPreconditionError("Backward without the Forward of this gradient");
    }
    grads_.resize(inputs_.size());
    std::vector<DeviceTensor> dx(inputs_.size());
    for (size_t i = 0; i < inputs_.size(); ++i) {
      if (!need[i]) continue;
      const IndexPlan::Input& in = plan_->inputs[i];
      DPTRAIN_ASSIGN_OR_RETURN(float* g, grads_[i].Ensure(ctx, in.size));
      DPTRAIN_RETURN_IF_ERROR(SumReaders(in.offsets.data(), in.readers.data(), grad_output.data, g,
                                         in.size, ctx.stream()));
      dx[i] = DeviceTensor{g, batches_[i], inputs_[i]};
    }
    if (operand_ && operand_->grad() != nullptr) {  // Overwritten, as the CPU node does.
      const IndexPlan::Input& in = plan_->inputs.back();
      DPTRAIN_RETURN_IF_ERROR(SumReaders(in.offsets.data(), in.readers.data(), grad_output.data,
                                         operand_->grad(), in.size, ctx.stream()));
    }
    return dx;
  }

 private:
  const graph::NodeImpl<float>& cpu_;
  const std::vector<nn::Dims> inputs_;  // The runtime inputs' dims (none: the batch's source).
  PlanCache plans_;                     // The sources (the Forward's inputs, then the operand).
  IndexPlan* plan_ = nullptr;           // The last Forward's.
  std::vector<int> batches_;            // The last Forward's inputs' batches.
  DeviceBuffer<float> output_;
  std::vector<DeviceBuffer<float>> grads_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuNode>> MakeConcatTwin(const GpuNodeContext& ctx) {
  const nn::Dims out = ctx.cpu.output_dims();
  int channels = 0;
  for (const nn::Dims& d : ctx.input_dims) {
    if (d.h != out.h || d.w != out.w) return ctx.Error("Concat other than over the channels");
    channels += d.c;
  }
  if (ctx.input_dims.empty() || channels != out.c) {
    return ctx.Error("Concat of constants (computed values only)");
  }
  return std::unique_ptr<GpuNode>(std::make_unique<ConcatTwin>(ctx.input_dims, out));
}

absl::StatusOr<std::unique_ptr<GpuNode>> MakeSliceTwin(const GpuNodeContext& ctx) {
  if (ctx.input_dims.size() != 1) return ctx.Error("more than one computed input");
  const nn::Dims in = ctx.input_dims[0];
  const nn::Dims out = ctx.cpu.output_dims();
  const std::array<int, 3> start = ctx.cpu.twin().slice_start;
  const int in_dims[3] = {in.c, in.h, in.w};
  const int out_dims[3] = {out.c, out.h, out.w};
  int axis = -1;
  for (int a = 0; a < 3; ++a) {
    if (in_dims[a] == out_dims[a]) continue;
    if (axis >= 0) return ctx.Error("Slice of several axes");
    axis = a;
  }
  if (axis < 0) axis = 0;  // The whole input: one row per sample.
  int64_t inner = 1, outer = 1;
  for (int a = axis + 1; a < 3; ++a) inner *= in_dims[a];
  for (int a = 0; a < axis; ++a) outer *= in_dims[a];
  return std::unique_ptr<GpuNode>(
      std::make_unique<SliceTwin>(in, out, outer, int64_t{out_dims[axis]} * inner,
                                  int64_t{in_dims[axis]} * inner, int64_t{start[axis]} * inner));
}

absl::StatusOr<std::unique_ptr<GpuNode>> MakeMoveTwin(const GpuNodeContext& ctx) {
  if (ctx.input_dims.size() > static_cast<size_t>(graph::kMaxSourceInputs)) {
    return ctx.Error(absl::StrCat("moves elements of ", ctx.input_dims.size(), " inputs (at most ",
                                  graph::kMaxSourceInputs, ")"));
  }
  return std::unique_ptr<GpuNode>(std::make_unique<MoveTwin>(ctx.cpu, ctx.input_dims));
}

absl::StatusOr<std::unique_ptr<GpuNode>> MakeChannelShuffleTwin(const GpuNodeContext& ctx) {
  if (ctx.input_dims.size() != 1) return ctx.Error("more than one computed input");
  return std::unique_ptr<GpuNode>(
      std::make_unique<ChannelShuffleTwin>(ctx.input_dims[0], ctx.cpu.twin().shuffle_groups));
}

}  // namespace cuda
}  // namespace dptrain
