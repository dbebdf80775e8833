// The any-shape ops that move elements (any_shape_ops.h): Transpose, Gather (and the embedding
// lookup), Slice, Concat, Pad; Expand is in any_shape_expand_ops.cc.
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "worker/graph/any_shape_internal.h"
#include "worker/graph/any_shape_ops.h"
#include "worker/graph/element_sources.h"
#include "worker/graph/multi_input_ops.h"
#include "worker/graph/shape_ops.h"
#include "worker/graph/slice_ops.h"
#include "worker/nn/batch_sample.h"

namespace dptrain {
namespace graph {
namespace any_shape_internal {
namespace {

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

  bool ElementSources(int batch, std::vector<int64_t>& sources) const override {
    Shape out_shape, strides;
    Plan(batch, out_shape, strides);
    sources.resize(Product(out_shape));
    ForEachOffset(out_shape, strides, [&](int64_t k, int64_t off) { sources[k] = off; });
    return true;
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

  bool ElementSources(int batch, std::vector<int64_t>& sources) const override {
    int64_t outer, size, inner;
    Plan(batch, outer, size, inner);
    const int64_t picked = static_cast<int64_t>(indices_.size());
    sources.resize(outer * picked * inner);
    int64_t k = 0;
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t j = 0; j < picked; ++j) {
        for (int64_t i = 0; i < inner; ++i) sources[k++] = (o * size + indices_[j]) * inner + i;
      }
    }
    return true;
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

// Rows of a tensor of the model picked by constant indices (axis 0): a relative-position bias
// gathered from its table (Swin, BEiT). A value without a batch; a learned table gets the sum of
// its rows' gradients.
template <typename T>
class GatherRowsNode final : public OperandNode<T> {
 public:
  GatherRowsNode(Operand<T> table, int64_t row, std::vector<int64_t> indices, ValueShape out)
      : OperandNode<T>(std::move(out), std::move(table)), row_(row), indices_(std::move(indices)) {}

  // inputs[0] is the graph's input, read for nothing (node.h): the output has no batch.
  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    T* y = EnsureSize(output_, static_cast<int64_t>(indices_.size()) * row_);
    for (size_t j = 0; j < indices_.size(); ++j) {
      const T* src = this->operand().data() + indices_[j] * row_;
      std::copy(src, src + row_, y + j * row_);
    }
    return {y, 1, this->output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (T* g = this->operand().grad(); g != nullptr) {
      std::fill(g, g + this->operand().size(), T(0));
      for (size_t j = 0; j < indices_.size(); ++j) {
        T* dst = g + indices_[j] * row_;
        const T* src = grad_output.data + j * row_;
        for (int64_t i = 0; i < row_; ++i) dst[i] += src[i];
      }
    }
    return std::vector<TensorRef<T>>(need_input_grad.size());
  }

  // The table is input 1 (after the graph's input, read for nothing).
  bool ElementSources(int batch, std::vector<int64_t>& sources) const override {
    sources.resize(indices_.size() * row_);
    for (size_t j = 0; j < indices_.size(); ++j) {
      for (int64_t i = 0; i < row_; ++i) {
        sources[j * row_ + i] = ElementSource(1, indices_[j] * row_ + i);
      }
    }
    return true;
  }

 private:
  const int64_t row_;
  const std::vector<int64_t> indices_;
  std::vector<T> output_;
};

template <typename T>
absl::StatusOr<std::unique_ptr<NodeImpl<T>>> CreateGatherRows(const NodeContext& ctx) {
  const NodeInput& data = ctx.inputs[0];
  if (data.constant->type != Tensor::Type::kFloat || data.constant->shape.empty()) {
    return ctx.Error("the data (input 0) must be a float tensor of at least one axis");
  }
  DPTRAIN_ASSIGN_OR_RETURN(const Tensor* indices,
                           ctx.ConstantInput(1, Tensor::Type::kInt64, false));
  DPTRAIN_ASSIGN_OR_RETURN(const int64_t axis, IntAttribute(ctx.node, "axis", 0));
  const Shape& own = data.constant->shape;
  if (axis != 0 && axis != -static_cast<int64_t>(own.size())) {
    return ctx.Error(absl::StrCat("Gather of a tensor of the model along axis ", axis,
                                  " unsupported (its rows: axis 0)"));
  }
  const int64_t rows = own[0];
  std::vector<int64_t> picked;
  for (int64_t i : indices->ints) {
    if (i < -rows || i >= rows) {
      return ctx.Error(
          absl::StrCat("index ", i, " out of range for the ", rows, " rows of '", data.name, "'"));
    }
    picked.push_back(i < 0 ? i + rows : i);
  }
  ValueShape out;
  out.batch_axis = -1;
  out.dims = indices->shape;
  out.dims.insert(out.dims.end(), own.begin() + 1, own.end());
  if (out.rank() < 1 || out.rank() > kMaxRank)
    return ctx.Error("the result's rank is out of range");
  const int64_t row = Product(own, 1);
  return std::unique_ptr<NodeImpl<T>>(std::make_unique<GatherRowsNode<T>>(
      Operand<T>(data, own), row, std::move(picked), std::move(out)));
}

// ---- An embedding lookup: rows of a table of the model picked by computed ids ----

// Gather(table, ids) with ids a computed value (nn.Embedding's export: the graph's int64 input,
// or a view of it): the output is the ids' shape + the table's row shape, with the ids' batch
// axis. The ids are values of T holding integers (graph.h: Graph::input_ids); CheckInputs
// refuses any that is not an integer in [0, rows) before Forward reads it, as nn.Embedding does
// (ONNX's negative indices are refused too). A learned table's gradient holds the sum of the
// output gradients of each row's lookups (zero for rows not looked up); the ids get none.
template <typename T>
class EmbeddingNode final : public OperandNode<T> {
 public:
  // `padding_row`: the row whose gradient stays zero (nn.Embedding's padding_idx), or -1.
  EmbeddingNode(Operand<T> table, int64_t rows, int64_t row, ValueShape ids, ValueShape out,
                int64_t padding_row)
      : OperandNode<T>(std::move(out), std::move(table)),
        rows_(rows),
        row_(row),
        ids_(std::move(ids)),
        padding_row_(padding_row) {}

  int64_t ids_below() const override { return rows_; }

  TwinSpec<T> twin() const override {
    TwinSpec<T> t = OperandNode<T>::twin();
    t.lookup_rows = rows_;
    t.lookup_row = row_;
    t.lookup_padding = padding_row_;
    return t;
  }

  absl::Status CheckInputs(absl::Span<const TensorRef<T>> inputs, bool) const override {
    const TensorRef<T>& ids = inputs[0];
    const int64_t n = ids.size();
    for (int64_t j = 0; j < n; ++j) {
      const T v = ids.data[j];
      if (v >= 0 && v < static_cast<T>(rows_) && v == std::floor(v)) continue;
      std::string where = absl::StrCat("element ", j);
      int64_t sample = -1;
      if (ids_.batch_axis == 0 && ids_.batch_outer == 1 && ids_.batch_inner == 1 && ids.batch > 0) {
        const int64_t per_sample = n / ids.batch;
        sample = j / per_sample;
        where = absl::StrCat(nn::BatchSampleText(sample), ", position ", j % per_sample);
      }
      absl::Status error = absl::InvalidArgumentError(
          absl::StrCat("id ", absl::StrFormat("%.17g", static_cast<double>(v)), " (", where,
                       ") is not a row of the table '", this->operand().name(),
                       "' (an integer in [0, ", rows_, "))"));
      return sample >= 0 ? nn::AtBatchSample(std::move(error), sample) : error;
    }
    return absl::OkStatus();
  }

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& ids = inputs[0];
    const int64_t n = ids.size();
    T* y = EnsureSize(output_, n * row_);
    for (int64_t j = 0; j < n; ++j) {
      const T* src = this->operand().data() + static_cast<int64_t>(ids.data[j]) * row_;
      std::copy(src, src + row_, y + j * row_);
    }
    last_ids_ = ids;
    return {y, ids.batch, this->output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (T* g = this->operand().grad(); g != nullptr) {
      std::fill(g, g + this->operand().size(), T(0));
      for (int64_t j = 0; j < last_ids_.size(); ++j) {
        const int64_t id = static_cast<int64_t>(last_ids_.data[j]);
        if (id == padding_row_) continue;  // PyTorch's padding_idx: no gradient.
        T* dst = g + id * row_;
        const T* src = grad_output.data + j * row_;
        for (int64_t i = 0; i < row_; ++i) dst[i] += src[i];
      }
    }
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    // Ids are integers: the output does not change with them (almost everywhere).
    T* dx = EnsureSize(grad_input_, last_ids_.size());
    std::fill(dx, dx + last_ids_.size(), T(0));
    return {TensorRef<T>{dx, last_ids_.batch, ids_.dims_for_ops()}};
  }

 private:
  const int64_t rows_, row_;
  const ValueShape ids_;
  const int64_t padding_row_;
  TensorRef<T> last_ids_;  // Forward's input, valid until Backward returns (node.h).
  std::vector<T> output_, grad_input_;
};

template <typename T>
absl::StatusOr<std::unique_ptr<NodeImpl<T>>> CreateEmbedding(const NodeContext& ctx) {
  const NodeInput& data = ctx.inputs[0];
  if (data.constant->type != Tensor::Type::kFloat || data.constant->shape.empty()) {
    return ctx.Error("the table (input 0) must be a float tensor of at least one axis");
  }
  DPTRAIN_ASSIGN_OR_RETURN(const ValueShape ids, ShapeOf(ctx, 1));
  DPTRAIN_ASSIGN_OR_RETURN(const int64_t axis, IntAttribute(ctx.node, "axis", 0));
  DPTRAIN_ASSIGN_OR_RETURN(const int64_t padding, IntAttribute(ctx.node, "padding_idx", -1));
  const Shape& own = data.constant->shape;
  if (padding < -1 || padding >= own[0]) {
    return ctx.Error(absl::StrCat("padding_idx ", padding, " is not a row of the table"));
  }
  if (axis != 0 && axis != -static_cast<int64_t>(own.size())) {
    return ctx.Error(absl::StrCat("a lookup in a tensor of the model along axis ", axis,
                                  " unsupported (its rows: axis 0)"));
  }
  ValueShape out = ids;
  out.dims.insert(out.dims.end(), own.begin() + 1, own.end());
  if (out.rank() > kMaxRank) return ctx.Error("the result's rank is out of range");
  return std::unique_ptr<NodeImpl<T>>(std::make_unique<EmbeddingNode<T>>(
      Operand<T>(data, own), own[0], Product(own, 1), ids, std::move(out), padding));
}

template <typename T>
struct Gather {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"axis", "padding_idx"}));
    if (ctx.inputs.size() == 2 && ctx.input(0) != nullptr && ctx.inputs[0].constant != nullptr) {
      if (ctx.inputs[1].is_runtime()) return CreateEmbedding<T>(ctx);
      return CreateGatherRows<T>(ctx);
    }
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

  bool ElementSources(int batch, std::vector<int64_t>& sources) const override {
    Shape out_shape, strides;
    const int64_t base = Plan(batch, out_shape, strides);
    sources.resize(Product(out_shape));
    ForEachOffset(out_shape, strides, [&](int64_t k, int64_t off) { sources[k] = base + off; });
    return true;
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

template <typename T>
absl::StatusOr<std::unique_ptr<NodeImpl<T>>> CreateSlice(const NodeContext& ctx) {
  DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"starts", "ends", "axes"}));
  DPTRAIN_ASSIGN_OR_RETURN(const ValueShape in, ShapeOf(ctx, 0));
  DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> starts,
                           ctx.IntsInputOrAttribute(1, "starts", true, {}));
  DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> ends,
                           ctx.IntsInputOrAttribute(2, "ends", true, {}));
  std::vector<int64_t> all_axes(starts.size());
  std::iota(all_axes.begin(), all_axes.end(), 0);
  DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> axes,
                           ctx.IntsInputOrAttribute(3, "axes", true, all_axes));
  DPTRAIN_ASSIGN_OR_RETURN(
      const std::vector<int64_t> steps,
      ctx.IntsInputOrAttribute(4, "steps", true, std::vector<int64_t>(starts.size(), 1)));
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
    if (steps[i] == 0 || steps[i] < -kMaxAxisSize) {
      return ctx.Error(absl::StrCat("step ", steps[i], " unsupported"));
    }
    const int64_t size = in.dims[*a];
    // ONNX's clamping: a negative index counts from the end; a positive step's bounds into
    // [0, size], a negative step's (x.flip(d): from the end down) into [0, size - 1] and
    // [-1, size - 1].
    const bool down = steps[i] < 0;
    auto clamp = [size](int64_t v, int64_t low, int64_t high) {
      if (v < 0) v = v < -size ? -size - 1 : v + size;  // No overflow for -INT64_MAX.
      return std::clamp(v, low, high);
    };
    const int64_t b = down ? clamp(starts[i], 0, size - 1) : clamp(starts[i], 0, size);
    const int64_t e = down ? clamp(ends[i], -1, size - 1) : clamp(ends[i], 0, size);
    if (down ? e >= b : e <= b) {
      return ctx.Error(absl::StrCat("the slice [", starts[i], ", ", ends[i], ") step ", steps[i],
                                    " of axis ", axes[i], " (size ", size, ") is empty"));
    }
    first[*a] = b;
    step[*a] = steps[i];
    out.dims[*a] = down ? (b - e - 1) / -steps[i] + 1 : (e - b - 1) / steps[i] + 1;
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

  bool ElementSources(int batch, std::vector<int64_t>& sources) const override {
    const Shape out_shape = this->out_.Concrete(batch);
    const int64_t outer = Product(out_shape, 0, axis_), inner = Product(out_shape, axis_ + 1);
    sources.clear();
    sources.reserve(Product(out_shape));
    for (int64_t o = 0; o < outer; ++o) {
      for (size_t i = 0; i < in_.size(); ++i) {
        const int64_t block = in_[i].dims[axis_] * inner;
        for (int64_t e = 0; e < block; ++e) {
          sources.push_back(ElementSource(static_cast<int>(i), o * block + e));
        }
      }
    }
    return true;
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

// ---- Pad ----

// Zero padding along any axes but the batch's (Swin pads its channels-last windows).
template <typename T>
class PadNode final : public AnyShapeNode<T> {
 public:
  PadNode(ValueShape in, Shape begin, ValueShape out)
      : AnyShapeNode<T>(std::move(out)), in_(std::move(in)), begin_(std::move(begin)) {}

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    Shape strides;
    const int64_t base = Plan(x.batch, strides);
    const int64_t n = Product(this->out_.Concrete(x.batch));
    T* y = EnsureSize(output_, n);
    std::fill(y, y + n, T(0));
    ForEachOffset(in_.Concrete(x.batch), strides,
                  [&](int64_t k, int64_t off) { y[base + off] = x.data[k]; });
    return {y, x.batch, this->output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    const int batch = grad_output.batch;
    Shape strides;
    const int64_t base = Plan(batch, strides);
    T* dx = EnsureSize(grad_input_, int64_t{batch} * in_.per_sample());
    const T* dy = grad_output.data;
    ForEachOffset(in_.Concrete(batch), strides,
                  [&](int64_t k, int64_t off) { dx[k] = dy[base + off]; });
    return {TensorRef<T>{dx, batch, in_.dims_for_ops()}};
  }

  bool ElementSources(int batch, std::vector<int64_t>& sources) const override {
    Shape strides;
    const int64_t base = Plan(batch, strides);
    sources.assign(Product(this->out_.Concrete(batch)), kZeroSource);
    ForEachOffset(in_.Concrete(batch), strides,
                  [&](int64_t k, int64_t off) { sources[base + off] = k; });
    return true;
  }

 private:
  // The output's strides along each input axis, and where the input's first element lands.
  int64_t Plan(int batch, Shape& strides) const {
    strides = Strides(this->out_.Concrete(batch));
    int64_t base = 0;
    for (size_t a = 0; a < strides.size(); ++a) base += begin_[a] * strides[a];
    return base;
  }

  const ValueShape in_;
  const Shape begin_;
  std::vector<T> output_, grad_input_;
};

template <typename T>
struct AnyShapePad {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    if (AllBatchFirst(ctx)) {
      absl::StatusOr<std::unique_ptr<NodeImpl<T>>> made = Build<T>(PadOp(), ctx);
      if (made.ok()) return made;
    }
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"mode", "pads", "value"}));
    DPTRAIN_ASSIGN_OR_RETURN(const ValueShape in, ShapeOf(ctx, 0));
    DPTRAIN_ASSIGN_OR_RETURN(const std::string mode, StringAttribute(ctx.node, "mode", "constant"));
    if (mode != "constant") return ctx.Error(absl::StrCat("mode ", mode, " unsupported"));
    DPTRAIN_ASSIGN_OR_RETURN(const Shape pads, ctx.IntsInputOrAttribute(1, "pads", false));
    DPTRAIN_ASSIGN_OR_RETURN(float value, FloatAttribute(ctx.node, "value", 0.0f));
    DPTRAIN_RETURN_IF_ERROR(ctx.CheckNotLearned(2, "padding value"));
    DPTRAIN_ASSIGN_OR_RETURN(const Tensor* v, ctx.ConstantInput(2, Tensor::Type::kFloat, true));
    if (v != nullptr) value = v->num_elements() == 1 ? v->floats[0] : 1.0f;
    if (value != 0) return ctx.Error("only zero padding is supported");
    if (ctx.inputs.size() > 3) return ctx.Error("the axes input is unsupported");
    const int r = in.rank();
    if (pads.size() != static_cast<size_t>(2 * r)) {
      return ctx.Error(absl::StrCat("pads ", ShapeText(pads), " for a value of rank ", r));
    }
    ValueShape out = in;
    Shape begin(r);
    for (int a = 0; a < r; ++a) {
      const int64_t b = pads[a], e = pads[r + a];
      if (b < 0 || e < 0 || b > kMaxAxisSize || e > kMaxAxisSize ||
          (a == in.batch_axis && (b != 0 || e != 0))) {
        return ctx.Error(absl::StrCat("pads ", ShapeText(pads), " of ", in.ToString(),
                                      " unsupported (non-negative, not of the batch axis)"));
      }
      begin[a] = b;
      out.dims[a] += b + e;
    }
    return std::unique_ptr<NodeImpl<T>>(
        std::make_unique<PadNode<T>>(in, std::move(begin), std::move(out)));
  }
};

}  // namespace
}  // namespace any_shape_internal

OpFactory TransposeOp() { return MakeOpFactory<any_shape_internal::Transpose>(true); }
OpFactory GatherOp() { return MakeOpFactory<any_shape_internal::Gather>(true); }
OpFactory AnyShapeSliceOp() { return MakeOpFactory<any_shape_internal::AnyShapeSlice>(true); }
OpFactory AnyShapePadOp() { return MakeOpFactory<any_shape_internal::AnyShapePad>(true); }
OpFactory AnyShapeConcatOp() { return MakeOpFactory<any_shape_internal::AnyShapeConcat>(true); }

}  // namespace graph
}  // namespace dptrain
