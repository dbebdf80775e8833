// Expand (any_shape_ops.h): of a tensor of the model to a shape with the batch (a class token),
// and of a computed value along its size-1 axes (a padding mask to every head).
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/graph/any_shape_internal.h"
#include "worker/graph/any_shape_ops.h"
#include "worker/graph/element_sources.h"

namespace dptrain {
namespace graph {
namespace any_shape_internal {
namespace {

// ---- Expand ----

template <typename T>
class ExpandNode final : public OperandNode<T> {
 public:
  ExpandNode(Operand<T> operand, ValueShape out)
      : OperandNode<T>(std::move(out), std::move(operand)) {}

  // inputs[0] is the graph's input, for the batch size only (node.h).
  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const int batch = inputs[0].batch;
    const Shape out_shape = this->out_.Concrete(batch);
    T* y = EnsureSize(output_, Product(out_shape));
    const T* c = this->operand().data();
    ForEachOffset(out_shape, this->operand().StridesAgainst(out_shape),
                  [&](int64_t k, int64_t off) { y[k] = c[off]; });
    return {y, batch, this->output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (T* g = this->operand().grad(); g != nullptr) {
      std::fill(g, g + this->operand().size(), T(0));
      const Shape out_shape = this->out_.Concrete(grad_output.batch);
      const T* dy = grad_output.data;
      ForEachOffset(out_shape, this->operand().StridesAgainst(out_shape),
                    [&](int64_t k, int64_t off) { g[off] += dy[k]; });
    }
    return std::vector<TensorRef<T>>(need_input_grad.size());
  }

  // The operand is input 1 (after the graph's input, read for its batch size).
  bool ElementSources(int batch, std::vector<int64_t>& sources) const override {
    const Shape out_shape = this->out_.Concrete(batch);
    sources.resize(Product(out_shape));
    ForEachOffset(out_shape, this->operand().StridesAgainst(out_shape),
                  [&](int64_t k, int64_t off) { sources[k] = ElementSource(1, off); });
    return true;
  }

 private:
  std::vector<T> output_;
};

// Expand of a computed value (a padding mask [B, 1, 1, T] to every head): broadcast along its
// size-1 axes, the batch kept; its gradient sums over the copies.
template <typename T>
class ExpandValueNode final : public AnyShapeNode<T> {
 public:
  ExpandValueNode(ValueShape in, ValueShape out)
      : AnyShapeNode<T>(std::move(out)), in_(std::move(in)) {}

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    const Shape out_shape = this->out_.Concrete(x.batch);
    T* y = EnsureSize(output_, Product(out_shape));
    ForEachOffset(out_shape, InStrides(x.batch),
                  [&](int64_t k, int64_t off) { y[k] = x.data[off]; });
    return {y, x.batch, this->output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    const int batch = grad_output.batch;
    const int64_t n = int64_t{batch} * in_.per_sample();
    T* dx = EnsureSize(grad_input_, n);
    std::fill(dx, dx + n, T(0));
    const T* dy = grad_output.data;
    ForEachOffset(this->out_.Concrete(batch), InStrides(batch),
                  [&](int64_t k, int64_t off) { dx[off] += dy[k]; });
    return {TensorRef<T>{dx, batch, in_.dims_for_ops()}};
  }

  bool ElementSources(int batch, std::vector<int64_t>& sources) const override {
    const Shape out_shape = this->out_.Concrete(batch);
    sources.resize(Product(out_shape));
    ForEachOffset(out_shape, InStrides(batch), [&](int64_t k, int64_t off) { sources[k] = off; });
    return true;
  }

 private:
  // The input's stride along each output axis (right-aligned); 0 where it is broadcast.
  Shape InStrides(int batch) const {
    const Shape in = in_.Concrete(batch), out = this->out_.Concrete(batch);
    const Shape own = Strides(in);
    Shape s(out.size(), 0);
    const size_t lead = out.size() - in.size();
    for (size_t i = 0; i < in.size(); ++i) {
      if (in[i] == out[lead + i]) s[lead + i] = own[i];
    }
    return s;
  }

  const ValueShape in_;
  std::vector<T> output_, grad_input_;
};

template <typename T>
absl::StatusOr<std::unique_ptr<NodeImpl<T>>> CreateExpandValue(const NodeContext& ctx,
                                                               const Shape& target) {
  DPTRAIN_ASSIGN_OR_RETURN(const ValueShape in, ShapeOf(ctx, 0));
  auto refuse = [&](absl::string_view why) {
    return ctx.Error(absl::StrCat("Expand of ", in.ToString(), " to ", ShapeText(target),
                                  " unsupported: ", why));
  };
  if (in.batch_outer != 1 || in.batch_inner != 1 || in.batch_axis < 0) {
    return refuse("the batch merged with another axis, or no batch");
  }
  if (target.empty() || target.size() > static_cast<size_t>(kMaxRank)) {
    return refuse("expected 1 to 6 dims");
  }
  ValueShape out;
  const size_t rank = std::max(static_cast<size_t>(in.rank()), target.size());
  out.dims.assign(rank, 1);
  out.batch_axis = in.batch_axis + static_cast<int>(rank - in.rank());
  for (size_t i = 0; i < rank; ++i) {
    const size_t lead_in = rank - in.rank(), lead_target = rank - target.size();
    const int64_t a = i >= lead_in ? in.dims[i - lead_in] : 1;
    const int64_t b = i >= lead_target ? target[i - lead_target] : 1;
    if (static_cast<int>(i) == out.batch_axis) {
      // The batch stays: a fixed export wrote its batch size here, a dynamic one the batch.
      if (b != kBatchSize && (b < 1 || b > kMaxAxisSize)) return refuse("a bad size at the batch");
      continue;
    }
    if (b == kBatchSize || IsBatchMultiple(b)) return refuse("the batch on another axis");
    if (b < 1 || b > kMaxAxisSize) return refuse("a size out of range");
    if (a != 1 && b != 1 && a != b) return refuse("the shapes do not broadcast");
    out.dims[i] = std::max(a, b);
  }
  int64_t elements = 1;
  for (int64_t d : out.dims) {
    elements *= d;  // Each d <= 2^30 and the product so far <= 2^31: no overflow.
    if (elements > (int64_t{1} << 31)) return refuse("too many elements");
  }
  return std::unique_ptr<NodeImpl<T>>(std::make_unique<ExpandValueNode<T>>(in, std::move(out)));
}

template <typename T>
struct Expand {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {}));
    const NodeInput* in = ctx.input(0);
    if (in != nullptr && in->is_runtime()) {
      const NodeInput* target_in = ctx.input(1);
      if (target_in == nullptr || target_in->constant == nullptr ||
          target_in->constant->type != Tensor::Type::kInt64 ||
          target_in->constant->shape.size() != 1) {
        return ctx.Error("the target shape (input 1) must be a 1-D int64 constant");
      }
      return CreateExpandValue<T>(ctx, target_in->constant->ints);
    }
    if (in == nullptr || in->constant == nullptr || in->constant->type != Tensor::Type::kFloat) {
      return ctx.Error(
          "only Expand of a computed value or of a float tensor of the model is "
          "supported");
    }
    const NodeInput* target_in = ctx.input(1);
    if (target_in == nullptr || target_in->constant == nullptr ||
        target_in->constant->type != Tensor::Type::kInt64 ||
        target_in->constant->shape.size() != 1) {
      return ctx.Error("the target shape (input 1) must be a 1-D int64 constant");
    }
    const Shape& own = in->constant->shape;
    Shape target = target_in->constant->ints;
    for (int64_t d : own) {
      if (d < 1) return ctx.Error(absl::StrCat("Expand of ", in->constant->ToString(), ": empty"));
    }
    auto refuse = [&](absl::string_view why) {
      return ctx.Error(absl::StrCat("Expand of ", in->constant->ToString(), " to ",
                                    ShapeText(target_in->constant->ints), " unsupported: ", why));
    };
    if (target.empty() || target.size() > static_cast<size_t>(kMaxRank)) {
      return refuse("expected 1 to 6 dims");
    }
    for (int64_t d : target) {
      if (d != kBatchSize && d > kMaxAxisSize) return refuse("a dimension too large");
    }
    const int64_t symbolic = std::count(target.begin(), target.end(), kBatchSize);
    if (symbolic > 1) return refuse("the batch twice");
    const int batch_axis =
        symbolic == 1
            ? static_cast<int>(std::find(target.begin(), target.end(), kBatchSize) - target.begin())
            : 0;
    if (symbolic == 0 && target[0] < 2) {
      // A graph exported with a fixed batch writes it (2 or more) as the first entry; 1 there
      // is a value without a batch, which values here always have.
      return refuse("the first entry must be the batch (export with a batch of 2 or more)");
    }
    target[batch_axis] = 1;
    ValueShape out;
    out.dims.assign(std::max(own.size(), target.size()), 1);
    out.batch_axis = batch_axis + static_cast<int>(out.dims.size() - target.size());
    for (size_t i = 0; i < out.dims.size(); ++i) {
      const int64_t a =
          i + own.size() >= out.dims.size() ? own[i + own.size() - out.dims.size()] : 1;
      const int64_t b =
          i + target.size() >= out.dims.size() ? target[i + target.size() - out.dims.size()] : 1;
      if (a != 1 && b != 1 && a != b) return refuse("the shapes do not broadcast");
      if (b < 1) return refuse("a negative size");
      out.dims[i] = std::max(a, b);
    }
    if (out.dims[out.batch_axis] != 1) {
      return refuse("the tensor must have one element along the batch axis");
    }
    Operand<T> operand(*in, own);
    return std::unique_ptr<NodeImpl<T>>(
        std::make_unique<ExpandNode<T>>(std::move(operand), std::move(out)));
  }
};

}  // namespace
}  // namespace any_shape_internal

OpFactory ExpandOp() { return MakeOpFactory<any_shape_internal::Expand>(true); }

}  // namespace graph
}  // namespace dptrain
