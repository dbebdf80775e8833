#include "worker/graph/shape_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/nn/tensor.h"

namespace dptrain {
namespace graph {
namespace {

using nn::EnsureSize;

// Output = input with other dims (no copy), gradient likewise: Identity, Reshape, and Dropout
// where it drops nothing.
template <typename T>
class AliasNode : public NodeImpl<T> {
 public:
  AliasNode(Dims input_dims, Dims output_dims, std::optional<ValueShape> shape = std::nullopt)
      : in_(input_dims), out_(output_dims), shape_(std::move(shape)) {}
  Dims output_dims() const override { return out_; }
  std::optional<ValueShape> output_shape() const override { return shape_; }
  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    return {inputs[0].data, inputs[0].batch, out_};
  }
  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    return {TensorRef<T>{grad_output.data, grad_output.batch, in_}};
  }

 private:
  const Dims in_;
  const Dims out_;
  const std::optional<ValueShape> shape_;
};

// An alias of input 0 with the whole shape `out` (its per-sample dims from it).
template <typename T>
absl::StatusOr<std::unique_ptr<NodeImpl<T>>> MakeView(const NodeContext& ctx, ValueShape out) {
  return std::unique_ptr<NodeImpl<T>>(
      std::make_unique<AliasNode<T>>(*ctx.inputs[0].dims, out.dims_for_ops(), std::move(out)));
}

template <typename T>
struct Identity {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {}));
    DPTRAIN_ASSIGN_OR_RETURN(const Dims input, ctx.SoleRuntimeInput());
    if (ctx.inputs.size() != 1) return ctx.Error("Identity takes one input");
    return std::unique_ptr<NodeImpl<T>>(std::make_unique<AliasNode<T>>(input, input));
  }
};

// Squeeze (remove size-1 axes; all of them, the batch's aside, without axes) or Unsqueeze
// (insert them) of a computed value: a view, never of the batch axis.
template <typename T, bool kSqueeze>
struct SqueezeFactory {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"axes"}));
    DPTRAIN_RETURN_IF_ERROR(ctx.SoleRuntimeInput().status());
    const ValueShape& in = *ctx.inputs[0].shape;
    std::vector<int64_t> axes;
    if (ctx.input(1) != nullptr) {
      DPTRAIN_ASSIGN_OR_RETURN(const Tensor* t, ctx.ConstantInput(1, Tensor::Type::kInt64, false));
      axes = t->ints;
    } else {
      DPTRAIN_ASSIGN_OR_RETURN(axes, IntsAttribute(ctx.node, "axes", {}));
    }
    if (!kSqueeze && axes.empty()) return ctx.Error("Unsqueeze without axes");
    auto refuse = [&]() {
      return ctx.Error(absl::StrCat("axes ", ShapeText(axes), " do not fit ", in.ToString(),
                                    " (the batch axis, a dimension not of size 1, an axis out "
                                    "of range or given twice, or a rank above ",
                                    kMaxRank, ")"));
    };
    const int out_rank = kSqueeze ? in.rank() - static_cast<int>(axes.size())
                                  : in.rank() + static_cast<int>(axes.size());
    if (out_rank < 1 || out_rank > kMaxRank) return refuse();
    std::vector<bool> marked(kSqueeze ? in.rank() : out_rank, false);
    for (int64_t a : axes) {
      const std::optional<int> n = NormalizeAxis(a, static_cast<int>(marked.size()));
      if (!n.has_value() || marked[*n]) return refuse();
      marked[*n] = true;
    }
    ValueShape out = in;
    out.dims.clear();
    if (kSqueeze) {
      for (int i = 0; i < in.rank(); ++i) {
        const bool drop = axes.empty() ? in.dims[i] == 1 && i != in.batch_axis : marked[i];
        if (drop && (i == in.batch_axis || in.dims[i] != 1)) return refuse();
        if (drop) continue;
        if (i == in.batch_axis) out.batch_axis = out.rank();
        out.dims.push_back(in.dims[i]);
      }
    } else {
      int next = 0;
      for (int i = 0; i < out_rank; ++i) {
        if (marked[i]) {
          out.dims.push_back(1);
          continue;
        }
        if (next == in.batch_axis) out.batch_axis = i;
        out.dims.push_back(in.dims[next++]);
      }
    }
    return MakeView<T>(ctx, std::move(out));
  }
};
template <typename T>
using Squeeze = SqueezeFactory<T, true>;
template <typename T>
using Unsqueeze = SqueezeFactory<T, false>;

template <typename T>
struct Reshape {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"allowzero"}));
    DPTRAIN_RETURN_IF_ERROR(ctx.SoleRuntimeInput().status());
    const NodeInput* target = ctx.input(1);
    if (target == nullptr || target->constant == nullptr ||
        target->constant->type != Tensor::Type::kInt64 || target->constant->shape.size() != 1) {
      DPTRAIN_RETURN_IF_ERROR(ctx.TargetShapeInput(1).status());  // Its error.
    }
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t allow_zero, IntAttribute(ctx.node, "allowzero", 0));
    if (allow_zero != 0) return ctx.Error("allowzero=1 unsupported");
    absl::StatusOr<ValueShape> out = ReshapedShape(*ctx.inputs[0].shape, target->constant->ints);
    if (!out.ok()) return ctx.Error(out.status().message());
    return MakeView<T>(ctx, *std::move(out));
  }
};

// Zero padding over H and W.
template <typename T>
class PadNode final : public NodeImpl<T> {
 public:
  PadNode(Dims input, int top, int left, int bottom, int right)
      : in_(input),
        out_{input.c, input.h + top + bottom, input.w + left + right},
        top_(top),
        left_(left) {}

  Dims output_dims() const override { return out_; }
  TwinSpec<T> twin() const override {
    TwinSpec<T> t;
    t.pad_top = top_;
    t.pad_left = left_;
    return t;
  }

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    T* y = EnsureSize(output_, x.batch * out_.size());
    std::fill(y, y + x.batch * out_.size(), T(0));
    const int64_t planes = int64_t{x.batch} * in_.c;
    for (int64_t p = 0; p < planes; ++p) {
      const T* src = x.data + p * in_.h * in_.w;
      T* dst = y + p * out_.h * out_.w + top_ * out_.w + left_;
      for (int r = 0; r < in_.h; ++r)
        std::copy(src + r * in_.w, src + (r + 1) * in_.w, dst + r * out_.w);
    }
    return {y, x.batch, out_};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    const int batch = grad_output.batch;
    T* dx = EnsureSize(grad_input_, batch * in_.size());
    const int64_t planes = int64_t{batch} * in_.c;
    for (int64_t p = 0; p < planes; ++p) {
      const T* src = grad_output.data + p * out_.h * out_.w + top_ * out_.w + left_;
      T* dst = dx + p * in_.h * in_.w;
      for (int r = 0; r < in_.h; ++r)
        std::copy(src + r * out_.w, src + r * out_.w + in_.w, dst + r * in_.w);
    }
    return {TensorRef<T>{dx, batch, in_}};
  }

 private:
  const Dims in_;
  const Dims out_;
  const int top_;
  const int left_;
  std::vector<T> output_;
  std::vector<T> grad_input_;
};

template <typename T>
struct Pad {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"mode", "pads", "value"}));
    DPTRAIN_ASSIGN_OR_RETURN(const Dims input, ctx.SoleRuntimeInput());
    DPTRAIN_ASSIGN_OR_RETURN(const std::string mode, StringAttribute(ctx.node, "mode", "constant"));
    if (mode != "constant") return ctx.Error(absl::StrCat("mode ", mode, " unsupported"));
    std::vector<int64_t> pads;
    if (ctx.input(1) != nullptr) {
      DPTRAIN_ASSIGN_OR_RETURN(const Tensor* t, ctx.ConstantInput(1, Tensor::Type::kInt64, false));
      pads = t->ints;
    } else {
      DPTRAIN_ASSIGN_OR_RETURN(pads, IntsAttribute(ctx.node, "pads", {}));
    }
    float value = 0;
    DPTRAIN_ASSIGN_OR_RETURN(value, FloatAttribute(ctx.node, "value", 0.0f));
    DPTRAIN_RETURN_IF_ERROR(ctx.CheckNotLearned(2, "padding value"));
    DPTRAIN_ASSIGN_OR_RETURN(const Tensor* v, ctx.ConstantInput(2, Tensor::Type::kFloat, true));
    if (v != nullptr) value = v->num_elements() == 1 ? v->floats[0] : 1.0f;
    if (value != 0) return ctx.Error("only zero padding is supported");
    if (ctx.inputs.size() > 3) return ctx.Error("the axes input is unsupported");
    // [n_begin, c_begin, h_begin, w_begin, n_end, c_end, h_end, w_end]
    if (pads.size() != 8 || pads[0] != 0 || pads[1] != 0 || pads[4] != 0 || pads[5] != 0 ||
        pads[2] < 0 || pads[3] < 0 || pads[6] < 0 || pads[7] < 0) {
      return ctx.Error(absl::StrCat("pads ", ShapeText(pads),
                                    " unsupported (non-negative, of H and W of a 4-D value only)"));
    }
    return std::unique_ptr<NodeImpl<T>>(
        std::make_unique<PadNode<T>>(input, static_cast<int>(pads[2]), static_cast<int>(pads[3]),
                                     static_cast<int>(pads[6]), static_cast<int>(pads[7])));
  }
};

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

template <typename T>
class DropoutNode final : public NodeImpl<T> {
 public:
  DropoutNode(Dims dims, double ratio, uint64_t seed) : dims_(dims), ratio_(ratio), seed_(seed) {}
  TwinSpec<T> twin() const override {
    TwinSpec<T> t;
    t.dropout_ratio = ratio_;
    t.dropout_seed = seed_;
    return t;
  }

  Dims output_dims() const override { return dims_; }

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    dropped_ = training && ratio_ > 0;
    if (!dropped_) return x;
    const int64_t n = x.size();
    uint8_t* keep = EnsureSize(keep_, n);
    T* y = EnsureSize(output_, n);
    const T scale = static_cast<T>(1.0 / (1.0 - ratio_));
    const uint64_t stream = SplitMix64(seed_ ^ SplitMix64(step_++));
    for (int64_t i = 0; i < n; ++i) {
      const double u =
          static_cast<double>(SplitMix64(stream + static_cast<uint64_t>(i)) >> 11) * 0x1.0p-53;
      keep[i] = u >= ratio_;
      y[i] = keep[i] ? x.data[i] * scale : T(0);
    }
    return {y, x.batch, dims_};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    if (!dropped_) return {grad_output};
    const int64_t n = grad_output.size();
    T* dx = EnsureSize(grad_input_, n);
    const T scale = static_cast<T>(1.0 / (1.0 - ratio_));
    for (int64_t i = 0; i < n; ++i) dx[i] = keep_[i] ? grad_output.data[i] * scale : T(0);
    return {TensorRef<T>{dx, grad_output.batch, dims_}};
  }

 private:
  const Dims dims_;
  const double ratio_;
  const uint64_t seed_;
  uint64_t step_ = 0;     // Training Forwards so far: each draws a new mask.
  bool dropped_ = false;  // The last Forward applied a mask.
  std::vector<uint8_t> keep_;
  std::vector<T> output_;
  std::vector<T> grad_input_;
};

template <typename T>
struct Dropout {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"ratio", "seed"}));
    DPTRAIN_ASSIGN_OR_RETURN(const Dims input, ctx.SoleRuntimeInput());
    DPTRAIN_ASSIGN_OR_RETURN(float ratio, FloatAttribute(ctx.node, "ratio", 0.5f));
    DPTRAIN_RETURN_IF_ERROR(ctx.CheckNotLearned(1, "ratio"));
    DPTRAIN_ASSIGN_OR_RETURN(const Tensor* r, ctx.ConstantInput(1, Tensor::Type::kFloat, true));
    if (r != nullptr) {
      if (r->num_elements() != 1) return ctx.Error("ratio must be a scalar");
      ratio = r->floats[0];
    }
    if (!(ratio >= 0 && ratio < 1)) {
      return ctx.Error(absl::StrCat("ratio ", ratio, " is not in [0, 1)"));
    }
    if (ctx.inputs.size() > 3) return ctx.Error("too many inputs");
    return std::unique_ptr<NodeImpl<T>>(
        std::make_unique<DropoutNode<T>>(input, static_cast<double>(ratio), ctx.seed));
  }
};

// Softmax and LogSoftmax over the channels (axis 1; or -1 of a [N, C] value, which is
// [C, 1, 1] per sample here), at every pixel: what a classifier's head ends with
// (log_softmax then nll_loss, as PyTorch's MNIST example; the worker's cross-entropy on
// log-probabilities equals nll_loss on them).
template <typename T>
class SoftmaxNode final : public NodeImpl<T> {
 public:
  SoftmaxNode(Dims dims, bool log) : dims_(dims), log_(log) {}
  Dims output_dims() const override { return dims_; }
  TwinSpec<T> twin() const override {
    TwinSpec<T> t;
    t.softmax = !log_;
    t.log_softmax = log_;
    return t;
  }
  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    T* y = EnsureSize(output_, x.size());
    const int64_t plane = int64_t{dims_.h} * dims_.w, c = dims_.c;
    for (int64_t n = 0; n < x.batch; ++n) {
      for (int64_t p = 0; p < plane; ++p) {
        const T* in = x.data + n * c * plane + p;
        T* out = y + n * c * plane + p;
        T top = in[0];
        for (int64_t k = 1; k < c; ++k) top = std::max(top, in[k * plane]);
        T sum = 0;
        for (int64_t k = 0; k < c; ++k) sum += std::exp(in[k * plane] - top);
        const T log_sum = std::log(sum) + top;
        for (int64_t k = 0; k < c; ++k) {
          out[k * plane] = log_ ? in[k * plane] - log_sum : std::exp(in[k * plane] - log_sum);
        }
      }
    }
    output_ref_ = {y, x.batch, dims_};
    return output_ref_;
  }
  // Softmax: dx = y (dy - sum(dy y)); LogSoftmax: dx = dy - exp(y) sum(dy), per pixel.
  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    T* dx = EnsureSize(grad_input_, grad_output.size());
    const int64_t plane = int64_t{dims_.h} * dims_.w, c = dims_.c;
    for (int64_t n = 0; n < grad_output.batch; ++n) {
      for (int64_t p = 0; p < plane; ++p) {
        const int64_t at = n * c * plane + p;
        const T* dy = grad_output.data + at;
        const T* y = output_ref_.data + at;
        T* d = dx + at;
        T dot = 0;
        for (int64_t k = 0; k < c; ++k) dot += log_ ? dy[k * plane] : dy[k * plane] * y[k * plane];
        for (int64_t k = 0; k < c; ++k) {
          d[k * plane] = log_ ? dy[k * plane] - std::exp(y[k * plane]) * dot
                              : y[k * plane] * (dy[k * plane] - dot);
        }
      }
    }
    return {TensorRef<T>{dx, grad_output.batch, dims_}};
  }

 private:
  const Dims dims_;
  const bool log_;
  std::vector<T> output_, grad_input_;
  TensorRef<T> output_ref_;
};

template <typename T>
absl::StatusOr<std::unique_ptr<NodeImpl<T>>> MakeSoftmax(const NodeContext& ctx, bool log) {
  DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"axis"}));
  DPTRAIN_ASSIGN_OR_RETURN(const int64_t axis, IntAttribute(ctx.node, "axis", -1));
  if (ctx.inputs.size() != 1) return ctx.Error("takes one input");
  DPTRAIN_ASSIGN_OR_RETURN(const Dims input, ctx.SoleRuntimeInput());
  const bool features = input.h == 1 && input.w == 1;  // [N, C]: axis -1 is the channels.
  if (axis != 1 && !(features && axis == -1)) {
    return ctx.Error(absl::StrCat("axis ", axis,
                                  " unsupported (1, the channels; or -1 of a "
                                  "[N, C] value)"));
  }
  return std::unique_ptr<NodeImpl<T>>(std::make_unique<SoftmaxNode<T>>(input, log));
}

template <typename T>
struct Softmax {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    return MakeSoftmax<T>(ctx, /*log=*/false);
  }
};

template <typename T>
struct LogSoftmax {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    return MakeSoftmax<T>(ctx, /*log=*/true);
  }
};

// Cast to float (what PyTorch's exports put around some activations): the identity; any
// other target type is refused.
template <typename T>
struct Cast {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"to"}));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t to, IntAttribute(ctx.node, "to", 0));
    constexpr int64_t kOnnxFloat = 1;  // onnx.TensorProto.FLOAT.
    if (to != kOnnxFloat) {
      return ctx.Error(absl::StrCat("cast to ONNX type ", to, " unsupported (float, 1, only)"));
    }
    if (ctx.inputs.size() != 1) return ctx.Error("Cast takes one input");
    DPTRAIN_ASSIGN_OR_RETURN(const Dims input, ctx.SoleRuntimeInput());
    return std::unique_ptr<NodeImpl<T>>(std::make_unique<AliasNode<T>>(input, input));
  }
};

}  // namespace

OpFactory ReshapeOp() { return MakeOpFactory<Reshape>(true); }
OpFactory IdentityOp() { return MakeOpFactory<Identity>(); }
OpFactory SqueezeOp() { return MakeOpFactory<Squeeze>(true); }
OpFactory UnsqueezeOp() { return MakeOpFactory<Unsqueeze>(true); }
OpFactory PadOp() { return MakeOpFactory<Pad>(); }
OpFactory DropoutOp() { return MakeOpFactory<Dropout>(); }
OpFactory CastOp() { return MakeOpFactory<Cast>(); }
OpFactory SoftmaxOp() { return MakeOpFactory<Softmax>(); }
OpFactory LogSoftmaxOp() { return MakeOpFactory<LogSoftmax>(); }

}  // namespace graph
}  // namespace dptrain
