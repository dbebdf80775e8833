// Runs a graph forward and backward on the CPU: builds every node through the op registry, lays
// their parameters and buffers out in flat buffers, and back-propagates in reverse topological
// order, adding up the gradients of a value that feeds several nodes (a residual branch, a
// Concat of a value with itself).
//
// Layout: the parameters in the order of the graph's constants (for an ONNX file, its
// initializers: PyTorch's state_dict order), back to back; the buffers node by node, each
// node's in its own order, then the entries of the model's state that no node reads as a
// parameter or buffer (an int64 index buffer read through shape arithmetic), kept fixed. A
// parameter several nodes learn (a tied weight: a module applied twice) is laid out once, its
// gradient the sum of theirs; it may not also be a plain constant operand of a node that does not
// learn it.
//
// Templated on the scalar type: float for training, double for gradient checks. Not
// thread-safe: one thread drives an executor (its layers may split work over a pool).
#ifndef DPTRAIN_WORKER_GRAPH_EXECUTOR_H_
#define DPTRAIN_WORKER_GRAPH_EXECUTOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/graph/graph.h"
#include "worker/graph/node.h"
#include "worker/graph/op_registry.h"
#include "worker/nn/layer.h"
#include "worker/nn/model.h"
#include "worker/nn/thread_pool.h"

namespace dptrain {
namespace graph {

struct ExecutorOptions {
  // Seeds the random ops (Dropout's masks), each node from this and its position.
  uint64_t seed = 0;
  // Handed to every node (not owned; must outlive the executor), or null: the calling thread.
  nn::ThreadPool* pool = nullptr;
  nn::ConvAlgorithm conv_algorithm = nn::ConvAlgorithm::kAuto;
};

template <typename T>
class Executor {
 public:
  // Validates `graph` (ValidateGraph), then builds its nodes. InvalidArgument, one line naming the
  // node, for: an op `registry` does not have ("unsupported op 'X' (node 'n')"), whatever a
  // factory refuses, a node reading a value that is not computed (a secondary output such as
  // BatchNormalization's running mean, or a missing one), a parameter read as a plain operand or
  // tied with another shape, and an output that is not a computed value. `graph` may be destroyed
  // afterwards.
  static absl::StatusOr<std::unique_ptr<Executor<T>>> Create(const Graph& graph,
                                                             const OpRegistry& registry,
                                                             const ExecutorOptions& options = {});

  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Parameters and buffers, named by the graph's constants (buffers the graph lacks, such as
  // num_batches_tracked, named by their node), with offsets into the flat buffers.
  const std::vector<nn::ParamInfo>& params() const { return params_; }
  const std::vector<nn::ParamInfo>& buffers() const { return buffers_; }
  int64_t num_params() const { return num_params_; }
  int64_t num_buffers() const { return num_buffers_; }
  // Their initial values, from the graph's constants (buffers it lacks: their nodes' fill).
  const std::vector<T>& initial_params() const { return initial_params_; }
  const std::vector<T>& initial_buffers() const { return initial_buffers_; }
  // Moves them out (both empty afterwards): for the model that keeps them as its weights.
  std::vector<T> ReleaseInitialParams() { return std::move(initial_params_); }
  std::vector<T> ReleaseInitialBuffers() { return std::move(initial_buffers_); }

  nn::Dims input_dims() const { return input_dims_; }
  bool input_ids() const { return input_ids_; }  // Graph::input_ids.
  // For an input of ids that only embedding lookups read: the fewest rows of their tables,
  // which every id must be below (a data set can be checked whole before training); else 0.
  int64_t input_id_limit() const { return input_id_limit_; }
  nn::Dims output_dims() const;
  const ValueShape& output_shape() const { return value_shapes_[output_]; }
  int num_nodes() const { return static_cast<int>(nodes_.size()); }

  // Points the nodes at flat buffers of num_params(), num_params() and num_buffers() elements
  // (not owned; they must outlive every later Forward/Backward). Must precede Forward; call it
  // again whenever one of them moves.
  void Bind(const T* params, T* grads, T* buffers);

  // The output for `batch` samples of input_dims() at `input` (which must stay valid and
  // unchanged until Backward returns). The view is valid until the next Forward. In training
  // mode, nodes update their buffers (batch norm's running statistics) and draw new masks.
  // InvalidArgument naming the node for input values a node refuses (NodeImpl::CheckInputs:
  // token ids outside an embedding table); the later nodes did not run.
  absl::StatusOr<nn::TensorRef<T>> Forward(const T* input, int batch, bool training);

  // Given d(loss)/d(output) of the last Forward, overwrites the parameter gradients (zero for
  // parameters the output does not depend on) and returns d(loss)/d(input) if
  // `need_input_grad` (valid until the next Backward), else an empty view.
  nn::TensorRef<T> Backward(nn::TensorRef<T> grad_output, bool need_input_grad);

  // The plan, which another backend's executor follows with its twins of the nodes
  // (worker/cuda/gpu_graph.h): the nodes in order, the values they read and write (value 0 is
  // the graph's input) and where their tensors lie in the flat buffers.
  struct NodeState {
    std::string name;
    std::string op;
    std::unique_ptr<NodeImpl<T>> impl;
    std::vector<int> inputs;  // Value ids of the runtime inputs, in order.
    int output = -1;          // Value id.
    // Every value it reads and writes is batch-first of rank 2 to 4 (ValueShape::IsBatchFirst)
    // and it is not built by an any-shape op (TwinSpec::any_shape): what another backend's
    // twins know how to run.
    bool batch_first = true;
    // Per Params() / Buffers() entry of the node.
    std::vector<int64_t> param_offsets, param_sizes, buffer_offsets;
    // Per Params() entry: -1, or, for a weight tied to an earlier node's (a later use of the
    // same constant), which of the executor's tied gradients this node writes instead.
    std::vector<int> param_tied;
  };
  const std::vector<NodeState>& nodes() const { return nodes_; }
  const std::vector<nn::Dims>& value_dims() const { return value_dims_; }
  // Per value, its whole shape (value_shape.h).
  const std::vector<ValueShape>& value_shapes() const { return value_shapes_; }
  // How many runtime inputs read each value (+1 for the graph's output).
  const std::vector<int>& value_consumers() const { return value_consumers_; }
  int output_value() const { return output_; }

 private:
  Executor() = default;

  // Where node's Params() entry `slot` writes its gradient (grads_ must be bound).
  T* GradOf(NodeState& node, size_t slot);

  // Adds `grad` to the gradient of value `v`: keeps the view where it is v's only contribution,
  // else copies it first (several consumers; or it lies in grad_pair_ and `consumed_next` is
  // false: v's producer is not the next node back, and the nodes in between write the pair).
  void Accumulate(int v, nn::TensorRef<T> grad, bool consumed_next);

  nn::Dims input_dims_;
  bool input_ids_ = false;
  int64_t input_id_limit_ = 0;
  std::vector<NodeState> nodes_;
  std::vector<nn::Dims> value_dims_;  // Per value id; id 0 is the graph input.
  std::vector<ValueShape> value_shapes_;
  std::vector<int> value_producer_;   // Node index; -1 for the graph input.
  std::vector<int> value_consumers_;  // Runtime input slots reading it (+1 for the output).
  int output_ = -1;
  std::vector<nn::ParamInfo> params_;
  std::vector<nn::ParamInfo> buffers_;
  int64_t num_params_ = 0;
  int64_t num_buffers_ = 0;
  std::vector<T> initial_params_;
  std::vector<T> initial_buffers_;
  T* grads_ = nullptr;
  nn::GradBufferPair<T> grad_pair_;  // The nodes' input gradients (see Accumulate).
  // A later use of a tied weight: its gradient, added into the flat one at `offset` after each
  // Backward.
  struct TiedGrad {
    int64_t offset;
    std::vector<T> grad;
  };
  std::vector<TiedGrad> tied_grads_;
  nn::LayerContext<T> ctx_;          // Every node's, every call.

  // Per value, reused from step to step.
  std::vector<nn::TensorRef<T>> values_;
  std::vector<nn::TensorRef<T>> grad_views_;
  std::vector<bool> grad_ready_;
  std::vector<bool> requires_grad_;
  std::vector<std::vector<T>> grad_sums_;
};

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_EXECUTOR_H_
