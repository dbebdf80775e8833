// The any-shape ops that select elements (any_shape_ops.h): TopK's values (k-max pooling).
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/graph/any_shape_internal.h"
#include "worker/graph/any_shape_ops.h"
#include "worker/graph/reduce_elements.h"

namespace dptrain {
namespace graph {
namespace any_shape_internal {
namespace {

// The k largest (or smallest) elements along one axis, in order (largest first, or smallest
// first); ties go to the lower index, NaN counts as the largest (so the smallest take it last),
// as PyTorch's topk. The
// gradient goes to the elements taken.
template <typename T>
class TopKNode final : public AnyShapeNode<T> {
 public:
  TopKNode(ValueShape in, ValueShape out, int axis, int64_t k, bool largest)
      : AnyShapeNode<T>(std::move(out)),
        in_(std::move(in)),
        axis_(axis),
        k_(k),
        largest_(largest) {}

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    const Shape shape = in_.Concrete(x.batch);
    int64_t outer = 1, inner = 1;
    for (int a = 0; a < axis_; ++a) outer *= shape[a];
    for (size_t a = axis_ + 1; a < shape.size(); ++a) inner *= shape[a];
    const int64_t n = shape[axis_];
    T* y = EnsureSize(output_, outer * k_ * inner);
    int64_t* taken = EnsureSize(taken_, outer * k_ * inner);
    order_.resize(static_cast<size_t>(n));
    // a before b: larger (smaller) first, NaN the largest, then the lower index
    // (reduce_elements.h).
    auto before = [this](T a, int64_t ia, T b, int64_t ib) {
      return TopKBefore(a, ia, b, ib, largest_);
    };
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        const T* row = x.data + o * n * inner + i;
        std::iota(order_.begin(), order_.end(), int64_t{0});
        std::partial_sort(
            order_.begin(), order_.begin() + k_, order_.end(),
            [&](int64_t a, int64_t b) { return before(row[a * inner], a, row[b * inner], b); });
        for (int64_t j = 0; j < k_; ++j) {
          const int64_t at = (o * k_ + j) * inner + i;
          y[at] = row[order_[j] * inner];
          taken[at] = (o * n + order_[j]) * inner + i;
        }
      }
    }
    return {y, x.batch, this->output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    const int64_t size = int64_t{grad_output.batch} * in_.per_sample();
    T* dx = EnsureSize(grad_input_, size);
    std::fill(dx, dx + size, T(0));
    for (int64_t j = 0; j < grad_output.size(); ++j) dx[taken_[j]] += grad_output.data[j];
    return {TensorRef<T>{dx, grad_output.batch, in_.dims_for_ops()}};
  }

  TwinSpec<T> twin() const override {
    TwinSpec<T> t = AnyShapeNode<T>::twin();
    t.topk = {static_cast<int>(axis_), k_, largest_ ? 1 : 0};
    return t;
  }

 private:
  const ValueShape in_;
  const int axis_;
  const int64_t k_;
  const bool largest_;
  std::vector<T> output_, grad_input_;
  std::vector<int64_t> taken_;  // Per output element, the input element it is.
  std::vector<int64_t> order_;
};

// TopK(x, k): k a constant; axis (default -1) not the batch's; largest (1) or not; sorted
// (1; unsorted output is refused, its order being the implementation's). Only the values
// (output 0) are computed: a graph reading the indices is refused by the executor.
template <typename T>
struct TopK {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"axis", "largest", "sorted"}));
    if (ctx.inputs.size() != 2) return ctx.Error("TopK takes two inputs (x, k)");
    DPTRAIN_ASSIGN_OR_RETURN(const ValueShape in, ShapeOf(ctx, 0));
    DPTRAIN_ASSIGN_OR_RETURN(const Tensor* k, ctx.ConstantInput(1, Tensor::Type::kInt64, false));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t axis, IntAttribute(ctx.node, "axis", -1));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t largest, IntAttribute(ctx.node, "largest", 1));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t sorted, IntAttribute(ctx.node, "sorted", 1));
    const std::optional<int> a = NormalizeAxis(axis, in.rank());
    if (!a.has_value() || *a == in.batch_axis) {
      return ctx.Error(absl::StrCat("axis ", axis, " of ", in.ToString(),
                                    " unsupported (an axis other than the batch's)"));
    }
    if (k->num_elements() != 1 || k->ints[0] < 1 || k->ints[0] > in.dims[*a]) {
      return ctx.Error(absl::StrCat("k ", k->ToString(), " is not one number in [1, ", in.dims[*a],
                                    "], the size of axis ", axis));
    }
    if (sorted != 1) return ctx.Error("sorted=0 unsupported");
    ValueShape out = in;
    out.dims[*a] = k->ints[0];
    return std::unique_ptr<NodeImpl<T>>(
        std::make_unique<TopKNode<T>>(in, std::move(out), *a, k->ints[0], largest != 0));
  }
};

}  // namespace
}  // namespace any_shape_internal

OpFactory AnyShapeTopKOp() { return MakeOpFactory<any_shape_internal::TopK>(true); }

}  // namespace graph
}  // namespace dptrain
