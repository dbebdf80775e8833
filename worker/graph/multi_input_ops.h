// Ops over several runtime inputs, the joins of a branching graph (ONNX semantics, restricted):
//   Add, Sub, Mul, Div  element-wise a op b of two runtime values of equal dims, or one of
//           them [C, 1, 1] against the other's [C, H, W] (broadcast over the plane, as a
//           squeeze-and-excitation gate), or a runtime value and a constant scalar; other
//           broadcasts and constant tensors are refused (MatMul + Add of a bias is fused
//           into Gemm by the ONNX importer).
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
OpFactory ConcatOp();

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_MULTI_INPUT_OPS_H_
