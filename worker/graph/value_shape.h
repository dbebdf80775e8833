// The whole shape of a runtime value, batch included: its rank and every axis, one of which
// holds the batch, alone or merged with neighbours. A value is always stored in the row-major
// order of this shape (TensorRef's data), so a Reshape never moves data and Transpose copies.
//
// Most ops (convolutions, pooling, batch norm, the built-in models' layers) take values whose
// batch is the first axis and whose rank is 2 to 4 (IsBatchFirst): the per-sample nn::Dims they
// have always read. Transformer-style graphs move the batch elsewhere: nn.MultiheadAttention
// exports x.transpose(0, 1) ([N, B, D]), merges it with the heads (.view(N, B * H, d): the
// batch is the major part of axis 1) and splits it back (.view(N * B, D): the minor part of
// axis 0); timm's attention reshapes to 5-D and permutes the batch to axis 1. A merged axis is
// kept as outer * batch * inner, so that the batch can be found again whatever the run's batch
// size.
#ifndef DPTRAIN_WORKER_GRAPH_VALUE_SHAPE_H_
#define DPTRAIN_WORKER_GRAPH_VALUE_SHAPE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/nn/tensor.h"

namespace dptrain {
namespace graph {

// Ranks the executor keeps (ONNX allows more; exported vision models stay within 6).
inline constexpr int kMaxRank = 6;
// The largest axis, and the most elements of one sample (per-sample dims are ints).
inline constexpr int64_t kMaxAxisSize = int64_t{1} << 30;
inline constexpr int64_t kMaxSampleSize = (int64_t{1} << 31) - 1;

struct ValueShape {
  // Per axis; the batch axis's entry is outer * inner (the batch itself left out).
  std::vector<int64_t> dims;
  // -1: a value without a batch, the same for every sample (computed from tensors of the model:
  // a relative-position bias gathered from its table), held once (TensorRef::batch 1).
  int batch_axis = 0;
  // Axis `batch_axis` has outer * batch * inner elements; index i of it is
  // ((o * batch) + b) * inner + n.
  int64_t batch_outer = 1;
  int64_t batch_inner = 1;

  int rank() const { return static_cast<int>(dims.size()); }
  // Elements per sample: the product of dims.
  int64_t per_sample() const;
  // True when the batch is axis 0 alone (not merged) and the rank is 2 to 4: the values whose
  // per-sample dims every op reads (BatchFirstDims).
  bool IsBatchFirst() const;
  // The per-sample dims of a batch-first value (rank r holds its r - 1 dims first in c, h, w);
  // for any other value, all its elements in c ({per_sample(), 1, 1}), which only ops that
  // read the whole shape may interpret.
  nn::Dims dims_for_ops() const;
  // The sizes of every axis for `batch` samples.
  std::vector<int64_t> Concrete(int64_t batch) const;
  // The size of axis `axis` for `batch` samples.
  int64_t AxisSize(int axis, int64_t batch) const;
  // "[B, 17, 16]", "[17, B*2, 8]", "[17*B, 16]", "[2*B*3, 4]".
  std::string ToString() const;

  bool operator==(const ValueShape& o) const {
    return dims == o.dims && batch_axis == o.batch_axis && batch_outer == o.batch_outer &&
           batch_inner == o.batch_inner;
  }
  bool operator!=(const ValueShape& o) const { return !(*this == o); }

  // [B] followed by the first rank - 1 of `dims`' c, h, w; a rank too small to hold dims that
  // are not 1 grows to fit them.
  static ValueShape BatchFirst(const nn::Dims& dims, int rank);
};

// The axis `axis` (negative: from the end) of a rank-`rank` value, or nullopt if out of range.
std::optional<int> NormalizeAxis(int64_t axis, int rank);

// The shape a Reshape of `in` to `target` gives, or an error saying why it cannot be followed.
// `target` holds the sizes as the exported graph gives them: ONNX's 0 (copy the input's
// axis: the batch axis copies the batch) and one -1 (inferred), kBatchSize (graph.h: the
// batch, from a Shape) or, in a graph exported with a fixed batch, that batch's size written
// as a number. The batch is found by where its elements lie: the axis whose leading elements
// hold exactly the input's elements before the batch, with the export's batch (inferred from
// the element count) as a factor of its size.
absl::StatusOr<ValueShape> ReshapedShape(const ValueShape& in, const std::vector<int64_t>& target);

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_VALUE_SHAPE_H_
