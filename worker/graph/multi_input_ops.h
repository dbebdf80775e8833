// Ops over several runtime inputs, the joins of a branching graph (ONNX semantics, restricted):
//   Add     a + b of two runtime values of equal dims (no broadcasting; a constant operand is
//           refused; MatMul + Add of a bias is fused into Gemm by the ONNX importer).
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
OpFactory ConcatOp();

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_MULTI_INPUT_OPS_H_
