// A model as data: a graph of nodes (op, name, attributes, input and output value names) from one
// graph input (a batch of samples of per-sample dims C x H x W) to one output (the logits), with
// named constants (initial weights, buffers and constant operands such as a Reshape's shape).
//
// The op names and attribute names are ONNX's ("Conv", "kernel_shape", ...), so a graph read
// from an ONNX file (onnx_import.h) and one built in code mean the same. Which constants are
// learnable parameters, buffers or plain operands is the ops' business (op_registry.h): a
// Conv's second input is its weight, a Reshape's second input its target shape.
//
// Values: the graph input is batch-first ([B, C, H, W] or a lower rank: input_dims per sample,
// input_rank); the executor gives every node output a whole shape (value_shape.h: the batch on
// any axis) and, for the ops that read them, per-sample nn::Dims (a feature vector of f
// elements is {f, 1, 1}).
#ifndef DPTRAIN_WORKER_GRAPH_GRAPH_H_
#define DPTRAIN_WORKER_GRAPH_GRAPH_H_

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/nn/tensor.h"

namespace dptrain {
namespace graph {

// A constant tensor: float (weights, buffers, float operands) or int64 (shapes, axes, pads).
// Exactly one of `floats` and `ints` holds product(shape) values (one for a scalar, shape {}).
struct Tensor {
  enum class Type { kFloat, kInt64 };
  Type type = Type::kFloat;
  std::vector<int64_t> shape;
  std::vector<float> floats;
  std::vector<int64_t> ints;

  // product(shape); 1 for a scalar.
  int64_t num_elements() const;
  // "float[4,3]" / "int64[2]".
  std::string ToString() const;
};

// An element of an int64 constant that the executor computed from a Shape (shape_arithmetic.h)
// and that stands for the batch size, known only at run time: dimension 0 of a Shape, as in
// x.view(x.size(0), -1) exported with a dynamic batch axis. Ops read it as an entry of a
// target shape (Reshape: value_shape.h's ReshapedShape; Expand).
inline constexpr int64_t kBatchSize = std::numeric_limits<int64_t>::min();

// The batch size times k (k from 1 to 2^40), as shape arithmetic computes it from kBatchSize
// (nn.MultiheadAttention's export: bsz * num_heads, tgt_len * bsz): kBatchSize for k = 1, else
// a value just above it. Ops read such entries only where kBatchSize may stand.
inline constexpr int64_t kMaxBatchFactor = int64_t{1} << 40;
inline constexpr int64_t BatchMultiple(int64_t k) { return k == 1 ? kBatchSize : kBatchSize + k; }
inline constexpr bool IsBatchMultiple(int64_t v) {
  return v == kBatchSize || (v > kBatchSize + 1 && v <= kBatchSize + kMaxBatchFactor);
}
// k of BatchMultiple(k) (1 for kBatchSize).
inline constexpr int64_t BatchFactor(int64_t v) { return v == kBatchSize ? 1 : v - kBatchSize; }

// "[1, 2, 3]": a shape (or any int list) in error messages; kBatchSize reads "B", a multiple
// "B*3".
std::string ShapeText(const std::vector<int64_t>& shape);

// An attribute value, as ONNX's INT, FLOAT, STRING, INTS and FLOATS.
using Attribute =
    std::variant<int64_t, float, std::string, std::vector<int64_t>, std::vector<float>>;

struct Node {
  std::string op;    // "Conv", "Relu", ...
  std::string name;  // Unique in the graph; errors name it.
  std::map<std::string, Attribute> attributes;
  std::vector<std::string> inputs;  // Value names; "" marks an absent optional input.
  std::vector<std::string> outputs;
};

struct NamedConstant {
  std::string name;
  Tensor value;
  // An entry of the model's state: an ONNX initializer, under its state_dict name (a parameter
  // or a buffer of the PyTorch module; the file does not say which). An op that reads it as a
  // plain operand (Add, Sub, Mul, Div) learns it as a parameter, or, where `fixed`
  // (MarkBuffers, onnx_import.h), keeps it as a buffer. False: a constant written into the
  // graph (an ONNX Constant node: a Python number or tensor of the forward code).
  bool state = false;
  bool fixed = false;
};

// The one input of a graph imported from several [batch, n] inputs: their columns side by
// side, in the graph's order, each input a Slice of it (onnx_import.h's ConcatenatedInputs).
inline constexpr char kMultiInput[] = "dptrain_inputs";

struct Graph {
  std::string name;
  std::string input;                     // The graph input's value name.
  nn::Dims input_dims;                   // Per sample.
  // The input's rank, batch included (2 to 4); 0: the smallest that holds input_dims.
  int input_rank = 0;
  // The input holds integer ids (an ONNX int64/int32 input: token or category ids for the
  // model's embedding tables, Gather of a learned table), carried as values of the executor's
  // type (exact below 2^24 in float); false: images or features.
  bool input_ids = false;
  std::string output;                    // The logits' value name: [batch, classes].
  std::vector<NamedConstant> constants;  // Initializers, in file order (the order of params()).
  std::vector<Node> nodes;               // Topologically ordered.

  // The constant named `name`, or null.
  const Tensor* FindConstant(absl::string_view name) const;
  const NamedConstant* FindNamedConstant(absl::string_view name) const;
};

// Structural checks, independent of the ops: the graph has at least one node, an input with
// positive dims and an output; names of nodes, constants and values are non-empty and unique
// (no value is defined twice); every node input is the graph input, a constant or an output of
// an EARLIER node (topological order); the output is a node output. InvalidArgument naming the
// node and value otherwise. Whether the ops exist is the executor's check (op_registry.h).
absl::Status ValidateGraph(const Graph& graph);

// Typed attribute lookups: `fallback` when the node has no such attribute, InvalidArgument
// naming the node and attribute when it has one of another type. An INT is accepted where a
// FLOAT is asked for.
absl::StatusOr<int64_t> IntAttribute(const Node& node, absl::string_view name, int64_t fallback);
absl::StatusOr<float> FloatAttribute(const Node& node, absl::string_view name, float fallback);
// The double nearest the shortest decimal that reads back as `f`: PyTorch writes its double
// hyper-parameters into ONNX's FLOAT attributes (eps=1e-3 becomes 0.001f), and this recovers
// them (0.001, not 0.0010000000474974513) where the float's error would show.
double ShortestDecimal(float f);
absl::StatusOr<std::string> StringAttribute(const Node& node, absl::string_view name,
                                            const std::string& fallback);
absl::StatusOr<std::vector<int64_t>> IntsAttribute(const Node& node, absl::string_view name,
                                                   const std::vector<int64_t>& fallback);

// InvalidArgument naming the first attribute of `node` that is not in `known` (so that an
// attribute an op does not implement is refused, never silently ignored), else OK.
absl::Status CheckKnownAttributes(const Node& node, const std::vector<absl::string_view>& known);

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_GRAPH_H_
