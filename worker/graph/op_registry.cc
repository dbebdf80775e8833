#include "worker/graph/op_registry.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "worker/graph/any_shape_ops.h"
#include "worker/graph/elementwise_ops.h"
#include "worker/graph/layer_ops.h"
#include "worker/graph/multi_input_ops.h"
#include "worker/graph/norm_ops.h"
#include "worker/graph/recurrent_ops.h"
#include "worker/graph/shape_ops.h"
#include "worker/graph/slice_ops.h"

namespace dptrain {
namespace graph {

absl::Status OpRegistry::Register(const std::string& op, OpFactory factory) {
  if (op.empty() || factory.make_float == nullptr || factory.make_double == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("op '", op, "': empty name or null factory"));
  }
  if (!ops_.emplace(op, factory).second) {
    return absl::AlreadyExistsError(absl::StrCat("op '", op, "' is registered twice"));
  }
  return absl::OkStatus();
}

bool OpRegistry::AnyShape(absl::string_view op) const {
  auto it = ops_.find(op);
  return it != ops_.end() && it->second.any_shape;
}

std::vector<std::string> OpRegistry::ops() const {
  std::vector<std::string> names;
  for (const auto& [name, factory] : ops_) names.push_back(name);
  return names;
}

template <typename T>
absl::StatusOr<std::unique_ptr<NodeImpl<T>>> OpRegistry::Create(const NodeContext& context) const {
  auto it = ops_.find(context.node.op);
  if (it == ops_.end()) {
    if (absl::Status s = CheckOpSupported(*this, context.node); !s.ok()) return s;
  }
  if constexpr (std::is_same_v<T, float>) {
    return it->second.make_float(context);
  } else {
    return it->second.make_double(context);
  }
}

template absl::StatusOr<std::unique_ptr<NodeImpl<float>>> OpRegistry::Create<float>(
    const NodeContext&) const;
template absl::StatusOr<std::unique_ptr<NodeImpl<double>>> OpRegistry::Create<double>(
    const NodeContext&) const;

absl::Status CheckOpSupported(const OpRegistry& registry, const Node& node) {
  if (registry.Has(node.op)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported op '", node.op, "' (node '", node.name, "')"));
}

OpRegistry BuiltinOps() {
  OpRegistry r;
  // The names below are distinct, so a failure is a bug here.
  auto add = [&r](const std::string& op, OpFactory factory) {
    if (absl::Status s = r.Register(op, factory); !s.ok()) {
      std::fprintf(stderr, "BuiltinOps: %s\n", s.ToString().c_str());
      std::abort();
    }
  };
  // Element-wise on values of any shape (the per-sample dims of others are their element count).
  auto elementwise = [](OpFactory f) {
    f.any_shape = true;
    return f;
  };
  // One line per op. Layers of worker/nn (layer_ops.h), the batch-first versions of
  // any_shape_ops.h's:
  add("Conv", ConvOp());
  add("Gemm", AnyShapeGemmOp());
  add("MatMul", AnyShapeMatMulOp());
  add("Relu", elementwise(ReluOp()));
  add("Sigmoid", elementwise(SigmoidOp()));
  add("BatchNormalization", BatchNormOp());
  add("MaxPool", MaxPoolOp());
  add("AveragePool", AveragePoolOp());
  add("GlobalAveragePool", GlobalAveragePoolOp());
  add("ReduceMean", AnyShapeReduceMeanOp());
  add("ReduceSum", AnyShapeReduceSumOp());
  add("ReduceMax", AnyShapeReduceMaxOp());
  add("ReduceMin", AnyShapeReduceMinOp());
  add("ReduceL2", AnyShapeReduceL2Op());
  add("TorchLSTM", TorchLstmOp());
  add("TorchGRU", TorchGruOp());
  add("Flatten", FlattenOp());
  add("Residual", ResidualOp());
  // Shapes and element-wise ops of one input (shape_ops.h):
  add("Reshape", ReshapeOp());  // Reshape, Squeeze, Unsqueeze: any shape.
  add("Identity", elementwise(IdentityOp()));
  add("Squeeze", SqueezeOp());
  add("Unsqueeze", UnsqueezeOp());
  add("Pad", AnyShapePadOp());
  add("Dropout", elementwise(DropoutOp()));
  add("Tanh", elementwise(TanhOp()));
  add("LeakyRelu", elementwise(LeakyReluOp()));
  add("Clip", elementwise(ClipOp()));
  add("Erf", elementwise(ErfOp()));
  add("HardSigmoid", elementwise(HardSigmoidOp()));
  add("HardSwish", elementwise(HardSwishOp()));
  add("Elu", elementwise(EluOp()));
  add("Selu", elementwise(SeluOp()));
  add("Softplus", elementwise(SoftplusOp()));
  add("Softsign", elementwise(SoftsignOp()));
  add("Exp", elementwise(ExpOp()));
  add("Sin", elementwise(SinOp()));
  add("Cos", elementwise(CosOp()));
  add("Log", elementwise(LogOp()));
  add("Sqrt", elementwise(SqrtOp()));
  add("Neg", elementwise(NegOp()));
  add("Abs", elementwise(AbsOp()));
  add("Reciprocal", elementwise(ReciprocalOp()));
  add("Pow", elementwise(PowOp()));
  add("Cast", AnyShapeCastOp());
  add("Softmax", AnyShapeSoftmaxOp());
  add("LogSoftmax", AnyShapeLogSoftmaxOp());
  // Moving elements (slice_ops.h; any_shape_ops.h):
  add("Slice", AnyShapeSliceOp());
  add("Transpose", TransposeOp());
  add("Gather", GatherOp());
  add("Expand", ExpandOp());
  add("Equal", EqualOp());
  add("Not", NotOp());
  add("Where", WhereOp());
  add("ChannelShuffle", ChannelShuffleOp());
  // Several runtime inputs (multi_input_ops.h):
  add("Add", AnyShapeAddOp());
  add("Sub", AnyShapeSubOp());
  add("Mul", AnyShapeMulOp());
  add("Div", AnyShapeDivOp());
  add("Max", AnyShapeMaxOp());
  add("Min", AnyShapeMinOp());
  add("TopK", AnyShapeTopKOp());
  add("PRelu", PReluOp());
  add("Concat", AnyShapeConcatOp());
  // Normalizations with their own parameters (norm_ops.h):
  add("LayerNormalization", AnyShapeLayerNormalizationOp());
  add("InstanceNormalization", InstanceNormalizationOp());
  return r;
}

}  // namespace graph
}  // namespace dptrain
