// Ops over several runtime inputs, the joins of a branching graph (ONNX semantics, restricted):
//   Add, Sub, Mul, Div  element-wise a op b of two runtime values of equal dims, or one of
//           them [C, 1, 1] against the other's [C, H, W] (broadcast over the plane, as a
//           squeeze-and-excitation gate), or [1, H, W] (broadcast over the channels: a
//           statistic per pixel); or a runtime value and a tensor of the graph: a scalar,
//           [C, 1, 1] or a sample's dims (an initializer is learned as a parameter unless
//           marked a buffer, NamedConstant::state; the internal attribute operand_shape gives
//           the shape the graph views it as, e.g. a [C] weight unsqueezed to [C, 1, 1]). Other
//           broadcasts (NumPy's, by the whole shapes) are any_shape_ops.h's, which registers
//           these as its batch-first versions. Per-sample dims keep no rank, so an operand is
//           matched against them with trailing 1s dropped: [F] against [N, F] is one value per
//           feature, as ONNX says, and so is [C] against a [N, C, 1, 1] value, which ONNX would
//           broadcast to [N, C, 1, C] (a shape no classifier keeps to its output).
//   PRelu   x > 0 ? x : slope * x, the slope a tensor of the model as above (nn.PReLU's
//           weight, learned: one value or one per channel).
//   Concat  any number of runtime values along axis 1 (channels, or features of [N, F]
//           values), equal H and W.
// The executor adds up the gradients of a value that feeds several nodes (a residual branch);
// these ops only pass theirs on.
#ifndef DPTRAIN_WORKER_GRAPH_MULTI_INPUT_OPS_H_
#define DPTRAIN_WORKER_GRAPH_MULTI_INPUT_OPS_H_

#include "worker/graph/op_registry.h"

namespace dptrain {
namespace graph {

OpFactory AddOp();
OpFactory SubOp();
OpFactory MulOp();
OpFactory DivOp();
OpFactory PReluOp();
OpFactory ConcatOp();

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_MULTI_INPUT_OPS_H_
