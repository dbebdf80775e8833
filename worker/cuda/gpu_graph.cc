#include "worker/cuda/gpu_graph.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/gpu_batched_matmul.h"
#include "worker/cuda/gpu_broadcast_binary.h"
#include "worker/cuda/gpu_lookup.h"
#include "worker/cuda/gpu_movement_ops.h"
#include "worker/cuda/gpu_recurrent.h"
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
  if (spec.recurrent.hidden > 0) return MakeRecurrentTwin(ctx);
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
  // Tied weights: a later use of a weight writes its gradient into a buffer of its own, added
  // into the first use's (in the flat gradients) when the first use's backward is done.
  std::map<int64_t, int> first_use;  // Offset of a weight -> the node of its first use.
  for (size_t n = 0; n < cpu.nodes().size(); ++n) {
    const auto& node = cpu.nodes()[n];
    for (size_t s = 0; s < node.param_tied.size(); ++s) {
      if (node.param_tied[s] < 0) first_use.emplace(node.param_offsets[s], static_cast<int>(n));
    }
  }
  g->tied_of_.assign(cpu.nodes().size(), {});
  g->tied_into_.assign(cpu.nodes().size(), {});
  for (size_t n = 0; n < cpu.nodes().size(); ++n) {
    const auto& node = cpu.nodes()[n];
    g->tied_of_[n].assign(node.param_tied.size(), -1);
    for (size_t s = 0; s < node.param_tied.size(); ++s) {
      if (node.param_tied[s] < 0) continue;
      const auto first = first_use.find(node.param_offsets[s]);
      if (first == first_use.end()) {
        return absl::InternalError(
            absl::StrCat("node '", node.name, "': a tied weight's first use"));
      }
      g->tied_of_[n][s] = static_cast<int>(g->tied_.size());
      g->tied_into_[first->second].push_back(static_cast<int>(g->tied_.size()));
      g->tied_.push_back(Tied{node.param_offsets[s], node.param_sizes[s], {}});
    }
  }
  for (const auto& node : cpu.nodes()) {
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

bool GpuGraph::Replayable() const {
  for (const auto& node : nodes_) {
    if (!node->Replayable()) return false;
  }
  return true;
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
  params_ = params;
  grads_ = grads;
  for (size_t n = 0; n < nodes_.size(); ++n) BindNodeParams(n);
}

void GpuGraph::BindNodeParams(size_t n) {
  std::vector<const float*> values;
  std::vector<float*> grad_ptrs;
  const auto& node = cpu_.nodes()[n];
  for (size_t s = 0; s < node.param_offsets.size(); ++s) {
    values.push_back(params_ + node.param_offsets[s]);
    // A tied use's gradient: its own buffer (null until the first Forward allocates it).
    const int t = tied_of_[n][s];
    grad_ptrs.push_back(t < 0 ? grads_ + node.param_offsets[s] : tied_[t].grad.data());
  }
  nodes_[n]->BindParams(values, grad_ptrs);
}

absl::Status GpuGraph::AllocateTiedGrads(DeviceContext& ctx) {
  if (tied_allocated_) return absl::OkStatus();
  for (Tied& t : tied_) DPTRAIN_RETURN_IF_ERROR(t.grad.Ensure(ctx, t.size).status());
  for (size_t n = 0; n < nodes_.size(); ++n) {
    if (std::any_of(tied_of_[n].begin(), tied_of_[n].end(), [](int t) { return t >= 0; })) {
      BindNodeParams(n);
    }
  }
  tied_allocated_ = true;
  return absl::OkStatus();
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
  if (!tied_.empty() && params_ != nullptr) DPTRAIN_RETURN_IF_ERROR(AllocateTiedGrads(ctx));
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

absl::Status GpuGraph::ReportGrads(DeviceContext& ctx, int node) {
  // The later uses of the first use's tied weights, added in node order (as the CPU executor).
  for (int t : tied_into_[node]) {
    DPTRAIN_RETURN_IF_ERROR(
        AddInto(tied_[t].grad.data(), grads_ + tied_[t].offset, tied_[t].size, ctx.stream()));
  }
  if (!grads_ready_) return absl::OkStatus();
  const auto& plan = cpu_.nodes()[node];
  for (size_t s = 0; s < plan.param_offsets.size(); ++s) {
    if (tied_of_[node][s] >= 0) continue;  // Reported with its first use's.
    DPTRAIN_RETURN_IF_ERROR(grads_ready_(first_part_[node] + static_cast<int>(s),
                                         plan.param_offsets[s], plan.param_sizes[s]));
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceTensor> GpuGraph::Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                bool need_input_grad) {
  if (!tied_.empty() && !tied_allocated_) {  // The tied uses' buffers come with the first Forward.
    return absl::FailedPreconditionError("Backward before any Forward");
  }
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
        const int t = tied_of_[n][s];
        float* g = t < 0 ? grads_ + node.param_offsets[s] : tied_[t].grad.data();
        DPTRAIN_CUDA_RETURN_IF_ERROR(
            cudaMemsetAsync(g, 0, node.param_sizes[s] * sizeof(float), ctx.stream()));
      }
      DPTRAIN_RETURN_IF_ERROR(ReportGrads(ctx, n));
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
    DPTRAIN_RETURN_IF_ERROR(ReportGrads(ctx, n));
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
