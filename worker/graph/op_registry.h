// The one table from op type to implementation: an op is one registration (a factory per scalar
// type), looked up by its name; nothing downcasts a node to find out what it is.
//
// BuiltinOps() holds the CPU ops (ONNX names and semantics, restricted as each op's factory
// says; the list is in op_registry.cc):
//   Conv, Gemm, MatMul, Relu, Sigmoid, Tanh, LeakyRelu, Clip, Erf, HardSigmoid, HardSwish,
//   Elu, Selu, Softplus, Softsign, Exp, Log, Sqrt, Neg, Abs, Reciprocal, Pow (constant exponent),
//   BatchNormalization, LayerNormalization, InstanceNormalization, MaxPool, AveragePool,
//   GlobalAveragePool,
//   ReduceMean, ReduceSum, ReduceMax, Flatten, Reshape, Squeeze, Unsqueeze, Pad, Dropout, Identity,
//   Cast, Softmax, LogSoftmax, Slice, Add, Sub, Mul, Div, PRelu, Concat, Transpose, Gather, Expand,
//   Equal, Not, Where; and Residual (not ONNX: the built-in resnet18's fused block),
//   ChannelShuffle (not ONNX: ShuffleNet's, fused by the importer), TorchLSTM and TorchGRU (not
//   ONNX: one nn.LSTM or nn.GRU layer as torch exports it, recurrent_ops.h). Those of
//   any_shape_ops.h (and the element-wise ones, Reshape, Squeeze, Unsqueeze, Dropout, Identity,
//   Cast) take values of any shape (OpFactory::any_shape); the others batch-first values of rank 2
//   to 4.
// Shape and the int64 arithmetic on it are no ops: the executor evaluates them when it is built
// (shape_arithmetic.h).
// A registry is a plain value: built once (e.g. in main), passed by const reference; it is
// thread-compatible (concurrent const use is safe).
#ifndef DPTRAIN_WORKER_GRAPH_OP_REGISTRY_H_
#define DPTRAIN_WORKER_GRAPH_OP_REGISTRY_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/graph/graph.h"
#include "worker/graph/node.h"

namespace dptrain {
namespace graph {

// An op's factories, one per scalar type.
struct OpFactory {
  NodeFactory<float> make_float = nullptr;
  NodeFactory<double> make_double = nullptr;
  // The op reads its inputs' whole shapes (NodeInput::shape) and takes values whose batch is
  // not the first axis, or of rank > 4. False: the executor refuses such inputs, in one line,
  // before the factory sees per-sample dims that would not describe them.
  bool any_shape = false;
};

// The OpFactory of a node class template whose instances have
//   static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext&);
template <template <typename> class Impl>
OpFactory MakeOpFactory(bool any_shape = false) {
  return {&Impl<float>::Create, &Impl<double>::Create, any_shape};
}

class OpRegistry {
 public:
  // AlreadyExists if `op` is registered; InvalidArgument for an empty name or null factories.
  absl::Status Register(const std::string& op, OpFactory factory);

  bool Has(absl::string_view op) const { return ops_.count(std::string(op)) > 0; }
  // OpFactory::any_shape of a registered op (false for others).
  bool AnyShape(absl::string_view op) const;
  // Registered op names, sorted.
  std::vector<std::string> ops() const;

  // Builds the implementation of `context.node`. InvalidArgument "unsupported op 'X' (node 'n')"
  // for an op that is not registered, else whatever the factory says.
  template <typename T>
  absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& context) const;

 private:
  std::map<std::string, OpFactory, std::less<>> ops_;
};

// The one-line error for a node whose op is not in `registry`, or OK.
absl::Status CheckOpSupported(const OpRegistry& registry, const Node& node);

// A registry holding every CPU op listed above.
OpRegistry BuiltinOps();

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_OP_REGISTRY_H_
