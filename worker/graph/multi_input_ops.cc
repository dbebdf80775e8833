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

template <typename T>
class AddNode final : public NodeImpl<T> {
 public:
  explicit AddNode(Dims dims) : dims_(dims) {}
  Dims output_dims() const override { return dims_; }
  TensorRef<T> Forward(absl::Span<const TensorRef<T>> inputs, bool training) override {
    const TensorRef<T>& a = inputs[0];
    const TensorRef<T>& b = inputs[1];
    T* y = EnsureSize(output_, a.size());
    for (int64_t i = 0; i < a.size(); ++i) y[i] = a.data[i] + b.data[i];
    return {y, a.batch, dims_};
  }
  // d(a + b)/da = d(a + b)/db = 1: both gradients are the output's (aliased, not copied).
  std::vector<TensorRef<T>> Backward(TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    return {need_input_grad[0] ? grad_output : TensorRef<T>{},
            need_input_grad[1] ? grad_output : TensorRef<T>{}};
  }

 private:
  const Dims dims_;
  std::vector<T> output_;
};

template <typename T>
struct Add {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {}));
    if (ctx.inputs.size() != 2) return ctx.Error("Add takes two inputs");
    DPTRAIN_ASSIGN_OR_RETURN(const Dims a, ctx.RuntimeInput(0));
    DPTRAIN_ASSIGN_OR_RETURN(const Dims b, ctx.RuntimeInput(1));
    if (a != b) {
      return ctx.Error(absl::StrCat("inputs of dims ", a.ToString(), " and ", b.ToString(),
                                    ": broadcasting unsupported"));
    }
    return std::unique_ptr<NodeImpl<T>>(std::make_unique<AddNode<T>>(a));
  }
};

template <typename T>
class ConcatNode final : public NodeImpl<T> {
 public:
  ConcatNode(std::vector<Dims> inputs, Dims output)
      : inputs_(std::move(inputs)), out_(output), grad_inputs_(inputs_.size()) {}

  Dims output_dims() const override { return out_; }

  TensorRef<T> Forward(absl::Span<const TensorRef<T>> inputs, bool training) override {
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

  std::vector<TensorRef<T>> Backward(TensorRef<T> grad_output,
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

OpFactory AddOp() { return MakeOpFactory<Add>(); }
OpFactory ConcatOp() { return MakeOpFactory<Concat>(); }

}  // namespace graph
}  // namespace dptrain
