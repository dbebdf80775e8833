#include "worker/graph/layer_ops.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/graph/tensor_block.h"
#include "worker/nn/activations.h"
#include "worker/nn/avg_pool2d.h"
#include "worker/nn/batch_norm2d.h"
#include "worker/nn/conv2d.h"
#include "worker/nn/global_avg_pool2d.h"
#include "worker/nn/linear.h"
#include "worker/nn/max_pool2d.h"
#include "worker/nn/residual.h"

namespace dptrain {
namespace graph {
namespace {

template <typename T>
using Part = typename TensorBlock<T>::Part;

// A node that runs one nn::Layer on its one runtime input, its parameters and buffers handed
// over through TensorBlocks (bound directly where the model keeps them back to back).
template <typename T>
class LayerNode final : public NodeImpl<T> {
 public:
  struct Tensors {
    std::vector<NodeTensorSpec> specs;  // The graph's tensors, in the layer's order.
    std::vector<Part<T>> parts;         // The layer's tensors (a superset of specs).
  };

  LayerNode(std::unique_ptr<nn::Layer<T>> layer, Dims output_dims, Tensors params, Tensors buffers)
      : layer_(std::move(layer)),
        output_dims_(output_dims),
        param_specs_(std::move(params.specs)),
        buffer_specs_(std::move(buffers.specs)),
        params_(std::move(params.parts)),
        buffers_(std::move(buffers.parts)) {}

  Dims output_dims() const override { return output_dims_; }
  absl::Status CheckInputs(absl::Span<const TensorRef<T>> inputs, bool training) const override {
    return layer_->CheckInput(inputs[0], training);
  }
  TwinSpec<T> twin() const override {
    TwinSpec<T> t;
    t.layer = layer_.get();
    t.params = params_.parts();
    t.buffers = buffers_.parts();
    return t;
  }
  std::vector<NodeTensorSpec> Params() const override { return param_specs_; }
  std::vector<NodeTensorSpec> Buffers() const override { return buffer_specs_; }
  void BindParams(absl::Span<const T* const> params, absl::Span<T* const> grads) override {
    params_.Bind(params, grads, /*writable=*/false);
    layer_->BindParams(params_.values(), params_.grads());
  }
  void BindBuffers(absl::Span<T* const> buffers) override {
    const std::vector<const T*> values(buffers.begin(), buffers.end());
    buffers_.Bind(values, {}, /*writable=*/true);
    layer_->BindBuffers(buffers_.mutable_values());
  }

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    params_.CopyIn();
    buffers_.CopyIn();
    TensorRef<T> y = layer_->Forward(ctx, inputs[0], training);
    if (training) buffers_.CopyValuesOut();
    return y;
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    TensorRef<T> dx = layer_->Backward(ctx, grad_output, need_input_grad[0]);
    params_.CopyGradsOut();
    return {dx};
  }

 private:
  std::unique_ptr<nn::Layer<T>> layer_;
  const Dims output_dims_;
  const std::vector<NodeTensorSpec> param_specs_;
  const std::vector<NodeTensorSpec> buffer_specs_;
  TensorBlock<T> params_;
  TensorBlock<T> buffers_;
};

// Every input but the first is a constant (a layer's parameters), or an error naming it.
absl::Status ConstantsAfterTheFirst(const NodeContext& ctx) {
  for (size_t i = 1; i < ctx.inputs.size(); ++i) {
    if (ctx.inputs[i].is_runtime()) {
      return ctx.Error(absl::StrCat("input ", i, " ('", ctx.inputs[i].name,
                                    "') must be a constant, not a computed value"));
    }
  }
  return absl::OkStatus();
}

// The node for `layer` on runtime input 0, after checking that the layer fits its dims.
template <typename T>
absl::StatusOr<std::unique_ptr<NodeImpl<T>>> MakeLayerNode(
    const NodeContext& ctx, std::unique_ptr<nn::Layer<T>> layer,
    typename LayerNode<T>::Tensors params = {}, typename LayerNode<T>::Tensors buffers = {}) {
  DPTRAIN_ASSIGN_OR_RETURN(const Dims input, ctx.RuntimeInput(0));
  DPTRAIN_RETURN_IF_ERROR(ConstantsAfterTheFirst(ctx));
  absl::StatusOr<Dims> out = layer->OutputDims(input);
  if (!out.ok()) return ctx.Error(out.status().message());
  return std::unique_ptr<NodeImpl<T>>(std::make_unique<LayerNode<T>>(
      std::move(layer), *out, std::move(params), std::move(buffers)));
}

// A graph tensor that the layer binds as is.
NodeTensorSpec SpecOf(const NodeInput& in) {
  return {in.name, in.constant->shape, in.constant, 0.0f};
}

// The kernel, stride and padding of a 2-D window op (Conv, MaxPool, AveragePool): attributes
// kernel_shape (must equal `kernel` when that is given, i.e. from a convolution's weight),
// strides (default 1), pads (symmetric: begin == end), dilations (1) and auto_pad (NOTSET or
// VALID without pads).
struct Window {
  int kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w;
};

// A 1-D window's attributes (Conv1d, MaxPool1d on [N, C, L]) as the 2-D window they are on
// per-sample dims {C, L, 1}: kernel [k, 1], strides [s, 1], pads [b, 0, e, 0], dilations [d, 1];
// attributes of another length are left as they are (and refused by ReadWindow).
Node As2dWindow(const Node& node) {
  Node out = node;
  auto widen = [&out](const std::string& name, size_t length, auto f) {
    auto a = out.attributes.find(name);
    if (a == out.attributes.end()) return;
    const auto* v = std::get_if<std::vector<int64_t>>(&a->second);
    if (v != nullptr && v->size() == length) a->second = f(*v);
  };
  auto one_axis = [](const std::vector<int64_t>& v) { return std::vector<int64_t>{v[0], 1}; };
  widen("kernel_shape", 1, one_axis);
  widen("strides", 1, one_axis);
  widen("dilations", 1, one_axis);
  widen("pads", 2, [](const std::vector<int64_t>& v) {
    return std::vector<int64_t>{v[0], 0, v[1], 0};
  });
  return out;
}

absl::StatusOr<Window> ReadWindow(const NodeContext& ctx, std::vector<int64_t> kernel) {
  // A 1-D window over [N, C, L] (Conv1d, MaxPool1d) is the 2-D window As2dWindow says.
  const NodeInput* x = ctx.input(0);
  const bool one_d = x != nullptr && x->shape.has_value() && x->shape->rank() == 3;
  const Node widened = one_d ? As2dWindow(ctx.node) : Node();
  const Node& node = one_d ? widened : ctx.node;
  DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> kernel_shape,
                           IntsAttribute(node, "kernel_shape", kernel));
  if (kernel_shape.empty()) return ctx.Error("kernel_shape missing");
  if (kernel_shape.size() != 2) {
    return ctx.Error(absl::StrCat("kernel_shape ", ShapeText(kernel_shape), ": only 2-D windows"));
  }
  if (!kernel.empty() && kernel_shape != kernel) {
    return ctx.Error(absl::StrCat("kernel_shape ", ShapeText(kernel_shape),
                                  " does not match the weight's ", ShapeText(kernel)));
  }
  DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> strides,
                           IntsAttribute(node, "strides", {1, 1}));
  DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> pads,
                           IntsAttribute(node, "pads", {0, 0, 0, 0}));
  DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> dilations,
                           IntsAttribute(node, "dilations", {1, 1}));
  DPTRAIN_ASSIGN_OR_RETURN(const std::string auto_pad, StringAttribute(node, "auto_pad", "NOTSET"));
  if (auto_pad != "NOTSET" && auto_pad != "VALID") {
    return ctx.Error(absl::StrCat("auto_pad ", auto_pad, " unsupported (NOTSET or VALID only)"));
  }
  if (strides.size() != 2 || strides[0] < 1 || strides[1] < 1) {
    return ctx.Error(absl::StrCat("strides ", ShapeText(strides), " unsupported"));
  }
  if (pads.size() != 4 || pads[0] != pads[2] || pads[1] != pads[3] || pads[0] < 0 || pads[1] < 0 ||
      (auto_pad == "VALID" && (pads[0] != 0 || pads[1] != 0))) {
    return ctx.Error(
        absl::StrCat("pads ", ShapeText(pads), " unsupported (symmetric 2-D padding only)"));
  }
  if (dilations.size() != 2 || dilations[0] != 1 || dilations[1] != 1) {
    return ctx.Error(absl::StrCat("dilations ", ShapeText(dilations), " unsupported (1 only)"));
  }
  return Window{static_cast<int>(kernel_shape[0]), static_cast<int>(kernel_shape[1]),
                static_cast<int>(strides[0]),      static_cast<int>(strides[1]),
                static_cast<int>(pads[0]),         static_cast<int>(pads[1])};
}

// A float constant input of `shape` (or, with `alternative`, that shape instead), or an error.
absl::Status CheckShape(const NodeContext& ctx, size_t index, const std::vector<int64_t>& shape,
                        const std::vector<int64_t>& alternative = {}) {
  const std::vector<int64_t>& actual = ctx.inputs[index].constant->shape;
  if (actual == shape || (!alternative.empty() && actual == alternative)) return absl::OkStatus();
  return ctx.Error(absl::StrCat("input ", index, " ('", ctx.inputs[index].name, "') has shape ",
                                ShapeText(actual), ", expected ", ShapeText(shape)));
}

// Conv with group > 1 (grouped, and depthwise when group == channels, as MobileNet's): one
// nn::Conv2d per group over its slice of the channels. Each group's weight rows and bias are
// staged contiguously for its layer before Forward, and their gradients copied back after
// Backward; the input and output-gradient slices are gathered per group.
template <typename T>
class GroupedConvNode final : public NodeImpl<T> {
 public:
  GroupedConvNode(std::vector<std::unique_ptr<nn::Conv2d<T>>> groups, Dims input, Dims output,
                  std::vector<NodeTensorSpec> specs)
      : groups_(std::move(groups)),
        in_(input),
        out_(output),
        specs_(std::move(specs)),
        in_g_{in_.c / static_cast<int>(groups_.size()), in_.h, in_.w},
        out_g_{out_.c / static_cast<int>(groups_.size()), out_.h, out_.w},
        weight_g_(int64_t{out_g_.c} * specs_[0].size() / out_.c),
        staged_(groups_.size(), std::vector<T>(weight_g_ + out_g_.c)),
        staged_grads_(groups_.size(), std::vector<T>(weight_g_ + out_g_.c)),
        inputs_(groups_.size()),
        grad_outputs_(groups_.size()) {
    for (size_t g = 0; g < groups_.size(); ++g) {
      groups_[g]->BindParams(staged_[g].data(), staged_grads_[g].data());
    }
  }

  Dims output_dims() const override { return out_; }
  TwinSpec<T> twin() const override {
    TwinSpec<T> t;
    nn::Conv2dOptions all = groups_[0]->options();
    all.in_channels = in_.c;
    all.out_channels = out_.c;
    t.grouped_conv = all;
    t.groups = static_cast<int>(groups_.size());
    t.params.push_back({specs_[0].size(), true, T(0), 0});
    t.params.push_back({int64_t{out_.c}, specs_.size() > 1, T(0), 0});
    return t;
  }
  std::vector<NodeTensorSpec> Params() const override { return specs_; }
  void BindParams(absl::Span<const T* const> params, absl::Span<T* const> grads) override {
    weight_ = params[0];
    weight_grad_ = grads[0];
    bias_ = specs_.size() > 1 ? params[1] : nullptr;
    bias_grad_ = specs_.size() > 1 ? grads[1] : nullptr;
  }

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    const int batch = x.batch;
    T* y = nn::EnsureSize(output_, int64_t{batch} * out_.size());
    for (size_t g = 0; g < groups_.size(); ++g) {
      std::vector<T>& s = staged_[g];
      std::copy(weight_ + g * weight_g_, weight_ + (g + 1) * weight_g_, s.begin());
      for (int c = 0; c < out_g_.c; ++c) s[weight_g_ + c] = bias_ ? bias_[g * out_g_.c + c] : T(0);
      T* xg = nn::EnsureSize(inputs_[g], int64_t{batch} * in_g_.size());
      for (int n = 0; n < batch; ++n) {
        const T* from = x.data + n * in_.size() + g * in_g_.size();
        std::copy(from, from + in_g_.size(), xg + n * in_g_.size());
      }
      const TensorRef<T> yg = groups_[g]->Forward(ctx, {xg, batch, in_g_}, training);
      for (int n = 0; n < batch; ++n) {
        std::copy(yg.data + n * out_g_.size(), yg.data + (n + 1) * out_g_.size(),
                  y + n * out_.size() + g * out_g_.size());
      }
    }
    return {y, batch, out_};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    // The groups' input gradients stay in their own buffers: they are gathered while
    // grad_output, which may lie in the shared pair, is still being read.
    nn::LayerContext<T> own = ctx;
    own.grad_buffers = nullptr;
    const int batch = grad_output.batch;
    T* dx = need_input_grad[0] ? nn::EnsureSize(grad_input_, int64_t{batch} * in_.size()) : nullptr;
    for (size_t g = 0; g < groups_.size(); ++g) {
      T* dyg = nn::EnsureSize(grad_outputs_[g], int64_t{batch} * out_g_.size());
      for (int n = 0; n < batch; ++n) {
        const T* from = grad_output.data + n * out_.size() + g * out_g_.size();
        std::copy(from, from + out_g_.size(), dyg + n * out_g_.size());
      }
      const TensorRef<T> dxg = groups_[g]->Backward(own, {dyg, batch, out_g_}, need_input_grad[0]);
      const std::vector<T>& sg = staged_grads_[g];
      std::copy(sg.begin(), sg.begin() + weight_g_, weight_grad_ + g * weight_g_);
      if (bias_grad_ != nullptr) {
        std::copy(sg.begin() + weight_g_, sg.end(), bias_grad_ + g * out_g_.c);
      }
      if (dx == nullptr) continue;
      for (int n = 0; n < batch; ++n) {
        std::copy(dxg.data + n * in_g_.size(), dxg.data + (n + 1) * in_g_.size(),
                  dx + n * in_.size() + g * in_g_.size());
      }
    }
    return {dx == nullptr ? TensorRef<T>{} : TensorRef<T>{dx, batch, in_}};
  }

 private:
  std::vector<std::unique_ptr<nn::Conv2d<T>>> groups_;
  const Dims in_, out_;
  const std::vector<NodeTensorSpec> specs_;
  const Dims in_g_, out_g_;
  const int64_t weight_g_;                             // Elements of one group's weight rows.
  std::vector<std::vector<T>> staged_, staged_grads_;  // Per group: weight rows, then bias.
  const T* weight_ = nullptr;
  T* weight_grad_ = nullptr;
  const T* bias_ = nullptr;
  T* bias_grad_ = nullptr;
  std::vector<std::vector<T>> inputs_, grad_outputs_;
  std::vector<T> output_, grad_input_;
};

template <typename T>
struct Conv {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(
        ctx.node, {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"}));
    DPTRAIN_ASSIGN_OR_RETURN(const Dims input, ctx.RuntimeInput(0));
    DPTRAIN_ASSIGN_OR_RETURN(const Tensor* weight,
                             ctx.ConstantInput(1, Tensor::Type::kFloat, false));
    DPTRAIN_ASSIGN_OR_RETURN(const Tensor* bias, ctx.ConstantInput(2, Tensor::Type::kFloat, true));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t group, IntAttribute(ctx.node, "group", 1));
    std::vector<int64_t> w = weight->shape;
    // Conv1d on [N, C, L]: a 2-D convolution of a [k, 1] kernel on dims {C, L, 1}, its window
    // attributes widened to 2-D; the weight keeps its [out, in, k] name, shape and layout.
    const bool one_d = w.size() == 3;
    if (one_d) {
      const NodeInput& x = ctx.inputs[0];
      if (!x.shape.has_value() || x.shape->rank() != 3) {
        return ctx.Error(absl::StrCat("weight shape ", ShapeText(w),
                                      ": a 1-D convolution of a [N, C, L] input only"));
      }
      w.push_back(1);
    }
    // A Linear's [out, in] weight as a 1x1 convolution's: what SinkChannelsLast (graph_rewrites.h)
    // makes of a Linear applied to each pixel of a channels-last value.
    if (w.size() == 2 && ctx.node.attributes.count("kernel_shape") > 0) {
      DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> k,
                               IntsAttribute(ctx.node, "kernel_shape", {}));
      if (k == std::vector<int64_t>{1, 1}) w = {w[0], w[1], 1, 1};
    }
    if (w.size() != 4) {
      return ctx.Error(absl::StrCat("weight shape ", ShapeText(w), ": only 2-D convolutions"));
    }
    if (group < 1 || input.c % group != 0 || w[0] % group != 0) {
      return ctx.Error(absl::StrCat("group ", group, " does not divide the ", input.c,
                                    " input and ", w[0], " output channels"));
    }
    if (w[1] * group != input.c) {
      return ctx.Error(absl::StrCat("weight ", ShapeText(weight->shape), " does not fit input ",
                                    input.ToString(),
                                    group > 1 ? absl::StrCat(" in ", group, " groups") : ""));
    }
    if (bias != nullptr) DPTRAIN_RETURN_IF_ERROR(CheckShape(ctx, 2, {w[0]}));
    DPTRAIN_ASSIGN_OR_RETURN(const Window win, ReadWindow(ctx, {w[2], w[3]}));
    nn::Conv2dOptions o;  // Of one group's convolution.
    o.in_channels = static_cast<int>(w[1]);
    o.out_channels = static_cast<int>(w[0] / group);
    o.kernel_h = win.kernel_h;
    o.kernel_w = win.kernel_w;
    o.stride_h = win.stride_h;
    o.stride_w = win.stride_w;
    o.pad_h = win.pad_h;
    o.pad_w = win.pad_w;
    if (group > 1) return Grouped(ctx, input, o, bias != nullptr, group);
    typename LayerNode<T>::Tensors params;
    params.specs.push_back(SpecOf(ctx.inputs[1]));
    params.parts.push_back({weight->num_elements()});
    if (bias != nullptr) params.specs.push_back(SpecOf(ctx.inputs[2]));
    params.parts.push_back({w[0], /*provided=*/bias != nullptr});
    return MakeLayerNode<T>(ctx, std::make_unique<nn::Conv2d<T>>(o), std::move(params));
  }

  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Grouped(const NodeContext& ctx,
                                                              const Dims& input,
                                                              const nn::Conv2dOptions& o, bool bias,
                                                              int64_t group) {
    DPTRAIN_RETURN_IF_ERROR(ConstantsAfterTheFirst(ctx));
    std::vector<std::unique_ptr<nn::Conv2d<T>>> groups;
    for (int64_t g = 0; g < group; ++g) groups.push_back(std::make_unique<nn::Conv2d<T>>(o));
    absl::StatusOr<Dims> out_g = groups[0]->OutputDims({o.in_channels, input.h, input.w});
    if (!out_g.ok()) return ctx.Error(out_g.status().message());
    const Dims out{static_cast<int>(o.out_channels * group), out_g->h, out_g->w};
    std::vector<NodeTensorSpec> specs = {SpecOf(ctx.inputs[1])};
    if (bias) specs.push_back(SpecOf(ctx.inputs[2]));
    return std::unique_ptr<NodeImpl<T>>(
        std::make_unique<GroupedConvNode<T>>(std::move(groups), input, out, std::move(specs)));
  }
};

// Gemm (transB 0 or 1) and MatMul (as Gemm with transB 0 and no C).
template <typename T>
struct Linear {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"alpha", "beta", "transA", "transB"}));
    DPTRAIN_ASSIGN_OR_RETURN(const Dims input, ctx.RuntimeInput(0));
    DPTRAIN_ASSIGN_OR_RETURN(const Tensor* b, ctx.ConstantInput(1, Tensor::Type::kFloat, false));
    const bool is_gemm = ctx.node.op == "Gemm";
    const Tensor* c = nullptr;
    if (is_gemm) {
      DPTRAIN_ASSIGN_OR_RETURN(c, ctx.ConstantInput(2, Tensor::Type::kFloat, true));
    } else if (ctx.inputs.size() > 2) {
      return ctx.Error("MatMul takes two inputs");
    }
    DPTRAIN_ASSIGN_OR_RETURN(const float alpha, FloatAttribute(ctx.node, "alpha", 1.0f));
    DPTRAIN_ASSIGN_OR_RETURN(const float beta, FloatAttribute(ctx.node, "beta", 1.0f));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t trans_a, IntAttribute(ctx.node, "transA", 0));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t trans_b, IntAttribute(ctx.node, "transB", 0));
    if (alpha != 1.0f || (c != nullptr && beta != 1.0f) || trans_a != 0) {
      return ctx.Error(absl::StrCat("alpha ", alpha, ", beta ", beta, ", transA ", trans_a,
                                    " unsupported (1, 1, 0 only)"));
    }
    if (b->shape.size() != 2) {
      return ctx.Error(absl::StrCat("weight shape ", ShapeText(b->shape), ": 2-D only"));
    }
    const int64_t out = trans_b ? b->shape[0] : b->shape[1];
    const int64_t in = trans_b ? b->shape[1] : b->shape[0];
    if (in != input.size()) {
      return ctx.Error(absl::StrCat("weight ", ShapeText(b->shape),
                                    (trans_b ? " (transposed)" : ""), " does not fit input ",
                                    input.ToString(), " of ", input.size(), " features"));
    }
    if (c != nullptr) DPTRAIN_RETURN_IF_ERROR(CheckShape(ctx, 2, {out}, {1, out}));
    typename LayerNode<T>::Tensors params;
    params.specs.push_back(SpecOf(ctx.inputs[1]));
    Part<T> weight{b->num_elements()};
    if (!trans_b) weight.transposed_rows = out;  // The layer's [out, in] is the graph's [in, out].
    params.parts.push_back(weight);
    if (c != nullptr) params.specs.push_back(SpecOf(ctx.inputs[2]));
    params.parts.push_back({out, /*provided=*/c != nullptr});
    return MakeLayerNode<T>(
        ctx, std::make_unique<nn::Linear<T>>(static_cast<int>(in), static_cast<int>(out)),
        std::move(params));
  }
};

template <typename T>
struct Relu {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {}));
    return MakeLayerNode<T>(ctx, std::make_unique<nn::ReLU<T>>());
  }
};

template <typename T>
struct Sigmoid {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {}));
    return MakeLayerNode<T>(ctx, std::make_unique<nn::Sigmoid<T>>());
  }
};

// The state_dict name of a batch norm's num_batches_tracked: beside its running mean (input
// `mean_input` of the node: "layer1.0.bn1.running_mean" -> "layer1.0.bn1.num_batches_tracked"),
// else "<node><suffix>.num_batches_tracked" (`suffix` tells a node's batch norms apart).
std::string NumBatchesTrackedName(const NodeContext& ctx, size_t mean_input = 3,
                                  absl::string_view suffix = "") {
  const std::string& mean = ctx.inputs[mean_input].name;
  constexpr absl::string_view kSuffix = "running_mean";
  if (absl::EndsWith(mean, kSuffix)) {
    return absl::StrCat(mean.substr(0, mean.size() - kSuffix.size()), "num_batches_tracked");
  }
  return absl::StrCat(ctx.node.name, suffix, ".num_batches_tracked");
}

template <typename T>
struct BatchNorm {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(
        CheckKnownAttributes(ctx.node, {"epsilon", "momentum", "training_mode", "spatial"}));
    DPTRAIN_ASSIGN_OR_RETURN(const Dims input, ctx.RuntimeInput(0));
    for (size_t i = 1; i <= 4; ++i) {
      DPTRAIN_RETURN_IF_ERROR(ctx.ConstantInput(i, Tensor::Type::kFloat, false).status());
      DPTRAIN_RETURN_IF_ERROR(CheckShape(ctx, i, {input.c}));
    }
    DPTRAIN_ASSIGN_OR_RETURN(const float eps_attr, FloatAttribute(ctx.node, "epsilon", 1e-5f));
    DPTRAIN_ASSIGN_OR_RETURN(const float momentum_attr, FloatAttribute(ctx.node, "momentum", 0.9f));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t spatial, IntAttribute(ctx.node, "spatial", 1));
    // ONNX's momentum weighs the running statistic, PyTorch's the batch's: 1 - the other.
    const double eps = ShortestDecimal(eps_attr);
    const double momentum = 1 - ShortestDecimal(momentum_attr);
    if (!(eps > 0) || !std::isfinite(eps)) {
      return ctx.Error(absl::StrCat("epsilon ", eps, " must be positive"));
    }
    if (!(momentum_attr > 0 && momentum_attr <= 1)) {
      // PyTorch's momentum=None (a cumulative average) traces as ONNX momentum 0 (its first
      // step's factor, 1): refused, as the file cannot say which it was.
      return ctx.Error(absl::StrCat("momentum ", momentum_attr,
                                    " unsupported: ONNX's momentum must lie in (0, 1] "
                                    "(PyTorch's momentum=None, a cumulative average, exports as "
                                    "0)"));
    }
    if (spatial != 1) return ctx.Error("spatial=0 unsupported");
    typename LayerNode<T>::Tensors params, buffers;
    for (size_t i : {1, 2}) {
      params.specs.push_back(SpecOf(ctx.inputs[i]));
      params.parts.push_back({input.c});
    }
    for (size_t i : {3, 4}) {
      buffers.specs.push_back(SpecOf(ctx.inputs[i]));
      buffers.parts.push_back({input.c});
    }
    buffers.specs.push_back({NumBatchesTrackedName(ctx), {}, nullptr, 0.0f});
    buffers.parts.push_back({1});
    return MakeLayerNode<T>(ctx, std::make_unique<nn::BatchNorm2d<T>>(input.c, eps, momentum),
                            std::move(params), std::move(buffers));
  }
};

absl::StatusOr<nn::Pool2dOptions> ReadPool(const NodeContext& ctx) {
  DPTRAIN_ASSIGN_OR_RETURN(const int64_t ceil_mode, IntAttribute(ctx.node, "ceil_mode", 0));
  if (ceil_mode != 0 && ceil_mode != 1) {
    return ctx.Error(absl::StrCat("ceil_mode=", ceil_mode, " unsupported"));
  }
  DPTRAIN_ASSIGN_OR_RETURN(const Window w, ReadWindow(ctx, {}));
  return nn::Pool2dOptions{w.kernel_h, w.kernel_w, w.stride_h,    w.stride_w,
                           w.pad_h,    w.pad_w,    ceil_mode == 1};
}

template <typename T>
struct MaxPool {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(
        CheckKnownAttributes(ctx.node, {"auto_pad", "ceil_mode", "dilations", "kernel_shape",
                                        "pads", "storage_order", "strides"}));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t storage_order,
                             IntAttribute(ctx.node, "storage_order", 0));
    if (storage_order != 0) return ctx.Error("storage_order=1 unsupported");
    DPTRAIN_ASSIGN_OR_RETURN(const nn::Pool2dOptions o, ReadPool(ctx));
    return MakeLayerNode<T>(ctx, std::make_unique<nn::MaxPool2d<T>>(o));
  }
};

template <typename T>
struct AveragePool {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(
        ctx.node,
        {"auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads", "strides"}));
    DPTRAIN_ASSIGN_OR_RETURN(nn::Pool2dOptions o, ReadPool(ctx));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t include_pad,
                             IntAttribute(ctx.node, "count_include_pad", 0));
    if (include_pad != 0 && include_pad != 1) {
      return ctx.Error(absl::StrCat("count_include_pad=", include_pad, " unsupported"));
    }
    o.count_include_pad = include_pad == 1;
    return MakeLayerNode<T>(ctx, std::make_unique<nn::AvgPool2d<T>>(o));
  }
};

template <typename T>
struct GlobalAveragePool {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {}));
    return MakeLayerNode<T>(ctx, std::make_unique<nn::GlobalAvgPool2d<T>>());
  }
};

// ReduceMean over H and W (x.mean((2, 3)) as exported): GlobalAveragePool, whatever keepdims
// (a [N, C] value is [C, 1, 1] per sample here). Other axes are refused.
// The mean over the channels at each pixel, kept as one channel ([C, H, W] -> [1, H, W]):
// ReduceMean(axes=[1], keepdims=1), a layer norm over each pixel's channels written out.
template <typename T>
class ChannelMeanNode final : public NodeImpl<T> {
 public:
  explicit ChannelMeanNode(Dims in) : in_(in) {}
  Dims output_dims() const override { return {1, in_.h, in_.w}; }
  TwinSpec<T> twin() const override {
    TwinSpec<T> t;
    t.channel_mean = true;
    return t;
  }

  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    const TensorRef<T>& x = inputs[0];
    const int64_t plane = int64_t{in_.h} * in_.w;
    T* y = nn::EnsureSize(output_, x.batch * plane);
    for (int64_t n = 0; n < x.batch; ++n) {
      T* out = y + n * plane;
      std::fill(out, out + plane, T(0));
      for (int c = 0; c < in_.c; ++c) {
        const T* in = x.data + (n * in_.c + c) * plane;
        for (int64_t p = 0; p < plane; ++p) out[p] += in[p];
      }
      for (int64_t p = 0; p < plane; ++p) out[p] /= static_cast<T>(in_.c);
    }
    return {y, x.batch, output_dims()};
  }

  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    if (!need_input_grad[0]) return {TensorRef<T>{}};
    const int64_t plane = int64_t{in_.h} * in_.w;
    T* dx = nn::EnsureSize(grad_input_, grad_output.batch * in_.size());
    for (int64_t n = 0; n < grad_output.batch; ++n) {
      const T* dy = grad_output.data + n * plane;
      for (int c = 0; c < in_.c; ++c) {
        T* d = dx + (n * in_.c + c) * plane;
        for (int64_t p = 0; p < plane; ++p) d[p] = dy[p] / static_cast<T>(in_.c);
      }
    }
    return {TensorRef<T>{dx, grad_output.batch, in_}};
  }

 private:
  const Dims in_;
  std::vector<T> output_, grad_input_;
};

template <typename T>
struct ReduceMean {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"axes", "keepdims"}));
    DPTRAIN_ASSIGN_OR_RETURN(std::vector<int64_t> axes, IntsAttribute(ctx.node, "axes", {}));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t keepdims, IntAttribute(ctx.node, "keepdims", 1));
    if (axes == std::vector<int64_t>{1} && keepdims == 1) {
      DPTRAIN_ASSIGN_OR_RETURN(const Dims input, ctx.RuntimeInput(0));
      return std::unique_ptr<NodeImpl<T>>(std::make_unique<ChannelMeanNode<T>>(input));
    }
    for (int64_t& a : axes) a = a < 0 ? a + 4 : a;
    std::sort(axes.begin(), axes.end());
    if (axes != std::vector<int64_t>{2, 3}) {
      return ctx.Error(absl::StrCat("axes ", ShapeText(axes),
                                    " unsupported (the spatial ones, 2 and 3, or the channels, 1, "
                                    "with keepdims=1)"));
    }
    return WithBatchFirstShape<T>(MakeLayerNode<T>(ctx, std::make_unique<nn::GlobalAvgPool2d<T>>()),
                                  keepdims ? 4 : 2);
  }
};

template <typename T>
struct Flatten {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"axis"}));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t axis, IntAttribute(ctx.node, "axis", 1));
    if (axis != 1) return ctx.Error(absl::StrCat("axis ", axis, " unsupported (1 only)"));
    return WithBatchFirstShape<T>(MakeLayerNode<T>(ctx, std::make_unique<nn::Flatten<T>>()), 2);
  }
};

template <typename T>
struct Residual {
  static absl::StatusOr<std::unique_ptr<NodeImpl<T>>> Create(const NodeContext& ctx) {
    DPTRAIN_RETURN_IF_ERROR(CheckKnownAttributes(ctx.node, {"stride"}));
    DPTRAIN_ASSIGN_OR_RETURN(const Dims input, ctx.RuntimeInput(0));
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t stride, IntAttribute(ctx.node, "stride", 1));
    if (ctx.inputs.size() != 15) {
      return ctx.Error(absl::StrCat("has ", ctx.inputs.size(), " inputs, expected 15"));
    }
    const bool shortcut_conv = ctx.input(5) != nullptr;
    if (shortcut_conv != (ctx.input(6) != nullptr)) {
      return ctx.Error(
          "the shortcut convolution needs both its weight (input 5) and its bias "
          "(input 6), or neither (an identity shortcut)");
    }
    for (size_t i = 1; i < 15; ++i) {
      const bool optional = i == 5 || i == 6;
      if (optional && ctx.input(i) == nullptr && !shortcut_conv) continue;
      DPTRAIN_RETURN_IF_ERROR(ctx.ConstantInput(i, Tensor::Type::kFloat, false).status());
    }
    const std::vector<int64_t>& w1 = ctx.inputs[1].constant->shape;
    if (w1.size() != 4 || w1[0] < 1) {
      return ctx.Error(absl::StrCat("conv1 weight ", ShapeText(w1), " is not [out, in, 3, 3]"));
    }
    const int64_t out = w1[0], in = input.c;
    DPTRAIN_RETURN_IF_ERROR(CheckShape(ctx, 1, {out, in, 3, 3}));
    DPTRAIN_RETURN_IF_ERROR(CheckShape(ctx, 3, {out, out, 3, 3}));
    for (size_t i : {2, 4, 7, 8, 9, 10, 11, 12, 13, 14}) {
      DPTRAIN_RETURN_IF_ERROR(CheckShape(ctx, i, {out}));
    }
    if (shortcut_conv) {
      DPTRAIN_RETURN_IF_ERROR(CheckShape(ctx, 5, {out, in, 1, 1}));
      DPTRAIN_RETURN_IF_ERROR(CheckShape(ctx, 6, {out}));
    } else if (in != out || stride != 1) {
      return ctx.Error(
          absl::StrCat("an identity shortcut needs in == out channels and stride 1, "
                       "got ",
                       in, " -> ", out, " with stride ", stride));
    }
    if (stride < 1) return ctx.Error(absl::StrCat("stride ", stride, " unsupported"));
    const nn::ResidualOptions o{static_cast<int>(in), static_cast<int>(out), shortcut_conv,
                                static_cast<int>(stride)};
    auto layer = std::make_unique<nn::Residual<T>>(
        o, ctx.scratch != nullptr ? ctx.scratch->Get<nn::ResidualScratch<T>>() : nullptr);
    typename LayerNode<T>::Tensors params, buffers;
    for (size_t i : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}) {
      if (ctx.input(i) == nullptr) continue;
      params.specs.push_back(SpecOf(ctx.inputs[i]));
      params.parts.push_back({params.specs.back().size()});
    }
    for (size_t mean : {11, 13}) {
      for (size_t i : {mean, mean + 1}) {
        buffers.specs.push_back(SpecOf(ctx.inputs[i]));
        buffers.parts.push_back({out});
      }
      buffers.specs.push_back(
          {NumBatchesTrackedName(ctx, mean, mean == 11 ? ".bn1" : ".bn2"), {}, nullptr, 0.0f});
      buffers.parts.push_back({1});
    }
    return MakeLayerNode<T>(ctx, std::move(layer), std::move(params), std::move(buffers));
  }
};

}  // namespace

OpFactory ResidualOp() { return MakeOpFactory<Residual>(); }
OpFactory ConvOp() { return MakeOpFactory<Conv>(); }
OpFactory LinearOp() { return MakeOpFactory<Linear>(); }
OpFactory ReluOp() { return MakeOpFactory<Relu>(); }
OpFactory SigmoidOp() { return MakeOpFactory<Sigmoid>(); }
OpFactory BatchNormOp() { return MakeOpFactory<BatchNorm>(); }
OpFactory MaxPoolOp() { return MakeOpFactory<MaxPool>(); }
OpFactory AveragePoolOp() { return MakeOpFactory<AveragePool>(); }
OpFactory GlobalAveragePoolOp() { return MakeOpFactory<GlobalAveragePool>(); }
OpFactory ReduceMeanOp() { return MakeOpFactory<ReduceMean>(); }
OpFactory FlattenOp() { return MakeOpFactory<Flatten>(); }

}  // namespace graph
}  // namespace dptrain
