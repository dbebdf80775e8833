#include "worker/graph/elementwise_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/nn/tensor.h"

namespace dptrain {
namespace graph {
namespace {

using nn::EnsureSize;

template <typename T>
class TanhNode final : public NodeImpl<T> {
 public:
  explicit TanhNode(Dims dims) : dims_(dims) {}
  Dims output_dims() const override { return dims_; }
  TwinSpec<T> twin() const override {
    TwinSpec<T> t;
    t.function = ElementFunction::kTanh;
    return t;
  }
  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    T* y = EnsureSize(output_, x.size());
    for (int64_t i = 0; i < x.size(); ++i) y[i] = std::tanh(x.data[i]);
    output_ref_ = {y, x.batch, dims_};
    return output_ref_;
  }
  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    const int64_t n = grad_output.size();
    T* dx = EnsureSize(grad_input_, n);
    const T* y = output_ref_.data;
    for (int64_t i = 0; i < n; ++i) dx[i] = grad_output.data[i] * (T(1) - y[i] * y[i]);
    return {TensorRef<T>{dx, grad_output.batch, dims_}};
  }

 private:
  const Dims dims_;
  std::vector<T> output_;
  TensorRef<T> output_ref_;
  std::vector<T> grad_input_;
};

template <typename T>
struct Tanh {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {}));
    DPTRAIN_ASSIGN_OR_RETURN(const Dims input, ctx.SoleRuntimeInput());
    if (ctx.inputs.size() != 1) return ctx.Error("Tanh takes one input");
    return std::unique_ptr<NodeImpl<T>>(std::make_unique<TanhNode<T>>(input));
  }
};

// y = fn.value(x) element by element, its derivative fn.slope(x): the smooth and
// piecewise-smooth activations below.
template <typename T, typename Fn>
class FunctionNode final : public NodeImpl<T> {
 public:
  FunctionNode(Dims dims, Fn fn) : dims_(dims), fn_(fn) {}
  Dims output_dims() const override { return dims_; }
  TwinSpec<T> twin() const override {
    TwinSpec<T> t;
    fn_.Describe(t);
    return t;
  }
  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    input_ = inputs[0];
    T* y = EnsureSize(output_, input_.size());
    for (int64_t i = 0; i < input_.size(); ++i) y[i] = fn_.value(input_.data[i]);
    return {y, input_.batch, dims_};
  }
  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    const int64_t n = grad_output.size();
    T* dx = EnsureSize(grad_input_, n);
    for (int64_t i = 0; i < n; ++i) dx[i] = grad_output.data[i] * fn_.slope(input_.data[i]);
    return {TensorRef<T>{dx, grad_output.batch, dims_}};
  }

 private:
  const Dims dims_;
  const Fn fn_;
  TensorRef<T> input_;
  std::vector<T> output_, grad_input_;
};

// erf(x) (GELU as PyTorch exports it: x * 0.5 * (1 + erf(x / sqrt(2)))).
template <typename T>
struct ErfFn {
  T value(T x) const { return std::erf(x); }
  T slope(T x) const { return T(1.1283791670955126) * std::exp(-x * x); }  // 2 / sqrt(pi).
  void Describe(TwinSpec<T>& t) const { t.function = ElementFunction::kErf; }
};

// max(0, min(1, alpha x + beta)).
template <typename T>
struct HardSigmoidFn {
  T alpha, beta;
  T value(T x) const { return std::max(T(0), std::min(T(1), alpha * x + beta)); }
  T slope(T x) const {
    const T z = alpha * x + beta;
    return z > T(0) && z < T(1) ? alpha : T(0);
  }
  void Describe(TwinSpec<T>& t) const {
    t.function = ElementFunction::kHardSigmoid;
    t.a = static_cast<double>(alpha);
    t.b = static_cast<double>(beta);
  }
};

// x * HardSigmoid(x) with alpha 1/6, beta 1/2 (MobileNetV3's).
template <typename T>
struct HardSwishFn {
  T value(T x) const { return x * std::max(T(0), std::min(T(1), x / T(6) + T(0.5))); }
  T slope(T x) const { return x < T(-3) ? T(0) : x > T(3) ? T(1) : x / T(3) + T(0.5); }
  void Describe(TwinSpec<T>& t) const { t.function = ElementFunction::kHardSwish; }
};

// Elu and Selu: scale (x > 0 ? x : alpha (exp(x) - 1)).
template <typename T>
struct EluFn {
  T alpha, scale;
  T value(T x) const { return scale * (x > T(0) ? x : alpha * (std::exp(x) - T(1))); }
  T slope(T x) const { return scale * (x > T(0) ? T(1) : alpha * std::exp(x)); }
  void Describe(TwinSpec<T>& t) const {
    t.function = ElementFunction::kElu;
    t.a = static_cast<double>(alpha);
    t.b = static_cast<double>(scale);
  }
};

// log(1 + exp(x)), x itself past 20 (PyTorch's threshold); its slope is sigmoid(x).
template <typename T>
struct SoftplusFn {
  T value(T x) const { return x > T(20) ? x : std::log1p(std::exp(x)); }
  T slope(T x) const { return x > T(20) ? T(1) : T(1) / (T(1) + std::exp(-x)); }
  void Describe(TwinSpec<T>& t) const { t.function = ElementFunction::kSoftplus; }
};

// x / (1 + |x|).
template <typename T>
struct SoftsignFn {
  T value(T x) const { return x / (T(1) + std::abs(x)); }
  T slope(T x) const { return T(1) / ((T(1) + std::abs(x)) * (T(1) + std::abs(x))); }
  void Describe(TwinSpec<T>& t) const { t.function = ElementFunction::kSoftsign; }
};

// exp(x), log(x), sqrt(x), -x, |x| (slope 0 at 0, as PyTorch's sign), 1 / x.
template <typename T>
struct ExpFn {
  T value(T x) const { return std::exp(x); }
  T slope(T x) const { return std::exp(x); }
  void Describe(TwinSpec<T>& t) const { t.function = ElementFunction::kExp; }
};

template <typename T>
struct LogFn {
  T value(T x) const { return std::log(x); }
  T slope(T x) const { return T(1) / x; }
  void Describe(TwinSpec<T>& t) const { t.function = ElementFunction::kLog; }
};

// sin(x), cos(x).
template <typename T>
struct SinFn {
  T value(T x) const { return std::sin(x); }
  T slope(T x) const { return std::cos(x); }
  void Describe(TwinSpec<T>& t) const { t.function = ElementFunction::kSin; }
};

template <typename T>
struct CosFn {
  T value(T x) const { return std::cos(x); }
  T slope(T x) const { return -std::sin(x); }
  void Describe(TwinSpec<T>& t) const { t.function = ElementFunction::kCos; }
};

template <typename T>
struct SqrtFn {
  T value(T x) const { return std::sqrt(x); }
  T slope(T x) const { return T(0.5) / std::sqrt(x); }
  void Describe(TwinSpec<T>& t) const { t.function = ElementFunction::kSqrt; }
};

template <typename T>
struct NegFn {
  T value(T x) const { return -x; }
  T slope(T) const { return T(-1); }
  void Describe(TwinSpec<T>& t) const { t.function = ElementFunction::kNeg; }
};

template <typename T>
struct AbsFn {
  T value(T x) const { return std::abs(x); }
  T slope(T x) const { return x > T(0) ? T(1) : x < T(0) ? T(-1) : T(0); }
  void Describe(TwinSpec<T>& t) const { t.function = ElementFunction::kAbs; }
};

template <typename T>
struct ReciprocalFn {
  T value(T x) const { return T(1) / x; }
  T slope(T x) const { return T(-1) / (x * x); }
  void Describe(TwinSpec<T>& t) const { t.function = ElementFunction::kReciprocal; }
};

// x ** e for a constant exponent e (x ** 3 in GELU's tanh approximation, x.pow(2) in a norm
// written out); the slope e x^(e - 1) (0 for e = 0, as PyTorch's).
template <typename T>
struct PowFn {
  T exponent;
  T value(T x) const { return std::pow(x, exponent); }
  T slope(T x) const { return exponent == T(0) ? T(0) : exponent * std::pow(x, exponent - T(1)); }
  void Describe(TwinSpec<T>& t) const {
    t.function = ElementFunction::kPow;
    t.a = static_cast<double>(exponent);
  }
};

// The node of an element-wise function of one runtime input, once its attributes are read.
template <typename T, typename Fn>
absl::StatusOr<std::unique_ptr<NodeImpl<T>>> MakeFunctionNode(const NodeContext& ctx, Fn fn) {
  if (ctx.inputs.size() != 1) return ctx.Error("takes one input");
  DPTRAIN_ASSIGN_OR_RETURN(const Dims input, ctx.SoleRuntimeInput());
  return std::unique_ptr<NodeImpl<T>>(std::make_unique<FunctionNode<T, Fn>>(input, fn));
}

// An element-wise function op without attributes (Erf, HardSwish, Softplus, Softsign).
template <template <typename> class Fn>
struct PlainFunction {
  template <typename T>
  struct Op {
    static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
      DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {}));
      return MakeFunctionNode<T>(ctx, Fn<T>{});
    }
  };
};

template <typename T>
struct HardSigmoid {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"alpha", "beta"}));
    DPTRAIN_ASSIGN_OR_RETURN(const float alpha, FloatAttribute(ctx.node, "alpha", 0.2f));
    DPTRAIN_ASSIGN_OR_RETURN(const float beta, FloatAttribute(ctx.node, "beta", 0.5f));
    return MakeFunctionNode<T>(ctx, HardSigmoidFn<T>{static_cast<T>(alpha), static_cast<T>(beta)});
  }
};

template <typename T>
struct Elu {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"alpha"}));
    DPTRAIN_ASSIGN_OR_RETURN(const float alpha, FloatAttribute(ctx.node, "alpha", 1.0f));
    return MakeFunctionNode<T>(ctx, EluFn<T>{static_cast<T>(alpha), T(1)});
  }
};

// Selu: ONNX's (and PyTorch's) default alpha and gamma.
template <typename T>
struct Selu {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"alpha", "gamma"}));
    DPTRAIN_ASSIGN_OR_RETURN(const float alpha,
                             FloatAttribute(ctx.node, "alpha", 1.67326319217681884765625f));
    DPTRAIN_ASSIGN_OR_RETURN(const float gamma,
                             FloatAttribute(ctx.node, "gamma", 1.05070102214813232421875f));
    return MakeFunctionNode<T>(ctx, EluFn<T>{static_cast<T>(alpha), static_cast<T>(gamma)});
  }
};

// y = g(x) element by element, g piecewise linear: LeakyRelu (alpha x below 0) and Clip
// (to [min, max]; the gradient is 0 outside, as PyTorch's clamp and hardtanh give).
template <typename T>
class PiecewiseLinearNode final : public NodeImpl<T> {
 public:
  // Below `low`: slope `below` (and the value low + below (x - low) for LeakyRelu, whose low
  // is 0; Clip's slope 0 keeps `low`); above `high`: `high` (Clip), or x when high is inf.
  PiecewiseLinearNode(Dims dims, T low, T below, T high)
      : dims_(dims), low_(low), below_(below), high_(high) {}
  Dims output_dims() const override { return dims_; }
  TwinSpec<T> twin() const override {
    TwinSpec<T> t;
    t.function = ElementFunction::kPiecewiseLinear;
    t.a = static_cast<double>(low_);
    t.b = static_cast<double>(below_);
    t.c = static_cast<double>(high_);
    return t;
  }
  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    input_ = inputs[0];
    T* y = EnsureSize(output_, input_.size());
    for (int64_t i = 0; i < input_.size(); ++i) {
      const T x = input_.data[i];
      y[i] = x < low_ ? low_ + below_ * (x - low_) : x > high_ ? high_ : x;
    }
    return {y, input_.batch, dims_};
  }
  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    const int64_t n = grad_output.size();
    T* dx = EnsureSize(grad_input_, n);
    for (int64_t i = 0; i < n; ++i) {
      const T x = input_.data[i];
      dx[i] = grad_output.data[i] * (x < low_ ? below_ : x > high_ ? T(0) : T(1));
    }
    return {TensorRef<T>{dx, grad_output.batch, dims_}};
  }

 private:
  const Dims dims_;
  const T low_, below_, high_;
  TensorRef<T> input_;
  std::vector<T> output_, grad_input_;
};

template <typename T>
struct LeakyRelu {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"alpha"}));
    DPTRAIN_ASSIGN_OR_RETURN(const float alpha, FloatAttribute(ctx.node, "alpha", 0.01f));
    if (ctx.inputs.size() != 1) return ctx.Error("LeakyRelu takes one input");
    DPTRAIN_ASSIGN_OR_RETURN(const Dims input, ctx.SoleRuntimeInput());
    return std::unique_ptr<NodeImpl<T>>(std::make_unique<PiecewiseLinearNode<T>>(
        input, T(0), static_cast<T>(alpha), std::numeric_limits<T>::infinity()));
  }
};

// Clip: the bounds from the optional constant inputs 1 and 2 (opset 11 on, as PyTorch's
// clamp / ReLU6 / hardtanh export) or the min/max attributes (opset 6).
template <typename T>
struct Clip {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"min", "max"}));
    if (ctx.inputs.empty() || ctx.inputs.size() > 3) return ctx.Error("Clip takes 1 to 3 inputs");
    DPTRAIN_ASSIGN_OR_RETURN(const Dims input, ctx.RuntimeInput(0));
    DPTRAIN_ASSIGN_OR_RETURN(
        float low, FloatAttribute(ctx.node, "min", -std::numeric_limits<float>::infinity()));
    DPTRAIN_ASSIGN_OR_RETURN(
        float high, FloatAttribute(ctx.node, "max", std::numeric_limits<float>::infinity()));
    for (size_t k : {size_t{1}, size_t{2}}) {
      DPTRAIN_RETURN_IF_ERROR(ctx.CheckNotLearned(k, "bound"));
      // An integer bound clips an integer value (a count: `n.clamp(min=1)` of a mask's sum).
      const NodeInput* in = ctx.input(k);
      const Tensor::Type type =
          in != nullptr && in->constant != nullptr ? in->constant->type : Tensor::Type::kFloat;
      DPTRAIN_ASSIGN_OR_RETURN(const Tensor* bound, ctx.ConstantInput(k, type, /*optional=*/true));
      if (bound == nullptr) continue;
      if (bound->num_elements() != 1) {
        return ctx.Error(absl::StrCat("bound ", k, " is not a scalar"));
      }
      (k == 1 ? low : high) =
          type == Tensor::Type::kFloat ? bound->floats[0] : static_cast<float>(bound->ints[0]);
    }
    if (!(low <= high)) {
      return ctx.Error(absl::StrCat("min ", low, " is above max ", high));
    }
    return std::unique_ptr<NodeImpl<T>>(std::make_unique<PiecewiseLinearNode<T>>(
        input, static_cast<T>(low), T(0), static_cast<T>(high)));
  }
};

// Pow(x, e): e a constant scalar, float or integer (PyTorch exports x ** 3 so).
template <typename T>
struct Pow {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {}));
    if (ctx.inputs.size() != 2) return ctx.Error("Pow takes 2 inputs");
    DPTRAIN_ASSIGN_OR_RETURN(const Dims input, ctx.RuntimeInput(0));
    const NodeInput* e = ctx.input(1);
    if (e == nullptr || e->constant == nullptr) {
      return ctx.Error("the exponent must be a constant (x ** 3 as PyTorch exports it)");
    }
    DPTRAIN_RETURN_IF_ERROR(ctx.CheckNotLearned(1, "exponent"));
    // Through ConstantInput: an int64 exponent may not be the batch size (kBatchSize).
    DPTRAIN_RETURN_IF_ERROR(ctx.ConstantInput(1, e->constant->type, false).status());
    const Tensor& t = *e->constant;
    const size_t n = t.type == Tensor::Type::kFloat ? t.floats.size() : t.ints.size();
    if (n != 1) return ctx.Error("the exponent is not a scalar");
    const double exponent = t.type == Tensor::Type::kFloat ? static_cast<double>(t.floats[0])
                                                           : static_cast<double>(t.ints[0]);
    if (!std::isfinite(exponent)) return ctx.Error("the exponent is not finite");
    return std::unique_ptr<NodeImpl<T>>(
        std::make_unique<FunctionNode<T, PowFn<T>>>(input, PowFn<T>{static_cast<T>(exponent)}));
  }
};

}  // namespace

OpFactory TanhOp() { return MakeOpFactory<Tanh>(); }
OpFactory LeakyReluOp() { return MakeOpFactory<LeakyRelu>(); }
OpFactory ClipOp() { return MakeOpFactory<Clip>(); }
OpFactory ErfOp() { return MakeOpFactory<PlainFunction<ErfFn>::Op>(); }
OpFactory HardSigmoidOp() { return MakeOpFactory<HardSigmoid>(); }
OpFactory HardSwishOp() { return MakeOpFactory<PlainFunction<HardSwishFn>::Op>(); }
OpFactory EluOp() { return MakeOpFactory<Elu>(); }
OpFactory SeluOp() { return MakeOpFactory<Selu>(); }
OpFactory SoftplusOp() { return MakeOpFactory<PlainFunction<SoftplusFn>::Op>(); }
OpFactory SoftsignOp() { return MakeOpFactory<PlainFunction<SoftsignFn>::Op>(); }
OpFactory ExpOp() { return MakeOpFactory<PlainFunction<ExpFn>::Op>(); }
OpFactory LogOp() { return MakeOpFactory<PlainFunction<LogFn>::Op>(); }
OpFactory SqrtOp() { return MakeOpFactory<PlainFunction<SqrtFn>::Op>(); }
OpFactory SinOp() { return MakeOpFactory<PlainFunction<SinFn>::Op>(); }
OpFactory CosOp() { return MakeOpFactory<PlainFunction<CosFn>::Op>(); }
OpFactory NegOp() { return MakeOpFactory<PlainFunction<NegFn>::Op>(); }
OpFactory AbsOp() { return MakeOpFactory<PlainFunction<AbsFn>::Op>(); }
OpFactory ReciprocalOp() { return MakeOpFactory<PlainFunction<ReciprocalFn>::Op>(); }
OpFactory PowOp() { return MakeOpFactory<Pow>(); }

}  // namespace graph
}  // namespace dptrain
