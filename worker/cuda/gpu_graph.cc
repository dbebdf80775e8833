#include "worker/cuda/gpu_graph.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/gpu_batched_matmul.h"
#include "worker/cuda/gpu_broadcast_binary.h"
#include "worker/cuda/gpu_lookup.h"
#include "worker/cuda/gpu_movement_ops.h"
#include "worker/cuda/gpu_reduce.h"
#include "worker/cuda/gpu_rowwise.h"
#include "worker/cuda/kernels.h"

namespace dptrain {
namespace cuda {

namespace {

// The twin of a node whose values are not all batch-first (graph/any_shape_ops.h), chosen by
// what the CPU node says it does rather than by its op: a move of elements, a broadcast binary
// op, a Where, a reduction, a TopK, a node applied to each row of the last axis, a product of two
// computed values, an embedding lookup, an element-wise function (masks' comparisons too); else the
// registry's twin where it works on the elements alone (views, activations).
absl::StatusOr<std::unique_ptr<GpuNode>> AnyShapeTwin(const graph::Executor<float>& cpu,
                                                      const graph::Executor<float>::NodeState& node,
                                                      const GpuNodeContext& ctx,
                                                      const GpuOpRegistry& registry) {
  std::vector<int64_t> indices;
  if (node.impl->ElementSources(1, indices)) return MakeMoveTwin(ctx);
  if (node.impl->OperandIndices(1, indices)) return MakeBroadcastBinaryTwin(ctx);
  if (node.impl->ReducedIndices(1, indices)) return MakeReduceTwin(ctx);
  std::vector<std::vector<float>> constants;
  if (node.impl->BroadcastConstants(1, constants)) return MakeWhereTwin(ctx);
  const graph::TwinSpec<float> spec = node.impl->twin();
  if (spec.rowwise != nullptr) {
    return MakeRowwiseTwin(ctx, cpu.value_shapes()[node.inputs[0]].dims.back(), registry);
  }
  if (spec.batched_matmul[0] > 0) return MakeBatchedMatMulTwin(ctx);
  if (spec.lookup_row > 0) return MakeLookupTwin(ctx);
  if (spec.topk[1] > 0) return MakeTopKTwin(ctx, cpu.value_shapes()[node.inputs[0]]);
  if (spec.function != graph::ElementFunction::kNone) return MakeElementFunctionTwin(ctx);
  if (!spec.any_shape && registry.TakesAnyShape(node.op)) return registry.Create(ctx);
  return absl::UnimplementedError(absl::StrCat(
      "node '", node.name, "' (", node.op,
      ") works on values whose batch is not the first axis, of rank above 4, or row by row of "
      "their last axis (attention, transformers): no CUDA version yet; --device=cpu trains it"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuGraph>> GpuGraph::Create(const graph::Executor<float>& cpu,
                                                           const GpuOpRegistry& registry) {
  std::unique_ptr<GpuGraph> g(new GpuGraph(cpu));
  for (const auto& node : cpu.nodes()) {
    for (size_t s = 0; s < node.param_tied.size(); ++s) {
      if (node.param_tied[s] < 0) continue;
      return absl::UnimplementedError(absl::StrCat(
          "node '", node.name, "' (", node.op,
          ") learns a weight tied to an earlier node's (a module applied twice): tied weights "
          "have no CUDA version yet; --device=cpu trains it"));
    }
    GpuNodeContext ctx{node.name, node.op, *node.impl, {}};
    for (int v : node.inputs) ctx.input_dims.push_back(cpu.value_dims()[v]);
    DPTRAIN_ASSIGN_OR_RETURN(
        std::unique_ptr<GpuNode> twin,
        node.batch_first ? registry.Create(ctx) : AnyShapeTwin(cpu, node, ctx, registry));
    g->nodes_.push_back(std::move(twin));
  }
  for (const auto& node : cpu.nodes()) {  // One part per parameter, numbered node by node.
    g->first_part_.push_back(g->num_parts_);
    g->num_parts_ += static_cast<int>(node.param_offsets.size());
  }
  const size_t values = cpu.value_dims().size();
  g->values_.resize(values);
  g->grad_views_.resize(values);
  g->grad_ready_.resize(values);
  g->requires_grad_.resize(values);
  g->grad_sums_.resize(values);
  return g;
}

std::string GpuGraph::ToString() const {
  return absl::StrCat("GpuGraph(", nodes_.size(), " nodes)");
}

std::vector<nn::TensorSpec> GpuGraph::ParamSpecs() const {
  std::vector<nn::TensorSpec> specs;
  for (const nn::ParamInfo& p : cpu_.params()) specs.push_back({p.name, p.shape});
  return specs;
}

std::vector<nn::TensorSpec> GpuGraph::BufferSpecs() const {
  std::vector<nn::TensorSpec> specs;
  for (const nn::ParamInfo& b : cpu_.buffers()) specs.push_back({b.name, b.shape});
  return specs;
}

void GpuGraph::BindParams(const float* params, float* grads) {
  grads_ = grads;
  for (size_t n = 0; n < nodes_.size(); ++n) {
    std::vector<const float*> values;
    std::vector<float*> grad_ptrs;
    for (int64_t offset : cpu_.nodes()[n].param_offsets) {
      values.push_back(params + offset);
      grad_ptrs.push_back(grads + offset);
    }
    nodes_[n]->BindParams(values, grad_ptrs);
  }
}

void GpuGraph::BindBuffers(float* buffers) {
  for (size_t n = 0; n < nodes_.size(); ++n) {
    std::vector<float*> ptrs;
    for (int64_t offset : cpu_.nodes()[n].buffer_offsets) ptrs.push_back(buffers + offset);
    nodes_[n]->BindBuffers(ptrs);
  }
}

absl::Status GpuGraph::NodeError(int n, const absl::Status& error) const {
  const auto& node = cpu_.nodes()[n];
  return absl::Status(error.code(),
                      absl::StrCat("node '", node.name, "' (", node.op, "): ", error.message()));
}

absl::StatusOr<DeviceTensor> GpuGraph::Forward(DeviceContext& ctx, DeviceTensor input,
                                               bool training) {
  values_[0] = input;
  std::vector<DeviceTensor> inputs;
  for (size_t n = 0; n < nodes_.size(); ++n) {
    inputs.clear();
    for (int v : cpu_.nodes()[n].inputs) inputs.push_back(values_[v]);
    if (inputs.empty()) inputs.push_back(values_[0]);  // For the batch size (graph/node.h).
    absl::StatusOr<DeviceTensor> out = nodes_[n]->Forward(ctx, inputs, training);
    if (!out.ok()) return NodeError(n, out.status());
    values_[cpu_.nodes()[n].output] = *out;
  }
  return values_[cpu_.output_value()];
}

absl::Status GpuGraph::Accumulate(DeviceContext& ctx, int v, DeviceTensor grad) {
  if (!grad_ready_[v]) {
    grad_ready_[v] = true;
    if (cpu_.value_consumers()[v] == 1) {
      grad_views_[v] = grad;  // The only contribution: no copy.
      return absl::OkStatus();
    }
    DPTRAIN_ASSIGN_OR_RETURN(float* sum, grad_sums_[v].Ensure(ctx, grad.size()));
    DPTRAIN_RETURN_IF_ERROR(CopyOnDevice(ctx, sum, grad.data, grad.size()));
    grad_views_[v] = DeviceTensor{sum, grad.batch, cpu_.value_dims()[v]};
    return absl::OkStatus();
  }
  return AddInto(grad.data, grad_sums_[v].data(), grad.size(), ctx.stream());
}

absl::Status GpuGraph::ReportGrads(int node) {
  if (!grads_ready_) return absl::OkStatus();
  const auto& plan = cpu_.nodes()[node];
  for (size_t s = 0; s < plan.param_offsets.size(); ++s) {
    DPTRAIN_RETURN_IF_ERROR(grads_ready_(first_part_[node] + static_cast<int>(s),
                                         plan.param_offsets[s], plan.param_sizes[s]));
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceTensor> GpuGraph::Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                bool need_input_grad) {
  const auto& plan = cpu_.nodes();
  requires_grad_[0] = need_input_grad;
  for (const auto& node : plan) {
    bool needed = !node.param_offsets.empty();
    for (int v : node.inputs) needed = needed || requires_grad_[v];
    requires_grad_[node.output] = needed;
  }
  std::fill(grad_ready_.begin(), grad_ready_.end(), false);
  DPTRAIN_RETURN_IF_ERROR(Accumulate(ctx, cpu_.output_value(), grad_output));
  std::vector<bool> need;
  for (int n = static_cast<int>(plan.size()) - 1; n >= 0; --n) {
    const auto& node = plan[n];
    if (!requires_grad_[node.output]) continue;
    if (!grad_ready_[node.output]) {
      // The output does not reach the loss: the parameters' gradients are zero.
      for (size_t s = 0; s < node.param_offsets.size(); ++s) {
        DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
            grads_ + node.param_offsets[s], 0, node.param_sizes[s] * sizeof(float), ctx.stream()));
      }
      DPTRAIN_RETURN_IF_ERROR(ReportGrads(n));
      continue;
    }
    need.clear();
    for (int v : node.inputs) need.push_back(requires_grad_[v]);
    absl::StatusOr<std::vector<DeviceTensor>> backward =
        nodes_[n]->Backward(ctx, grad_views_[node.output], need);
    if (!backward.ok()) return NodeError(n, backward.status());
    const std::vector<DeviceTensor>& grads = *backward;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      if (need[i] && grads[i].data != nullptr) {  // Empty: nothing (as the CPU executor).
        DPTRAIN_RETURN_IF_ERROR(Accumulate(ctx, node.inputs[i], grads[i]));
      }
    }
    DPTRAIN_RETURN_IF_ERROR(ReportGrads(n));
  }
  if (!need_input_grad) return DeviceTensor{};
  if (!grad_ready_[0]) {
    const int64_t n = values_[0].size();
    DPTRAIN_ASSIGN_OR_RETURN(float* zero, grad_sums_[0].Ensure(ctx, n));
    DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(zero, 0, n * sizeof(float), ctx.stream()));
    return DeviceTensor{zero, values_[0].batch, cpu_.input_dims()};
  }
  return grad_views_[0];
}

}  // namespace cuda
}  // namespace dptrain
