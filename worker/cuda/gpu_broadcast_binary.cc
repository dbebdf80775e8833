#include "worker/cuda/gpu_broadcast_binary.h"

#include <map>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/graph_kernels.h"
#include "worker/cuda/graph_operand.h"
#include "worker/cuda/index_plan.h"

namespace dptrain {
namespace cuda {
namespace {

class BroadcastBinaryTwin final : public OperandNodeTwin {
 public:
  BroadcastBinaryTwin(const graph::NodeImpl<float>& cpu, std::vector<nn::Dims> inputs)
      : OperandNodeTwin(cpu.twin()), cpu_(cpu), inputs_(std::move(inputs)) {
    const graph::TwinSpec<float> spec = cpu.twin();
    op_ = static_cast<int>(*spec.binary);
    swapped_ = spec.swapped;
    // As the CPU node: the full value is input 0 beside a tensor, else the right one if swapped.
    full_ = operand_ || !swapped_ ? 0 : 1;
  }

  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, absl::Span<const DeviceTensor> inputs,
                                       bool) override {
    const DeviceTensor& x = inputs[full_];
    x_ = x.data;
    batches_.clear();
    for (const DeviceTensor& in : inputs) batches_.push_back(in.batch);
    int64_t other_size = 0;
    if (operand_) {
      other_size = operand_->size();
      DPTRAIN_ASSIGN_OR_RETURN(other_, operand_->Values(ctx));
    } else {
      other_ = inputs[1 - full_].data;
      other_size = inputs[1 - full_].size();
    }
    plan_ = plans_.Find(x.batch);
    if (plan_ == nullptr) {
      std::vector<int64_t> indices;
      if (!cpu_.OperandIndices(x.batch, indices)) {
        return absl::InternalError("the CPU node no longer describes its operand");
      }
      DPTRAIN_ASSIGN_OR_RETURN(std::unique_ptr<IndexPlan> made,
                               MakeIndexPlan(ctx, indices, {other_size}));
      plan_ = plans_.Put(x.batch, std::move(made));
    }
    DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, plan_->outputs));
    DPTRAIN_RETURN_IF_ERROR(BroadcastBinaryForward(op_, swapped_, x_, other_, plan_->indices.data(),
                                                   y, plan_->outputs, ctx.stream()));
    return DeviceTensor{y, x.batch, cpu_.output_dims()};
  }

  absl::StatusOr<std::vector<DeviceTensor>> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                     const std::vector<bool>& need) override {
    if (plan_ == nullptr || grad_output.size() != plan_->outputs) {
      return absl::FailedPreconditionError("Backward without the Forward of this gradient");
    }
    std::vector<DeviceTensor> dx(need.size());
    const int64_t n = plan_->outputs;
    if (need[full_]) {
      DPTRAIN_ASSIGN_OR_RETURN(float* g, grad_x_.Ensure(ctx, n));
      DPTRAIN_RETURN_IF_ERROR(BroadcastBinaryBackwardFull(
          op_, swapped_, x_, other_, plan_->indices.data(), grad_output.data, g, n, ctx.stream()));
      dx[full_] = DeviceTensor{g, batches_[full_], inputs_[full_]};
    }
    float* other_grad = nullptr;
    if (operand_) {
      other_grad = operand_->grad();  // Null unless learned.
    } else if (need[1 - full_]) {
      DPTRAIN_ASSIGN_OR_RETURN(other_grad, grad_other_.Ensure(ctx, plan_->inputs[0].size));
      dx[1 - full_] = DeviceTensor{other_grad, batches_[1 - full_], inputs_[1 - full_]};
    }
    if (other_grad != nullptr) {
      const IndexPlan::Input& o = plan_->inputs[0];
      DPTRAIN_RETURN_IF_ERROR(BroadcastBinaryBackwardOperand(
          op_, swapped_, x_, other_, o.offsets.data(), o.readers.data(), grad_output.data,
          other_grad, o.size, ctx.stream()));
    }
    return dx;
  }

 private:
  const graph::NodeImpl<float>& cpu_;
  const std::vector<nn::Dims> inputs_;
  int op_ = 0;
  bool swapped_ = false;
  size_t full_ = 0;
  PlanCache plans_;  // The operand indices and the operand's readers.
  IndexPlan* plan_ = nullptr;
  const float* x_ = nullptr;  // The last Forward's, valid until Backward returns.
  const float* other_ = nullptr;
  std::vector<int> batches_;
  DeviceBuffer<float> output_, grad_x_, grad_other_;
};

class WhereTwin final : public GpuNode {
 public:
  WhereTwin(const graph::NodeImpl<float>& cpu, std::vector<nn::Dims> inputs)
      : cpu_(cpu), inputs_(std::move(inputs)) {}

  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, absl::Span<const DeviceTensor> inputs,
                                       bool) override {
    batch_ = inputs[0].batch;
    std::vector<DeviceBuffer<float>>& constants = constants_[batch_];
    if (constants.empty()) {  // This batch size's constants, broadcast once.
      std::vector<std::vector<float>> host;
      if (!cpu_.BroadcastConstants(batch_, host) || host.size() != 3) {
        return absl::InternalError("the CPU node no longer describes its constants");
      }
      constants.resize(3);
      for (int i = 0; i < 3; ++i) {
        DPTRAIN_RETURN_IF_ERROR(UploadAndWait(ctx, host[i], constants[i]));
      }
    }
    size_t runtime = 0;
    for (int i = 0; i < 3; ++i) {
      const bool constant = constants[i].data() != nullptr;
      runtime_[i] = constant ? -1 : static_cast<int>(runtime);
      v_[i] = constant ? constants[i].data() : inputs[runtime++].data;
    }
    n_ = int64_t{batch_} * cpu_.output_dims().size();
    DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, n_));
    DPTRAIN_RETURN_IF_ERROR(WhereForward(v_[0], v_[1], v_[2], y, n_, ctx.stream()));
    return DeviceTensor{y, batch_, cpu_.output_dims()};
  }

  absl::StatusOr<std::vector<DeviceTensor>> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                     const std::vector<bool>& need) override {
    if (grad_output.size() != n_) {
      return absl::FailedPreconditionError("Backward without the Forward of this gradient");
    }
    std::vector<DeviceTensor> dx(need.size());
    float* d[3] = {nullptr, nullptr, nullptr};
    for (int i = 1; i < 3; ++i) {  // The condition gets none (its slot: an empty tensor).
      const int slot = runtime_[i];
      if (slot < 0 || !need[slot]) continue;
      DPTRAIN_ASSIGN_OR_RETURN(d[i], grads_[i].Ensure(ctx, n_));
      dx[slot] = DeviceTensor{d[i], batch_, inputs_[slot]};
    }
    if (runtime_[0] >= 0 && need[runtime_[0]]) {
      DPTRAIN_ASSIGN_OR_RETURN(float* zero, grads_[0].Ensure(ctx, n_));
      DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(zero, 0, n_ * sizeof(float), ctx.stream()));
      dx[runtime_[0]] = DeviceTensor{zero, batch_, inputs_[runtime_[0]]};
    }
    DPTRAIN_RETURN_IF_ERROR(WhereBackward(v_[0], grad_output.data, d[1], d[2], n_, ctx.stream()));
    return dx;
  }

 private:
  const graph::NodeImpl<float>& cpu_;
  const std::vector<nn::Dims> inputs_;
  std::map<int, std::vector<DeviceBuffer<float>>> constants_;  // By batch size.
  int batch_ = 0;
  int64_t n_ = 0;
  int runtime_[3] = {-1, -1, -1};  // Per input: its runtime slot, -1 for a constant.
  const float* v_[3] = {nullptr, nullptr, nullptr};  // The last Forward's cond, a, b.
  DeviceBuffer<float> output_, grads_[3];
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuNode>> MakeWhereTwin(const GpuNodeContext& ctx) {
  std::vector<std::vector<float>> probe;
  if (!ctx.cpu.BroadcastConstants(1, probe) || probe.size() != 3) {
    return ctx.Error("this form of the op");
  }
  return std::unique_ptr<GpuNode>(std::make_unique<WhereTwin>(ctx.cpu, ctx.input_dims));
}

absl::StatusOr<std::unique_ptr<GpuNode>> MakeBroadcastBinaryTwin(const GpuNodeContext& ctx) {
  const graph::TwinSpec<float> spec = ctx.cpu.twin();
  const size_t runtime = spec.operand_size > 0 ? 1 : 2;
  if (!spec.binary.has_value() || ctx.input_dims.size() != runtime) {
    return ctx.Error("this form of the op");
  }
  return std::unique_ptr<GpuNode>(std::make_unique<BroadcastBinaryTwin>(ctx.cpu, ctx.input_dims));
}

}  // namespace cuda
}  // namespace dptrain
