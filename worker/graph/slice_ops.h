// Ops that move elements of one runtime input without arithmetic (ONNX semantics, restricted as
// said; anything else is refused by the factory with a one-line error naming the node):
//   Slice           Constant starts, ends and axes (inputs from opset 10, attributes before),
//                   steps 1. Axes 1 to 3 (the per-sample dims; the batch cannot be sliced;
//                   negative axes, steps and other values: any_shape_ops.h's Slice);
//                   starts and ends clamped as ONNX says (negative: from the end). x.chunk(2, 1)
//                   and x[:, a:b] export as this.
//   ChannelShuffle  Not ONNX: ShuffleNet's channel shuffle, x.view(n, g, c / g, h, w)
//                   .transpose(1, 2).reshape(n, c, h, w), which the importer fuses from its
//                   Reshape, Transpose, Reshape (graph_rewrites.h: a 5-D value has no per-sample
//                   dims here). Attributes: group; split_shape and merged_shape, the two Reshape
//                   targets, checked against the input's dims. Output channel j * g + i is input
//                   channel i * (c / g) + j.
#ifndef DPTRAIN_WORKER_GRAPH_SLICE_OPS_H_
#define DPTRAIN_WORKER_GRAPH_SLICE_OPS_H_

#include "worker/graph/op_registry.h"

namespace dptrain {
namespace graph {

OpFactory SliceOp();
OpFactory ChannelShuffleOp();

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_SLICE_OPS_H_
