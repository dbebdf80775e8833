// What an op is to the executor: a node implementation built from a graph node, the dims of its
// inputs and the values of its constant inputs, templated on the scalar type like the
// worker/nn layers it mostly wraps (float for training, double for gradient checks).
//
// A node has one runtime output, its first output value (the others, such as
// BatchNormalization's running statistics or Dropout's mask, are not computed, and a graph that
// reads them is refused by the executor). Its runtime inputs are the inputs that are not
// constants; its constant inputs were handed to its factory, and the learnable ones (and
// buffers) are described by Params() and Buffers() so that the executor lays them out in the
// model's flat buffers.
//
// A node is not thread-safe; one thread drives it at a time.
#ifndef DPTRAIN_WORKER_GRAPH_NODE_H_
#define DPTRAIN_WORKER_GRAPH_NODE_H_

#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <typeindex>
#include <typeinfo>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/graph/graph.h"
#include "worker/graph/value_shape.h"
#include "worker/nn/conv2d.h"
#include "worker/nn/layer.h"
#include "worker/nn/tensor.h"

namespace dptrain {
namespace graph {

using nn::Dims;
using nn::TensorRef;

// One input of a node as its factory sees it.
struct NodeInput {
  std::string name;                  // "" for an absent optional input.
  // A runtime value: its per-sample dims (ValueShape::dims_for_ops) and its whole shape.
  std::optional<Dims> dims;
  std::optional<ValueShape> shape;
  const Tensor* constant = nullptr;  // A constant: its value (owned by the graph).
  // A constant that is model state (NamedConstant::state, fixed): learned, or a fixed buffer,
  // where the op reads it as a plain operand.
  bool state = false;
  bool fixed = false;

  bool present() const { return !name.empty(); }
  bool is_runtime() const { return dims.has_value(); }
};

// NodeImpl::ids_below of a node that reads ids without needing a bound.
inline constexpr int64_t kNoIdBound = std::numeric_limits<int64_t>::max();

// Scratch that the nodes of one executor may share: its nodes run one at a time, so buffers a
// node uses only inside one Forward or Backward call (nn::Residual's backward gradients) need
// not be one per node. One object per type, made on first use; nodes keep it alive.
class SharedScratch {
 public:
  template <typename S>
  std::shared_ptr<S> Get() {
    std::shared_ptr<void>& item = items_[std::type_index(typeid(S))];
    if (item == nullptr) item = std::make_shared<S>();
    return std::static_pointer_cast<S>(item);
  }

 private:
  std::map<std::type_index, std::shared_ptr<void>> items_;
};

// Everything a factory may read; valid only during the factory call.
struct NodeContext {
  const Node& node;
  std::vector<NodeInput> inputs;  // One per node.inputs entry.
  // Seeds the node's randomness (Dropout's masks); the executor derives it from its own seed and
  // the node's position, so that runs with the same seed are identical.
  uint64_t seed = 0;
  // The executor's shared scratch (see SharedScratch); null: the node keeps its own.
  SharedScratch* scratch = nullptr;

  // The input at `index` if present, else null (also past the end: absent optional inputs).
  const NodeInput* input(size_t index) const {
    return index < inputs.size() && inputs[index].present() ? &inputs[index] : nullptr;
  }
  // InvalidArgument "node 'n' (Op): <what>".
  absl::Status Error(absl::string_view what) const;
  // The runtime input at `index`, or an error saying it must be one.
  absl::StatusOr<Dims> RuntimeInput(size_t index) const;
  // The runtime input 0 of a node whose other inputs (if any) must be constants.
  absl::StatusOr<Dims> SoleRuntimeInput() const;
  // The constant input at `index` of `type`, or an error saying it must be one (null: absent and
  // `optional`).
  // An int64 constant holding the batch size (kBatchSize) is refused.
  absl::StatusOr<const Tensor*> ConstantInput(size_t index, Tensor::Type type, bool optional) const;
  // OK unless the input at `index` is model state that would be learned (an initializer not
  // marked as a buffer: NamedConstant::state) and this op can only read it as a fixed `role`
  // (Pow's exponent, Clip's bound): then an error saying so, rather than a parameter silently
  // frozen.
  absl::Status CheckNotLearned(size_t index, absl::string_view role) const;
  // A 1-D int64 constant input at `index`, or the INTS attribute `name` (what ops took before
  // an opset turned it into an input), or `fallback` where there is neither and `optional`.
  absl::StatusOr<std::vector<int64_t>> IntsInputOrAttribute(
      size_t index, absl::string_view name, bool optional,
      std::vector<int64_t> fallback = {}) const;
  // A 1-D int64 constant at `index` whose first entry may be the batch size (kBatchSize) and
  // no other: a Reshape target, or an error saying why not.
  absl::StatusOr<const Tensor*> TargetShapeInput(size_t index) const;
};

// A learnable tensor or buffer of a node, named as in PyTorch's state_dict (the constant's name).
struct NodeTensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  // Its initial value (owned by the graph), or null: all `fill`.
  const Tensor* initial = nullptr;
  float fill = 0;

  int64_t size() const;
};

// The element-wise functions of one input:
//   kTanh; kErf; kHardSigmoid max(0, min(1, a x + b)); kHardSwish;
//   kPiecewiseLinear (LeakyRelu, Clip): x < a: a + b (x - a); x > c: c; else x;
//   kElu (Elu, Selu): b (x > 0 ? x : a (exp(x) - 1)); kSoftplus log(1 + exp(x)) (x past 20:
//   x, as PyTorch's); kSoftsign x / (1 + |x|); kExp; kLog; kSqrt; kNeg; kAbs; kReciprocal
//   1 / x; kPow x ** a.
// The values are the GPU kernels' function codes (worker/cuda/graph_kernels.cu): append only.
enum class ElementFunction {
  kNone,
  kTanh,
  kErf,
  kHardSigmoid,
  kHardSwish,
  kPiecewiseLinear,
  kElu,
  kSoftplus,
  kSoftsign,
  kExp,
  kLog,
  kSqrt,
  kNeg,
  kAbs,
  kReciprocal,
  kPow,
  kSin,
  kCos,
  kEqual,    // 1 where (x == a) != (b != 0), else 0 (Equal, Not, a cast to bool); no gradient.
  kTruncate  // trunc(x) (a cast to an integer type); no gradient.
};
// The element-wise binary ops, and how operand b lines up with a (per sample): the same dims;
// one value per channel ([C, 1, 1] against [C, H, W], as a squeeze-and-excitation gate); one
// constant scalar; or one value per pixel.
// kMax, kMin: element-wise maximum and minimum (any-shape nodes only: no CUDA twin).
enum class BinaryOp { kAdd, kSub, kMul, kDiv, kPRelu, kMax, kMin };
// kPixel: b is [1, H, W] against a's [C, H, W] (a per-pixel statistic: a channel layer norm).
enum class Broadcast { kNone, kChannel, kScalar, kPixel };
// Where a node's operand tensor comes from: a computed value, a constant scalar the node keeps,
// or a tensor of the graph (held: a constant copied into the node; a parameter it learns; a
// buffer it keeps fixed).
enum class OperandSource { kComputed, kScalar, kHeld, kParam, kBuffer };

template <typename T>
class NodeImpl;

// What another backend (worker/cuda/gpu_graph.h) needs to build a node's twin: the facts the
// CPU factory parsed and checked, so that attributes are read once. Each op fills what its twin
// reads; the rest stay at their defaults.
template <typename T>
struct TwinSpec {
  // A node that runs one nn::Layer: the layer, and for its parameters and buffers, how the
  // layer's tensors map onto the graph's (tensor_block.h's parts; empty: none).
  const nn::Layer<T>* layer = nullptr;
  struct Part {
    int64_t size = 0;
    bool provided = true;  // False: the graph lacks it; the layer sees `fill`.
    T fill = T(0);
    int64_t transposed_rows = 0;  // > 0: the graph holds it transposed.
  };
  std::vector<Part> params, buffers;
  // Dropout: the probability of zeroing an element and the seed of its masks (each training
  // Forward draws mask k from SplitMix64(seed ^ SplitMix64(k)); shape_ops.h).
  double dropout_ratio = 0;
  uint64_t dropout_seed = 0;
  // Element-wise functions of one input (shape_ops.h), with their constants a, b, c.
  ElementFunction function = ElementFunction::kNone;
  double a = 0, b = 0, c = 0;
  // Add, Sub, Mul, Div (multi_input_ops.h): the op, how the other operand lines up with the
  // full one, whether they are swapped (the full one is the right operand), the constant.
  std::optional<BinaryOp> binary;
  Broadcast broadcast = Broadcast::kNone;
  bool swapped = false;
  double scalar = 0;
  // Add, Sub, Mul, Div, PRelu and InstanceNormalization: where the operand tensor (the scale
  // and B) comes from; for kHeld, the node's copy of its values (operand_size of them; scale
  // then B), valid while the node lives.
  OperandSource operand_source = OperandSource::kComputed;
  const T* held_operand = nullptr;
  int64_t operand_size = 0;
  // Conv with group > 1 (layer_ops.h): the whole convolution's options (in and out channels
  // of all groups) and the group count; `params` says how weight and bias map.
  std::optional<nn::Conv2dOptions> grouped_conv;
  int groups = 1;
  // Pad: the zero rows above and columns left of the input (the rest follow from the dims).
  int pad_top = 0, pad_left = 0;
  // LayerNormalization over each whole sample (norm_ops.h): its epsilon (0: not one);
  // Params() say whether there is a bias.
  double layer_norm_eps = 0;
  // Softmax or LogSoftmax over the channels.
  bool softmax = false, log_softmax = false;
  // Slice (slice_ops.h): where the window starts in c, h, w (its size: the output dims).
  std::array<int, 3> slice_start = {0, 0, 0};
  // ChannelShuffle (slice_ops.h): its group count.
  int shuffle_groups = 0;
  // ReduceMean over the channels (layer_ops.h).
  bool channel_mean = false;
  // InstanceNormalization (norm_ops.h): its epsilon (0: not one).
  double instance_norm_eps = 0;
  // Built by an op of any_shape_ops.h (values of any rank, the batch on any axis; a layer
  // applied to each row of a last axis, which the fields above may describe).
  bool any_shape = false;
  // An embedding lookup (a table of the model, the operand, by computed ids): the table's rows
  // and row length (0: not a lookup), and the row whose gradient stays zero (padding_idx; -1).
  int64_t lookup_rows = 0, lookup_row = 0, lookup_padding = -1;
  // A reduction over axes other than the batch's (reduce_elements.h's numbering; -1: not one)
  // and what a mean or sum multiplies by.
  int reduction = -1;
  double reduce_scale = 1;
  // TopK (any_shape_ops.h): the axis, k and whether the largest (1) or smallest (0); k 0: not
  // one.
  std::array<int64_t, 3> topk = {0, 0, 0};
  // MatMul of two computed values [..., m, k] x [..., k, n] (any_shape_ops.h): m, k, n; one
  // product per leading index (A's elements / (m k) of them), row-major. Zeros for the others.
  std::array<int, 3> batched_matmul = {0, 0, 0};
  // A node applied to each row of its input's last axis, the rows as its batch (Gemm,
  // LayerNormalization, Softmax over the last axis of a [B, T, D] value): that node, built for
  // one row (its own twin() describes it). Null for the others.
  const NodeImpl<T>* rowwise = nullptr;
  // One layer of nn.LSTM or nn.GRU (recurrent_ops.h; hidden 0: not one): its form, and per
  // tensor (per direction weight_ih, weight_hh, then bias_ih and bias_hh where there are
  // biases) where it lies, its size and, for kHeld, its values (valid while the node lives).
  struct RecurrentTensor {
    OperandSource source = OperandSource::kHeld;
    const T* held = nullptr;
    int64_t size = 0;
  };
  struct Recurrent {
    bool gru = false, biases = false, lengths = false;
    int directions = 1, output = 0;  // output: 0 Y, 1 Y_h, 2 Y_c.
    int64_t steps = 0, in = 0, hidden = 0;
    std::vector<RecurrentTensor> tensors;
  } recurrent;
};

template <typename T>
class NodeImpl {
 public:
  virtual ~NodeImpl() = default;

  // See TwinSpec; by default nothing (an op whose twin needs only its dims and output dims).
  virtual TwinSpec<T> twin() const { return {}; }

  // Per-sample dims of the output (fixed by the factory from the input dims).
  virtual Dims output_dims() const = 0;
  // The output's whole shape (value_shape.h), or nullopt: the executor's default, input 0's
  // shape where the dims are input 0's, else a batch-first value of input 0's rank
  // (ValueShape::BatchFirst). Ops that change the rank or read whole shapes say it.
  virtual std::optional<ValueShape> output_shape() const { return std::nullopt; }

  // Learnable tensors (inputs of the node that are constants) and buffers, in the order the
  // Bind calls hand them over. Empty by default.
  virtual std::vector<NodeTensorSpec> Params() const { return {}; }
  virtual std::vector<NodeTensorSpec> Buffers() const { return {}; }
  // One pointer per Params() entry to its values and one to its gradient, wherever the model's
  // flat buffers keep them (not necessarily back to back). Not owned; called before Forward and
  // again whenever the buffers move. Backward overwrites the gradients.
  virtual void BindParams(absl::Span<const T* const> params, absl::Span<T* const> grads) {}
  // One pointer per Buffers() entry; a training Forward updates them.
  virtual void BindBuffers(absl::Span<T* const> buffers) {}
  // The output for the runtime inputs (in input order, constants left out; a node without
  // runtime inputs gets the graph's input, for the batch size only), owned by the node
  // and valid until its next Forward. The inputs stay valid until Backward returns. `ctx` is
  // what wrapped layers compute with (nn::LayerContext: the pool, the convolution algorithm,
  // the executor's shared input-gradient buffers), per call as for the layers.
  virtual TensorRef<T> Forward(const nn::LayerContext<T>& ctx,
                               absl::Span<const TensorRef<T>> inputs, bool training) = 0;
  // Refuses runtime input values the node cannot take (an embedding lookup's ids outside its
  // table or not integers; a batch norm's single value per channel in training), called with
  // Forward's inputs and mode just before it: the executor's Forward then fails with this
  // status (InvalidArgument naming the node) and runs no later node. OK by default.
  virtual absl::Status CheckInputs(absl::Span<const TensorRef<T>> inputs, bool training) const {
    return absl::OkStatus();
  }
  // A node whose runtime input is ids (an embedding lookup): the bound they must be below (its
  // table's rows); kNoIdBound for a node that may read ids and needs no bound (a comparison:
  // ids == pad); 0 for the others (what they do with ids is not known).
  virtual int64_t ids_below() const { return 0; }

  // An op that only moves the elements of its runtime inputs (element_sources.h): sets, for
  // `batch` samples, the source of each output element in order, and returns true; false (the
  // default) for every other op. Other backends run such a node as a gather and its inverse.
  virtual bool ElementSources(int batch, std::vector<int64_t>& sources) const { return false; }
  // Add, Sub, Mul, Div, Max or Min of a value and an operand broadcast into it (binary_elements.h;
  // TwinSpec says which op and where the operand lies): sets, for `batch` samples, the operand's
  // element that each output element reads, and returns true; false (the default) for every
  // other op.
  virtual bool OperandIndices(int batch, std::vector<int64_t>& indices) const { return false; }
  // A reduction over axes other than the batch's (reduce_elements.h; TwinSpec::reduction): sets,
  // for `batch` samples, the output element each input element adds into, and returns true;
  // false (the default) for every other op.
  virtual bool ReducedIndices(int batch, std::vector<int64_t>& out_of) const { return false; }
  // Where (cond ? a : b): sets, per input (cond, a, b), its constant broadcast to the output of
  // `batch` samples (empty for a computed input), and returns true; false (the default) for
  // every other op.
  virtual bool BroadcastConstants(int batch, std::vector<std::vector<T>>& values) const {
    return false;
  }

  // Given d(loss)/d(output) of the last Forward, overwrites the parameter gradients and returns
  // d(loss)/d(input) for each runtime input whose `need_input_grad` is true (an empty view for
  // the others), owned by the node (or aliasing grad_output) and valid until its next Backward;
  // or, for a node that wraps a layer, in ctx.grad_buffers and valid only until the next node
  // writes that pair (the executor copies out what must live longer).
  virtual std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx,
                                             TensorRef<T> grad_output,
                                             const std::vector<bool>& need_input_grad) = 0;
};

// A node that hands everything to `inner` (its parameters, buffers, forward and backward);
// subclasses change what they say about the output or how they view the values.
template <typename T>
class DelegatingNode : public NodeImpl<T> {
 public:
  explicit DelegatingNode(std::unique_ptr<NodeImpl<T>> inner) : inner_(std::move(inner)) {}
  TwinSpec<T> twin() const override { return inner_->twin(); }
  Dims output_dims() const override { return inner_->output_dims(); }
  std::vector<NodeTensorSpec> Params() const override { return inner_->Params(); }
  std::vector<NodeTensorSpec> Buffers() const override { return inner_->Buffers(); }
  void BindParams(absl::Span<const T* const> params, absl::Span<T* const> grads) override {
    inner_->BindParams(params, grads);
  }
  void BindBuffers(absl::Span<T* const> buffers) override { inner_->BindBuffers(buffers); }
  TensorRef<T> Forward(const nn::LayerContext<T>& ctx, absl::Span<const TensorRef<T>> inputs,
                       bool training) override {
    return inner_->Forward(ctx, inputs, training);
  }
  absl::Status CheckInputs(absl::Span<const TensorRef<T>> inputs, bool training) const override {
    return inner_->CheckInputs(inputs, training);
  }
  int64_t ids_below() const override { return inner_->ids_below(); }
  bool ElementSources(int batch, std::vector<int64_t>& sources) const override {
    return inner_->ElementSources(batch, sources);
  }
  bool OperandIndices(int batch, std::vector<int64_t>& indices) const override {
    return inner_->OperandIndices(batch, indices);
  }
  bool ReducedIndices(int batch, std::vector<int64_t>& out_of) const override {
    return inner_->ReducedIndices(batch, out_of);
  }
  bool BroadcastConstants(int batch, std::vector<std::vector<T>>& values) const override {
    return inner_->BroadcastConstants(batch, values);
  }
  std::vector<TensorRef<T>> Backward(const nn::LayerContext<T>& ctx, TensorRef<T> grad_output,
                                     const std::vector<bool>& need_input_grad) override {
    return inner_->Backward(ctx, grad_output, need_input_grad);
  }

 protected:
  NodeImpl<T>& inner() const { return *inner_; }

 private:
  std::unique_ptr<NodeImpl<T>> inner_;
};

// `inner` with the whole output shape `shape` (ops whose rank the per-sample dims do not tell:
// Flatten's [B, F] beside a pooled [B, C, 1, 1]).
template <typename T>
class ShapedNode final : public DelegatingNode<T> {
 public:
  ShapedNode(std::unique_ptr<NodeImpl<T>> inner, ValueShape shape)
      : DelegatingNode<T>(std::move(inner)), shape_(std::move(shape)) {}
  std::optional<ValueShape> output_shape() const override { return shape_; }

 private:
  const ValueShape shape_;
};

// `made` with the output shape [B, dims...] (rank 1 + dims.size()), errors passed on.
template <typename T>
absl::StatusOr<std::unique_ptr<NodeImpl<T>>> WithBatchFirstShape(
    absl::StatusOr<std::unique_ptr<NodeImpl<T>>> made, int rank) {
  if (!made.ok()) return made;
  ValueShape shape = ValueShape::BatchFirst((*made)->output_dims(), rank);
  return std::unique_ptr<NodeImpl<T>>(
      std::make_unique<ShapedNode<T>>(*std::move(made), std::move(shape)));
}

// A node implementation built from its context: InvalidArgument (via NodeContext::Error) for a
// configuration the op does not support.
template <typename T>
using NodeFactory = absl::StatusOr<std::unique_ptr<NodeImpl<T>>> (*)(const NodeContext&);

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_NODE_H_
