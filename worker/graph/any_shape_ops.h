// Ops on values of any rank (up to kMaxRank) whose batch may lie on any axis (value_shape.h):
// what attention blocks and vision transformers export. Each reads its inputs' whole shapes
// (NodeInput::shape) and says its output's (NodeImpl::output_shape). Where an op's inputs are
// batch-first values of rank 2 to 4 and the op means what it always did, the factory builds the
// op of the other files instead (so that those graphs, and their CUDA twins, are unchanged);
// the nodes built here have no CUDA twin yet (TwinSpec::any_shape).
//
//   Transpose  any permutation (perm; reversed when absent); a copy.
//   MatMul     of two computed values [..., M, K] x [..., K, N] with the same leading axes (the
//              batch among them): one matrix product per leading index (attention's q k^T and
//              its product with v). With a constant weight, a Linear applied to each row of
//              the last axis (below).
//   Gemm, MatMul of a weight, LayerNormalization, Softmax, LogSoftmax over the last axis of a
//              value of rank > 2 or whose batch is not first: the op of layer_ops.h, norm_ops.h
//              or shape_ops.h applied to every row of the last axis, the rows taken as its
//              batch (a Linear at each token; a layer norm of each token's features).
//   Gather     of a computed value along an axis other than the batch's, with constant 0-D or
//              1-D indices (negative: from the end): x[:, 0] (a class token); of a tensor of
//              the model by constant indices (a relative-position bias: a value without a
//              batch); of a tensor of the model by computed ids (nn.Embedding: an embedding
//              lookup; ids that are not integers in [0, rows) refused before Forward).
//   Slice      along axes other than the batch's, constant starts, ends, axes and steps
//              (negative axes counted from the rank; a negative step goes down, x.flip(d), with
//              ONNX's clamping); x[..., a:b] and Split's outputs.
//   Concat     of computed values along an axis other than the batch's, same shapes otherwise.
//   Pad        zeros along any axes but the batch's (constant mode, value 0).
//   ReduceMean, ReduceSum, ReduceMax, ReduceMin, ReduceL2
//              over axes other than the batch's (attribute, or input from opset 18;
//              ReduceSum's from 13), keepdims or not (a layer norm written out:
//              x.mean(-1, keepdim=True); a masked mean's sums; a text CNN's max over time, its
//              gradient to the first largest (smallest) element as torch.max(x, dim)'s;
//              F.normalize's norm, its gradient x / norm, 0 at a zero norm).
//   Expand     of a tensor of the model to a shape with the batch: the axis where a dynamic
//              export's target holds the batch size, else axis 0, which the tensor must have of
//              size 1 (cls_token.expand(B, -1, -1)); a learned one gets the sum of its uses'
//              gradients. Of a computed value along its size-1 axes, the batch kept (a padding
//              mask to every head).
//   Equal      of a computed value and a constant of one element (ids == pad), Not of a
//              computed value, Cast to bool (x != 0): 1 or 0, no gradient. Cast to an integer
//              type: trunc(x), no gradient.
//   Where      cond ? a : b, computed inputs of one shape, constants broadcast into it
//              (masked_fill); the gradient to a computed a or b where it was taken.
//   Add, Sub, Mul, Div  of two computed values of one shape (or one of size 1 along axes where
//              the other is not: x - mean), or of a computed value and a
//              tensor of the graph that broadcasts to its shape as NumPy does, of size 1 on the
//              batch axis (a bias over the last axis, a positional embedding, a scalar); the
//              tensor is learned, fixed or held as multi_input_ops.h says.
//   TopK       the k largest (or smallest) values along an axis other than the batch's, in
//              order (k-max pooling: x.topk(k, dim).values), k a constant; the gradient to the
//              elements taken; ties to the lower index and NaN largest, as PyTorch's.
//   Max, Min   the same operands (two), element by element (torch.maximum, torch.minimum, a
//              clamp by a tensor): the gradient to the operand taken, halved on a tie as
//              PyTorch's; NaN wins.
#ifndef DPTRAIN_WORKER_GRAPH_ANY_SHAPE_OPS_H_
#define DPTRAIN_WORKER_GRAPH_ANY_SHAPE_OPS_H_

#include "worker/graph/op_registry.h"

namespace dptrain {
namespace graph {

OpFactory TransposeOp();
OpFactory GatherOp();
OpFactory ExpandOp();
OpFactory EqualOp();
OpFactory NotOp();
OpFactory WhereOp();
OpFactory AnyShapeCastOp();  // CastOp() but to bool.
// The ops above that also have a batch-first version, which each falls back to:
OpFactory AnyShapeMatMulOp();  // LinearOp()
OpFactory AnyShapeGemmOp();    // LinearOp()
OpFactory AnyShapeLayerNormalizationOp();
OpFactory AnyShapeSoftmaxOp();
OpFactory AnyShapeLogSoftmaxOp();
OpFactory AnyShapeReduceMeanOp();
OpFactory AnyShapeReduceSumOp();  // Any shape only (no batch-first version).
OpFactory AnyShapeReduceMaxOp();  // Any shape only (no batch-first version).
OpFactory AnyShapeReduceMinOp();  // Any shape only.
OpFactory AnyShapeReduceL2Op();   // Any shape only.
OpFactory AnyShapePadOp();
OpFactory AnyShapeSliceOp();
OpFactory AnyShapeConcatOp();
OpFactory AnyShapeAddOp();
OpFactory AnyShapeSubOp();
OpFactory AnyShapeMulOp();
OpFactory AnyShapeDivOp();
OpFactory AnyShapeMaxOp();  // Any shape only.
OpFactory AnyShapeMinOp();  // Any shape only.
OpFactory AnyShapeTopKOp();  // Any shape only.

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_ANY_SHAPE_OPS_H_
