#include "worker/graph/graph.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dptrain {
namespace graph {
namespace {

absl::Status Invalid(const Node& node, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("node '", node.name, "' (", node.op, "): ", what));
}

// The attribute `name` of `node` if it holds an A; null if absent; an error if of another type.
template <typename A>
absl::StatusOr<const A*> Find(const Node& node, absl::string_view name, const char* type) {
  auto it = node.attributes.find(std::string(name));
  if (it == node.attributes.end()) return nullptr;
  if (const A* a = std::get_if<A>(&it->second)) return a;
  return Invalid(node, absl::StrCat("attribute '", name, "' is not of type ", type));
}

}  // namespace

int64_t Tensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string Tensor::ToString() const {
  return absl::StrCat(type == Type::kFloat ? "float" : "int64", "[", absl::StrJoin(shape, ","),
                      "]");
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[",
                      absl::StrJoin(shape, ", ",
                                    [](std::string* out, int64_t d) {
                                      if (d == kBatchSize) {
                                        out->append("B");
                                      } else if (IsBatchMultiple(d)) {
                                        absl::StrAppend(out, "B*", BatchFactor(d));
                                      } else {
                                        absl::StrAppend(out, d);
                                      }
                                    }),
                      "]");
}

const Tensor* Graph::FindConstant(absl::string_view name) const {
  const NamedConstant* c = FindNamedConstant(name);
  return c != nullptr ? &c->value : nullptr;
}

const NamedConstant* Graph::FindNamedConstant(absl::string_view name) const {
  for (const NamedConstant& c : constants) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

absl::Status ValidateGraph(const Graph& graph) {
  if (graph.nodes.empty()) return absl::InvalidArgumentError("graph has no nodes");
  if (graph.input.empty()) return absl::InvalidArgumentError("graph has no input");
  if (graph.output.empty()) return absl::InvalidArgumentError("graph has no output");
  if (graph.input_dims.c < 1 || graph.input_dims.h < 1 || graph.input_dims.w < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("graph input '", graph.input, "' has dims ", graph.input_dims.ToString()));
  }
  std::set<std::string> defined = {graph.input};
  for (const NamedConstant& c : graph.constants) {
    if (c.name.empty()) return absl::InvalidArgumentError("a constant has no name");
    if (!defined.insert(c.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("value '", c.name, "' is defined twice"));
    }
    const int64_t n = c.value.num_elements();
    const size_t held =
        c.value.type == Tensor::Type::kFloat ? c.value.floats.size() : c.value.ints.size();
    if (n < 0 || static_cast<size_t>(n) != held) {
      return absl::InvalidArgumentError(absl::StrCat(
          "constant '", c.name, "' of shape ", c.value.ToString(), " holds ", held, " values"));
    }
  }
  std::set<std::string> node_names;
  for (const Node& node : graph.nodes) {
    if (node.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("a node of op ", node.op, " has no name"));
    }
    if (!node_names.insert(node.name).second) return Invalid(node, "node name used twice");
    for (const std::string& in : node.inputs) {
      if (!in.empty() && defined.count(in) == 0) {
        return Invalid(node, absl::StrCat("input '", in, "' is not defined before the node"));
      }
    }
    if (node.outputs.empty() || node.outputs[0].empty()) {
      return Invalid(node, "its first output has no name");
    }
    for (const std::string& out : node.outputs) {
      if (out.empty()) continue;  // An optional output left out.
      if (!defined.insert(out).second) {
        return Invalid(node, absl::StrCat("output '", out, "' is defined twice"));
      }
    }
  }
  for (const NamedConstant& c : graph.constants) {
    if (c.name == graph.output) {
      return absl::InvalidArgumentError(
          absl::StrCat("graph output '", graph.output, "' is a constant"));
    }
  }
  if (graph.output == graph.input || defined.count(graph.output) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("graph output '", graph.output, "' is not a node output"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> IntAttribute(const Node& node, absl::string_view name, int64_t fallback) {
  absl::StatusOr<const int64_t*> a = Find<int64_t>(node, name, "INT");
  if (!a.ok()) return a.status();
  return *a == nullptr ? fallback : **a;
}

absl::StatusOr<float> FloatAttribute(const Node& node, absl::string_view name, float fallback) {
  auto it = node.attributes.find(std::string(name));
  if (it == node.attributes.end()) return fallback;
  if (const float* f = std::get_if<float>(&it->second)) return *f;
  if (const int64_t* i = std::get_if<int64_t>(&it->second)) return static_cast<float>(*i);
  return Invalid(node, absl::StrCat("attribute '", name, "' is not of type FLOAT"));
}

double ShortestDecimal(float f) {
  if (!std::isfinite(f)) return f;
  char text[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, static_cast<double>(f));
    if (std::strtof(text, nullptr) == f) return std::strtod(text, nullptr);
  }
  return f;  // Unreachable: 9 significant digits read back as any float.
}

absl::StatusOr<std::string> StringAttribute(const Node& node, absl::string_view name,
                                            const std::string& fallback) {
  absl::StatusOr<const std::string*> a = Find<std::string>(node, name, "STRING");
  if (!a.ok()) return a.status();
  return *a == nullptr ? fallback : **a;
}

absl::StatusOr<std::vector<int64_t>> IntsAttribute(const Node& node, absl::string_view name,
                                                   const std::vector<int64_t>& fallback) {
  absl::StatusOr<const std::vector<int64_t>*> a = Find<std::vector<int64_t>>(node, name, "INTS");
  if (!a.ok()) return a.status();
  return *a == nullptr ? fallback : **a;
}

absl::Status CheckKnownAttributes(const Node& node, const std::vector<absl::string_view>& known) {
  for (const auto& [name, value] : node.attributes) {
    bool found = false;
    for (absl::string_view k : known) found |= k == name;
    if (!found) return Invalid(node, absl::StrCat("unsupported attribute '", name, "'"));
  }
  return absl::OkStatus();
}

}  // namespace graph
}  // namespace dptrain
