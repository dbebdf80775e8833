// Element-wise functions of one runtime input (ONNX semantics, restricted as said; anything else
// is refused by the factory with a one-line error naming the node):
//   Tanh      tanh(x).
//   LeakyRelu, Clip, Erf, HardSigmoid, HardSwish, Elu, Selu, Softplus, Softsign   as ONNX
//             defines them (Clip's bounds from constant inputs or the opset-6 attributes; the
//             gradient is 0 where clipped; Softplus is x past 20, as PyTorch computes it).
//   Exp, Log, Sqrt, Neg, Abs, Reciprocal, Pow (a constant exponent), Sin, Cos.
// A bound or exponent that is a tensor of the model which would be learned is refused
// (NodeContext::CheckNotLearned).
#ifndef DPTRAIN_WORKER_GRAPH_ELEMENTWISE_OPS_H_
#define DPTRAIN_WORKER_GRAPH_ELEMENTWISE_OPS_H_

#include "worker/graph/op_registry.h"

namespace dptrain {
namespace graph {

OpFactory TanhOp();
OpFactory LeakyReluOp();  // alpha (default 0.01).
OpFactory ClipOp();       // Bounds from constant inputs 1, 2 or the min/max attributes.
OpFactory ErfOp();
OpFactory HardSigmoidOp();  // alpha (0.2), beta (0.5).
OpFactory HardSwishOp();
OpFactory EluOp();       // alpha (1).
OpFactory SeluOp();      // alpha, gamma (ONNX's defaults).
OpFactory SoftplusOp();  // log(1 + exp(x)); x past 20, as PyTorch's threshold.
OpFactory SoftsignOp();
// Exp, Log, Sqrt, Neg, Abs, Reciprocal: element-wise, as PyTorch (log, sqrt and 1/x of values
// outside their domain give NaN or infinity, as there). Pow(x, e): e a constant scalar.
OpFactory ExpOp();
OpFactory LogOp();
OpFactory SqrtOp();
OpFactory NegOp();
OpFactory AbsOp();
OpFactory ReciprocalOp();
OpFactory PowOp();
OpFactory SinOp();
OpFactory CosOp();
}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_ELEMENTWISE_OPS_H_
