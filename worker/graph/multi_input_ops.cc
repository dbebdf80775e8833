#include "worker/graph/multi_input_ops.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/nn/tensor.h"

namespace dptrain {
namespace graph {
namespace {

using nn::EnsureSize;

// The element-wise binary ops (node.h): y = f(a, b) and the partial derivatives, per element.
using Binary = BinaryOp;

const char* BinaryName(Binary op) {
  switch (op) {
    case Binary::kAdd:
      return "Add";
    case Binary::kSub:
      return "Sub";
    case Binary::kMul:
      return "Mul";
    case Binary::kPRelu:
      return "PRelu";
    default:
      return "Div";
  }
}

template <typename T>
T Apply(Binary op, T a, T b) {
  switch (op) {
    case Binary::kAdd:
      return a + b;
    case Binary::kSub:
      return a - b;
    case Binary::kMul:
      return a * b;
    case Binary::kPRelu:
      return a > T(0) ? a : a * b;  // b: the slope.
    default:
      return a / b;
  }
}

// d f / d a and d f / d b at (a, b).
template <typename T>
T PartialA(Binary op, T a, T b) {
  if (op == Binary::kPRelu) return a > T(0) ? T(1) : b;
  return op == Binary::kMul ? b : op == Binary::kDiv ? T(1) / b : T(1);
}
template <typename T>
T PartialB(Binary op, T a, T b) {
  if (op == Binary::kPRelu) return a > T(0) ? T(0) : a;
  return op == Binary::kAdd   ? T(1)
         : op == Binary::kSub ? T(-1)
         : op == Binary::kMul ? a
                              : -a / (b * b);
}

using Source = OperandSource;

// A tensor operand of the graph's: its name, shape and value (owned by the graph, which may be
// gone once the executor is built: read only by the factory and while the executor lays out
// its parameters and buffers).
struct GraphOperand {
  std::string name;
  std::vector<int64_t> shape;
  const Tensor* value = nullptr;
};

// y = f(a, b) for a runtime a and the other operand b; a may be the broadcast operand too
// (then `swapped`: the node computes f(b, a) with a and b renamed so that `a` is full). A
// graph tensor b has no batch: per channel it is [C, 1, 1], unbroadcast the dims of a sample.
template <typename T>
class BinaryNode final : public NodeImpl<T> {
 public:
  BinaryNode(Binary op, Dims dims, Broadcast broadcast, bool swapped, Source source, T scalar,
             GraphOperand operand = {})
      : op_(op),
        dims_(dims),
        broadcast_(broadcast),
        swapped_(swapped),
        source_(source),
        scalar_(scalar),
        operand_(std::move(operand)),
        // The runtime inputs' positions (a constant is left out of them).
        full_index_(source != Source::kComputed ? 0
                    : swapped                   ? 1
                                                : 0),
        other_index_(source != Source::kComputed ? 1
                     : swapped                   ? 0
                                                 : 1) {
    if (operand_.value != nullptr) operand_size_ = operand_.value->num_elements();
    if (source_ == Source::kHeld) {
      held_.assign(operand_.value->floats.begin(), operand_.value->floats.end());
      other_data_ = held_.data();
    }
  }
  Dims output_dims() const override { return dims_; }
  TwinSpec<T> twin() const override {
    TwinSpec<T> t;
    t.binary = op_;
    t.broadcast = broadcast_;
    t.swapped = swapped_;
    t.scalar = static_cast<double>(scalar_);
    t.operand_source = source_;
    t.held_operand = source_ == Source::kHeld ? held_.data() : nullptr;
    t.operand_size = operand_size_;
    return t;
  }
  std::vector<NodeTensorSpec> Params() const override {
    if (source_ != Source::kParam) return {};
    return {{operand_.name, operand_.shape, operand_.value}};
  }
  std::vector<NodeTensorSpec> Buffers() const override {
    if (source_ != Source::kBuffer) return {};
    return {{operand_.name, operand_.shape, operand_.value}};
  }
  void BindParams(absl::Span<const T* const> params, absl::Span<T* const> grads) override {
    if (source_ != Source::kParam) return;
    other_data_ = params[0];
    param_grad_ = grads[0];
  }
  void BindBuffers(absl::Span<T* const> buffers) override {
    if (source_ == Source::kBuffer) other_data_ = buffers[0];
  }

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    full_ = inputs[full_index_];
    if (source_ == Source::kComputed) other_data_ = inputs[other_index_].data;
    if (source_ == Source::kComputed) other_ = inputs[other_index_];
    T* y = EnsureSize(output_, full_.size());
    for (int64_t i = 0; i < full_.size(); ++i) {
      const T b = Other(i);
      y[i] = swapped_ ? Apply(op_, b, full_.data[i]) : Apply(op_, full_.data[i], b);
    }
    return {y, full_.batch, dims_};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    const size_t full_index = full_index_, other_index = other_index_;
    std::vector<TensorRef<T>> grads(need_input_grad.size());
    const int64_t n = grad_output.size();
    // Add and Sub pass the gradient of the full operand through unchanged (aliased).
    const bool identity_full = op_ == Binary::kAdd || (op_ == Binary::kSub && !swapped_);
    if (need_input_grad[full_index]) {
      if (identity_full) {
        grads[full_index] = grad_output;
      } else {
        T* d = EnsureSize(grad_full_, n);
        for (int64_t i = 0; i < n; ++i) {
          const T a = full_.data[i], b = Other(i);
          d[i] = grad_output.data[i] * (swapped_ ? PartialB(op_, b, a) : PartialA(op_, a, b));
        }
        grads[full_index] = {d, grad_output.batch, dims_};
      }
    }
    T* d = nullptr;
    if (source_ == Source::kParam) {
      d = param_grad_;
      std::fill(d, d + operand_size_, T(0));
    } else if (source_ == Source::kComputed && other_index < need_input_grad.size() &&
               need_input_grad[other_index]) {
      d = EnsureSize(grad_other_, other_.size());
      std::fill(d, d + other_.size(), T(0));
      grads[other_index] = {d, other_.batch, other_.dims};
    }
    if (d != nullptr) {
      for (int64_t i = 0; i < n; ++i) {  // Summed where broadcast.
        const T a = full_.data[i], b = Other(i);
        const T partial = swapped_ ? PartialA(op_, b, a) : PartialB(op_, a, b);
        d[OtherIndex(i)] += grad_output.data[i] * partial;
      }
    }
    return grads;
  }

 private:
  // The index into the other operand of element i of the full one.
  int64_t OtherIndex(int64_t i) const {
    const int64_t plane = int64_t{dims_.h} * dims_.w;
    const bool batched = source_ == Source::kComputed;
    switch (broadcast_) {
      case Broadcast::kScalar:
        return 0;
      case Broadcast::kChannel:
        return batched ? i / plane : i / plane % dims_.c;
      case Broadcast::kPixel:  // Runtime only: [1, H, W] per sample.
        return i / (plane * dims_.c) * plane + i % plane;
      default:
        return batched ? i : i % dims_.size();
    }
  }
  T Other(int64_t i) const {
    return source_ == Source::kScalar ? scalar_ : other_data_[OtherIndex(i)];
  }

  const Binary op_;
  const Dims dims_;
  const Broadcast broadcast_;
  const bool swapped_;
  const Source source_;
  const T scalar_;
  const GraphOperand operand_;
  int64_t operand_size_ = 0;
  const size_t full_index_, other_index_;
  TensorRef<T> full_, other_;
  const T* other_data_ = nullptr;
  T* param_grad_ = nullptr;
  std::vector<T> held_;
  std::vector<T> output_, grad_full_, grad_other_;
};

// How a graph tensor of `shape` lines up with a sample of `x`: one element (kScalar), one per
// channel ([C, 1, 1] or [1, C, 1, 1], x not [C, 1, 1] itself), or one per element of a sample
// (its shape, leading 1s aside, is x's per-sample dims with trailing 1s dropped: [C, H, W],
// [1, C, H, W], [F] against [F, 1, 1]); else none.
std::optional<Broadcast> OperandBroadcast(const std::vector<int64_t>& shape, const Dims& x) {
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  if (elements == 1) return Broadcast::kScalar;
  std::vector<int64_t> s = shape;
  while (!s.empty() && s.front() == 1) s.erase(s.begin());
  std::vector<int64_t> sample = {x.c, x.h, x.w};
  auto trim = [](std::vector<int64_t> v) {
    while (!v.empty() && v.back() == 1) v.pop_back();
    return v;
  };
  if (trim(s) == trim(sample)) return Broadcast::kNone;
  if (s.size() == 3 && s[0] == x.c && s[1] == 1 && s[2] == 1) return Broadcast::kChannel;
  return std::nullopt;
}

template <typename T, Binary kOp>
struct BinaryOpFactory {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    // operand_shape (not ONNX; set by the importer's rewrites, graph_rewrites.h): the shape
    // the graph gives a tensor operand of its own where it differs from the tensor's (a
    // state_dict [C] unsqueezed to [C, 1, 1]; a channels-last [C] moved channels-first).
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"operand_shape"}));
    if (ctx.inputs.size() != 2)
      return ctx.Error(absl::StrCat(BinaryName(kOp), " takes two inputs"));
    for (size_t k = 0; k < 2; ++k) {  // One operand of the graph's.
      const NodeInput* in = ctx.input(k);
      if (in == nullptr || in->constant == nullptr) continue;
      if (kOp == Binary::kPRelu && k == 0) return ctx.Error("input 0 must be a computed value");
      DPTRAIN_ASSIGN_OR_RETURN(const Tensor* c, ctx.ConstantInput(k, Tensor::Type::kFloat, false));
      DPTRAIN_ASSIGN_OR_RETURN(const Dims x, ctx.RuntimeInput(1 - k));
      DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> shape,
                               IntsAttribute(ctx.node, "operand_shape", c->shape));
      int64_t elements = 1;
      for (int64_t d : shape) elements *= d;
      if (elements != c->num_elements()) {
        return ctx.Error(
            absl::StrCat("operand_shape ", ShapeText(shape), " does not fit ", c->ToString()));
      }
      const std::optional<Broadcast> broadcast = OperandBroadcast(shape, x);
      if (!broadcast.has_value()) {
        return ctx.Error(
            absl::StrCat("constant input ", k, " ('", in->name, "') is ", c->ToString(),
                         ": against ", x.ToString(),
                         " only a scalar, one value per channel ([C, 1, 1]) or the dims of a "
                         "sample are supported"));
      }
      const Source source = in->state ? (in->fixed ? Source::kBuffer : Source::kParam)
                            : *broadcast == Broadcast::kScalar ? Source::kScalar
                                                               : Source::kHeld;
      return std::unique_ptr<NodeImpl<T>>(std::make_unique<BinaryNode<T>>(
          kOp, x, *broadcast, /*swapped=*/k == 0, source, static_cast<T>(c->floats[0]),
          GraphOperand{in->name, c->shape, c}));
    }
    if (kOp == Binary::kPRelu)
      return ctx.Error("the slope (input 1) must be a tensor of the model");
    DPTRAIN_ASSIGN_OR_RETURN(const Dims a, ctx.RuntimeInput(0));
    DPTRAIN_ASSIGN_OR_RETURN(const Dims b, ctx.RuntimeInput(1));
    auto per_channel = [](const Dims& small, const Dims& full) {
      return small.c == full.c && small.h == 1 && small.w == 1 && (full.h > 1 || full.w > 1);
    };
    if (a == b) {
      return std::unique_ptr<NodeImpl<T>>(std::make_unique<BinaryNode<T>>(
          kOp, a, Broadcast::kNone, false, Source::kComputed, T(0)));
    }
    if (per_channel(b, a) || per_channel(a, b)) {
      const bool swapped = per_channel(a, b);
      return std::unique_ptr<NodeImpl<T>>(std::make_unique<BinaryNode<T>>(
          kOp, swapped ? b : a, Broadcast::kChannel, swapped, Source::kComputed, T(0)));
    }
    auto per_pixel = [](const Dims& small, const Dims& full) {
      return small.c == 1 && full.c > 1 && small.h == full.h && small.w == full.w;
    };
    if (per_pixel(b, a) || per_pixel(a, b)) {
      const bool swapped = per_pixel(a, b);
      return std::unique_ptr<NodeImpl<T>>(std::make_unique<BinaryNode<T>>(
          kOp, swapped ? b : a, Broadcast::kPixel, swapped, Source::kComputed, T(0)));
    }
    return ctx.Error(absl::StrCat("inputs of dims ", a.ToString(), " and ", b.ToString(),
                                  ": broadcasting supported only per channel ([C, 1, 1]), per "
                                  "pixel ([1, H, W]) or of a scalar constant"));
  }
};

template <typename T>
using Add = BinaryOpFactory<T, Binary::kAdd>;

template <typename T>
class ConcatNode final : public NodeImpl<T> {
 public:
  ConcatNode(std::vector<Dims> inputs, Dims output)
      : inputs_(std::move(inputs)), out_(output), grad_inputs_(inputs_.size()) {}

  Dims output_dims() const override { return out_; }

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const int batch = inputs[0].batch;
    T* y = EnsureSize(output_, batch * out_.size());
    for (int n = 0; n < batch; ++n) {
      T* dst = y + n * out_.size();
      for (size_t i = 0; i < inputs.size(); ++i) {
        const int64_t m = inputs_[i].size();
        const T* src = inputs[i].data + n * m;
        dst = std::copy(src, src + m, dst);
      }
    }
    return {y, batch, out_};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    const int batch = grad_output.batch;
    std::vector<TensorRef<T>> grads(inputs_.size());
    int64_t offset = 0;  // Of input i's block within a sample.
    for (size_t i = 0; i < inputs_.size(); ++i) {
      const int64_t m = inputs_[i].size();
      if (need_input_grad[i]) {
        T* dx = EnsureSize(grad_inputs_[i], batch * m);
        for (int n = 0; n < batch; ++n) {
          const T* src = grad_output.data + n * out_.size() + offset;
          std::copy(src, src + m, dx + n * m);
        }
        grads[i] = {dx, batch, inputs_[i]};
      }
      offset += m;
    }
    return grads;
  }

 private:
  const std::vector<Dims> inputs_;
  const Dims out_;
  std::vector<T> output_;
  std::vector<std::vector<T>> grad_inputs_;
};

template <typename T>
struct Concat {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"axis"}));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t axis, IntAttribute(ctx.node, "axis", 1));
    if (axis != 1) return ctx.Error(absl::StrCat("axis ", axis, " unsupported (1 only)"));
    if (ctx.inputs.empty()) return ctx.Error("no inputs");
    std::vector<Dims> dims;
    Dims out{0, 0, 0};
    for (size_t i = 0; i < ctx.inputs.size(); ++i) {
      DPTRAIN_ASSIGN_OR_RETURN(const Dims d, ctx.RuntimeInput(i));
      if (i == 0) {
        out = {0, d.h, d.w};
      } else if (d.h != out.h || d.w != out.w) {
        return ctx.Error(absl::StrCat("input ", i, " of dims ", d.ToString(),
                                      " does not match input 0's ", dims[0].ToString()));
      }
      out.c += d.c;
      dims.push_back(d);
    }
    return std::unique_ptr<NodeImpl<T>>(std::make_unique<ConcatNode<T>>(std::move(dims), out));
  }
};

}  // namespace

template <typename T>
using Sub = BinaryOpFactory<T, Binary::kSub>;
template <typename T>
using Mul = BinaryOpFactory<T, Binary::kMul>;
template <typename T>
using PRelu = BinaryOpFactory<T, Binary::kPRelu>;
template <typename T>
using Div = BinaryOpFactory<T, Binary::kDiv>;

OpFactory AddOp() { return MakeOpFactory<Add>(); }
OpFactory SubOp() { return MakeOpFactory<Sub>(); }
OpFactory MulOp() { return MakeOpFactory<Mul>(); }
OpFactory DivOp() { return MakeOpFactory<Div>(); }
OpFactory PReluOp() { return MakeOpFactory<PRelu>(); }
OpFactory ConcatOp() { return MakeOpFactory<Concat>(); }

}  // namespace graph
}  // namespace dptrain
