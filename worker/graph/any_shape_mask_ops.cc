// The any-shape ops of masks (any_shape_ops.h): Equal and Not of a computed value, Cast to
// bool or to an integer type, and Where.
// What a padding mask exports as: ids == pad, its negation, and masked_fill(x, mask, value).
#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/graph/any_shape_internal.h"
#include "worker/graph/any_shape_ops.h"
#include "worker/graph/shape_ops.h"

namespace dptrain {
namespace graph {
namespace any_shape_internal {
namespace {

// A constant's values as T (int64 constants hold the imported bool and integer tensors).
template <typename T>
std::vector<T> ValuesOf(const Tensor& t) {
  if (t.type == Tensor::Type::kFloat) return std::vector<T>(t.floats.begin(), t.floats.end());
  std::vector<T> v;
  v.reserve(t.ints.size());
  for (int64_t i : t.ints) v.push_back(static_cast<T>(i));
  return v;
}

// ---- Element by element without a gradient ----

// y = Value(x) element by element; no gradient flows through it (the input's is zero), as
// through PyTorch's comparisons and integer casts.
template <typename T>
class NoGradientNode : public AnyShapeNode<T> {
 public:
  using AnyShapeNode<T>::AnyShapeNode;

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    T* y = EnsureSize(output_, x.size());
    for (int64_t i = 0; i < x.size(); ++i) y[i] = Value(x.data[i]);
    return {y, x.batch, this->output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    T* dx = EnsureSize(grad_input_, grad_output.size());
    std::fill(dx, dx + grad_output.size(), T(0));
    return {TensorRef<T>{dx, grad_output.batch, this->output_dims()}};
  }

 protected:
  virtual T Value(T x) const = 0;

 private:
  std::vector<T> output_, grad_input_;
};

// ---- Equal to a constant, Not ----

// y = 1 where x == value, else 0 (Equal; Not is value 0): a mask of the ids (ids == pad) or of
// another mask.
template <typename T>
class CompareNode final : public NoGradientNode<T> {
 public:
  // `negate`: 1 where x != value instead (a cast to bool: x != 0).
  CompareNode(ValueShape shape, T value, bool negate = false)
      : NoGradientNode<T>(std::move(shape)), value_(value), negate_(negate) {}
  int64_t ids_below() const override { return kNoIdBound; }
  TwinSpec<T> twin() const override {
    TwinSpec<T> t = NoGradientNode<T>::twin();
    t.function = ElementFunction::kEqual;
    t.a = static_cast<double>(value_);
    t.b = negate_ ? 1 : 0;
    return t;
  }

 private:
  T Value(T x) const override { return (x == value_) != negate_ ? T(1) : T(0); }

  const T value_;
  const bool negate_;
};

template <typename T>
struct Equal {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {}));
    if (ctx.inputs.size() != 2) return ctx.Error("Equal takes two inputs");
    const bool first = ctx.inputs[0].is_runtime(), second = ctx.inputs[1].is_runtime();
    if (first == second) {
      return ctx.Error(first ? "Equal of two computed values unsupported"
                             : "Equal of two constants left unfolded");
    }
    const NodeInput& constant = ctx.inputs[first ? 1 : 0];
    if (constant.constant == nullptr || constant.constant->num_elements() != 1) {
      return ctx.Error("Equal to a constant of one element only (ids == pad)");
    }
    DPTRAIN_RETURN_IF_ERROR(ctx.CheckNotLearned(first ? 1 : 0, "compared value"));
    DPTRAIN_ASSIGN_OR_RETURN(const ValueShape shape, ShapeOf(ctx, first ? 0 : 1));
    return std::unique_ptr<NodeImpl<T>>(
        std::make_unique<CompareNode<T>>(shape, ValuesOf<T>(*constant.constant)[0]));
  }
};

template <typename T>
struct Not {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {}));
    if (ctx.inputs.size() != 1) return ctx.Error("Not takes one input");
    DPTRAIN_ASSIGN_OR_RETURN(const ValueShape shape, ShapeOf(ctx, 0));
    return std::unique_ptr<NodeImpl<T>>(std::make_unique<CompareNode<T>>(shape, T(0)));
  }
};

// ---- Cast to an integer type ----

// y = trunc(x) (ONNX's and NumPy's float-to-integer cast), held in T like every value: a
// mask's or a count's cast (`(ids != pad).sum(1)` as pack_padded_sequence's lengths); PyTorch's
// integer tensors have no gradient.
template <typename T>
class TruncateNode final : public NoGradientNode<T> {
 public:
  explicit TruncateNode(ValueShape shape) : NoGradientNode<T>(std::move(shape)) {}
  TwinSpec<T> twin() const override {
    TwinSpec<T> t = NoGradientNode<T>::twin();
    t.function = ElementFunction::kTruncate;
    return t;
  }

 private:
  T Value(T x) const override { return std::trunc(x); }
};

// Cast: to bool, x != 0 (a mask cast before Where); to an integer type, trunc(x) without a
// gradient; to float, CastOp's identity.
template <typename T>
struct Cast {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    constexpr int64_t kOnnxBool = 9;  // onnx.TensorProto.BOOL.
    // UINT8, INT8, UINT16, INT16, INT32, INT64, UINT32, UINT64.
    constexpr std::array<int64_t, 8> kOnnxIntegers = {2, 3, 4, 5, 6, 7, 12, 13};
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t to, IntAttribute(ctx.node, "to", 0));
    const bool integer =
        std::find(kOnnxIntegers.begin(), kOnnxIntegers.end(), to) != kOnnxIntegers.end();
    if (to != kOnnxBool && !integer) return Build<T>(CastOp(), ctx);
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"to"}));
    if (ctx.inputs.size() != 1 || !ctx.inputs[0].is_runtime()) {
      return ctx.Error("Cast takes one computed input");
    }
    DPTRAIN_ASSIGN_OR_RETURN(const ValueShape shape, ShapeOf(ctx, 0));
    if (integer) return std::unique_ptr<NodeImpl<T>>(std::make_unique<TruncateNode<T>>(shape));
    return std::unique_ptr<NodeImpl<T>>(std::make_unique<CompareNode<T>>(shape, T(0), true));
  }
};

// ---- Where ----

// y = cond ? a : b element by element. The computed inputs share the output's shape; the
// constants broadcast into it (NumPy, size 1 along the batch axis): masked_fill(x, mask, v) is
// Where(mask, v, x). The gradient goes to a computed a where cond holds and to a computed b
// where it does not; the condition gets none.
template <typename T>
class WhereNode final : public AnyShapeNode<T> {
 public:
  // Per input (cond, a, b): its values and shape if it is a constant, else nullopt.
  struct Constant {
    std::vector<T> values;
    Shape shape;
  };
  WhereNode(ValueShape shape, std::array<std::optional<Constant>, 3> constants)
      : AnyShapeNode<T>(std::move(shape)), constants_(std::move(constants)) {}

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const int batch = inputs[0].batch;
    const Shape out_shape = this->out_.Concrete(batch);
    const int64_t n = Product(out_shape);
    const T* v[3];
    size_t runtime = 0;
    for (int i = 0; i < 3; ++i) {
      if (!constants_[i].has_value()) {
        v[i] = inputs[runtime++].data;
        continue;
      }
      // A constant broadcast to the output, every step (its strides depend on the batch).
      T* b = EnsureSize(broadcast_[i], n);
      Broadcast(i, batch, b);
      v[i] = b;
    }
    cond_ = v[0];
    T* y = EnsureSize(output_, n);
    for (int64_t k = 0; k < n; ++k) y[k] = cond_[k] != T(0) ? v[1][k] : v[2][k];
    return {y, batch, this->output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    const int64_t n = grad_output.size();
    std::vector<TensorRef<T>> grads;
    for (int i = 0; i < 3; ++i) {
      if (constants_[i].has_value()) continue;
      const size_t slot = grads.size();
      grads.emplace_back();
      if (!need_input_grad[slot]) continue;
      T* d = EnsureSize(grad_inputs_[i], n);
      for (int64_t k = 0; k < n; ++k) {
        const bool taken = i == 1 ? cond_[k] != T(0) : i == 2 ? cond_[k] == T(0) : false;
        d[k] = taken ? grad_output.data[k] : T(0);
      }
      grads[slot] = {d, grad_output.batch, this->output_dims()};
    }
    return grads;
  }

  bool BroadcastConstants(int batch, std::vector<std::vector<T>>& values) const override {
    values.assign(3, {});
    const int64_t n = Product(this->out_.Concrete(batch));
    for (int i = 0; i < 3; ++i) {
      if (!constants_[i].has_value()) continue;
      values[i].resize(n);
      Broadcast(i, batch, values[i].data());
    }
    return true;
  }

 private:
  // Constant input i broadcast to the output of `batch` samples, into `out`.
  void Broadcast(int i, int batch, T* out) const {
    const Shape out_shape = this->out_.Concrete(batch);
    const Constant& c = *constants_[i];
    const Shape own = Strides(c.shape);
    Shape strides(out_shape.size(), 0);
    const size_t lead = out_shape.size() - c.shape.size();
    for (size_t a = 0; a < c.shape.size(); ++a) {
      if (c.shape[a] != 1) strides[lead + a] = own[a];
    }
    ForEachOffset(out_shape, strides, [&](int64_t k, int64_t off) { out[k] = c.values[off]; });
  }

  const std::array<std::optional<Constant>, 3> constants_;
  std::vector<T> broadcast_[3], grad_inputs_[3], output_;
  const T* cond_ = nullptr;  // Forward's condition, valid until Backward returns (node.h).
};

template <typename T>
struct Where {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {}));
    if (ctx.inputs.size() != 3) return ctx.Error("Where takes three inputs");
    std::optional<ValueShape> shape;
    for (size_t i = 0; i < 3; ++i) {
      if (!ctx.inputs[i].is_runtime()) continue;
      DPTRAIN_ASSIGN_OR_RETURN(const ValueShape s, ShapeOf(ctx, i));
      if (shape.has_value() && !(s == *shape)) {
        return ctx.Error(absl::StrCat("computed inputs of shapes ", shape->ToString(), " and ",
                                      s.ToString(), " unsupported (one shape)"));
      }
      shape = s;
    }
    if (!shape.has_value()) return ctx.Error("Where of three constants left unfolded");
    std::array<std::optional<typename WhereNode<T>::Constant>, 3> constants;
    for (size_t i = 0; i < 3; ++i) {
      const NodeInput& in = ctx.inputs[i];
      if (in.is_runtime()) continue;
      if (in.constant == nullptr) return ctx.Error(absl::StrCat("input ", i, " is absent"));
      DPTRAIN_RETURN_IF_ERROR(ctx.CheckNotLearned(i, "a Where operand"));
      Shape own = in.constant->shape;
      std::vector<T> values = ValuesOf<T>(*in.constant);
      if (!BroadcastsTo(own, *shape)) {
        // A constant of one value throughout that broadcasts but for its entry at the batch
        // axis is that scalar: a tensor an export made with its batch size written in
        // (nn.MultiheadAttention's zeros of [bsz * heads, 1, L]).
        Shape batchless = own;
        const int at = shape->batch_axis - (shape->rank() - static_cast<int>(own.size()));
        if (at >= 0 && at < static_cast<int>(own.size())) batchless[at] = 1;
        const bool uniform =
            !values.empty() && BroadcastsTo(batchless, *shape) &&
            std::all_of(values.begin(), values.end(), [&](T v) { return v == values[0]; });
        if (!uniform) {
          return ctx.Error(absl::StrCat("the constant ", in.constant->ToString(), " of input ", i,
                                        " does not broadcast to ", shape->ToString()));
        }
        values.resize(1);
        own.clear();
      }
      constants[i] = typename WhereNode<T>::Constant{std::move(values), std::move(own)};
    }
    return std::unique_ptr<NodeImpl<T>>(
        std::make_unique<WhereNode<T>>(*shape, std::move(constants)));
  }
};

}  // namespace
}  // namespace any_shape_internal

OpFactory EqualOp() { return MakeOpFactory<any_shape_internal::Equal>(true); }
OpFactory NotOp() { return MakeOpFactory<any_shape_internal::Not>(true); }
OpFactory WhereOp() { return MakeOpFactory<any_shape_internal::Where>(true); }
OpFactory AnyShapeCastOp() { return MakeOpFactory<any_shape_internal::Cast>(true); }

}  // namespace graph
}  // namespace dptrain
