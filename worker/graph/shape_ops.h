// Ops of one runtime input that are not worker/nn layers and not element-wise functions
// (elementwise_ops.h) (ONNX semantics, restricted as said; anything else is refused by the
// factory with a one-line error naming the node):
//   Reshape   Of any value (value_shape.h's ReshapedShape): for a batch-first value the
//             target's first entry is the batch whatever its value (PyTorch's tracer writes
//             the export batch there for x.view(x.size(0), -1)) and the rest, with 0 = copy
//             the input's dimension and one -1 = inferred, holds a sample (up to 5 axes);
//             otherwise the batch is found where its elements lie (merged with the heads or
//             the tokens, as nn.MultiheadAttention exports it). No copy: the output aliases
//             the input.
//   Identity  The input itself.
//   Squeeze, Unsqueeze  of a computed value (constant axes: the input or, before opset 13,
//             the attribute; negative ones counted from its rank), never the batch axis: a
//             view with another shape.
//   Pad       mode "constant" with value 0 over H and W only (4-D pads from a constant input or,
//             before opset 11, the attribute), non-negative.
//   Dropout   In training, zeroes each element with probability `ratio` and scales the rest
//             by 1 / (1 - ratio), with masks drawn from a counter-based generator seeded by the
//             node's seed (NodeContext::seed) and its training step count: deterministic for a
//             seed, but NOT PyTorch's random stream, which cannot be reproduced here; a check
//             against PyTorch must turn dropout off on both sides (GraphModelOptions::dropout).
//             In evaluation, and for ratio 0, the identity. The executor's mode decides; the
//             file's training_mode input is not read.
//   Cast      to float only: the identity.
//   Softmax, LogSoftmax   over the channels (axis 1, or -1 of a [N, C] value); over the last
//             axis of any other value: any_shape_ops.h.
#ifndef DPTRAIN_WORKER_GRAPH_SHAPE_OPS_H_
#define DPTRAIN_WORKER_GRAPH_SHAPE_OPS_H_

#include "worker/graph/op_registry.h"

namespace dptrain {
namespace graph {

OpFactory ReshapeOp();
OpFactory IdentityOp();
OpFactory SqueezeOp();
OpFactory UnsqueezeOp();
OpFactory PadOp();
OpFactory DropoutOp();
OpFactory CastOp();
OpFactory SoftmaxOp();
OpFactory LogSoftmaxOp();

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_SHAPE_OPS_H_
