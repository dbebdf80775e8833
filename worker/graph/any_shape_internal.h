// What the any-shape ops (any_shape_ops.h) share: row-major index arithmetic over whole shapes,
// the base of their nodes, and a tensor of the model read as an operand. Internal to
// any_shape_*_ops.cc.
#ifndef DPTRAIN_WORKER_GRAPH_ANY_SHAPE_INTERNAL_H_
#define DPTRAIN_WORKER_GRAPH_ANY_SHAPE_INTERNAL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/graph/node.h"
#include "worker/graph/op_registry.h"
#include "worker/graph/value_shape.h"

namespace dptrain {
namespace graph {
namespace any_shape_internal {

using nn::EnsureSize;
using Shape = std::vector<int64_t>;

inline int64_t Product(const Shape& s, size_t begin = 0, size_t end = SIZE_MAX) {
  int64_t p = 1;
  for (size_t i = begin; i < end && i < s.size(); ++i) p *= s[i];
  return p;
}

inline Shape Strides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * shape[i + 1];
  }
  return strides;
}

// Calls f(k, offset) for every element k of `shape` in row-major order, with
// offset = sum over axes of coordinate * strides[axis] (0-stride axes: a broadcast).
template <typename F>
void ForEachOffset(const Shape& shape, const Shape& strides, F f) {
  const int rank = static_cast<int>(shape.size());
  if (rank == 0) {
    f(int64_t{0}, int64_t{0});
    return;
  }
  for (int64_t d : shape) {
    if (d == 0) return;
  }
  Shape coord(rank, 0);
  const int64_t last = shape[rank - 1], last_stride = strides[rank - 1];
  int64_t offset = 0, k = 0;
  while (true) {
    for (int64_t j = 0; j < last; ++j) f(k++, offset + j * last_stride);
    int a = rank - 2;
    for (; a >= 0; --a) {
      offset += strides[a];
      if (++coord[a] < shape[a]) break;
      offset -= strides[a] * shape[a];
      coord[a] = 0;
    }
    if (a < 0) return;
  }
}

template <typename T>
absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Build(const OpFactory& f, const NodeContext& ctx) {
  if constexpr (std::is_same_v<T, float>) {
    return f.make_float(ctx);
  } else {
    return f.make_double(ctx);
  }
}

// The runtime input at `index` with its whole shape, or an error.
inline absl::StatusOr<ValueShape> ShapeOf(const NodeContext& ctx, size_t index) {
  const NodeInput* in = ctx.input(index);
  if (in == nullptr || !in->shape.has_value()) {
    return ctx.Error(absl::StrCat("input ", index, " must be a computed value"));
  }
  return *in->shape;
}

inline bool AllBatchFirst(const NodeContext& ctx) {
  for (const NodeInput& in : ctx.inputs) {
    if (in.shape.has_value() && !in.shape->IsBatchFirst()) return false;
  }
  return true;
}

// Every node of this file: its output shape, and no CUDA twin (TwinSpec::any_shape).
template <typename T>
class AnyShapeNode : public NodeImpl<T> {
 public:
  explicit AnyShapeNode(ValueShape out) : out_(std::move(out)) {}
  Dims output_dims() const override { return out_.dims_for_ops(); }
  std::optional<ValueShape> output_shape() const override { return out_; }
  TwinSpec<T> twin() const override {
    TwinSpec<T> t;
    t.any_shape = true;
    return t;
  }

 protected:
  const ValueShape out_;
};

// ---- A tensor of the model read by Expand or a broadcast binary op ----

// Where the node's operand tensor comes from (as multi_input_ops.h says): learned, fixed, or a
// copy the node holds.
template <typename T>
class Operand {
 public:
  Operand() = default;
  // The graph owns `in.constant`, read only while the executor is built (Params, Buffers).
  Operand(const NodeInput& in, Shape shape)
      : name_(in.name), shape_(std::move(shape)), size_(in.constant->num_elements()) {
    value_ = in.constant;
    source_ = !in.state  ? OperandSource::kHeld
              : in.fixed ? OperandSource::kBuffer
                         : OperandSource::kParam;
    if (source_ == OperandSource::kHeld) {
      held_.assign(in.constant->floats.begin(), in.constant->floats.end());
      data_ = held_.data();
    }
  }
  std::vector<NodeTensorSpec> Params() const {
    if (source_ != OperandSource::kParam) return {};
    return {{name_, value_->shape, value_}};
  }
  std::vector<NodeTensorSpec> Buffers() const {
    if (source_ != OperandSource::kBuffer) return {};
    return {{name_, value_->shape, value_}};
  }
  void BindParams(absl::Span<const T* const> params, absl::Span<T* const> grads) {
    if (source_ != OperandSource::kParam) return;
    data_ = params[0];
    grad_ = grads[0];
  }
  void BindBuffers(absl::Span<T* const> buffers) {
    if (source_ == OperandSource::kBuffer) data_ = buffers[0];
  }
  const T* data() const { return data_; }
  T* grad() const { return grad_; }  // Null unless learned.
  int64_t size() const { return size_; }
  // Its strides against an output of `out` (rank >= its own; right-aligned; 0 on broadcast axes).
  Shape StridesAgainst(const Shape& out) const {
    const Shape own = Strides(shape_);
    Shape s(out.size(), 0);
    const size_t lead = out.size() - shape_.size();
    for (size_t i = 0; i < shape_.size(); ++i) {
      if (shape_[i] != 1) s[lead + i] = own[i];
    }
    return s;
  }
  const Shape& shape() const { return shape_; }
  const std::string& name() const { return name_; }
  OperandSource source() const { return source_; }
  const T* held() const { return source_ == OperandSource::kHeld ? held_.data() : nullptr; }

 private:
  std::string name_;
  Shape shape_;
  int64_t size_ = 0;
  const Tensor* value_ = nullptr;
  OperandSource source_ = OperandSource::kHeld;
  std::vector<T> held_;
  const T* data_ = nullptr;
  T* grad_ = nullptr;
};

// An any-shape node that reads a tensor of the model (an Operand: a table, an expanded or
// broadcast tensor), whose Params/Buffers/Bind calls it hands on; none when constructed
// without one (a binary op of two computed values).
template <typename T>
class OperandNode : public AnyShapeNode<T> {
 public:
  OperandNode(ValueShape out, std::optional<Operand<T>> operand)
      : AnyShapeNode<T>(std::move(out)), operand_(std::move(operand)) {}
  std::vector<NodeTensorSpec> Params() const override {
    return operand_ ? operand_->Params() : std::vector<NodeTensorSpec>{};
  }
  std::vector<NodeTensorSpec> Buffers() const override {
    return operand_ ? operand_->Buffers() : std::vector<NodeTensorSpec>{};
  }
  void BindParams(absl::Span<const T* const> params, absl::Span<T* const> grads) override {
    if (operand_) operand_->BindParams(params, grads);
  }
  void BindBuffers(absl::Span<T* const> buffers) override {
    if (operand_) operand_->BindBuffers(buffers);
  }
  // Where the operand lies, for another backend's twin (TwinSpec's operand fields).
  TwinSpec<T> twin() const override {
    TwinSpec<T> t = AnyShapeNode<T>::twin();
    if (operand_) {
      t.operand_source = operand_->source();
      t.held_operand = operand_->held();
      t.operand_size = operand_->size();
    }
    return t;
  }

 protected:
  bool has_operand() const { return operand_.has_value(); }
  const Operand<T>& operand() const { return *operand_; }

 private:
  std::optional<Operand<T>> operand_;
};

// OK when `shape` broadcasts (NumPy, right-aligned) to `out` without the batch.
inline bool BroadcastsTo(const Shape& shape, const ValueShape& out) {
  if (shape.size() > static_cast<size_t>(out.rank())) return false;
  const size_t lead = out.rank() - shape.size();
  for (size_t i = 0; i < shape.size(); ++i) {
    const int axis = static_cast<int>(lead + i);
    if (shape[i] == 1) continue;
    if (axis == out.batch_axis || shape[i] != out.dims[axis]) return false;
  }
  return true;
}

}  // namespace any_shape_internal
}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_ANY_SHAPE_INTERNAL_H_
