#include "worker/graph/any_shape_ops.h"

#include <algorithm>
#include <memory>
#include <numeric>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/graph/layer_ops.h"
#include "worker/graph/multi_input_ops.h"
#include "worker/graph/norm_ops.h"
#include "worker/graph/shape_ops.h"
#include "worker/graph/slice_ops.h"
#include "worker/nn/gemm.h"

namespace dptrain {
namespace graph {
namespace {

using nn::EnsureSize;
using Shape = std::vector<int64_t>;

int64_t Product(const Shape& s, size_t begin = 0, size_t end = SIZE_MAX) {
  int64_t p = 1;
  for (size_t i = begin; i < end && i < s.size(); ++i) p *= s[i];
  return p;
}

Shape Strides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * shape[i + 1];
  }
  return strides;
}

// Calls f(k, offset) for every element k of `shape` in row-major order, with
// offset = sum over axes of coordinate * strides[axis] (0-stride axes: a broadcast).
template <typename F>
void ForEachOffset(const Shape& shape, const Shape& strides, F f) {
  const int rank = static_cast<int>(shape.size());
  if (rank == 0) {
    f(int64_t{0}, int64_t{0});
    return;
  }
  for (int64_t d : shape) {
    if (d == 0) return;
  }
  Shape coord(rank, 0);
  const int64_t last = shape[rank - 1], last_stride = strides[rank - 1];
  int64_t offset = 0, k = 0;
  while (true) {
    for (int64_t j = 0; j < last; ++j) f(k++, offset + j * last_stride);
    int a = rank - 2;
    for (; a >= 0; --a) {
      offset += strides[a];
      if (++coord[a] < shape[a]) break;
      offset -= strides[a] * shape[a];
      coord[a] = 0;
    }
    if (a < 0) return;
  }
}

template <typename T>
absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Build(const OpFactory& f, const NodeContext& ctx) {
  if constexpr (std::is_same_v<T, float>) {
    return f.make_float(ctx);
  } else {
    return f.make_double(ctx);
  }
}

// The runtime input at `index` with its whole shape, or an error.
absl::StatusOr<ValueShape> ShapeOf(const NodeContext& ctx, size_t index) {
  const NodeInput* in = ctx.input(index);
  if (in == nullptr || !in->shape.has_value()) {
    return ctx.Error(absl::StrCat("input ", index, " must be a computed value"));
  }
  return *in->shape;
}

bool AllBatchFirst(const NodeContext& ctx) {
  for (const NodeInput& in : ctx.inputs) {
    if (in.shape.has_value() && !in.shape->IsBatchFirst()) return false;
  }
  return true;
}

// Every node of this file: its output shape, and no CUDA twin (TwinSpec::any_shape).
template <typename T>
class AnyShapeNode : public NodeImpl<T> {
 public:
  explicit AnyShapeNode(ValueShape out) : out_(std::move(out)) {}
  Dims output_dims() const override { return out_.dims_for_ops(); }
  std::optional<ValueShape> output_shape() const override { return out_; }
  TwinSpec<T> twin() const override {
    TwinSpec<T> t;
    t.any_shape = true;
    return t;
  }

 protected:
  const ValueShape out_;
};

// ---- Transpose ----

template <typename T>
class TransposeNode final : public AnyShapeNode<T> {
 public:
  TransposeNode(ValueShape in, std::vector<int> perm, ValueShape out)
      : AnyShapeNode<T>(std::move(out)), in_(std::move(in)), perm_(std::move(perm)) {}

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    Shape out_shape, strides;
    Plan(x.batch, out_shape, strides);
    T* y = EnsureSize(output_, x.size());
    ForEachOffset(out_shape, strides, [&](int64_t k, int64_t off) { y[k] = x.data[off]; });
    return {y, x.batch, this->output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    Shape out_shape, strides;
    Plan(grad_output.batch, out_shape, strides);
    T* dx = EnsureSize(grad_input_, grad_output.size());
    const T* dy = grad_output.data;
    ForEachOffset(out_shape, strides, [&](int64_t k, int64_t off) { dx[off] = dy[k]; });
    return {TensorRef<T>{dx, grad_output.batch, in_.dims_for_ops()}};
  }

 private:
  // The output's sizes and, per output axis, the input's stride along it.
  void Plan(int batch, Shape& out_shape, Shape& strides) const {
    const Shape in_strides = Strides(in_.Concrete(batch));
    out_shape = this->out_.Concrete(batch);
    strides.resize(perm_.size());
    for (size_t p = 0; p < perm_.size(); ++p) strides[p] = in_strides[perm_[p]];
  }

  const ValueShape in_;
  const std::vector<int> perm_;
  std::vector<T> output_, grad_input_;
};

template <typename T>
struct Transpose {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"perm"}));
    DPTRAIN_ASSIGN_OR_RETURN(const ValueShape in, ShapeOf(ctx, 0));
    if (ctx.inputs.size() != 1) return ctx.Error("Transpose takes one input");
    std::vector<int64_t> reversed(in.rank());
    for (int i = 0; i < in.rank(); ++i) reversed[i] = in.rank() - 1 - i;
    DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> perm,
                             IntsAttribute(ctx.node, "perm", reversed));
    std::vector<int> p;
    std::vector<bool> seen(in.rank(), false);
    if (perm.size() != static_cast<size_t>(in.rank())) {
      return ctx.Error(absl::StrCat("perm ", ShapeText(perm), " is not a permutation of the ",
                                    in.rank(), " axes of ", in.ToString()));
    }
    for (int64_t a : perm) {
      if (a < 0 || a >= in.rank() || seen[a]) {
        return ctx.Error(absl::StrCat("perm ", ShapeText(perm), " is not a permutation of the ",
                                      in.rank(), " axes of ", in.ToString()));
      }
      seen[a] = true;
      p.push_back(static_cast<int>(a));
    }
    ValueShape out = in;
    for (int i = 0; i < in.rank(); ++i) {
      out.dims[i] = in.dims[p[i]];
      if (p[i] == in.batch_axis) out.batch_axis = i;
    }
    return std::unique_ptr<NodeImpl<T>>(
        std::make_unique<TransposeNode<T>>(in, std::move(p), std::move(out)));
  }
};

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
class RowwiseNode final : public NodeImpl<T> {
 public:
  RowwiseNode(std::unique_ptr<NodeImpl<T>> inner, ValueShape in)
      : inner_(std::move(inner)), in_(std::move(in)), out_(in_) {
    out_.dims.back() = inner_->output_dims().size();
  }
  Dims output_dims() const override { return out_.dims_for_ops(); }
  std::optional<ValueShape> output_shape() const override { return out_; }
  TwinSpec<T> twin() const override {
    TwinSpec<T> t = inner_->twin();
    t.any_shape = true;
    return t;
  }
  std::vector<NodeTensorSpec> Params() const override { return inner_->Params(); }
  std::vector<NodeTensorSpec> Buffers() const override { return inner_->Buffers(); }
  void BindParams(absl::Span<const T* const> params, absl::Span<T* const> grads) override {
    inner_->BindParams(params, grads);
  }
  void BindBuffers(absl::Span<T* const> buffers) override { inner_->BindBuffers(buffers); }

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    const int64_t row = in_.dims.back();
    const TensorRef<T> rows = {x.data, static_cast<int>(x.size() / row),
                               Dims{static_cast<int>(row), 1, 1}};
    const TensorRef<T> y = inner_->Forward(ctx, absl::MakeConstSpan(&rows, 1), training);
    return {y.data, x.batch, output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    const int64_t row = out_.dims.back();
    const TensorRef<T> rows = {grad_output.data, static_cast<int>(grad_output.size() / row),
                               Dims{static_cast<int>(row), 1, 1}};
    std::vector<TensorRef<T>> grads = inner_->Backward(ctx, rows, need_input_grad);
    if (need_input_grad[0]) grads[0] = {grads[0].data, grad_output.batch, in_.dims_for_ops()};
    return grads;
  }

 private:
  std::unique_ptr<NodeImpl<T>> inner_;
  const ValueShape in_;
  ValueShape out_;
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

// ---- Gather of a computed value ----

template <typename T>
class GatherNode final : public AnyShapeNode<T> {
 public:
  GatherNode(ValueShape in, int axis, std::vector<int64_t> indices, ValueShape out)
      : AnyShapeNode<T>(std::move(out)),
        in_(std::move(in)),
        axis_(axis),
        indices_(std::move(indices)) {}

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    int64_t outer, size, inner;
    Plan(x.batch, outer, size, inner);
    const int64_t picked = static_cast<int64_t>(indices_.size());
    T* y = EnsureSize(output_, outer * picked * inner);
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t j = 0; j < picked; ++j) {
        const T* src = x.data + (o * size + indices_[j]) * inner;
        std::copy(src, src + inner, y + (o * picked + j) * inner);
      }
    }
    return {y, x.batch, this->output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    int64_t outer, size, inner;
    Plan(grad_output.batch, outer, size, inner);
    const int64_t picked = static_cast<int64_t>(indices_.size());
    T* dx = EnsureSize(grad_input_, outer * size * inner);
    std::fill(dx, dx + outer * size * inner, T(0));
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t j = 0; j < picked; ++j) {
        T* dst = dx + (o * size + indices_[j]) * inner;
        const T* src = grad_output.data + (o * picked + j) * inner;
        for (int64_t i = 0; i < inner; ++i) dst[i] += src[i];
      }
    }
    return {TensorRef<T>{dx, grad_output.batch, in_.dims_for_ops()}};
  }

 private:
  void Plan(int batch, int64_t& outer, int64_t& size, int64_t& inner) const {
    const Shape s = in_.Concrete(batch);
    outer = Product(s, 0, axis_);
    size = s[axis_];
    inner = Product(s, axis_ + 1);
  }

  const ValueShape in_;
  const int axis_;
  const std::vector<int64_t> indices_;
  std::vector<T> output_, grad_input_;
};

template <typename T>
struct Gather {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"axis"}));
    DPTRAIN_ASSIGN_OR_RETURN(const ValueShape in, ShapeOf(ctx, 0));
    DPTRAIN_ASSIGN_OR_RETURN(const Tensor* indices,
                             ctx.ConstantInput(1, Tensor::Type::kInt64, false));
    if (ctx.inputs.size() != 2) return ctx.Error("Gather takes two inputs");
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t attr, IntAttribute(ctx.node, "axis", 0));
    const std::optional<int> axis = NormalizeAxis(attr, in.rank());
    if (!axis.has_value() || *axis == in.batch_axis) {
      return ctx.Error(absl::StrCat("axis ", attr, " of ", in.ToString(),
                                    " unsupported (an axis other than the batch's)"));
    }
    if (indices->shape.size() > 1) return ctx.Error("indices of rank > 1 unsupported");
    std::vector<int64_t> picked;
    const int64_t size = in.dims[*axis];
    for (int64_t i : indices->ints) {
      if (i < -size || i >= size) {
        return ctx.Error(
            absl::StrCat("index ", i, " out of range for axis ", *axis, " of ", in.ToString()));
      }
      picked.push_back(i < 0 ? i + size : i);
    }
    ValueShape out = in;
    out.dims.erase(out.dims.begin() + *axis);
    out.dims.insert(out.dims.begin() + *axis, indices->shape.begin(), indices->shape.end());
    if (in.batch_axis > *axis) {
      out.batch_axis += static_cast<int>(indices->shape.size()) - 1;
    }
    if (out.rank() < 1) return ctx.Error("the result would have no axis");
    return std::unique_ptr<NodeImpl<T>>(
        std::make_unique<GatherNode<T>>(in, *axis, std::move(picked), std::move(out)));
  }
};

// ---- Slice ----

template <typename T>
class SliceNode final : public AnyShapeNode<T> {
 public:
  SliceNode(ValueShape in, Shape starts, Shape steps, ValueShape out)
      : AnyShapeNode<T>(std::move(out)),
        in_(std::move(in)),
        starts_(std::move(starts)),
        steps_(std::move(steps)) {}

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    Shape out_shape, strides;
    const int64_t base = Plan(x.batch, out_shape, strides);
    T* y = EnsureSize(output_, Product(out_shape));
    ForEachOffset(out_shape, strides, [&](int64_t k, int64_t off) { y[k] = x.data[base + off]; });
    return {y, x.batch, this->output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    Shape out_shape, strides;
    const int64_t base = Plan(grad_output.batch, out_shape, strides);
    const int64_t n = int64_t{grad_output.batch} * in_.per_sample();
    T* dx = EnsureSize(grad_input_, n);
    std::fill(dx, dx + n, T(0));
    const T* dy = grad_output.data;
    ForEachOffset(out_shape, strides, [&](int64_t k, int64_t off) { dx[base + off] = dy[k]; });
    return {TensorRef<T>{dx, grad_output.batch, in_.dims_for_ops()}};
  }

 private:
  // The output's sizes, the input's stride along each output axis, and the first element.
  int64_t Plan(int batch, Shape& out_shape, Shape& strides) const {
    const Shape in_strides = Strides(in_.Concrete(batch));
    out_shape = this->out_.Concrete(batch);
    strides.resize(in_strides.size());
    int64_t base = 0;
    for (size_t a = 0; a < in_strides.size(); ++a) {
      strides[a] = in_strides[a] * steps_[a];
      base += starts_[a] * in_strides[a];
    }
    return base;
  }

  const ValueShape in_;
  const Shape starts_, steps_;  // Per axis (0 and 1 where not sliced).
  std::vector<T> output_, grad_input_;
};

absl::StatusOr<std::vector<int64_t>> IntsInput(const NodeContext& ctx, size_t index,
                                               absl::string_view name,
                                               std::vector<int64_t> fallback) {
  if (ctx.input(index) != nullptr) {
    DPTRAIN_ASSIGN_OR_RETURN(const Tensor* t,
                             ctx.ConstantInput(index, Tensor::Type::kInt64, false));
    if (t->shape.size() != 1) return ctx.Error(absl::StrCat(name, " must be 1-D"));
    return t->ints;
  }
  if (ctx.node.attributes.count(std::string(name)) > 0) {
    return IntsAttribute(ctx.node, name, {});
  }
  return fallback;
}

template <typename T>
absl::StatusOr<std::unique_ptr<NodeImpl<T>>> CreateSlice(const NodeContext& ctx) {
  DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"starts", "ends", "axes"}));
  DPTRAIN_ASSIGN_OR_RETURN(const ValueShape in, ShapeOf(ctx, 0));
  DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> starts, IntsInput(ctx, 1, "starts", {}));
  DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> ends, IntsInput(ctx, 2, "ends", {}));
  std::vector<int64_t> all_axes(starts.size());
  std::iota(all_axes.begin(), all_axes.end(), 0);
  DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> axes, IntsInput(ctx, 3, "axes", all_axes));
  DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> steps,
                           IntsInput(ctx, 4, "steps", std::vector<int64_t>(starts.size(), 1)));
  if (starts.empty() || ends.size() != starts.size() || axes.size() != starts.size() ||
      steps.size() != starts.size()) {
    return ctx.Error(absl::StrCat("starts ", ShapeText(starts), ", ends ", ShapeText(ends),
                                  ", axes ", ShapeText(axes), " and steps ", ShapeText(steps),
                                  " differ in length"));
  }
  Shape first(in.rank(), 0), step(in.rank(), 1);
  ValueShape out = in;
  std::vector<bool> seen(in.rank(), false);
  for (size_t i = 0; i < axes.size(); ++i) {
    const std::optional<int> a = NormalizeAxis(axes[i], in.rank());
    if (a.has_value() && seen[*a]) return ctx.Error(absl::StrCat("axis ", axes[i], " given twice"));
    if (!a.has_value() || *a == in.batch_axis) {
      return ctx.Error(absl::StrCat("axis ", axes[i], " of ", in.ToString(),
                                    " unsupported (an axis other than the batch's)"));
    }
    seen[*a] = true;
    if (steps[i] < 1) return ctx.Error(absl::StrCat("step ", steps[i], " unsupported (> 0)"));
    const int64_t size = in.dims[*a];
    auto clamp = [size](int64_t v) { return std::clamp(v < 0 ? v + size : v, int64_t{0}, size); };
    const int64_t b = clamp(starts[i]), e = clamp(ends[i]);
    if (e <= b) {
      return ctx.Error(absl::StrCat("the slice [", starts[i], ", ", ends[i], ") of axis ", axes[i],
                                    " (size ", size, ") is empty"));
    }
    first[*a] = b;
    step[*a] = steps[i];
    out.dims[*a] = (e - b - 1) / steps[i] + 1;
  }
  return std::unique_ptr<NodeImpl<T>>(
      std::make_unique<SliceNode<T>>(in, std::move(first), std::move(step), std::move(out)));
}

template <typename T>
struct AnyShapeSlice {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    if (AllBatchFirst(ctx)) {
      absl::StatusOr<std::unique_ptr<NodeImpl<T>>> made = Build<T>(SliceOp(), ctx);
      if (made.ok()) return made;
    }
    // Where both refuse, the error that knows the rank.
    return CreateSlice<T>(ctx);
  }
};

// ---- Concat ----

template <typename T>
class ConcatNode final : public AnyShapeNode<T> {
 public:
  ConcatNode(std::vector<ValueShape> in, int axis, ValueShape out)
      : AnyShapeNode<T>(std::move(out)), in_(std::move(in)), axis_(axis) {}

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const int batch = inputs[0].batch;
    const Shape out_shape = this->out_.Concrete(batch);
    const int64_t outer = Product(out_shape, 0, axis_), inner = Product(out_shape, axis_ + 1);
    T* y = EnsureSize(output_, Product(out_shape));
    T* dst = y;
    for (int64_t o = 0; o < outer; ++o) {
      for (size_t i = 0; i < inputs.size(); ++i) {
        const int64_t block = in_[i].dims[axis_] * inner;
        const T* src = inputs[i].data + o * block;
        dst = std::copy(src, src + block, dst);
      }
    }
    return {y, batch, this->output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    const int batch = grad_output.batch;
    const Shape out_shape = this->out_.Concrete(batch);
    const int64_t outer = Product(out_shape, 0, axis_), inner = Product(out_shape, axis_ + 1);
    grads_.resize(in_.size());
    std::vector<TensorRef<T>> result(in_.size());
    for (size_t i = 0; i < in_.size(); ++i) {
      if (!need_input_grad[i]) continue;
      EnsureSize(grads_[i], outer * in_[i].dims[axis_] * inner);
      result[i] = {grads_[i].data(), batch, in_[i].dims_for_ops()};
    }
    const T* src = grad_output.data;
    for (int64_t o = 0; o < outer; ++o) {
      for (size_t i = 0; i < in_.size(); ++i) {
        const int64_t block = in_[i].dims[axis_] * inner;
        if (need_input_grad[i]) std::copy(src, src + block, grads_[i].data() + o * block);
        src += block;
      }
    }
    return result;
  }

 private:
  const std::vector<ValueShape> in_;
  const int axis_;
  std::vector<T> output_;
  std::vector<std::vector<T>> grads_;
};

template <typename T>
absl::StatusOr<std::unique_ptr<NodeImpl<T>>> CreateConcat(const NodeContext& ctx, int axis) {
  std::vector<ValueShape> in;
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    DPTRAIN_ASSIGN_OR_RETURN(ValueShape s, ShapeOf(ctx, i));
    in.push_back(std::move(s));
  }
  ValueShape out = in[0];
  out.dims[axis] = 0;
  for (const ValueShape& s : in) {
    ValueShape a = s, b = in[0];
    a.dims[axis] = b.dims[axis] = 0;
    if (a != b) {
      return ctx.Error(absl::StrCat("inputs of shapes ", in[0].ToString(), " and ", s.ToString(),
                                    " differ other than along axis ", axis));
    }
    out.dims[axis] += s.dims[axis];
  }
  return std::unique_ptr<NodeImpl<T>>(
      std::make_unique<ConcatNode<T>>(std::move(in), axis, std::move(out)));
}

template <typename T>
struct AnyShapeConcat {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"axis"}));
    DPTRAIN_ASSIGN_OR_RETURN(const ValueShape first, ShapeOf(ctx, 0));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t attr, IntAttribute(ctx.node, "axis", 1));
    const std::optional<int> axis = NormalizeAxis(attr, first.rank());
    if (AllBatchFirst(ctx) && axis == 1) {
      Node node = ctx.node;  // Axis 1 as the batch-first version reads it (-1 of [N, F] too).
      node.attributes["axis"] = int64_t{1};
      return Build<T>(ConcatOp(), NodeContext{node, ctx.inputs, ctx.seed, ctx.scratch});
    }
    if (!axis.has_value() || *axis == first.batch_axis) {
      return ctx.Error(absl::StrCat("axis ", attr, " of ", first.ToString(),
                                    " unsupported (an axis other than the batch's)"));
    }
    return CreateConcat<T>(ctx, *axis);
  }
};

// ---- ReduceMean over axes other than the batch's ----

template <typename T>
class ReduceMeanNode final : public AnyShapeNode<T> {
 public:
  // `kept` is the output with the reduced axes kept as size 1 (keepdims=1), whatever the
  // output's own shape.
  ReduceMeanNode(ValueShape in, ValueShape kept, ValueShape out, int64_t count)
      : AnyShapeNode<T>(std::move(out)),
        in_(std::move(in)),
        kept_(std::move(kept)),
        count_(count) {}

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    const int64_t n = int64_t{x.batch} * kept_.per_sample();
    T* y = EnsureSize(output_, n);
    std::fill(y, y + n, T(0));
    ForEachOffset(in_.Concrete(x.batch), KeptStrides(x.batch),
                  [&](int64_t k, int64_t off) { y[off] += x.data[k]; });
    const T scale = T(1) / static_cast<T>(count_);
    for (int64_t i = 0; i < n; ++i) y[i] *= scale;
    return {y, x.batch, this->output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    const int batch = grad_output.batch;
    T* dx = EnsureSize(grad_input_, int64_t{batch} * in_.per_sample());
    const T* dy = grad_output.data;
    const T scale = T(1) / static_cast<T>(count_);
    ForEachOffset(in_.Concrete(batch), KeptStrides(batch),
                  [&](int64_t k, int64_t off) { dx[k] = dy[off] * scale; });
    return {TensorRef<T>{dx, batch, in_.dims_for_ops()}};
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

  const ValueShape in_, kept_;
  const int64_t count_;
  std::vector<T> output_, grad_input_;
};

template <typename T>
struct AnyShapeReduceMean {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"axes", "keepdims"}));
    DPTRAIN_ASSIGN_OR_RETURN(const ValueShape in, ShapeOf(ctx, 0));
    DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> axes, IntsInput(ctx, 1, "axes", {}));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t keepdims, IntAttribute(ctx.node, "keepdims", 1));
    if (in.IsBatchFirst() && ctx.node.attributes.count("axes") > 0) {
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
    if (axes.empty()) return ctx.Error("a mean over every axis (the batch's too) unsupported");
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
    return std::unique_ptr<NodeImpl<T>>(
        std::make_unique<ReduceMeanNode<T>>(in, std::move(kept), std::move(out), count));
  }
};

// ---- A tensor of the model read by Expand or a broadcast binary op ----

// Where the node's operand tensor comes from (as multi_input_ops.h says): learned, fixed, or a
// copy the node holds.
template <typename T>
class Operand {
 public:
  Operand() = default;
  // The graph owns `in.constant`, read only while the executor is built (Params, Buffers).
  Operand(const NodeInput& in, Shape shape)
      : name_(in.name), shape_(std::move(shape)), size_(in.constant->num_elements()) {
    value_ = in.constant;
    source_ = !in.state  ? OperandSource::kHeld
              : in.fixed ? OperandSource::kBuffer
                         : OperandSource::kParam;
    if (source_ == OperandSource::kHeld) {
      held_.assign(in.constant->floats.begin(), in.constant->floats.end());
      data_ = held_.data();
    }
  }
  std::vector<NodeTensorSpec> Params() const {
    if (source_ != OperandSource::kParam) return {};
    return {{name_, value_->shape, value_}};
  }
  std::vector<NodeTensorSpec> Buffers() const {
    if (source_ != OperandSource::kBuffer) return {};
    return {{name_, value_->shape, value_}};
  }
  void BindParams(absl::Span<const T* const> params, absl::Span<T* const> grads) {
    if (source_ != OperandSource::kParam) return;
    data_ = params[0];
    grad_ = grads[0];
  }
  void BindBuffers(absl::Span<T* const> buffers) {
    if (source_ == OperandSource::kBuffer) data_ = buffers[0];
  }
  const T* data() const { return data_; }
  T* grad() const { return grad_; }  // Null unless learned.
  int64_t size() const { return size_; }
  // Its strides against an output of `out` (rank >= its own; right-aligned; 0 on broadcast axes).
  Shape StridesAgainst(const Shape& out) const {
    const Shape own = Strides(shape_);
    Shape s(out.size(), 0);
    const size_t lead = out.size() - shape_.size();
    for (size_t i = 0; i < shape_.size(); ++i) {
      if (shape_[i] != 1) s[lead + i] = own[i];
    }
    return s;
  }
  const Shape& shape() const { return shape_; }

 private:
  std::string name_;
  Shape shape_;
  int64_t size_ = 0;
  const Tensor* value_ = nullptr;
  OperandSource source_ = OperandSource::kHeld;
  std::vector<T> held_;
  const T* data_ = nullptr;
  T* grad_ = nullptr;
};

// OK when `shape` broadcasts (NumPy, right-aligned) to `out` without the batch.
bool BroadcastsTo(const Shape& shape, const ValueShape& out) {
  if (shape.size() > static_cast<size_t>(out.rank())) return false;
  const size_t lead = out.rank() - shape.size();
  for (size_t i = 0; i < shape.size(); ++i) {
    const int axis = static_cast<int>(lead + i);
    if (shape[i] == 1) continue;
    if (axis == out.batch_axis || shape[i] != out.dims[axis]) return false;
  }
  return true;
}

// ---- Expand ----

template <typename T>
class ExpandNode final : public AnyShapeNode<T> {
 public:
  ExpandNode(Operand<T> operand, ValueShape out)
      : AnyShapeNode<T>(std::move(out)), operand_(std::move(operand)) {}
  std::vector<NodeTensorSpec> Params() const override { return operand_.Params(); }
  std::vector<NodeTensorSpec> Buffers() const override { return operand_.Buffers(); }
  void BindParams(absl::Span<const T* const> params, absl::Span<T* const> grads) override {
    operand_.BindParams(params, grads);
  }
  void BindBuffers(absl::Span<T* const> buffers) override { operand_.BindBuffers(buffers); }

  // inputs[0] is the graph's input, for the batch size only (node.h).
  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const int batch = inputs[0].batch;
    const Shape out_shape = this->out_.Concrete(batch);
    T* y = EnsureSize(output_, Product(out_shape));
    const T* c = operand_.data();
    ForEachOffset(out_shape, operand_.StridesAgainst(out_shape),
                  [&](int64_t k, int64_t off) { y[k] = c[off]; });
    return {y, batch, this->output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (T* g = operand_.grad(); g != nullptr) {
      std::fill(g, g + operand_.size(), T(0));
      const Shape out_shape = this->out_.Concrete(grad_output.batch);
      const T* dy = grad_output.data;
      ForEachOffset(out_shape, operand_.StridesAgainst(out_shape),
                    [&](int64_t k, int64_t off) { g[off] += dy[k]; });
    }
    return std::vector<TensorRef<T>>(need_input_grad.size());
  }

 private:
  Operand<T> operand_;
  std::vector<T> output_;
};

template <typename T>
struct Expand {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {}));
    const NodeInput* in = ctx.input(0);
    if (in == nullptr || in->constant == nullptr || in->constant->type != Tensor::Type::kFloat) {
      return ctx.Error("only Expand of a float tensor of the model is supported");
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

// ---- Add, Sub, Mul, Div with NumPy broadcasting ----

template <typename T>
class BroadcastBinaryNode final : public AnyShapeNode<T> {
 public:
  // `full` is the computed value's position among the runtime inputs; the operand is the other
  // computed value (same shape) when `operand` is empty, else the tensor. `swapped`: the full
  // value is the right operand.
  BroadcastBinaryNode(BinaryOp op, ValueShape shape, bool swapped,
                      std::optional<Operand<T>> operand,
                      std::optional<ValueShape> other_shape = std::nullopt)
      : AnyShapeNode<T>(shape),
        op_(op),
        swapped_(swapped),
        operand_(std::move(operand)),
        other_shape_(std::move(other_shape)) {}
  std::vector<NodeTensorSpec> Params() const override {
    return operand_ ? operand_->Params() : std::vector<NodeTensorSpec>{};
  }
  std::vector<NodeTensorSpec> Buffers() const override {
    return operand_ ? operand_->Buffers() : std::vector<NodeTensorSpec>{};
  }
  void BindParams(absl::Span<const T* const> params, absl::Span<T* const> grads) override {
    if (operand_) operand_->BindParams(params, grads);
  }
  void BindBuffers(absl::Span<T* const> buffers) override {
    if (operand_) operand_->BindBuffers(buffers);
  }

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const int batch = inputs[0].batch;
    batch_ = batch;
    if (operand_) {
      x_ = inputs[0].data;
      other_ = operand_->data();
    } else {
      x_ = inputs[swapped_ ? 1 : 0].data;
      other_ = inputs[swapped_ ? 0 : 1].data;
    }
    const Shape out_shape = this->out_.Concrete(batch);
    T* y = EnsureSize(output_, Product(out_shape));
    Visit(out_shape, [&](int64_t k, int64_t o) {
      const T a = swapped_ ? other_[o] : x_[k];
      const T b = swapped_ ? x_[k] : other_[o];
      switch (op_) {
        case BinaryOp::kAdd:
          y[k] = a + b;
          break;
        case BinaryOp::kSub:
          y[k] = a - b;
          break;
        case BinaryOp::kMul:
          y[k] = a * b;
          break;
        default:
          y[k] = a / b;
          break;
      }
    });
    return {y, batch, this->output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    const int batch = grad_output.batch;
    batch_ = batch;
    const Shape out_shape = this->out_.Concrete(batch);
    const int64_t n = Product(out_shape);
    const T* dy = grad_output.data;
    // d(out)/d(x) and d(out)/d(other) at each element, x being the full (computed) value.
    const bool need_x = operand_ ? need_input_grad[0] : need_input_grad[swapped_ ? 1 : 0];
    const bool need_other_value = !operand_ && need_input_grad[swapped_ ? 0 : 1];
    T* other_grad = nullptr;
    if (operand_ && operand_->grad() != nullptr) {
      other_grad = operand_->grad();
      std::fill(other_grad, other_grad + operand_->size(), T(0));
    } else if (need_other_value) {
      const int64_t m = other_shape_ ? Product(other_shape_->Concrete(batch)) : n;
      other_grad = EnsureSize(grad_other_, m);
      std::fill(other_grad, other_grad + m, T(0));
    }
    T* dx = need_x ? EnsureSize(grad_x_, n) : nullptr;
    Visit(out_shape, [&](int64_t k, int64_t o) {
      const T x = x_[k], c = other_[o], g = dy[k];
      T gx, gc;  // d/dx, d/dc of the output times g.
      switch (op_) {
        case BinaryOp::kAdd:
          gx = g;
          gc = g;
          break;
        case BinaryOp::kSub:
          gx = swapped_ ? -g : g;
          gc = swapped_ ? g : -g;
          break;
        case BinaryOp::kMul:
          gx = g * c;
          gc = g * x;
          break;
        default:
          if (swapped_) {  // c / x
            gx = -g * c / (x * x);
            gc = g / x;
          } else {  // x / c
            gx = g / c;
            gc = -g * x / (c * c);
          }
          break;
      }
      if (dx != nullptr) dx[k] = gx;
      if (other_grad != nullptr) other_grad[o] += gc;
    });
    std::vector<TensorRef<T>> grads(need_input_grad.size());
    const Dims dims = this->output_dims();
    if (operand_) {
      if (dx != nullptr) grads[0] = {dx, batch, dims};
    } else {
      if (dx != nullptr) grads[swapped_ ? 1 : 0] = {dx, batch, dims};
      if (need_other_value) {
        grads[swapped_ ? 0 : 1] = {other_grad, batch,
                                   other_shape_ ? other_shape_->dims_for_ops() : dims};
      }
    }
    return grads;
  }

 private:
  // f(k, o): element k of the output and the other operand's element o.
  template <typename F>
  void Visit(const Shape& out_shape, F f) {
    if (!operand_ && other_shape_) {  // A computed value broadcast along its size-1 axes.
      Shape strides = Strides(other_shape_->Concrete(batch_));
      for (size_t a = 0; a < strides.size(); ++a) {
        if (other_shape_->dims[a] == 1 && this->out_.dims[a] != 1) strides[a] = 0;
      }
      ForEachOffset(out_shape, strides, f);
      return;
    }
    if (!operand_) {
      const int64_t n = Product(out_shape);
      for (int64_t k = 0; k < n; ++k) f(k, k);
      return;
    }
    if (operand_->size() == 1) {
      const int64_t n = Product(out_shape);
      for (int64_t k = 0; k < n; ++k) f(k, 0);
      return;
    }
    ForEachOffset(out_shape, operand_->StridesAgainst(out_shape), f);
  }

  const BinaryOp op_;
  const bool swapped_;
  std::optional<Operand<T>> operand_;
  const std::optional<ValueShape> other_shape_;  // A computed operand that broadcasts.
  int batch_ = 0;
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
    auto into = [](const ValueShape& small, const ValueShape& full) {
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
    if (AllBatchFirst(ctx)) {
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

OpFactory TransposeOp() { return MakeOpFactory<Transpose>(true); }
OpFactory GatherOp() { return MakeOpFactory<Gather>(true); }
OpFactory ExpandOp() { return MakeOpFactory<Expand>(true); }
OpFactory AnyShapeMatMulOp() { return MakeOpFactory<RowwiseOf<RowOp::kMatMul>::Impl>(true); }
OpFactory AnyShapeGemmOp() { return MakeOpFactory<RowwiseOf<RowOp::kGemm>::Impl>(true); }
OpFactory AnyShapeLayerNormalizationOp() {
  return MakeOpFactory<RowwiseOf<RowOp::kLayerNorm>::Impl>(true);
}
OpFactory AnyShapeSoftmaxOp() { return MakeOpFactory<RowwiseOf<RowOp::kSoftmax>::Impl>(true); }
OpFactory AnyShapeLogSoftmaxOp() {
  return MakeOpFactory<RowwiseOf<RowOp::kLogSoftmax>::Impl>(true);
}
OpFactory AnyShapeReduceMeanOp() { return MakeOpFactory<AnyShapeReduceMean>(true); }
OpFactory AnyShapeSliceOp() { return MakeOpFactory<AnyShapeSlice>(true); }
OpFactory AnyShapeConcatOp() { return MakeOpFactory<AnyShapeConcat>(true); }
OpFactory AnyShapeAddOp() { return MakeOpFactory<BinaryOf<BinaryOp::kAdd>::Impl>(true); }
OpFactory AnyShapeSubOp() { return MakeOpFactory<BinaryOf<BinaryOp::kSub>::Impl>(true); }
OpFactory AnyShapeMulOp() { return MakeOpFactory<BinaryOf<BinaryOp::kMul>::Impl>(true); }
OpFactory AnyShapeDivOp() { return MakeOpFactory<BinaryOf<BinaryOp::kDiv>::Impl>(true); }

}  // namespace graph
}  // namespace dptrain
