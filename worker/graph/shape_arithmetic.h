// The int64 arithmetic that exported graphs compute shapes with (x.view(a, b, -1), x.chunk(2, 1)
// become Shape, Gather, Unsqueeze, Concat, Add, Div, ... on int64 values), evaluated once when
// a graph is loaded: by the importer where the operands are constants (FoldShapeConstants in
// graph_rewrites.h), and by the executor where they come from the dims of a computed value
// (Shape, whose per-sample dims are fixed once the input's are).
#ifndef DPTRAIN_WORKER_GRAPH_SHAPE_ARITHMETIC_H_
#define DPTRAIN_WORKER_GRAPH_SHAPE_ARITHMETIC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/graph/graph.h"

namespace dptrain {
namespace graph {

// Ops EvaluateShapeArithmetic evaluates: Unsqueeze, Squeeze, Concat (1-D), Gather (of 1-D data),
// Cast, Identity, Reshape, ConstantOfShape (an int64 value), Equal and Where (element-wise, or
// against a scalar; Equal gives 0 or 1), and Add, Sub, Mul, Div, Mod of int64 values of one
// shape or with a scalar (Div truncating, as ONNX's integer division; Mod with the divisor's
// sign; a zero divisor refused). Such
// chains compute x.expand(B, -1, -1)'s target. The batch size (kBatchSize,
// graph.h) moves through the first group; arithmetic on it, or a Cast of it to float, is
// refused.
bool IsShapeArithmetic(const std::string& op);

// The value of `node` (IsShapeArithmetic) for its inputs, which must be int64 constants (null:
// an absent optional input). InvalidArgument naming the node when it is malformed (an axis or
// index out of range, a division by zero, ...) or of a form not implemented.
absl::StatusOr<Tensor> EvaluateShapeArithmetic(const Node& node,
                                               const std::vector<const Tensor*>& inputs);

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_SHAPE_ARITHMETIC_H_
