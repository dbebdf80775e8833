#include "worker/graph/graph_rewrites.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/graph/constant_folding.h"
#include "worker/graph/shape_arithmetic.h"

namespace dptrain {
namespace graph {
namespace {

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
    if (node.op == "Shape" && node.inputs.size() == 1 && constants.count(node.inputs[0]) > 0) {
      // The shape of a constant (x.expand's target computed from a constant list).
      Tensor value;
      value.type = Tensor::Type::kInt64;
      value.ints = graph.constants[constants[node.inputs[0]]].value.shape;
      value.shape = {static_cast<int64_t>(value.ints.size())};
      constants[node.outputs[0]] = graph.constants.size();
      graph.constants.push_back({node.outputs[0], std::move(value)});
      continue;
    }
    std::vector<const Tensor*> inputs;
    const bool arithmetic =
        IsShapeArithmetic(node.op) &&
        !(node.op == "ConstantOfShape" && node.attributes.count("value_int") == 0);
    const bool wide = IsFoldableOnConstants(node.op);
    bool all_int_constants = arithmetic && !node.inputs.empty() && !node.inputs[0].empty();
    bool all_constants = wide && !node.inputs.empty() && !node.inputs[0].empty();
    for (const std::string& name : node.inputs) {
      if (!all_int_constants && !all_constants) break;
      if (name.empty()) {
        inputs.push_back(nullptr);
        continue;
      }
      auto it = constants.find(name);
      const NamedConstant* c = it == constants.end() ? nullptr : &graph.constants[it->second];
      all_int_constants =
          all_int_constants && c != nullptr && c->value.type == Tensor::Type::kInt64;
      // Float constants fold too where they are not model state (a mask, not a weight).
      all_constants =
          all_constants && c != nullptr && (c->value.type == Tensor::Type::kInt64 || !c->state);
      if (c != nullptr) inputs.push_back(&c->value);
    }
    if (!all_int_constants && !all_constants) {
      kept.push_back(std::move(node));
      continue;
    }
    absl::StatusOr<Tensor> folded = absl::InvalidArgumentError("");
    if (all_int_constants) folded = EvaluateShapeArithmetic(node, inputs);
    if (!folded.ok() && all_constants) {
      absl::StatusOr<Tensor> other = FoldConstantNode(node, inputs);
      if (other.ok()) {
        folded = std::move(other);
      } else if (!all_int_constants) {
        // Not foldable here (a batch size yet unknown, an unimplemented form): left for the
        // executor, which says why in one line if nothing else takes it.
        kept.push_back(std::move(node));
        continue;
      }
    }
    DPTRAIN_ASSIGN_OR_RETURN(Tensor value, std::move(folded));
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

void FuseLayerNorm(Graph& graph) {
  auto consumers = Consumers(graph);
  // The node that alone reads `value` (and the graph output does not), or null.
  auto sole_reader = [&](const std::string& value, const char* op) -> Node* {
    auto it = consumers.find(value);
    if (it == consumers.end() || it->second.size() != 1 || value == graph.output) return nullptr;
    Node& n = graph.nodes[it->second[0].first];
    return n.op == op ? &n : nullptr;
  };
  auto last_axis_mean = [](const Node& n) {
    const auto axes = n.attributes.find("axes");
    const auto keep = n.attributes.find("keepdims");
    const auto* a =
        axes == n.attributes.end() ? nullptr : std::get_if<std::vector<int64_t>>(&axes->second);
    const auto* k = keep == n.attributes.end() ? nullptr : std::get_if<int64_t>(&keep->second);
    return n.op == "ReduceMean" && n.inputs.size() == 1 && a != nullptr &&
           *a == std::vector<int64_t>{-1} && (keep == n.attributes.end() || (k && *k == 1)) &&
           n.attributes.size() == (keep == n.attributes.end() ? 1u : 2u);
  };
  auto scalar = [&](const std::string& name) -> std::optional<float> {
    const Tensor* t = FloatConstant(graph, name);
    const NamedConstant* c = graph.FindNamedConstant(name);
    if (t == nullptr || t->num_elements() != 1 || c->state) return std::nullopt;
    return t->floats[0];
  };
  // The other input of a two-input node, given one.
  auto other = [](const Node& n, const std::string& one) -> std::string {
    if (n.inputs.size() != 2) return "";
    return n.inputs[0] == one ? n.inputs[1] : n.inputs[1] == one ? n.inputs[0] : "";
  };
  std::set<const Node*> removed;
  std::vector<std::pair<const Node*, Node>> replaced;  // Last node of a pattern -> the fusion.
  for (Node& mean : graph.nodes) {
    if (!last_axis_mean(mean) || removed.count(&mean) > 0) continue;
    const std::string& x = mean.inputs[0];
    Node* sub = sole_reader(mean.outputs[0], "Sub");
    if (sub == nullptr || sub->inputs.size() != 2 || sub->inputs[0] != x ||
        sub->inputs[1] != mean.outputs[0]) {
      continue;
    }
    const std::string& centred = sub->outputs[0];
    auto readers = consumers.find(centred);
    if (readers == consumers.end() || readers->second.size() != 2 || centred == graph.output) {
      continue;
    }
    Node* pow = nullptr;
    Node* div = nullptr;
    for (const auto& [n, slot] : readers->second) {
      Node& r = graph.nodes[n];
      if (r.op == "Pow" && slot == 0) pow = &r;
      if (r.op == "Div" && slot == 0) div = &r;
    }
    if (pow == nullptr || div == nullptr || pow->inputs.size() != 2 ||
        scalar(pow->inputs[1]) != 2.0f) {
      continue;
    }
    Node* variance = nullptr;
    if (auto it = consumers.find(pow->outputs[0]);
        it != consumers.end() && it->second.size() == 1 && pow->outputs[0] != graph.output) {
      variance = &graph.nodes[it->second[0].first];
    }
    if (variance == nullptr || !last_axis_mean(*variance)) continue;
    Node* add_eps = sole_reader(variance->outputs[0], "Add");
    if (add_eps == nullptr) continue;
    const std::optional<float> eps = scalar(other(*add_eps, variance->outputs[0]));
    if (!eps.has_value() || !(*eps > 0)) continue;
    Node* sqrt = sole_reader(add_eps->outputs[0], "Sqrt");
    if (sqrt == nullptr || div->inputs[1] != sqrt->outputs[0] ||
        sole_reader(sqrt->outputs[0], "Div") != div) {
      continue;
    }
    // The affine part: a 1-D tensor of the model times, then one plus (elementwise_affine).
    Node* mul = sole_reader(div->outputs[0], "Mul");
    if (mul == nullptr) continue;
    const std::string weight = other(*mul, div->outputs[0]);
    const NamedConstant* w = graph.FindNamedConstant(weight);
    if (w == nullptr || !w->state || w->fixed || w->value.type != Tensor::Type::kFloat ||
        w->value.shape.size() != 1) {
      continue;
    }
    Node* last = mul;
    std::string bias;
    if (Node* add = sole_reader(mul->outputs[0], "Add"); add != nullptr) {
      const NamedConstant* b = graph.FindNamedConstant(other(*add, mul->outputs[0]));
      if (b != nullptr && b->state && !b->fixed && b->value.type == Tensor::Type::kFloat &&
          b->value.shape == w->value.shape) {
        bias = b->name;
        last = add;
      }
    }
    Node fused;
    fused.op = "LayerNormalization";
    fused.name = absl::StrCat(mean.name, "/fused");
    fused.inputs = {x, weight};
    if (!bias.empty()) fused.inputs.push_back(bias);
    fused.outputs = {last->outputs[0]};
    fused.attributes["axis"] = int64_t{-1};
    fused.attributes["epsilon"] = *eps;
    for (const Node* n : {static_cast<const Node*>(&mean), static_cast<const Node*>(sub),
                          static_cast<const Node*>(pow), static_cast<const Node*>(variance),
                          static_cast<const Node*>(add_eps), static_cast<const Node*>(sqrt),
                          static_cast<const Node*>(div), static_cast<const Node*>(mul)}) {
      removed.insert(n);
    }
    removed.insert(last);
    replaced.push_back({last, std::move(fused)});
  }
  if (replaced.empty()) return;
  std::vector<Node> kept;
  for (const Node& n : graph.nodes) {
    for (auto& [at, fused] : replaced) {
      if (at == &n) kept.push_back(std::move(fused));
    }
    if (removed.count(&n) == 0) kept.push_back(n);
  }
  graph.nodes = std::move(kept);
}

namespace {

// Einsum(a, b) of a batched matrix product with the same leading letters ("bhid,bhjd->bhij",
// "bhij,bhjd->bhid"), or nullopt: for each operand and the output, the permutation that brings
// it to [lead..., rows, cols] order (empty where it already is).
struct EinsumPlan {
  std::vector<int64_t> perm_a, perm_b, perm_out;
};

std::optional<EinsumPlan> PlanEinsum(const std::string& equation) {
  std::string eq;
  for (char c : equation) {
    if (c != ' ') eq.push_back(c);
  }
  const size_t comma = eq.find(','), arrow = eq.find("->");
  if (comma == std::string::npos || arrow == std::string::npos || arrow < comma) return {};
  const std::string a = eq.substr(0, comma), b = eq.substr(comma + 1, arrow - comma - 1),
                    out = eq.substr(arrow + 2);
  for (const std::string* t : {&a, &b, &out}) {
    if (t->size() < 2 || t->find('.') != std::string::npos) return {};
    for (char c : *t) {
      if (!std::isalpha(static_cast<unsigned char>(c)) || std::count(t->begin(), t->end(), c) > 1) {
        return {};
      }
    }
  }
  if (a.size() != b.size() || a.size() != out.size()) return {};
  // The one letter summed over (in both inputs, not in the output); the rows (a's other letter
  // not in b) and the columns (b's not in a); every other letter is in all three.
  std::string lead;
  char k = 0, m = 0, n = 0;
  for (char c : a) {
    const bool in_b = b.find(c) != std::string::npos, in_out = out.find(c) != std::string::npos;
    if (in_b && in_out) {
      lead.push_back(c);
    } else if (in_b && !in_out) {
      if (k != 0) return {};
      k = c;
    } else if (!in_b && in_out) {
      if (m != 0) return {};
      m = c;
    } else {
      return {};
    }
  }
  for (char c : b) {
    if (a.find(c) == std::string::npos) {
      if (n != 0 || out.find(c) == std::string::npos) return {};
      n = c;
    }
  }
  if (k == 0 || m == 0 || n == 0) return {};
  auto perm = [&](const std::string& from, const std::string& to) {
    std::vector<int64_t> p;
    for (char c : to) p.push_back(static_cast<int64_t>(from.find(c)));
    bool identity = true;
    for (size_t i = 0; i < p.size(); ++i) identity = identity && p[i] == static_cast<int64_t>(i);
    return identity ? std::vector<int64_t>{} : p;
  };
  EinsumPlan plan;
  plan.perm_a = perm(a, lead + m + k);
  plan.perm_b = perm(b, lead + k + n);
  // MatMul gives lead + m + n; the output's order from it.
  plan.perm_out = perm(lead + m + n, out);
  return plan;
}

}  // namespace

void EinsumToMatMul(Graph& graph) {
  std::set<std::string> names = {graph.input};
  for (const NamedConstant& c : graph.constants) names.insert(c.name);
  for (const Node& node : graph.nodes) {
    for (const std::string& o : node.outputs) names.insert(o);
  }
  auto fresh = [&](const std::string& stem) {
    std::string name = stem;
    for (int i = 1; names.count(name) > 0; ++i) name = absl::StrCat(stem, "_", i);
    names.insert(name);
    return name;
  };
  std::vector<Node> kept;
  for (Node& node : graph.nodes) {
    const auto eq = node.attributes.find("equation");
    const std::string* equation =
        eq == node.attributes.end() ? nullptr : std::get_if<std::string>(&eq->second);
    std::optional<EinsumPlan> plan;
    if (node.op == "Einsum" && node.inputs.size() == 2 && node.outputs.size() == 1 &&
        equation != nullptr && node.attributes.size() == 1) {
      plan = PlanEinsum(*equation);
    }
    if (!plan.has_value()) {
      kept.push_back(std::move(node));
      continue;
    }
    auto transposed = [&](const std::string& input, const std::vector<int64_t>& perm,
                          const char* role) {
      if (perm.empty()) return input;
      Node t;
      t.op = "Transpose";
      t.name = absl::StrCat(node.name, "/", role);
      t.inputs = {input};
      t.outputs = {fresh(t.name)};
      t.attributes["perm"] = perm;
      kept.push_back(t);
      return t.outputs[0];
    };
    Node matmul;
    matmul.op = "MatMul";
    matmul.name = node.name;
    matmul.inputs = {transposed(node.inputs[0], plan->perm_a, "a"),
                     transposed(node.inputs[1], plan->perm_b, "b")};
    matmul.outputs = {plan->perm_out.empty() ? node.outputs[0] : fresh(node.name + "/product")};
    const std::string product = matmul.outputs[0];
    kept.push_back(std::move(matmul));
    if (!plan->perm_out.empty()) {
      Node t;
      t.op = "Transpose";
      t.name = absl::StrCat(node.name, "/out");
      t.inputs = {product};
      t.outputs = {node.outputs[0]};
      t.attributes["perm"] = plan->perm_out;
      kept.push_back(std::move(t));
    }
  }
  graph.nodes = std::move(kept);
}

void SplitToSlices(Graph& graph) {
  std::set<std::string> names;
  for (const NamedConstant& c : graph.constants) names.insert(c.name);
  for (const Node& node : graph.nodes) {
    for (const std::string& o : node.outputs) names.insert(o);
  }
  auto int_constant = [&](const std::string& stem, std::vector<int64_t> values) {
    std::string name = stem;
    for (int i = 1; names.count(name) > 0; ++i) name = absl::StrCat(stem, "_", i);
    names.insert(name);
    Tensor t;
    t.type = Tensor::Type::kInt64;
    t.shape = {static_cast<int64_t>(values.size())};
    t.ints = std::move(values);
    graph.constants.push_back({name, std::move(t)});
    return name;
  };
  std::vector<Node> kept;
  for (Node& node : graph.nodes) {
    if (node.op != "Split" || node.inputs.empty()) {
      kept.push_back(std::move(node));
      continue;
    }
    // The sizes: input 1 (opset 13) or the split attribute (before).
    std::vector<int64_t> sizes;
    if (node.inputs.size() > 1 && !node.inputs[1].empty()) {
      const Tensor* t = graph.FindConstant(node.inputs[1]);
      if (t != nullptr && t->type == Tensor::Type::kInt64) sizes = t->ints;
    } else if (auto it = node.attributes.find("split"); it != node.attributes.end()) {
      if (const auto* v = std::get_if<std::vector<int64_t>>(&it->second)) sizes = *v;
    }
    const auto axis = node.attributes.find("axis");
    const int64_t* axis_value =
        axis == node.attributes.end() ? nullptr : std::get_if<int64_t>(&axis->second);
    bool known = sizes.size() == node.outputs.size() && node.attributes.size() <= 2;
    int64_t total = 0;
    for (int64_t size : sizes) {
      known = known && size >= 1 && !__builtin_add_overflow(total, size, &total);
    }
    for (const auto& [attribute, value] : node.attributes) {
      known = known && (attribute == "axis" || attribute == "split");
    }
    // Equal parts (no sizes given: F.glu, x.chunk of an even size as opset 13 writes it): the
    // axis's size from the Shape of the input, evaluated when the model loads, parts of size /
    // n (the last to the end). Anything else is left for the op check.
    bool equal = sizes.empty() && !node.outputs.empty() &&
                 (node.inputs.size() == 1 || node.inputs[1].empty());
    for (const auto& [attribute, value] : node.attributes) {
      const int64_t* v = std::get_if<int64_t>(&value);
      equal = equal && (attribute == "axis" || (attribute == "num_outputs" && v != nullptr &&
                                                *v == static_cast<int64_t>(node.outputs.size())));
    }
    if (!known && equal) {
      const int64_t a = axis_value != nullptr ? *axis_value : 0;
      const int64_t parts = static_cast<int64_t>(node.outputs.size());
      auto value = [&](const std::string& stem) {
        std::string name = stem;
        for (int i = 1; names.count(name) > 0; ++i) name = absl::StrCat(stem, "_", i);
        names.insert(name);
        return name;
      };
      auto add = [&](const std::string& op, const std::string& stem,
                     std::vector<std::string> inputs) {
        Node n;
        n.op = op;
        n.name = value(absl::StrCat(node.name, "/", stem));
        n.inputs = std::move(inputs);
        n.outputs = {n.name};
        const std::string out = n.name;
        kept.push_back(std::move(n));
        return out;
      };
      const std::string axes = int_constant(absl::StrCat(node.name, "/axes"), {a});
      const std::string shape = add("Shape", "shape", {node.inputs[0]});
      const std::string size = add("Gather", "size", {shape, axes});
      // ONNX's ceil(size / n) per part, the last smaller: (size + n - 1) / n.
      const std::string rounded =
          add("Add", "rounded", {size, int_constant(absl::StrCat(node.name, "/n_1"), {parts - 1})});
      const std::string part =
          add("Div", "part", {rounded, int_constant(absl::StrCat(node.name, "/parts"), {parts})});
      std::string start = int_constant(absl::StrCat(node.name, "/zero"), {0});
      for (int64_t i = 0; i < parts; ++i) {
        const std::string end =
            i + 1 == parts
                ? size
                : add("Mul", absl::StrCat(i, "/end"),
                      {part, int_constant(absl::StrCat(node.name, "/", i + 1), {i + 1})});
        if (!node.outputs[i].empty()) {
          Node slice;
          slice.op = "Slice";
          slice.name = value(absl::StrCat(node.name, "/", i));
          slice.inputs = {node.inputs[0], start, end, axes};
          slice.outputs = {node.outputs[i]};
          kept.push_back(std::move(slice));
        }
        start = end;
      }
      continue;
    }
    if (!known) {
      kept.push_back(std::move(node));
      continue;
    }
    const int64_t a = axis_value != nullptr ? *axis_value : 0;
    const std::string axes = int_constant(absl::StrCat(node.name, "/axes"), {a});
    int64_t start = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      Node slice;
      slice.op = "Slice";
      slice.name = absl::StrCat(node.name, "/", i);
      slice.inputs = {node.inputs[0], int_constant(absl::StrCat(slice.name, "/starts"), {start}),
                      int_constant(absl::StrCat(slice.name, "/ends"), {start + sizes[i]}), axes};
      slice.outputs = {node.outputs[i]};
      start += sizes[i];
      if (!node.outputs[i].empty()) kept.push_back(std::move(slice));
    }
  }
  graph.nodes = std::move(kept);
}

void FuseChannelShuffle(Graph& graph) {
  auto consumers = Consumers(graph);
  // The node reading `value` (once, as its input 0, and not the graph's output), else null.
  auto sole_reader = [&](const std::string& value, const char* op) -> Node* {
    const auto& readers = consumers[value];
    if (readers.size() != 1 || readers[0].second != 0 || value == graph.output) return nullptr;
    Node& reader = graph.nodes[readers[0].first];
    return reader.op == op ? &reader : nullptr;
  };
  std::set<size_t> removed;
  for (size_t r = 0; r < graph.nodes.size(); ++r) {
    Node& split = graph.nodes[r];
    if (split.op != "Reshape" || split.inputs.size() != 2 || removed.count(r) > 0) continue;
    Node* transpose = sole_reader(split.outputs[0], "Transpose");
    if (transpose == nullptr) continue;
    absl::StatusOr<std::vector<int64_t>> perm = IntsAttribute(*transpose, "perm", {});
    if (!perm.ok() || *perm != std::vector<int64_t>{0, 2, 1, 3, 4}) continue;
    Node* merge = sole_reader(transpose->outputs[0], "Reshape");
    // allowzero=1 would read a 0 in a shape as 0, not as the input's dimension.
    auto allow_zero = [](const Node& reshape) {
      absl::StatusOr<int64_t> a = IntAttribute(reshape, "allowzero", 0);
      return !a.ok() || *a != 0 ||
             reshape.attributes.size() > (reshape.attributes.count("allowzero"));
    };
    if (merge == nullptr || merge->inputs.size() != 2 || allow_zero(split) || allow_zero(*merge)) {
      continue;
    }
    // The shuffle takes the merging Reshape's place (after whatever computes the two shapes),
    // named after the Transpose; the other two go.
    Node shuffle;
    shuffle.op = "ChannelShuffle";
    shuffle.name = transpose->name;
    shuffle.inputs = {split.inputs[0], split.inputs[1], merge->inputs[1]};
    shuffle.outputs = merge->outputs;
    removed.insert(r);
    removed.insert(static_cast<size_t>(transpose - graph.nodes.data()));
    *merge = std::move(shuffle);
  }
  std::vector<Node> kept;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    if (removed.count(n) == 0) kept.push_back(std::move(graph.nodes[n]));
  }
  graph.nodes = std::move(kept);
}

namespace {

bool HasPerm(const Node& node, const std::vector<int64_t>& perm) {
  if (node.op != "Transpose" || node.inputs.size() != 1) return false;
  absl::StatusOr<std::vector<int64_t>> p = IntsAttribute(node, "perm", {});
  return p.ok() && *p == perm;
}

// Whether SinkChannelsLast can move `node` channels-first: an element-wise op, a mean over
// the last axis kept as one, or a Linear (a Gemm of FuseLinear) applied at each pixel.
bool SinkableOp(const Graph& graph, const Node& node) {
  static const std::set<std::string> kElementWise = {
      "Add",  "Sub",     "Mul",  "Div",      "Pow",       "Sqrt",        "Erf",
      "Relu", "Sigmoid", "Tanh", "Identity", "HardSwish", "HardSigmoid", "LeakyRelu",
      "Neg",  "Abs",     "Exp",  "Log",      "Reciprocal"};
  if (node.outputs.size() != 1 || node.attributes.count("operand_shape") > 0) return false;
  if (kElementWise.count(node.op) > 0) return true;
  if (node.op == "ReduceMean") {
    absl::StatusOr<std::vector<int64_t>> axes = IntsAttribute(node, "axes", {});
    absl::StatusOr<int64_t> keep = IntAttribute(node, "keepdims", 1);
    return axes.ok() && keep.ok() && *keep == 1 &&
           (*axes == std::vector<int64_t>{-1} || *axes == std::vector<int64_t>{3}) &&
           node.attributes.size() <= 2;
  }
  if (node.op == "Gemm") {
    absl::StatusOr<int64_t> trans_b = IntAttribute(node, "transB", 0);
    absl::StatusOr<int64_t> trans_a = IntAttribute(node, "transA", 0);
    absl::StatusOr<float> alpha = FloatAttribute(node, "alpha", 1.0f);
    absl::StatusOr<float> beta = FloatAttribute(node, "beta", 1.0f);
    const Tensor* w = node.inputs.size() >= 2 ? graph.FindConstant(node.inputs[1]) : nullptr;
    const Tensor* b = node.inputs.size() == 3 ? graph.FindConstant(node.inputs[2]) : nullptr;
    return trans_b.ok() && *trans_b == 1 && trans_a.ok() && *trans_a == 0 && alpha.ok() &&
           *alpha == 1.0f && beta.ok() && *beta == 1.0f && w != nullptr && w->shape.size() == 2 &&
           (node.inputs.size() == 2 || (b != nullptr && b->shape.size() == 1));
  }
  return false;
}

// One channels-last region starting at node `start` (Transpose perm [0, 2, 3, 1]); true when
// it was rewritten.
bool SinkRegion(Graph& graph, size_t start) {
  auto consumers = Consumers(graph);
  const Node& first = graph.nodes[start];
  std::set<std::string> inside = {first.outputs[0]};  // Values in channels-last layout.
  std::set<size_t> region, ends;
  std::vector<std::string> queue = {first.outputs[0]};
  while (!queue.empty()) {
    const std::string v = queue.back();
    queue.pop_back();
    if (v == graph.output) return false;
    for (const auto& [n, slot] : consumers[v]) {
      const Node& node = graph.nodes[n];
      if (HasPerm(node, {0, 3, 1, 2})) {
        ends.insert(n);
        continue;
      }
      if (region.count(n) > 0) continue;
      if (!SinkableOp(graph, node)) return false;
      region.insert(n);
      inside.insert(node.outputs[0]);
      queue.push_back(node.outputs[0]);
    }
  }
  if (ends.empty()) return false;
  // Every other input of the region: a value of the region, or a constant that lines up with
  // the channels after the move (a scalar or a 1-D per-channel tensor; a Gemm's weights).
  for (size_t n : region) {
    const Node& node = graph.nodes[n];
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const std::string& in = node.inputs[i];
      if (in.empty() || inside.count(in) > 0) continue;
      const Tensor* c = graph.FindConstant(in);
      if (c == nullptr) return false;
      if (node.op == "Gemm" || node.op == "Pow") continue;
      if (c->num_elements() != 1 && c->shape.size() != 1) return false;
    }
  }
  // Rewrite: the region reads the transposed value itself, the ends' readers read the region's.
  std::map<std::string, std::string> rename = {{first.outputs[0], first.inputs[0]}};
  for (size_t e : ends) rename[graph.nodes[e].outputs[0]] = graph.nodes[e].inputs[0];
  auto renamed = [&rename](const std::string& v) {
    // An end may read the start directly: follow the chain.
    std::string r = v;
    for (auto it = rename.find(r); it != rename.end(); it = rename.find(r)) r = it->second;
    return r;
  };
  for (Node& node : graph.nodes) {
    for (std::string& in : node.inputs) in = renamed(in);
  }
  graph.output = renamed(graph.output);
  for (size_t n : region) {
    Node& node = graph.nodes[n];
    if (node.op == "ReduceMean") {
      node.attributes["axes"] = std::vector<int64_t>{1};
    } else if (node.op == "Gemm") {
      node.op = "Conv";
      node.attributes.clear();
      node.attributes["kernel_shape"] = std::vector<int64_t>{1, 1};
    } else if (node.inputs.size() == 2) {
      for (const std::string& in : node.inputs) {
        const Tensor* c = graph.FindConstant(in);
        if (c != nullptr && c->shape.size() == 1 && c->num_elements() > 1) {
          node.attributes["operand_shape"] = std::vector<int64_t>{c->shape[0], 1, 1};
        }
      }
    }
  }
  std::vector<Node> kept;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    if (n != start && ends.count(n) == 0) kept.push_back(std::move(graph.nodes[n]));
  }
  graph.nodes = std::move(kept);
  return true;
}

}  // namespace

void SinkChannelsLast(Graph& graph) {
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    if (!HasPerm(node, {0, 2, 3, 1}) || graph.FindConstant(node.inputs[0]) != nullptr) continue;
    if (SinkRegion(graph, n)) n = static_cast<size_t>(-1);  // Indices moved: from the start.
  }
}

void ViewStateOperands(Graph& graph) {
  auto consumers = Consumers(graph);
  std::set<size_t> removed;
  for (size_t v = 0; v < graph.nodes.size(); ++v) {
    const Node& view = graph.nodes[v];
    if ((view.op != "Unsqueeze" && view.op != "Reshape") || view.inputs.empty()) continue;
    const NamedConstant* state = graph.FindNamedConstant(view.inputs[0]);
    if (state == nullptr || !state->state || state->value.type != Tensor::Type::kFloat) continue;
    // The view's shape, from constant axes or a constant target shape (0 and -1 resolved).
    std::vector<int64_t> shape = state->value.shape;
    if (view.op == "Unsqueeze") {
      std::vector<int64_t> axes;
      if (view.inputs.size() > 1) {
        const Tensor* a = graph.FindConstant(view.inputs[1]);
        if (a == nullptr || a->type != Tensor::Type::kInt64) continue;
        axes = a->ints;
      } else {
        absl::StatusOr<std::vector<int64_t>> a = IntsAttribute(view, "axes", {});
        if (!a.ok()) continue;
        axes = *a;
      }
      const int64_t rank = static_cast<int64_t>(shape.size() + axes.size());
      std::vector<int64_t> normal;
      for (int64_t a : axes) normal.push_back(a < 0 ? a + rank : a);
      std::sort(normal.begin(), normal.end());
      bool ok = true;
      for (int64_t a : normal) {
        if (a < 0 || a > static_cast<int64_t>(shape.size())) {
          ok = false;
          break;
        }
        shape.insert(shape.begin() + a, 1);
      }
      if (!ok) continue;
    } else {
      const Tensor* target = view.inputs.size() == 2 ? graph.FindConstant(view.inputs[1]) : nullptr;
      if (target == nullptr || target->type != Tensor::Type::kInt64) continue;
      int64_t known = 1, infer = -1;
      shape = target->ints;
      bool ok = true;
      for (size_t i = 0; i < shape.size() && ok; ++i) {
        if (shape[i] == 0) {  // Copy the tensor's dimension (allowzero=0).
          if (i >= state->value.shape.size()) {
            ok = false;
            break;
          }
          shape[i] = state->value.shape[i];
        }
        if (shape[i] == -1 && infer < 0) {
          infer = static_cast<int64_t>(i);
        } else if (shape[i] < 1) {
          ok = false;
        } else {
          known *= shape[i];
        }
      }
      if (!ok) continue;
      if (infer >= 0) {
        if (state->value.num_elements() % known != 0) continue;
        shape[infer] = state->value.num_elements() / known;
      }
    }
    // Every reader an element-wise op with two inputs; each then reads the state itself.
    const auto& readers = consumers[view.outputs[0]];
    bool all_binary = !readers.empty() && view.outputs[0] != graph.output;
    for (const auto& [n, slot] : readers) {
      const Node& r = graph.nodes[n];
      all_binary =
          all_binary && r.inputs.size() == 2 && r.attributes.empty() &&
          (r.op == "Add" || r.op == "Sub" || r.op == "Mul" || r.op == "Div" || r.op == "PRelu");
    }
    if (!all_binary) continue;
    for (const auto& [n, slot] : readers) {
      Node& r = graph.nodes[n];
      r.inputs[slot] = view.inputs[0];
      r.attributes["operand_shape"] = shape;
    }
    removed.insert(v);
  }
  std::vector<Node> kept;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    if (removed.count(n) == 0) kept.push_back(std::move(graph.nodes[n]));
  }
  graph.nodes = std::move(kept);
}

}  // namespace graph
}  // namespace dptrain
