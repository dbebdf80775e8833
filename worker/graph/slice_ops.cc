#include "worker/graph/slice_ops.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/nn/tensor.h"

namespace dptrain {
namespace graph {
namespace {

using nn::EnsureSize;

// Copies the window of `out` dims at `start` (c, h, w) of each sample of `in` dims between a
// full tensor and a windowed one: gather (full -> window) or scatter (window -> full).
template <typename T>
void CopyWindow(const Dims& in, const Dims& out, const std::array<int, 3>& start, int batch,
                const T* from, T* to, bool gather) {
  for (int64_t n = 0; n < batch; ++n) {
    for (int c = 0; c < out.c; ++c) {
      for (int h = 0; h < out.h; ++h) {
        const int64_t full = ((n * in.c + start[0] + c) * in.h + start[1] + h) * in.w + start[2];
        const int64_t window = ((n * out.c + c) * out.h + h) * out.w;
        if (gather) {
          std::copy(from + full, from + full + out.w, to + window);
        } else {
          std::copy(from + window, from + window + out.w, to + full);
        }
      }
    }
  }
}

template <typename T>
class SliceNode final : public NodeImpl<T> {
 public:
  SliceNode(Dims in, Dims out, std::array<int, 3> start) : in_(in), out_(out), start_(start) {}

  Dims output_dims() const override { return out_; }
  TwinSpec<T> twin() const override {
    TwinSpec<T> t;
    t.slice_start = start_;
    return t;
  }

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    T* y = EnsureSize(output_, x.batch * out_.size());
    CopyWindow(in_, out_, start_, x.batch, x.data, y, /*gather=*/true);
    return {y, x.batch, out_};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    const int batch = grad_output.batch;
    T* dx = EnsureSize(grad_input_, batch * in_.size());
    std::fill(dx, dx + batch * in_.size(), T(0));
    CopyWindow(in_, out_, start_, batch, grad_output.data, dx, /*gather=*/false);
    return {TensorRef<T>{dx, batch, in_}};
  }

 private:
  const Dims in_;
  const Dims out_;
  const std::array<int, 3> start_;
  std::vector<T> output_;
  std::vector<T> grad_input_;
};

template <typename T>
struct Slice {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"starts", "ends", "axes"}));
    DPTRAIN_ASSIGN_OR_RETURN(const Dims in, ctx.SoleRuntimeInput());
    DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> starts,
                             ctx.IntsInputOrAttribute(1, "starts", false));
    DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> ends,
                             ctx.IntsInputOrAttribute(2, "ends", false));
    std::vector<int64_t> all_axes(starts.size());
    for (size_t i = 0; i < all_axes.size(); ++i) all_axes[i] = static_cast<int64_t>(i);
    DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> axes,
                             ctx.IntsInputOrAttribute(3, "axes", true, all_axes));
    DPTRAIN_ASSIGN_OR_RETURN(
        const std::vector<int64_t> steps,
        ctx.IntsInputOrAttribute(4, "steps", true, std::vector<int64_t>(starts.size(), 1)));
    if (ends.size() != starts.size() || axes.size() != starts.size() ||
        steps.size() != starts.size()) {
      return ctx.Error(absl::StrCat("starts ", ShapeText(starts), ", ends ", ShapeText(ends),
                                    ", axes ", ShapeText(axes), " and steps ", ShapeText(steps),
                                    " differ in length"));
    }
    int dims[3] = {in.c, in.h, in.w};
    std::array<int, 3> start = {0, 0, 0};
    bool seen[3] = {false, false, false};
    for (size_t i = 0; i < axes.size(); ++i) {
      const int64_t axis = axes[i];
      if (axis < 1 || axis > 3) {
        return ctx.Error(
            absl::StrCat("axis ", axis,
                         " unsupported (1 to 3: the batch cannot be sliced, and a negative "
                         "axis needs the rank, which is not kept)"));
      }
      if (seen[axis - 1]) return ctx.Error(absl::StrCat("axis ", axis, " given twice"));
      seen[axis - 1] = true;
      if (steps[i] != 1) return ctx.Error(absl::StrCat("step ", steps[i], " unsupported (1 only)"));
      const int64_t size = dims[axis - 1];
      auto clamp = [size](int64_t v) {
        if (v < 0) v += size;
        return std::clamp<int64_t>(v, 0, size);
      };
      const int64_t b = clamp(starts[i]);
      const int64_t e = clamp(ends[i]);
      if (e <= b) {
        return ctx.Error(absl::StrCat("the slice [", starts[i], ", ", ends[i], ") of axis ", axis,
                                      " (size ", size, ") is empty"));
      }
      start[axis - 1] = static_cast<int>(b);
      dims[axis - 1] = static_cast<int>(e - b);
    }
    return std::unique_ptr<NodeImpl<T>>(
        std::make_unique<SliceNode<T>>(in, Dims{dims[0], dims[1], dims[2]}, start));
  }
};

// y[n, j * g + i] = x[n, i * per_group + j] per plane; its inverse is the shuffle with
// per_group groups.
template <typename T>
void Shuffle(const T* x, T* y, int batch, int channels, int groups, int64_t plane) {
  const int per_group = channels / groups;
  for (int64_t n = 0; n < batch; ++n) {
    const T* xs = x + n * channels * plane;
    T* ys = y + n * channels * plane;
    for (int i = 0; i < groups; ++i) {
      for (int j = 0; j < per_group; ++j) {
        const T* from = xs + (int64_t{i} * per_group + j) * plane;
        std::copy(from, from + plane, ys + (int64_t{j} * groups + i) * plane);
      }
    }
  }
}

template <typename T>
class ChannelShuffleNode final : public NodeImpl<T> {
 public:
  ChannelShuffleNode(Dims dims, int groups) : dims_(dims), groups_(groups) {}

  Dims output_dims() const override { return dims_; }
  TwinSpec<T> twin() const override {
    TwinSpec<T> t;
    t.shuffle_groups = groups_;
    return t;
  }

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    T* y = EnsureSize(output_, x.size());
    Shuffle(x.data, y, x.batch, dims_.c, groups_, int64_t{dims_.h} * dims_.w);
    return {y, x.batch, dims_};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    T* dx = EnsureSize(grad_input_, grad_output.size());
    Shuffle(grad_output.data, dx, grad_output.batch, dims_.c, dims_.c / groups_,
            int64_t{dims_.h} * dims_.w);
    return {TensorRef<T>{dx, grad_output.batch, dims_}};
  }

 private:
  const Dims dims_;
  const int groups_;
  std::vector<T> output_;
  std::vector<T> grad_input_;
};

template <typename T>
struct ChannelShuffle {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {}));
    if (ctx.inputs.size() != 3) return ctx.Error("expects the input and two shapes");
    DPTRAIN_ASSIGN_OR_RETURN(const Dims in, ctx.RuntimeInput(0));
    DPTRAIN_ASSIGN_OR_RETURN(const Tensor* split_shape, ctx.TargetShapeInput(1));
    DPTRAIN_ASSIGN_OR_RETURN(const Tensor* merged_shape, ctx.TargetShapeInput(2));
    const std::vector<int64_t>& split = split_shape->ints;
    const std::vector<int64_t>& merged = merged_shape->ints;
    // The first Reshape: [n, g, c / g, h, w]; the second: [n, c (or -1), h, w]. Entry 0 is the
    // batch, whatever it says.
    const int64_t groups = split.size() == 5 ? split[1] : 0;
    const bool split_fits = groups > 0 && in.c % groups == 0 && split[2] == in.c / groups &&
                            split[3] == in.h && split[4] == in.w;
    const bool merged_fits = merged.size() == 4 && (merged[1] == in.c || merged[1] == -1) &&
                             !(merged[0] == -1 && merged[1] == -1) && merged[2] == in.h &&
                             merged[3] == in.w;
    if (!split_fits || !merged_fits) {
      return ctx.Error(absl::StrCat(
          "a channel shuffle reshaping ", in.ToString(), " to ", ShapeText(split), " and back to ",
          ShapeText(merged), " unsupported (expected [n, g, c / g, h, w] and [n, c, h, w])"));
    }
    return std::unique_ptr<NodeImpl<T>>(
        std::make_unique<ChannelShuffleNode<T>>(in, static_cast<int>(groups)));
  }
};

}  // namespace

OpFactory SliceOp() { return MakeOpFactory<Slice>(); }
OpFactory ChannelShuffleOp() { return MakeOpFactory<ChannelShuffle>(); }

}  // namespace graph
}  // namespace dptrain
