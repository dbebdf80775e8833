#include "worker/graph/multi_input_ops.h"

#include <algorithm>
#include <memory>
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
    default:
      return a / b;
  }
}

// d f / d a and d f / d b at (a, b).
template <typename T>
T PartialA(Binary op, T a, T b) {
  return op == Binary::kMul ? b : op == Binary::kDiv ? T(1) / b : T(1);
}
template <typename T>
T PartialB(Binary op, T a, T b) {
  return op == Binary::kAdd   ? T(1)
         : op == Binary::kSub ? T(-1)
         : op == Binary::kMul ? a
                              : -a / (b * b);
}

// y = f(a, b) for runtime a and b (or a constant scalar b); a may be the broadcast operand
// too (then `swapped`: the node computes f(b, a) with a and b renamed so that `a` is full).
template <typename T>
class BinaryNode final : public NodeImpl<T> {
 public:
  BinaryNode(Binary op, Dims dims, Broadcast broadcast, bool swapped, T scalar)
      : op_(op),
        dims_(dims),
        broadcast_(broadcast),
        swapped_(swapped),
        scalar_(scalar),
        // The runtime inputs' positions (a constant is left out of them).
        full_index_(broadcast == Broadcast::kScalar ? 0
                    : swapped                       ? 1
                                                    : 0),
        other_index_(broadcast == Broadcast::kScalar ? 1
                     : swapped                       ? 0
                                                     : 1) {}
  Dims output_dims() const override { return dims_; }
  TwinSpec<T> twin() const override {
    TwinSpec<T> t;
    t.binary = op_;
    t.broadcast = broadcast_;
    t.swapped = swapped_;
    t.scalar = static_cast<double>(scalar_);
    return t;
  }

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    full_ = inputs[full_index_];
    other_ = broadcast_ == Broadcast::kScalar ? TensorRef<T>{} : inputs[other_index_];
    T* y = EnsureSize(output_, full_.size());
    const int64_t plane = dims_.h * dims_.w;
    for (int64_t i = 0; i < full_.size(); ++i) {
      const T b = Other(i, plane);
      y[i] = swapped_ ? Apply(op_, b, full_.data[i]) : Apply(op_, full_.data[i], b);
    }
    return {y, full_.batch, dims_};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    const size_t full_index = full_index_, other_index = other_index_;
    std::vector<TensorRef<T>> grads(need_input_grad.size());
    const int64_t n = grad_output.size(), plane = dims_.h * dims_.w;
    // Add and Sub pass the gradient of the full operand through unchanged (aliased).
    const bool identity_full = op_ == Binary::kAdd || (op_ == Binary::kSub && !swapped_);
    if (need_input_grad[full_index]) {
      if (identity_full) {
        grads[full_index] = grad_output;
      } else {
        T* d = EnsureSize(grad_full_, n);
        for (int64_t i = 0; i < n; ++i) {
          const T a = full_.data[i], b = Other(i, plane);
          d[i] = grad_output.data[i] * (swapped_ ? PartialB(op_, b, a) : PartialA(op_, a, b));
        }
        grads[full_index] = {d, grad_output.batch, dims_};
      }
    }
    if (broadcast_ != Broadcast::kScalar && other_index < need_input_grad.size() &&
        need_input_grad[other_index]) {
      const int64_t m = other_.size();
      T* d = EnsureSize(grad_other_, m);
      std::fill(d, d + m, T(0));
      for (int64_t i = 0; i < n; ++i) {  // Summed over the plane when broadcast.
        const T a = full_.data[i], b = Other(i, plane);
        const T partial = swapped_ ? PartialA(op_, b, a) : PartialB(op_, a, b);
        d[broadcast_ == Broadcast::kChannel ? i / plane : i] += grad_output.data[i] * partial;
      }
      grads[other_index] = {d, other_.batch, other_.dims};
    }
    return grads;
  }

 private:
  T Other(int64_t i, int64_t plane) const {
    return broadcast_ == Broadcast::kScalar    ? scalar_
           : broadcast_ == Broadcast::kChannel ? other_.data[i / plane]
                                               : other_.data[i];
  }

  const Binary op_;
  const Dims dims_;
  const Broadcast broadcast_;
  const bool swapped_;
  const T scalar_;
  const size_t full_index_, other_index_;
  TensorRef<T> full_, other_;
  std::vector<T> output_, grad_full_, grad_other_;
};

template <typename T, Binary kOp>
struct BinaryOpFactory {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {}));
    if (ctx.inputs.size() != 2)
      return ctx.Error(absl::StrCat(BinaryName(kOp), " takes two inputs"));
    for (size_t k = 0; k < 2; ++k) {  // One constant operand: a scalar.
      const NodeInput* in = ctx.input(k);
      if (in == nullptr || in->constant == nullptr) continue;
      DPTRAIN_ASSIGN_OR_RETURN(const Tensor* c, ctx.ConstantInput(k, Tensor::Type::kFloat, false));
      if (c->floats.size() != 1) {
        return ctx.Error(absl::StrCat("constant input ", k, " ('", in->name, "') is ",
                                      c->ToString(), ": only a scalar constant is supported"));
      }
      DPTRAIN_ASSIGN_OR_RETURN(const Dims x, ctx.RuntimeInput(1 - k));
      return std::unique_ptr<NodeImpl<T>>(std::make_unique<BinaryNode<T>>(
          kOp, x, Broadcast::kScalar, /*swapped=*/k == 0, static_cast<T>(c->floats[0])));
    }
    DPTRAIN_ASSIGN_OR_RETURN(const Dims a, ctx.RuntimeInput(0));
    DPTRAIN_ASSIGN_OR_RETURN(const Dims b, ctx.RuntimeInput(1));
    auto per_channel = [](const Dims& small, const Dims& full) {
      return small.c == full.c && small.h == 1 && small.w == 1 && (full.h > 1 || full.w > 1);
    };
    if (a == b) {
      return std::unique_ptr<NodeImpl<T>>(
          std::make_unique<BinaryNode<T>>(kOp, a, Broadcast::kNone, false, T(0)));
    }
    if (per_channel(b, a) || per_channel(a, b)) {
      const bool swapped = per_channel(a, b);
      return std::unique_ptr<NodeImpl<T>>(std::make_unique<BinaryNode<T>>(
          kOp, swapped ? b : a, Broadcast::kChannel, swapped, T(0)));
    }
    return ctx.Error(absl::StrCat("inputs of dims ", a.ToString(), " and ", b.ToString(),
                                  ": broadcasting supported only per channel ([C, 1, 1]) or "
                                  "of a scalar constant"));
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
using Div = BinaryOpFactory<T, Binary::kDiv>;

OpFactory AddOp() { return MakeOpFactory<Add>(); }
OpFactory SubOp() { return MakeOpFactory<Sub>(); }
OpFactory MulOp() { return MakeOpFactory<Mul>(); }
OpFactory DivOp() { return MakeOpFactory<Div>(); }
OpFactory ConcatOp() { return MakeOpFactory<Concat>(); }

}  // namespace graph
}  // namespace dptrain
