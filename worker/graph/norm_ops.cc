#include "worker/graph/norm_ops.h"

#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/nn/tensor.h"

namespace dptrain {
namespace graph {
namespace {

using nn::EnsureSize;

// xhat = (x - mean) / sqrt(var + eps) over `s` values (biased variance, the statistics in
// double); returns 1 / sqrt(var + eps).
template <typename T>
T Standardize(const T* x, int64_t s, double eps, T* xhat) {
  double mean = 0, var = 0;
  for (int64_t i = 0; i < s; ++i) mean += x[i];
  mean /= static_cast<double>(s);
  for (int64_t i = 0; i < s; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= static_cast<double>(s);
  const T inv = static_cast<T>(1.0 / std::sqrt(var + eps));
  for (int64_t i = 0; i < s; ++i) xhat[i] = static_cast<T>((x[i] - mean) * inv);
  return inv;
}

// The input gradient of Standardize followed by a gain: with d = dy * gain[i * gain_stride]
// (a gain per value, or one for all: stride 0), dx = inv / S (S d - sum(d) - xhat sum(d xhat)).
template <typename T>
void StandardizeBackward(const T* dy, const T* xhat, T inv, const T* gain, int64_t gain_stride,
                         int64_t s, T* dx) {
  double sum = 0, dot = 0;
  for (int64_t i = 0; i < s; ++i) {
    const double d = static_cast<double>(dy[i]) * gain[i * gain_stride];
    sum += d;
    dot += d * xhat[i];
  }
  const double k = inv / static_cast<double>(s);
  for (int64_t i = 0; i < s; ++i) {
    const double d = static_cast<double>(dy[i]) * gain[i * gain_stride];
    dx[i] = static_cast<T>(k * (static_cast<double>(s) * d - sum - xhat[i] * dot));
  }
}

// y = (x - mean) / sqrt(var + eps) * scale + bias over each sample's S values (biased variance,
// as nn.LayerNorm); the statistics in double.
template <typename T>
class LayerNormNode final : public NodeImpl<T> {
 public:
  LayerNormNode(Dims dims, double eps, std::vector<NodeTensorSpec> specs)
      : dims_(dims), eps_(eps), specs_(std::move(specs)) {}

  Dims output_dims() const override { return dims_; }
  TwinSpec<T> twin() const override {
    TwinSpec<T> t;
    t.layer_norm_eps = eps_;
    return t;
  }
  std::vector<NodeTensorSpec> Params() const override { return specs_; }
  void BindParams(absl::Span<const T* const> params, absl::Span<T* const> grads) override {
    scale_ = params[0];
    scale_grad_ = grads[0];
    bias_ = specs_.size() > 1 ? params[1] : nullptr;
    bias_grad_ = specs_.size() > 1 ? grads[1] : nullptr;
  }

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    const int64_t s = dims_.size();
    T* y = EnsureSize(output_, x.size());
    T* xhat = EnsureSize(xhat_, x.size());
    T* inv = EnsureSize(inv_std_, x.batch);
    for (int n = 0; n < x.batch; ++n) {
      inv[n] = Standardize(x.data + n * s, s, eps_, xhat + n * s);
      for (int64_t i = 0; i < s; ++i) {
        y[n * s + i] = xhat[n * s + i] * scale_[i] + (bias_ != nullptr ? bias_[i] : T(0));
      }
    }
    batch_ = x.batch;
    return {y, x.batch, dims_};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    const int64_t s = dims_.size();
    const T* dy = grad_output.data;
    const T* xhat = xhat_.data();
    std::fill(scale_grad_, scale_grad_ + s, T(0));
    if (bias_grad_ != nullptr) std::fill(bias_grad_, bias_grad_ + s, T(0));
    for (int n = 0; n < batch_; ++n) {
      for (int64_t i = 0; i < s; ++i) {
        scale_grad_[i] += dy[n * s + i] * xhat[n * s + i];
        if (bias_grad_ != nullptr) bias_grad_[i] += dy[n * s + i];
      }
    }
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    T* dx = EnsureSize(grad_input_, int64_t{batch_} * s);
    for (int n = 0; n < batch_; ++n) {
      StandardizeBackward(dy + n * s, xhat + n * s, inv_std_[n], scale_, 1, s, dx + n * s);
    }
    return {TensorRef<T>{dx, batch_, dims_}};
  }

 private:
  const Dims dims_;
  const double eps_;
  const std::vector<NodeTensorSpec> specs_;
  const T* scale_ = nullptr;
  const T* bias_ = nullptr;
  T* scale_grad_ = nullptr;
  T* bias_grad_ = nullptr;
  int batch_ = 0;
  std::vector<T> output_, xhat_, inv_std_, grad_input_;
};

template <typename T>
struct LayerNormalization {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"axis", "epsilon", "stash_type"}));
    if (ctx.inputs.size() < 2 || ctx.inputs.size() > 3) {
      return ctx.Error("LayerNormalization takes 2 or 3 inputs");
    }
    DPTRAIN_ASSIGN_OR_RETURN(const Dims x, ctx.RuntimeInput(0));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t axis, IntAttribute(ctx.node, "axis", -1));
    DPTRAIN_ASSIGN_OR_RETURN(const float eps, FloatAttribute(ctx.node, "epsilon", 1e-5f));
    // The whole sample: axis 1; -3 of a [N, C, H, W] value (nn.LayerNorm([C, H, W]), the
    // only rank where -3 normalizes anything but the batch); -1 of a [N, F] value.
    const bool features = x.h == 1 && x.w == 1;
    if (axis != 1 && axis != -3 && !(features && axis == -1)) {
      return ctx.Error(absl::StrCat("axis ", axis,
                                    " unsupported (over each whole sample: 1, -3 of a [N, C, H, "
                                    "W] value or -1 of a [N, F] value)"));
    }
    if (!(eps > 0)) return ctx.Error(absl::StrCat("epsilon ", eps, " must be > 0"));
    std::vector<NodeTensorSpec> specs;
    for (size_t k : {size_t{1}, size_t{2}}) {
      DPTRAIN_ASSIGN_OR_RETURN(const Tensor* t,
                               ctx.ConstantInput(k, Tensor::Type::kFloat, /*optional=*/k == 2));
      if (t == nullptr) continue;
      if (t->num_elements() != x.size()) {
        return ctx.Error(absl::StrCat(k == 1 ? "Scale" : "B", " is ", t->ToString(), ", expected ",
                                      x.size(), " values (the sample's)"));
      }
      specs.push_back({ctx.inputs[k].name, t->shape, t, 0.0f});
    }
    return std::unique_ptr<NodeImpl<T>>(
        std::make_unique<LayerNormNode<T>>(x, static_cast<double>(eps), std::move(specs)));
  }
};

// y = (x - mean) / sqrt(var + eps) * scale[c] + bias[c] over each (sample, channel) plane
// (biased variance, as nn.InstanceNorm2d; GroupNorm exports as this over [N, G, C/G * H * W]);
// the statistics in double. scale and bias are learned (model state), fixed buffers, or
// constants of the graph held by the node.
template <typename T>
class InstanceNormNode final : public NodeImpl<T> {
 public:
  enum class Role { kParam, kBuffer, kHeld };
  InstanceNormNode(Dims dims, double eps, Role role, std::vector<NodeTensorSpec> specs)
      : dims_(dims), eps_(eps), role_(role), specs_(std::move(specs)) {
    if (role_ == Role::kHeld) {
      held_.assign(specs_[0].initial->floats.begin(), specs_[0].initial->floats.end());
      held_.insert(held_.end(), specs_[1].initial->floats.begin(), specs_[1].initial->floats.end());
      scale_ = held_.data();
      bias_ = held_.data() + dims_.c;
    }
  }

  Dims output_dims() const override { return dims_; }
  TwinSpec<T> twin() const override {
    TwinSpec<T> t;
    t.instance_norm_eps = eps_;
    t.operand_source = role_ == Role::kParam    ? OperandSource::kParam
                       : role_ == Role::kBuffer ? OperandSource::kBuffer
                                                : OperandSource::kHeld;
    t.held_operand = role_ == Role::kHeld ? held_.data() : nullptr;
    t.operand_size = 2 * int64_t{dims_.c};
    return t;
  }
  std::vector<NodeTensorSpec> Params() const override {
    return role_ == Role::kParam ? specs_ : std::vector<NodeTensorSpec>{};
  }
  std::vector<NodeTensorSpec> Buffers() const override {
    return role_ == Role::kBuffer ? specs_ : std::vector<NodeTensorSpec>{};
  }
  void BindParams(absl::Span<const T* const> params, absl::Span<T* const> grads) override {
    if (role_ != Role::kParam) return;
    scale_ = params[0];
    bias_ = params[1];
    scale_grad_ = grads[0];
    bias_grad_ = grads[1];
  }
  void BindBuffers(absl::Span<T* const> buffers) override {
    if (role_ != Role::kBuffer) return;
    scale_ = buffers[0];
    bias_ = buffers[1];
  }

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    const int64_t plane = int64_t{dims_.h} * dims_.w;
    const int64_t planes = int64_t{x.batch} * dims_.c;
    T* y = EnsureSize(output_, x.size());
    T* xhat = EnsureSize(xhat_, x.size());
    T* inv = EnsureSize(inv_std_, planes);
    for (int64_t p = 0; p < planes; ++p) {
      const int c = static_cast<int>(p % dims_.c);
      inv[p] = Standardize(x.data + p * plane, plane, eps_, xhat + p * plane);
      for (int64_t i = 0; i < plane; ++i) {
        y[p * plane + i] = xhat[p * plane + i] * scale_[c] + bias_[c];
      }
    }
    batch_ = x.batch;
    return {y, x.batch, dims_};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    const int64_t plane = int64_t{dims_.h} * dims_.w;
    const int64_t planes = int64_t{batch_} * dims_.c;
    const T* dy = grad_output.data;
    const T* xhat = xhat_.data();
    if (scale_grad_ != nullptr) {
      std::fill(scale_grad_, scale_grad_ + dims_.c, T(0));
      std::fill(bias_grad_, bias_grad_ + dims_.c, T(0));
      for (int64_t p = 0; p < planes; ++p) {
        const int c = static_cast<int>(p % dims_.c);
        for (int64_t i = 0; i < plane; ++i) {
          scale_grad_[c] += dy[p * plane + i] * xhat[p * plane + i];
          bias_grad_[c] += dy[p * plane + i];
        }
      }
    }
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    T* dx = EnsureSize(grad_input_, planes * plane);
    for (int64_t p = 0; p < planes; ++p) {
      StandardizeBackward(dy + p * plane, xhat + p * plane, inv_std_[p], scale_ + p % dims_.c, 0,
                          plane, dx + p * plane);
    }
    return {TensorRef<T>{dx, batch_, dims_}};
  }

 private:
  const Dims dims_;
  const double eps_;
  const Role role_;
  const std::vector<NodeTensorSpec> specs_;
  std::vector<T> held_;
  const T* scale_ = nullptr;
  const T* bias_ = nullptr;
  T* scale_grad_ = nullptr;
  T* bias_grad_ = nullptr;
  int batch_ = 0;
  std::vector<T> output_, xhat_, inv_std_, grad_input_;
};

template <typename T>
struct InstanceNormalization {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"epsilon"}));
    if (ctx.inputs.size() != 3) return ctx.Error("InstanceNormalization takes 3 inputs");
    DPTRAIN_ASSIGN_OR_RETURN(const Dims x, ctx.RuntimeInput(0));
    DPTRAIN_ASSIGN_OR_RETURN(const float eps, FloatAttribute(ctx.node, "epsilon", 1e-5f));
    if (!(eps > 0)) return ctx.Error(absl::StrCat("epsilon ", eps, " must be > 0"));
    std::vector<NodeTensorSpec> specs;
    for (size_t k : {size_t{1}, size_t{2}}) {
      DPTRAIN_ASSIGN_OR_RETURN(const Tensor* t, ctx.ConstantInput(k, Tensor::Type::kFloat, false));
      if (t->num_elements() != x.c) {
        return ctx.Error(absl::StrCat(k == 1 ? "scale" : "B", " is ", t->ToString(), ", expected ",
                                      x.c, " values (one per channel)"));
      }
      specs.push_back({ctx.inputs[k].name, t->shape, t, 0.0f});
    }
    using Role = typename InstanceNormNode<T>::Role;
    auto role_of = [&ctx](size_t k) {
      const NodeInput& in = ctx.inputs[k];
      return !in.state ? Role::kHeld : in.fixed ? Role::kBuffer : Role::kParam;
    };
    if (role_of(1) != role_of(2)) {
      return ctx.Error("scale and B must both be learned, both buffers or both constants");
    }
    return std::unique_ptr<NodeImpl<T>>(std::make_unique<InstanceNormNode<T>>(
        x, ShortestDecimal(eps), role_of(1), std::move(specs)));
  }
};

}  // namespace

OpFactory LayerNormalizationOp() { return MakeOpFactory<LayerNormalization>(); }
OpFactory InstanceNormalizationOp() { return MakeOpFactory<InstanceNormalization>(); }

}  // namespace graph
}  // namespace dptrain
