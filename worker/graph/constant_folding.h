// Ops evaluated once, when a graph is loaded, where every input is a constant that is not
// model state: what an export computes on constants (Swin's padding and window masks: Range,
// Expand, ScatterND, Where, N-d Slice and Transpose of int64 and float tensors). The int64
// arithmetic on shapes (shape_arithmetic.h) is tried first; this takes what it does not.
#ifndef DPTRAIN_WORKER_GRAPH_CONSTANT_FOLDING_H_
#define DPTRAIN_WORKER_GRAPH_CONSTANT_FOLDING_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/graph/graph.h"

namespace dptrain {
namespace graph {

// Add, Sub, Mul, Div, Pow, Min, Max, Equal, Less, Greater, Not, Where, Sqrt, Neg, Abs, Exp,
// Log, Reciprocal, Floor, Ceil (NumPy broadcasting), Range, Slice (any
// rank, negative steps), Transpose, Concat, Expand, Cast, Gather, ScatterND (no reduction),
// ConstantOfShape (int64 or float), Reshape, Unsqueeze, Squeeze, Identity.
bool IsFoldableOnConstants(const std::string& op);

// The value of `node` for its constant inputs (null: an absent optional one), int64 or float
// (bool as int64 0/1), at most 2^22 elements. InvalidArgument naming the node for what it does
// not implement, a batch size (known only at run time) among the inputs, or a malformed node.
absl::StatusOr<Tensor> FoldConstantNode(const Node& node, const std::vector<const Tensor*>& in);

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_CONSTANT_FOLDING_H_
