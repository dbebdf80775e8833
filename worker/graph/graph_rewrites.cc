#include "worker/graph/graph_rewrites.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace dptrain {
namespace graph {
namespace {

absl::Status NodeError(const Node& node, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("node '", node.name, "' (", node.op, "): ", what));
}

// Axes of a Squeeze/Unsqueeze: the attribute (before opset 13) or the int64 input 1.
absl::StatusOr<std::vector<int64_t>> Axes(const Node& node,
                                          const std::vector<const Tensor*>& inputs) {
  if (inputs.size() > 1 && inputs[1] != nullptr) return inputs[1]->ints;
  return IntsAttribute(node, "axes", {});
}

// Normalises `axis` for `rank` (negative counts from the end), or an error.
absl::StatusOr<int64_t> Axis(const Node& node, int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank) {
    return NodeError(node, absl::StrCat("axis ", axis, " out of range for rank ", rank));
  }
  return axis < 0 ? axis + rank : axis;
}

// The value of `node` (an op of FoldShapeConstants) of int64 constant inputs (null: absent).
absl::StatusOr<Tensor> Evaluate(const Node& node, const std::vector<const Tensor*>& in) {
  const Tensor& x = *in[0];
  if (node.op == "Identity") return x;
  if (node.op == "Cast") {
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t to, IntAttribute(node, "to", 0));
    constexpr int64_t kOnnxFloat = 1, kOnnxInt64 = 7;
    if (to == kOnnxInt64) return x;
    if (to != kOnnxFloat) return NodeError(node, absl::StrCat("cast to type ", to, " unsupported"));
    Tensor out;
    out.shape = x.shape;
    out.floats.assign(x.ints.begin(), x.ints.end());
    return out;
  }
  if (node.op == "Unsqueeze") {
    DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> axes, Axes(node, in));
    const int64_t rank = static_cast<int64_t>(x.shape.size() + axes.size());
    std::vector<int64_t> normal;
    for (int64_t a : axes) {
      DPTRAIN_ASSIGN_OR_RETURN(const int64_t n, Axis(node, a, rank));
      normal.push_back(n);
    }
    std::sort(normal.begin(), normal.end());
    Tensor out = x;
    for (int64_t a : normal) out.shape.insert(out.shape.begin() + a, 1);
    return out;
  }
  if (node.op == "Squeeze") {
    DPTRAIN_ASSIGN_OR_RETURN(const std::vector<int64_t> axes, Axes(node, in));
    const int64_t rank = static_cast<int64_t>(x.shape.size());
    std::set<int64_t> drop;
    for (int64_t a : axes) {
      DPTRAIN_ASSIGN_OR_RETURN(const int64_t n, Axis(node, a, rank));
      if (x.shape[n] != 1) return NodeError(node, absl::StrCat("axis ", a, " is not of size 1"));
      drop.insert(n);
    }
    Tensor out = x;
    out.shape.clear();
    for (int64_t i = 0; i < rank; ++i) {
      const bool squeezed = axes.empty() ? x.shape[i] == 1 : drop.count(i) > 0;
      if (!squeezed) out.shape.push_back(x.shape[i]);
    }
    return out;
  }
  if (node.op == "Concat") {
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t axis, IntAttribute(node, "axis", 0));
    Tensor out;
    out.type = Tensor::Type::kInt64;
    for (const Tensor* t : in) {
      if (t == nullptr || t->shape.size() != 1 || (axis != 0 && axis != -1)) {
        return NodeError(node, "folding is implemented for 1-D int64 constants only");
      }
      out.ints.insert(out.ints.end(), t->ints.begin(), t->ints.end());
    }
    out.shape = {static_cast<int64_t>(out.ints.size())};
    return out;
  }
  if (node.op == "Gather") {
    DPTRAIN_ASSIGN_OR_RETURN(const int64_t axis, IntAttribute(node, "axis", 0));
    if (in.size() != 2 || in[1] == nullptr || x.shape.size() != 1 || (axis != 0 && axis != -1) ||
        in[1]->shape.size() > 1) {
      return NodeError(node, "folding is implemented for 1-D data and 0-D or 1-D indices only");
    }
    Tensor out;
    out.type = Tensor::Type::kInt64;
    out.shape = in[1]->shape;
    const int64_t n = x.shape[0];
    for (int64_t i : in[1]->ints) {
      if (i < -n || i >= n) return NodeError(node, absl::StrCat("index ", i, " out of range"));
      out.ints.push_back(x.ints[i < 0 ? i + n : i]);
    }
    return out;
  }
  return NodeError(node, "not foldable");
}

bool IsFoldable(const std::string& op) {
  return op == "Unsqueeze" || op == "Squeeze" || op == "Concat" || op == "Gather" || op == "Cast" ||
         op == "Identity";
}

// Per value name: the (node index, input slot) pairs reading it.
std::map<std::string, std::vector<std::pair<size_t, size_t>>> Consumers(const Graph& graph) {
  std::map<std::string, std::vector<std::pair<size_t, size_t>>> consumers;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const std::vector<std::string>& inputs = graph.nodes[n].inputs;
    for (size_t s = 0; s < inputs.size(); ++s) {
      if (!inputs[s].empty()) consumers[inputs[s]].push_back({n, s});
    }
  }
  return consumers;
}

const Tensor* FloatConstant(const Graph& graph, const std::string& name) {
  const Tensor* t = graph.FindConstant(name);
  return t != nullptr && t->type == Tensor::Type::kFloat ? t : nullptr;
}

}  // namespace

absl::Status FoldShapeConstants(Graph& graph) {
  std::map<std::string, size_t> constants;  // Name -> index in graph.constants.
  for (size_t i = 0; i < graph.constants.size(); ++i) constants[graph.constants[i].name] = i;
  std::vector<Node> kept;
  for (Node& node : graph.nodes) {
    std::vector<const Tensor*> inputs;
    bool all_int_constants = IsFoldable(node.op) && !node.inputs.empty() && !node.inputs[0].empty();
    for (const std::string& name : node.inputs) {
      if (!all_int_constants) break;
      if (name.empty()) {
        inputs.push_back(nullptr);
        continue;
      }
      auto it = constants.find(name);
      all_int_constants =
          it != constants.end() && graph.constants[it->second].value.type == Tensor::Type::kInt64;
      if (all_int_constants) inputs.push_back(&graph.constants[it->second].value);
    }
    if (!all_int_constants) {
      kept.push_back(std::move(node));
      continue;
    }
    DPTRAIN_ASSIGN_OR_RETURN(Tensor value, Evaluate(node, inputs));
    // Adding may move the constants the pointers above point to; they are not used again.
    constants[node.outputs[0]] = graph.constants.size();
    graph.constants.push_back({node.outputs[0], std::move(value)});
  }
  graph.nodes = std::move(kept);
  return absl::OkStatus();
}

void FuseLinear(Graph& graph) {
  // MatMul(x, Transpose(W)) -> Gemm(x, W, transB=1).
  {
    auto consumers = Consumers(graph);
    std::set<size_t> removed;
    for (size_t t = 0; t < graph.nodes.size(); ++t) {
      const Node& transpose = graph.nodes[t];
      if (transpose.op != "Transpose" || transpose.inputs.size() != 1) continue;
      const Tensor* w = FloatConstant(graph, transpose.inputs[0]);
      absl::StatusOr<std::vector<int64_t>> perm = IntsAttribute(transpose, "perm", {1, 0});
      if (w == nullptr || w->shape.size() != 2 || !perm.ok() ||
          *perm != std::vector<int64_t>{1, 0} || consumers[transpose.inputs[0]].size() != 1) {
        continue;
      }
      const auto& readers = consumers[transpose.outputs[0]];
      if (readers.size() != 1 || readers[0].second != 1 || transpose.outputs[0] == graph.output) {
        continue;
      }
      Node& matmul = graph.nodes[readers[0].first];
      if (matmul.op != "MatMul" || matmul.inputs.size() != 2) continue;
      matmul.op = "Gemm";
      matmul.inputs[1] = transpose.inputs[0];
      matmul.attributes["transB"] = int64_t{1};
      removed.insert(t);
    }
    std::vector<Node> kept;
    for (size_t n = 0; n < graph.nodes.size(); ++n) {
      if (removed.count(n) == 0) kept.push_back(std::move(graph.nodes[n]));
    }
    graph.nodes = std::move(kept);
  }
  // MatMul/Gemm + Add(bias) -> Gemm with the bias.
  auto consumers = Consumers(graph);
  std::set<size_t> removed;
  for (size_t g = 0; g < graph.nodes.size(); ++g) {
    Node& gemm = graph.nodes[g];
    if ((gemm.op != "MatMul" && gemm.op != "Gemm") || gemm.inputs.size() != 2) continue;
    const Tensor* b = FloatConstant(graph, gemm.inputs[1]);
    if (b == nullptr || b->shape.size() != 2) continue;
    const absl::StatusOr<int64_t> trans_b = IntAttribute(gemm, "transB", 0);
    if (!trans_b.ok()) continue;
    const int64_t m = *trans_b ? b->shape[0] : b->shape[1];
    const auto& readers = consumers[gemm.outputs[0]];
    if (readers.size() != 1 || gemm.outputs[0] == graph.output) continue;
    Node& add = graph.nodes[readers[0].first];
    if (add.op != "Add" || add.inputs.size() != 2 || add.inputs[0] == add.inputs[1]) continue;
    const std::string& bias_name = add.inputs[1 - readers[0].second];
    const Tensor* bias = FloatConstant(graph, bias_name);
    if (bias == nullptr || bias->num_elements() != m ||
        !(bias->shape == std::vector<int64_t>{m} || bias->shape == std::vector<int64_t>{1, m})) {
      continue;
    }
    gemm.op = "Gemm";
    gemm.inputs.push_back(bias_name);
    gemm.attributes["beta"] = 1.0f;  // Irrelevant before (no C), 1 for the Add.
    gemm.outputs = add.outputs;
    removed.insert(readers[0].first);
  }
  std::vector<Node> kept;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    if (removed.count(n) == 0) kept.push_back(std::move(graph.nodes[n]));
  }
  graph.nodes = std::move(kept);
}

}  // namespace graph
}  // namespace dptrain
