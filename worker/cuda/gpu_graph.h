// A graph model (worker/graph/) on the GPU: the CPU executor's plan (which node reads which
// value, where each node's parameters and buffers lie in the flat buffers) run with each
// node's CUDA twin, built through a registry keyed by op (GpuOps) from what the CPU node's
// factory parsed (graph::TwinSpec): no attribute is read twice, no downcast looks for a type.
//
// Every batch-first CPU node has a twin: the ops that run one nn::Layer through gpu_network.h's
// layers (Conv, Gemm/MatMul as nn.Linear with a transposed weight staged, BatchNormalization, Relu,
// Sigmoid, MaxPool and AveragePool (ceil_mode and count_include_pad=False by our kernels),
// GlobalAveragePool, ReduceMean, Flatten); grouped and depthwise Conv (cuDNN's group count);
// Identity, Reshape, Cast (views); Dropout (the CPU node's masks, bit for bit); Tanh, Erf,
// HardSigmoid, HardSwish, LeakyRelu, Clip, Elu, Selu, Softplus, Softsign, Exp, Log, Sqrt, Neg,
// Abs, Reciprocal, Pow; Add, Sub, Mul, Div and PRelu in the CPU's forms (same dims, per
// channel, per pixel, a scalar, a tensor of the model: learned, a buffer or held); Pad; Softmax
// and LogSoftmax over the channels; Concat over the channels; Slice; ChannelShuffle;
// ReduceMean over the channels; LayerNormalization over each whole sample;
// InstanceNormalization (graph_kernels.h); Sin, Cos. A node whose values are not batch-first
// (graph/any_shape_ops.h: transformers, text models) gets its twin by what the CPU node says it
// does (gpu_graph.cc's AnyShapeTwin): a move of elements (gpu_movement_ops.h), a broadcast binary
// op or Where (gpu_broadcast_binary.h), a reduction (gpu_reduce.h), a layer on each row of the
// last axis (gpu_rowwise.h), a product of two computed values (gpu_batched_matmul.h), an
// embedding lookup (gpu_lookup.h), an LSTM or GRU layer (gpu_recurrent.h), an element-wise
// function (masks' comparisons and integer casts too), or the registry's twin where it works on
// the elements alone. A node whose op is missing from the registry, or whose twin refuses its
// form, is refused when
// the graph is built, with one line naming its op and node ("... no CUDA version yet;
// --device=cpu trains it").
//
// Gradients of a value read by several nodes are summed on the device, in the CPU
// executor's order; so are a tied weight's (a module applied twice: each later use's gradient
// added into the first's). Not thread-safe (one DeviceContext, one thread).
#ifndef DPTRAIN_WORKER_CUDA_GPU_GRAPH_H_
#define DPTRAIN_WORKER_CUDA_GPU_GRAPH_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/cuda/device_context.h"
#include "worker/cuda/gpu_layers.h"
#include "worker/graph/executor.h"

namespace dptrain {
namespace cuda {

// One node on the GPU: the device counterpart of graph::NodeImpl<float>, with its parameters
// and buffers in the same slots (the CPU node's Params() / Buffers() order).
class GpuNode {
 public:
  virtual ~GpuNode() = default;
  virtual void BindParams(absl::Span<const float* const> params, absl::Span<float* const> grads) {}
  virtual void BindBuffers(absl::Span<float* const> buffers) {}
  // As graph::NodeImpl::Forward: the output is owned by the node (or is a view of an input)
  // and valid until its next Forward; the inputs stay valid until Backward returns.
  virtual absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx,
                                               absl::Span<const DeviceTensor> inputs,
                                               bool training) = 0;
  // As graph::NodeImpl::Backward: overwrites the parameter gradients; d(loss)/d(input) for
  // each runtime input whose `need_input_grad` is true (an empty tensor for the others).
  virtual absl::StatusOr<std::vector<DeviceTensor>> Backward(
      DeviceContext& ctx, DeviceTensor grad_output, const std::vector<bool>& need_input_grad) = 0;
  // As GpuLayer::Replayable: false for a node whose work changes from step to step.
  virtual bool Replayable() const { return true; }
};

// What a twin's factory reads: the node as the CPU executor planned it.
struct GpuNodeContext {
  const std::string& name;
  const std::string& op;
  const graph::NodeImpl<float>& cpu;  // The CPU twin (its TwinSpec, output dims).
  std::vector<nn::Dims> input_dims;   // Of the runtime inputs, in order.
  // InvalidArgument "node 'n' (Op): <what> (no CUDA version yet; --device=cpu trains it)".
  absl::Status Error(absl::string_view what) const;
};

using GpuNodeFactory = absl::StatusOr<std::unique_ptr<GpuNode>> (*)(const GpuNodeContext&);

class GpuOpRegistry {
 public:
  // `any_shape`: the twin works on the elements alone (a view, an element-wise function), so
  // it also runs the op on values whose batch is not the first axis.
  void Register(const std::string& op, GpuNodeFactory factory, bool any_shape = false) {
    ops_[op] = factory;
    if (any_shape) any_shape_.insert(op);
  }
  bool Has(const std::string& op) const { return ops_.count(op) > 0; }
  bool TakesAnyShape(const std::string& op) const { return any_shape_.count(op) > 0; }
  // The twin, or Unimplemented "node 'n' (Op): no CUDA version yet; --device=cpu trains it".
  absl::StatusOr<std::unique_ptr<GpuNode>> Create(const GpuNodeContext& context) const;

 private:
  std::map<std::string, GpuNodeFactory> ops_;
  std::set<std::string> any_shape_;
};

// Every twin listed at the top.
GpuOpRegistry GpuOps();

// The twin of a node that applies an element-wise function (TwinSpec::function), on values of
// any shape: also the comparisons and integer casts of masks (no gradient).
absl::StatusOr<std::unique_ptr<GpuNode>> MakeElementFunctionTwin(const GpuNodeContext& ctx);

// The graph that `cpu` runs, on the GPU: same parameters, buffers and names (in the CPU
// executor's layout). Its parts are the parameters: each is reported (GradsReady) as soon as
// its node's backward is enqueued, so the model copies it out while earlier nodes compute.
class GpuGraph final : public GpuNetwork {
 public:
  // `cpu` must outlive the GpuGraph (its nodes describe the twins). Unimplemented for a node
  // without a twin; InvalidArgument for one whose configuration its twin does not support.
  static absl::StatusOr<std::unique_ptr<GpuGraph>> Create(const graph::Executor<float>& cpu,
                                                          const GpuOpRegistry& registry);

  std::string ToString() const override;
  std::vector<nn::TensorSpec> ParamSpecs() const override;
  void BindParams(const float* params, float* grads) override;
  std::vector<nn::TensorSpec> BufferSpecs() const override;
  void BindBuffers(float* buffers) override;
  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, DeviceTensor input,
                                       bool training) override;
  absl::StatusOr<DeviceTensor> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                        bool need_input_grad) override;
  int num_parts() const override { return num_parts_; }
  bool Replayable() const override;

 private:
  explicit GpuGraph(const graph::Executor<float>& cpu) : cpu_(cpu) {}
  // Adds `grad` to the gradient of value `v` (copied first where `v` has several readers).
  absl::Status Accumulate(DeviceContext& ctx, int v, DeviceTensor grad);
  // After node `node`'s backward (or zeroing) is enqueued: adds the later uses' gradients of
  // its tied weights into its own, then GradsReady for each of its parameters (a tied use's is
  // reported with its first use's).
  absl::Status ReportGrads(DeviceContext& ctx, int node);
  // Binds node n's parameters and gradients (a tied use's: its own buffer).
  void BindNodeParams(size_t n);
  // The tied uses' gradient buffers, at the first Forward (BindParams has no device context).
  absl::Status AllocateTiedGrads(DeviceContext& ctx);
  // `error` (of node n's forward or backward) with the node's name and op in front.
  absl::Status NodeError(int n, const absl::Status& error) const;

  const graph::Executor<float>& cpu_;
  std::vector<std::unique_ptr<GpuNode>> nodes_;  // One per cpu_.nodes() entry.
  std::vector<int> first_part_;                  // Per node: the part of its first parameter.
  int num_parts_ = 0;
  const float* params_ = nullptr;
  float* grads_ = nullptr;
  // A later use of a tied weight (graph::Executor's param_tied): where the weight lies, and
  // the gradient buffer the use writes.
  struct Tied {
    int64_t offset = 0, size = 0;
    DeviceBuffer<float> grad;
  };
  std::vector<Tied> tied_;
  std::vector<std::vector<int>> tied_of_;    // Per node and parameter slot: its Tied, or -1.
  std::vector<std::vector<int>> tied_into_;  // Per node: the Tied added into its weights.
  bool tied_allocated_ = false;
  std::vector<DeviceTensor> values_;      // Per value id, this step's.
  std::vector<DeviceTensor> grad_views_;  // Per value id: its gradient so far.
  std::vector<bool> grad_ready_;
  std::vector<bool> requires_grad_;
  std::vector<DeviceBuffer<float>> grad_sums_;  // Where several readers' gradients add up.
};

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_GPU_GRAPH_H_
