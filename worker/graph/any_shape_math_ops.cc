// The any-shape ops that compute (any_shape_ops.h): MatMul of two computed values, the
// row-wise layers (Gemm, MatMul of a weight, LayerNormalization, Softmax, LogSoftmax),
// ReduceMean, ReduceSum, ReduceMax, ReduceMin, ReduceL2, and Add, Sub, Mul, Div, Max, Min with
// NumPy broadcasting.
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/graph/any_shape_internal.h"
#include "worker/graph/any_shape_ops.h"
#include "worker/graph/binary_elements.h"
#include "worker/graph/layer_ops.h"
#include "worker/graph/multi_input_ops.h"
#include "worker/graph/norm_ops.h"
#include "worker/graph/reduce_elements.h"
#include "worker/graph/shape_ops.h"
#include "worker/nn/gemm.h"

namespace dptrain {
namespace graph {
namespace any_shape_internal {
namespace {

// ---- MatMul of two computed values ----

template <typename T>
class BatchedMatMulNode final : public AnyShapeNode<T> {
 public:
  BatchedMatMulNode(ValueShape a, ValueShape b, ValueShape out)
      : AnyShapeNode<T>(std::move(out)), a_(std::move(a)), b_(std::move(b)) {
    const int r = a_.rank();
    m_ = static_cast<int>(a_.dims[r - 2]);
    k_ = static_cast<int>(a_.dims[r - 1]);
    n_ = static_cast<int>(b_.dims[r - 1]);
  }

  TwinSpec<T> twin() const override {
    TwinSpec<T> t = AnyShapeNode<T>::twin();
    t.batched_matmul = {m_, k_, n_};
    return t;
  }

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    a_data_ = inputs[0].data;
    b_data_ = inputs[1].data;
    const int batch = inputs[0].batch;
    const int64_t count = Matrices(batch);
    T* c = EnsureSize(output_, count * m_ * n_);
    for (int64_t l = 0; l < count; ++l) {
      nn::Gemm(false, false, m_, n_, k_, T(1), a_data_ + l * m_ * k_, k_, b_data_ + l * k_ * n_, n_,
               T(0), c + l * m_ * n_, n_);
    }
    return {c, batch, this->output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    const int batch = grad_output.batch;
    const int64_t count = Matrices(batch);
    const T* dc = grad_output.data;
    std::vector<TensorRef<T>> grads(2);
    if (need_input_grad[0]) {  // dA = dC B^T
      T* da = EnsureSize(grad_a_, count * m_ * k_);
      for (int64_t l = 0; l < count; ++l) {
        nn::Gemm(false, true, m_, k_, n_, T(1), dc + l * m_ * n_, n_, b_data_ + l * k_ * n_, n_,
                 T(0), da + l * m_ * k_, k_);
      }
      grads[0] = {da, batch, a_.dims_for_ops()};
    }
    if (need_input_grad[1]) {  // dB = A^T dC
      T* db = EnsureSize(grad_b_, count * k_ * n_);
      for (int64_t l = 0; l < count; ++l) {
        nn::Gemm(true, false, k_, n_, m_, T(1), a_data_ + l * m_ * k_, k_, dc + l * m_ * n_, n_,
                 T(0), db + l * k_ * n_, n_);
      }
      grads[1] = {db, batch, b_.dims_for_ops()};
    }
    return grads;
  }

 private:
  int64_t Matrices(int batch) const {
    const Shape a = a_.Concrete(batch);
    return Product(a, 0, a.size() - 2);
  }

  const ValueShape a_, b_;
  int m_ = 0, k_ = 0, n_ = 0;
  const T* a_data_ = nullptr;
  const T* b_data_ = nullptr;
  std::vector<T> output_, grad_a_, grad_b_;
};

template <typename T>
absl::StatusOr<std::unique_ptr<NodeImpl<T>>> CreateBatchedMatMul(const NodeContext& ctx) {
  DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {}));
  DPTRAIN_ASSIGN_OR_RETURN(const ValueShape a, ShapeOf(ctx, 0));
  DPTRAIN_ASSIGN_OR_RETURN(const ValueShape b, ShapeOf(ctx, 1));
  const int r = a.rank();
  auto refuse = [&](absl::string_view why) {
    return ctx.Error(
        absl::StrCat("MatMul of ", a.ToString(), " and ", b.ToString(), " unsupported: ", why));
  };
  if (r < 3 || b.rank() != r) return refuse("expected two values of one rank, 3 or more");
  if (a.batch_axis >= r - 2 || b.batch_axis != a.batch_axis || b.batch_outer != a.batch_outer ||
      b.batch_inner != a.batch_inner ||
      !std::equal(a.dims.begin(), a.dims.end() - 2, b.dims.begin())) {
    return refuse("the leading axes (the batch among them) must be the same");
  }
  if (a.dims[r - 1] != b.dims[r - 2]) return refuse("inner dimensions differ");
  ValueShape out = a;
  out.dims[r - 1] = b.dims[r - 1];
  return std::unique_ptr<NodeImpl<T>>(std::make_unique<BatchedMatMulNode<T>>(a, b, out));
}

// ---- A layer applied to each row of the last axis ----

template <typename T>
class RowwiseNode final : public DelegatingNode<T> {
 public:
  RowwiseNode(std::unique_ptr<NodeImpl<T>> inner, ValueShape in)
      : DelegatingNode<T>(std::move(inner)), in_(std::move(in)), out_(in_) {
    out_.dims.back() = this->inner().output_dims().size();
  }
  Dims output_dims() const override { return out_.dims_for_ops(); }
  std::optional<ValueShape> output_shape() const override { return out_; }
  TwinSpec<T> twin() const override {
    TwinSpec<T> t = this->inner().twin();
    t.any_shape = true;
    t.rowwise = &this->inner();
    return t;
  }

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    const TensorRef<T> y =
        this->inner().Forward(ctx, absl::MakeConstSpan(&Rows(x, in_), 1), training);
    return {y.data, x.batch, output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    std::vector<TensorRef<T>> grads =
        this->inner().Backward(ctx, Rows(grad_output, out_), need_input_grad);
    if (need_input_grad[0]) grads[0] = {grads[0].data, grad_output.batch, in_.dims_for_ops()};
    return grads;
  }

 private:
  // `v` (of `shape`) as rows of its last axis, the rows as the batch.
  const TensorRef<T>& Rows(const TensorRef<T>& v, const ValueShape& shape) {
    const int64_t row = shape.dims.back();
    rows_ = {v.data, static_cast<int>(v.size() / row), Dims{static_cast<int>(row), 1, 1}};
    return rows_;
  }

  const ValueShape in_;
  ValueShape out_;
  TensorRef<T> rows_;
};

enum class RowOp { kGemm, kMatMul, kLayerNorm, kSoftmax, kLogSoftmax };

OpFactory BatchFirstVersion(RowOp op) {
  switch (op) {
    case RowOp::kGemm:
    case RowOp::kMatMul:
      return LinearOp();
    case RowOp::kLayerNorm:
      return LayerNormalizationOp();
    case RowOp::kSoftmax:
      return SoftmaxOp();
    case RowOp::kLogSoftmax:
      return LogSoftmaxOp();
  }
  return {};
}

template <typename T, RowOp kOp>
struct Rowwise {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    const OpFactory batch_first = BatchFirstVersion(kOp);
    const NodeInput* x = ctx.input(0);
    if (x == nullptr || !x->shape.has_value()) return Build<T>(batch_first, ctx);
    if (kOp == RowOp::kMatMul && ctx.input(1) != nullptr && ctx.input(1)->is_runtime()) {
      return CreateBatchedMatMul<T>(ctx);
    }
    const ValueShape& s = *x->shape;
    const bool has_axis = kOp != RowOp::kGemm && kOp != RowOp::kMatMul;
    int axis = s.rank() - 1;
    if (has_axis) {
      DPTRAIN_ASSIGN_OR_RETURN(const int64_t attr, IntAttribute(ctx.node, "axis", -1));
      const std::optional<int> a = NormalizeAxis(attr, s.rank());
      if (!a.has_value()) {
        return ctx.Error(absl::StrCat("axis ", attr, " out of range for ", s.ToString()));
      }
      axis = *a;
    }
    const bool rows = axis == s.rank() - 1 && (s.rank() > 2 || !s.IsBatchFirst());
    if (!rows) {
      if (s.IsBatchFirst()) return Build<T>(batch_first, ctx);
      return ctx.Error(absl::StrCat("axis ", axis, " of a value of shape ", s.ToString(),
                                    " unsupported (the last axis only)"));
    }
    if (axis == s.batch_axis) {
      return ctx.Error(absl::StrCat("works along the batch axis of ", s.ToString()));
    }
    // The batch-first op on [rows, D].
    Node node = ctx.node;
    if (has_axis) node.attributes["axis"] = int64_t{1};
    NodeContext rows_ctx{node, ctx.inputs, ctx.seed, ctx.scratch};
    const int64_t d = s.dims.back();
    rows_ctx.inputs[0].dims = Dims{static_cast<int>(d), 1, 1};
    rows_ctx.inputs[0].shape = ValueShape{{1, d}};
    absl::StatusOr<std::unique_ptr<NodeImpl<T>>> inner = Build<T>(batch_first, rows_ctx);
    if (!inner.ok() && s.IsBatchFirst() && (kOp == RowOp::kGemm || kOp == RowOp::kMatMul)) {
      // What a batch-first Linear has always taken: a weight over the whole flattened sample
      // (MatMul of a [N, C, H, W] value by [C * H * W, F]).
      absl::StatusOr<std::unique_ptr<NodeImpl<T>>> flat = Build<T>(batch_first, ctx);
      if (flat.ok()) return flat;
    }
    if (!inner.ok()) return inner.status();
    if ((*inner)->output_dims().h != 1 || (*inner)->output_dims().w != 1) {
      return ctx.Error("a row's output is not a vector");
    }
    return std::unique_ptr<NodeImpl<T>>(std::make_unique<RowwiseNode<T>>(*std::move(inner), s));
  }
};

// ---- Reductions (mean, sum, max, min, L2) over axes other than the batch's ----

enum class Reduction { kMean, kSum, kMax, kMin, kL2 };
static_assert(static_cast<int>(Reduction::kMean) == kReduceMean &&
                  static_cast<int>(Reduction::kSum) == kReduceSum &&
                  static_cast<int>(Reduction::kMax) == kReduceMax &&
                  static_cast<int>(Reduction::kMin) == kReduceMin &&
                  static_cast<int>(Reduction::kL2) == kReduceL2,
              "reduce_elements.h numbers the reductions as Reduction does");

template <typename T>
class ReduceNode final : public AnyShapeNode<T> {
 public:
  // `kept` is the output with the reduced axes kept as size 1 (keepdims=1), whatever the
  // output's own shape; a sum is multiplied by `scale` (1 / count for a mean, 1 for a sum). A
  // max's gradient goes to the first largest element, as torch.max(x, dim) gives it; an L2
  // norm's is x / norm, 0 where the norm is 0 (as PyTorch's norm gives it).
  ReduceNode(Reduction reduction, ValueShape in, ValueShape kept, ValueShape out, T scale)
      : AnyShapeNode<T>(std::move(out)),
        reduction_(reduction),
        in_(std::move(in)),
        kept_(std::move(kept)),
        scale_(scale) {}

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    const int64_t n = int64_t{x.batch} * kept_.per_sample();
    T* y = EnsureSize(output_, n);
    if (reduction_ == Reduction::kMax || reduction_ == Reduction::kMin) {
      int64_t* arg = EnsureSize(argmax_, n);
      std::fill(arg, arg + n, int64_t{-1});
      const bool max = reduction_ == Reduction::kMax;
      ForEachOffset(in_.Concrete(x.batch), KeptStrides(x.batch), [&](int64_t k, int64_t off) {
        // NaN wins, as in PyTorch's max and min.
        const bool better = max ? x.data[k] > y[off] : x.data[k] < y[off];
        if (arg[off] < 0 || better || (std::isnan(x.data[k]) && !std::isnan(y[off]))) {
          y[off] = x.data[k];
          arg[off] = k;
        }
      });
      return {y, x.batch, this->output_dims()};
    }
    std::fill(y, y + n, T(0));
    if (reduction_ == Reduction::kL2) {
      x_ = x.data;
      ForEachOffset(in_.Concrete(x.batch), KeptStrides(x.batch),
                    [&](int64_t k, int64_t off) { y[off] += x.data[k] * x.data[k]; });
      for (int64_t i = 0; i < n; ++i) y[i] = std::sqrt(y[i]);
      return {y, x.batch, this->output_dims()};
    }
    ForEachOffset(in_.Concrete(x.batch), KeptStrides(x.batch),
                  [&](int64_t k, int64_t off) { y[off] += x.data[k]; });
    if (scale_ != T(1)) {
      for (int64_t i = 0; i < n; ++i) y[i] *= scale_;
    }
    return {y, x.batch, this->output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    const int batch = grad_output.batch;
    const int64_t size = int64_t{batch} * in_.per_sample();
    T* dx = EnsureSize(grad_input_, size);
    const T* dy = grad_output.data;
    if (reduction_ == Reduction::kMax || reduction_ == Reduction::kMin) {
      std::fill(dx, dx + size, T(0));
      for (int64_t i = 0; i < grad_output.size(); ++i) dx[argmax_[i]] += dy[i];
      return {TensorRef<T>{dx, batch, in_.dims_for_ops()}};
    }
    if (reduction_ == Reduction::kL2) {
      const T* norm = output_.data();
      ForEachOffset(in_.Concrete(batch), KeptStrides(batch), [&](int64_t k, int64_t off) {
        dx[k] = norm[off] > T(0) ? dy[off] * x_[k] / norm[off] : T(0);
      });
      return {TensorRef<T>{dx, batch, in_.dims_for_ops()}};
    }
    ForEachOffset(in_.Concrete(batch), KeptStrides(batch),
                  [&](int64_t k, int64_t off) { dx[k] = dy[off] * scale_; });
    return {TensorRef<T>{dx, batch, in_.dims_for_ops()}};
  }

  TwinSpec<T> twin() const override {
    TwinSpec<T> t = AnyShapeNode<T>::twin();
    t.reduction = static_cast<int>(reduction_);
    t.reduce_scale = static_cast<double>(scale_);
    return t;
  }

  bool ReducedIndices(int batch, std::vector<int64_t>& out_of) const override {
    out_of.resize(int64_t{batch} * in_.per_sample());
    ForEachOffset(in_.Concrete(batch), KeptStrides(batch),
                  [&](int64_t k, int64_t off) { out_of[k] = off; });
    return true;
  }

 private:
  // The output's strides along each input axis; 0 along the reduced ones.
  Shape KeptStrides(int batch) const {
    Shape strides = Strides(kept_.Concrete(batch));
    for (int a = 0; a < in_.rank(); ++a) {
      if (kept_.dims[a] == 1 && in_.dims[a] != 1) strides[a] = 0;
    }
    return strides;
  }

  const Reduction reduction_;
  const ValueShape in_, kept_;
  const T scale_;
  std::vector<T> output_, grad_input_;
  std::vector<int64_t> argmax_;  // A max's or min's: per output element, the element taken.
  const T* x_ = nullptr;         // An L2 norm's input, valid until Backward returns (node.h).
};

// ReduceMean, ReduceSum, ReduceMax, ReduceMin or ReduceL2; the axes from the attribute or
// (opset 13 on) input 1.
template <Reduction kReduction>
struct AnyShapeReduce {
  template <typename T>
  struct Op {
    static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
      DPTRAIN_RETURN_IF_ERROR(
          CheckKnownAttributes(ctx.node, {"axes", "keepdims", "noop_with_empty_axes"}));
      DPTRAIN_ASSIGN_OR_RETURN(const ValueShape in, ShapeOf(ctx, 0));
      DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> axes,
                               ctx.IntsInputOrAttribute(1, "axes", true, {}));
      DPTRAIN_ASSIGN_OR_RETURN(const int64_t keepdims, IntAttribute(ctx.node, "keepdims", 1));
      DPTRAIN_ASSIGN_OR_RETURN(const int64_t noop,
                               IntAttribute(ctx.node, "noop_with_empty_axes", 0));
      if (noop != 0) return ctx.Error("noop_with_empty_axes unsupported");
      constexpr bool kMean = kReduction == Reduction::kMean;
      if (kMean && in.IsBatchFirst() && ctx.node.attributes.count("axes") > 0) {
        // The pooling and channel-mean nodes of layer_ops.h (CUDA twins), given the axes they
        // mean: H and W of [N, C, H, W], or the channels kept.
        std::vector<int64_t> normal;
        for (int64_t a : axes) {
          const std::optional<int> n = NormalizeAxis(a, in.rank());
          normal.push_back(n.has_value() ? *n : -1);
        }
        std::sort(normal.begin(), normal.end());
        if ((in.rank() == 4 && normal == std::vector<int64_t>{2, 3}) ||
            (normal == std::vector<int64_t>{1} && keepdims == 1)) {
          Node node = ctx.node;
          node.attributes["axes"] = normal;
          return Build<T>(ReduceMeanOp(), NodeContext{node, ctx.inputs, ctx.seed, ctx.scratch});
        }
      }
      if (axes.empty()) {
        return ctx.Error(absl::StrCat("a ",
                                      kMean                           ? "mean"
                                      : kReduction == Reduction::kSum ? "sum"
                                      : kReduction == Reduction::kMax ? "max"
                                      : kReduction == Reduction::kMin ? "min"
                                                                      : "norm",
                                      " over every axis (the batch's too) unsupported"));
      }
      ValueShape kept = in;
      int64_t count = 1;
      for (int64_t a : axes) {
        const std::optional<int> axis = NormalizeAxis(a, in.rank());
        if (!axis.has_value() || *axis == in.batch_axis || kept.dims[*axis] == 0) {
          return ctx.Error(absl::StrCat("axes ", ShapeText(axes), " of ", in.ToString(),
                                        " unsupported (each once, not the batch's)"));
        }
        count *= in.dims[*axis];
        kept.dims[*axis] = 0;  // Marked; set to 1 below.
      }
      ValueShape out = kept;
      out.dims.clear();
      for (int a = 0; a < in.rank(); ++a) {
        if (kept.dims[a] == 0) {
          kept.dims[a] = 1;
          if (!keepdims) continue;
        }
        if (a == in.batch_axis) out.batch_axis = out.rank();
        out.dims.push_back(kept.dims[a]);
      }
      const T scale = kMean ? T(1) / static_cast<T>(count) : T(1);
      return std::unique_ptr<NodeImpl<T>>(
          std::make_unique<ReduceNode<T>>(kReduction, in, std::move(kept), std::move(out), scale));
    }
  };
};

// ---- Add, Sub, Mul, Div with NumPy broadcasting ----

static_assert(static_cast<int>(BinaryOp::kAdd) == kBinaryAdd &&
                  static_cast<int>(BinaryOp::kSub) == kBinarySub &&
                  static_cast<int>(BinaryOp::kMul) == kBinaryMul &&
                  static_cast<int>(BinaryOp::kDiv) == kBinaryDiv &&
                  static_cast<int>(BinaryOp::kMax) == kBinaryMax &&
                  static_cast<int>(BinaryOp::kMin) == kBinaryMin,
              "binary_elements.h numbers the ops as BinaryOp does");

template <typename T>
class BroadcastBinaryNode final : public OperandNode<T> {
 public:
  // `full` is the computed value's position among the runtime inputs; the operand is the other
  // computed value (same shape) when `operand` is empty, else the tensor. `swapped`: the full
  // value is the right operand.
  BroadcastBinaryNode(BinaryOp op, ValueShape shape, bool swapped,
                      std::optional<Operand<T>> operand,
                      std::optional<ValueShape> other_shape = std::nullopt)
      : OperandNode<T>(shape, std::move(operand)),
        op_(op),
        swapped_(swapped),
        other_shape_(std::move(other_shape)) {}

  TwinSpec<T> twin() const override {
    TwinSpec<T> t = OperandNode<T>::twin();
    t.binary = op_;
    t.swapped = swapped_;
    return t;
  }

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const int batch = inputs[this->has_operand() || !swapped_ ? 0 : 1].batch;  // The full value's.
    if (this->has_operand()) {
      x_ = inputs[0].data;
      other_ = this->operand().data();
    } else {
      x_ = inputs[swapped_ ? 1 : 0].data;
      other_ = inputs[swapped_ ? 0 : 1].data;
    }
    const Shape out_shape = this->out_.Concrete(batch);
    T* y = EnsureSize(output_, Product(out_shape));
    const int op = static_cast<int>(op_);
    Visit(batch, out_shape,
          [&](int64_t k, int64_t o) { y[k] = BinaryValue(op, swapped_, x_[k], other_[o]); });
    return {y, batch, this->output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    const int batch = grad_output.batch;
    const Shape out_shape = this->out_.Concrete(batch);
    const int64_t n = Product(out_shape);
    const T* dy = grad_output.data;
    // d(out)/d(x) and d(out)/d(other) at each element, x being the full (computed) value.
    const bool need_x =
        this->has_operand() ? need_input_grad[0] : need_input_grad[swapped_ ? 1 : 0];
    const bool need_other_value = !this->has_operand() && need_input_grad[swapped_ ? 0 : 1];
    T* other_grad = nullptr;
    if (this->has_operand() && this->operand().grad() != nullptr) {
      other_grad = this->operand().grad();
      std::fill(other_grad, other_grad + this->operand().size(), T(0));
    } else if (need_other_value) {
      const int64_t m = other_shape_ ? Product(other_shape_->Concrete(batch)) : n;
      other_grad = EnsureSize(grad_other_, m);
      std::fill(other_grad, other_grad + m, T(0));
    }
    T* dx = need_x ? EnsureSize(grad_x_, n) : nullptr;
    const int op = static_cast<int>(op_);
    Visit(batch, out_shape, [&](int64_t k, int64_t o) {
      T gx, gc;  // d/dx, d/dc of the output times dy.
      BinaryGrads(op, swapped_, x_[k], other_[o], dy[k], gx, gc);
      if (dx != nullptr) dx[k] = gx;
      if (other_grad != nullptr) other_grad[o] += gc;
    });
    std::vector<TensorRef<T>> grads(need_input_grad.size());
    const Dims dims = this->output_dims();
    if (this->has_operand()) {
      if (dx != nullptr) grads[0] = {dx, batch, dims};
    } else {
      if (dx != nullptr) grads[swapped_ ? 1 : 0] = {dx, batch, dims};
      if (need_other_value) {
        const bool batchless = other_shape_ && other_shape_->batch_axis < 0;
        grads[swapped_ ? 0 : 1] = {other_grad, batchless ? 1 : batch,
                                   other_shape_ ? other_shape_->dims_for_ops() : dims};
      }
    }
    return grads;
  }

  bool OperandIndices(int batch, std::vector<int64_t>& indices) const override {
    const Shape out_shape = this->out_.Concrete(batch);
    indices.resize(Product(out_shape));
    Visit(batch, out_shape, [&](int64_t k, int64_t o) { indices[k] = o; });
    return true;
  }

 private:
  // f(k, o): element k of the output and the other operand's element o, for `batch` samples.
  template <typename F>
  void Visit(int batch, const Shape& out_shape, F f) const {
    if (!this->has_operand() && other_shape_) {
      // A computed value broadcast along its size-1 axes (right-aligned: one without a batch
      // may have fewer).
      const Shape own = Strides(other_shape_->Concrete(batch));
      const size_t lead = out_shape.size() - own.size();
      Shape strides(out_shape.size(), 0);
      for (size_t a = 0; a < own.size(); ++a) {
        // A value without a batch repeats along the batch axis too; a batched one does not
        // (its batch axis holds the same outer * inner as the output's: into() checked).
        const bool batch_axis = static_cast<int>(lead + a) == this->out_.batch_axis;
        const bool broadcast =
            other_shape_->dims[a] == 1 &&
            (batch_axis ? other_shape_->batch_axis < 0 : this->out_.dims[lead + a] != 1);
        if (!broadcast) strides[lead + a] = own[a];
      }
      ForEachOffset(out_shape, strides, f);
      return;
    }
    if (!this->has_operand()) {
      const int64_t n = Product(out_shape);
      for (int64_t k = 0; k < n; ++k) f(k, k);
      return;
    }
    if (this->operand().size() == 1) {
      const int64_t n = Product(out_shape);
      for (int64_t k = 0; k < n; ++k) f(k, 0);
      return;
    }
    ForEachOffset(out_shape, this->operand().StridesAgainst(out_shape), f);
  }

  const BinaryOp op_;
  const bool swapped_;
  const std::optional<ValueShape> other_shape_;  // A computed operand that broadcasts.
  const T* x_ = nullptr;
  const T* other_ = nullptr;
  std::vector<T> output_, grad_x_, grad_other_;
};

OpFactory BatchFirstBinary(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd:
      return AddOp();
    case BinaryOp::kSub:
      return SubOp();
    case BinaryOp::kMul:
      return MulOp();
    default:
      return DivOp();
  }
}

template <typename T>
absl::StatusOr<std::unique_ptr<NodeImpl<T>>> CreateBroadcastBinary(const NodeContext& ctx,
                                                                   BinaryOp op) {
  DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"operand_shape"}));
  if (ctx.inputs.size() != 2 || ctx.input(0) == nullptr || ctx.input(1) == nullptr) {
    return ctx.Error("takes two inputs");
  }
  const NodeInput& a = ctx.inputs[0];
  const NodeInput& b = ctx.inputs[1];
  if (a.is_runtime() && b.is_runtime()) {
    // One may broadcast into the other along its size-1 axes (x - x.mean(-1, keepdim=True)).
    // Or be a value without a batch (a relative-position bias) that broadcasts into it, as a
    // tensor of the model would.
    auto into = [](const ValueShape& small, const ValueShape& full) {
      if (full.batch_axis < 0) return false;
      if (small.batch_axis < 0) return BroadcastsTo(small.dims, full);
      if (small.rank() != full.rank() || small.batch_axis != full.batch_axis ||
          small.batch_outer != full.batch_outer || small.batch_inner != full.batch_inner) {
        return false;
      }
      for (int i = 0; i < full.rank(); ++i) {
        if (small.dims[i] != full.dims[i] && small.dims[i] != 1) return false;
      }
      return true;
    };
    if (*a.shape != *b.shape && (into(*b.shape, *a.shape) || into(*a.shape, *b.shape))) {
      const bool swapped = !into(*b.shape, *a.shape);
      return std::unique_ptr<NodeImpl<T>>(std::make_unique<BroadcastBinaryNode<T>>(
          op, swapped ? *b.shape : *a.shape, swapped, std::nullopt, swapped ? *a.shape : *b.shape));
    }
    if (*a.shape != *b.shape) {
      return ctx.Error(absl::StrCat("operands of shapes ", a.shape->ToString(), " and ",
                                    b.shape->ToString(),
                                    " unsupported: two computed values of one shape, or one "
                                    "of size 1 along the other's axes it does not match"));
    }
    return std::unique_ptr<NodeImpl<T>>(
        std::make_unique<BroadcastBinaryNode<T>>(op, *a.shape, false, std::nullopt));
  }
  const bool swapped = !a.is_runtime();
  const NodeInput& full = swapped ? b : a;
  const NodeInput& other = swapped ? a : b;
  if (!full.is_runtime()) return ctx.Error("needs a computed operand");
  if (other.constant == nullptr || other.constant->type != Tensor::Type::kFloat) {
    return ctx.Error(absl::StrCat("operand '", other.name, "' must be a float tensor"));
  }
  DPTRAIN_ASSIGN_OR_RETURN(const Shape shape,
                           IntsAttribute(ctx.node, "operand_shape", other.constant->shape));
  if (Product(shape) != other.constant->num_elements()) {
    return ctx.Error(absl::StrCat("operand_shape ", ShapeText(shape), " does not fit ",
                                  other.constant->ToString()));
  }
  if (!BroadcastsTo(shape, *full.shape)) {
    return ctx.Error(absl::StrCat("operand '", other.name, "' of shape ", ShapeText(shape),
                                  " does not broadcast to ", full.shape->ToString(),
                                  " (without the batch)"));
  }
  return std::unique_ptr<NodeImpl<T>>(
      std::make_unique<BroadcastBinaryNode<T>>(op, *full.shape, swapped, Operand<T>(other, shape)));
}

template <typename T, BinaryOp kOp>
struct AnyShapeBinary {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    constexpr bool kMaxMin = kOp == BinaryOp::kMax || kOp == BinaryOp::kMin;
    if (!kMaxMin && AllBatchFirst(ctx)) {
      absl::StatusOr<std::unique_ptr<NodeImpl<T>>> made = Build<T>(BatchFirstBinary(kOp), ctx);
      if (made.ok()) return made;
    }
    // Where both refuse, the error that knows the rank.
    return CreateBroadcastBinary<T>(ctx, kOp);
  }
};

template <RowOp kOp>
struct RowwiseOf {
  template <typename T>
  using Impl = Rowwise<T, kOp>;
};
template <BinaryOp kOp>
struct BinaryOf {
  template <typename T>
  using Impl = AnyShapeBinary<T, kOp>;
};

}  // namespace
}  // namespace any_shape_internal

OpFactory AnyShapeMatMulOp() {
  return MakeOpFactory<any_shape_internal::RowwiseOf<any_shape_internal::RowOp::kMatMul>::Impl>(
      true);
}
OpFactory AnyShapeGemmOp() {
  return MakeOpFactory<any_shape_internal::RowwiseOf<any_shape_internal::RowOp::kGemm>::Impl>(true);
}
OpFactory AnyShapeLayerNormalizationOp() {
  return MakeOpFactory<any_shape_internal::RowwiseOf<any_shape_internal::RowOp::kLayerNorm>::Impl>(
      true);
}
OpFactory AnyShapeSoftmaxOp() {
  return MakeOpFactory<any_shape_internal::RowwiseOf<any_shape_internal::RowOp::kSoftmax>::Impl>(
      true);
}
OpFactory AnyShapeLogSoftmaxOp() {
  return MakeOpFactory<any_shape_internal::RowwiseOf<any_shape_internal::RowOp::kLogSoftmax>::Impl>(
      true);
}
OpFactory AnyShapeReduceMeanOp() {
  return MakeOpFactory<
      any_shape_internal::AnyShapeReduce<any_shape_internal::Reduction::kMean>::Op>(true);
}

OpFactory AnyShapeReduceSumOp() {
  return MakeOpFactory<any_shape_internal::AnyShapeReduce<any_shape_internal::Reduction::kSum>::Op>(
      true);
}

OpFactory AnyShapeReduceMinOp() {
  return MakeOpFactory<any_shape_internal::AnyShapeReduce<any_shape_internal::Reduction::kMin>::Op>(
      true);
}
OpFactory AnyShapeReduceL2Op() {
  return MakeOpFactory<any_shape_internal::AnyShapeReduce<any_shape_internal::Reduction::kL2>::Op>(
      true);
}
OpFactory AnyShapeMaxOp() {
  return MakeOpFactory<any_shape_internal::BinaryOf<BinaryOp::kMax>::Impl>(true);
}
OpFactory AnyShapeMinOp() {
  return MakeOpFactory<any_shape_internal::BinaryOf<BinaryOp::kMin>::Impl>(true);
}

OpFactory AnyShapeReduceMaxOp() {
  return MakeOpFactory<any_shape_internal::AnyShapeReduce<any_shape_internal::Reduction::kMax>::Op>(
      true);
}
OpFactory AnyShapeAddOp() {
  return MakeOpFactory<any_shape_internal::BinaryOf<BinaryOp::kAdd>::Impl>(true);
}
OpFactory AnyShapeSubOp() {
  return MakeOpFactory<any_shape_internal::BinaryOf<BinaryOp::kSub>::Impl>(true);
}
OpFactory AnyShapeMulOp() {
  return MakeOpFactory<any_shape_internal::BinaryOf<BinaryOp::kMul>::Impl>(true);
}
OpFactory AnyShapeDivOp() {
  return MakeOpFactory<any_shape_internal::BinaryOf<BinaryOp::kDiv>::Impl>(true);
}

}  // namespace graph
}  // namespace dptrain
