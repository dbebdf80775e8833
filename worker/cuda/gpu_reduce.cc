#include "worker/cuda/gpu_reduce.h"

#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "worker/cuda/graph_kernels.h"
#include "worker/cuda/index_plan.h"
#include "worker/graph/reduce_elements.h"

namespace dptrain {
namespace cuda {
namespace {

class ReduceTwin final : public GpuNode {
 public:
  ReduceTwin(const graph::NodeImpl<float>& cpu, nn::Dims in_dims)
      : cpu_(cpu),
        in_dims_(in_dims),
        reduction_(cpu.twin().reduction),
        scale_(static_cast<float>(cpu.twin().reduce_scale)) {}

  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, absl::Span<const DeviceTensor> inputs,
                                       bool) override {
    x_ = inputs[0];
    // The plan: per input element, the output it adds into (`indices`), and each output's
    // inputs (the readers of the one "input" of outputs.size() elements).
    const int64_t outputs = int64_t{x_.batch} * cpu_.output_dims().size();
    plan_ = plans_.Find(x_.batch);
    if (plan_ == nullptr) {
      std::vector<int64_t> out_of;
      if (!cpu_.ReducedIndices(x_.batch, out_of)) {
        return absl::InternalError("the CPU node no longer describes its reduction");
      }
      DPTRAIN_ASSIGN_OR_RETURN(std::unique_ptr<IndexPlan> made,
                               MakeIndexPlan(ctx, out_of, {outputs}));
      plan_ = plans_.Put(x_.batch, std::move(made));
    }
    const bool arg_max = reduction_ == graph::kReduceMax || reduction_ == graph::kReduceMin;
    DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, outputs));
    int64_t* arg = nullptr;
    if (arg_max) {
      DPTRAIN_ASSIGN_OR_RETURN(arg, arg_.Ensure(ctx, outputs));
    }
    const IndexPlan::Input& o = plan_->inputs[0];
    DPTRAIN_RETURN_IF_ERROR(ReduceForward(reduction_, o.offsets.data(), o.readers.data(), x_.data,
                                          scale_, y, arg, outputs, ctx.stream()));
    return DeviceTensor{y, x_.batch, cpu_.output_dims()};
  }

  absl::StatusOr<std::vector<DeviceTensor>> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                     const std::vector<bool>& need) override {
    if (plan_ == nullptr || grad_output.size() != plan_->inputs[0].size) {
      return absl::FailedPreconditionError("Backward without the Forward of this gradient");
    }
    if (!need[0]) return std::vector<DeviceTensor>{DeviceTensor{}};
    DPTRAIN_ASSIGN_OR_RETURN(float* dx, grad_input_.Ensure(ctx, plan_->outputs));
    DPTRAIN_RETURN_IF_ERROR(ReduceBackward(reduction_, plan_->indices.data(), x_.data,
                                           output_.data(), arg_.data(), grad_output.data, scale_,
                                           dx, plan_->outputs, ctx.stream()));
    return std::vector<DeviceTensor>{DeviceTensor{dx, x_.batch, in_dims_}};
  }

 private:
  const graph::NodeImpl<float>& cpu_;
  const nn::Dims in_dims_;
  const int reduction_;
  const float scale_;
  PlanCache plans_;  // `outputs` of a plan: the input's elements.
  IndexPlan* plan_ = nullptr;
  DeviceTensor x_;  // The last Forward's input, valid until Backward returns.
  DeviceBuffer<float> output_, grad_input_;
  DeviceBuffer<int64_t> arg_;
};

class TopKTwin final : public GpuNode {
 public:
  TopKTwin(const graph::NodeImpl<float>& cpu, graph::ValueShape in, nn::Dims in_dims)
      : cpu_(cpu), in_(std::move(in)), in_dims_(in_dims) {
    const graph::TwinSpec<float> spec = cpu.twin();
    axis_ = static_cast<int>(spec.topk[0]);
    k_ = spec.topk[1];
    largest_ = spec.topk[2] != 0;
  }

  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, absl::Span<const DeviceTensor> inputs,
                                       bool) override {
    const DeviceTensor& x = inputs[0];
    batch_ = x.batch;
    size_ = x.size();
    const std::vector<int64_t> shape = in_.Concrete(x.batch);
    int64_t outer = 1, inner = 1;
    for (int a = 0; a < axis_; ++a) outer *= shape[a];
    for (size_t a = axis_ + 1; a < shape.size(); ++a) inner *= shape[a];
    outputs_ = outer * k_ * inner;
    DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, outputs_));
    DPTRAIN_ASSIGN_OR_RETURN(int64_t * taken, taken_.Ensure(ctx, outputs_));
    DPTRAIN_RETURN_IF_ERROR(
        TopKForward(x.data, y, taken, outer, shape[axis_], inner, k_, largest_, ctx.stream()));
    return DeviceTensor{y, x.batch, cpu_.output_dims()};
  }

  absl::StatusOr<std::vector<DeviceTensor>> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                     const std::vector<bool>& need) override {
    if (grad_output.size() != outputs_) {
      return absl::FailedPreconditionError("Backward without the Forward of this gradient");
    }
    if (!need[0]) return std::vector<DeviceTensor>{DeviceTensor{}};
    DPTRAIN_ASSIGN_OR_RETURN(float* dx, grad_input_.Ensure(ctx, size_));
    DPTRAIN_RETURN_IF_ERROR(
        TopKBackward(grad_output.data, taken_.data(), dx, outputs_, size_, ctx.stream()));
    return std::vector<DeviceTensor>{DeviceTensor{dx, batch_, in_dims_}};
  }

 private:
  const graph::NodeImpl<float>& cpu_;
  const graph::ValueShape in_;
  const nn::Dims in_dims_;
  int axis_ = 0;
  int64_t k_ = 0;
  bool largest_ = true;
  int batch_ = 0;
  int64_t size_ = 0, outputs_ = 0;
  DeviceBuffer<float> output_, grad_input_;
  DeviceBuffer<int64_t> taken_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuNode>> MakeTopKTwin(const GpuNodeContext& ctx,
                                                      const graph::ValueShape& in) {
  const graph::TwinSpec<float> spec = ctx.cpu.twin();
  if (spec.topk[1] < 1 || spec.topk[0] < 0 || spec.topk[0] >= in.rank() ||
      ctx.input_dims.size() != 1) {
    return ctx.Error("this form of the op");
  }
  return std::unique_ptr<GpuNode>(std::make_unique<TopKTwin>(ctx.cpu, in, ctx.input_dims[0]));
}

absl::StatusOr<std::unique_ptr<GpuNode>> MakeReduceTwin(const GpuNodeContext& ctx) {
  if (ctx.cpu.twin().reduction < 0 || ctx.input_dims.size() != 1) {
    return ctx.Error("this form of the op");
  }
  return std::unique_ptr<GpuNode>(std::make_unique<ReduceTwin>(ctx.cpu, ctx.input_dims[0]));
}

}  // namespace cuda
}  // namespace dptrain
