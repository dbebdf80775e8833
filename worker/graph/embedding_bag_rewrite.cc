// FuseEmbeddingBag (graph_rewrites.h): nn.EmbeddingBag's Loop over equal bags read back as one
// embedding lookup and a reduction over the bag's axis.
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/graph/graph_rewrites.h"

namespace dptrain {
namespace graph {
namespace {

class Producers {
 public:
  explicit Producers(const Graph& graph) : graph_(graph) {
    for (const Node& node : graph.nodes) {
      for (const std::string& o : node.outputs) producer_[o] = &node;
    }
  }
  // The node writing `value` if its op is `op` (through any Casts), else null.
  const Node* Of(std::string value, const std::string& op) const {
    for (int depth = 0; depth < 8; ++depth) {
      const auto it = producer_.find(value);
      if (it == producer_.end()) return nullptr;
      if (it->second->op == op) return it->second;
      if (it->second->op != "Cast" || it->second->inputs.empty()) return nullptr;
      value = it->second->inputs[0];
    }
    return nullptr;
  }
  // The int64 values of a constant (through Casts of constants folded later: not followed).
  std::optional<std::vector<int64_t>> Ints(const std::string& value) const {
    const Tensor* t = graph_.FindConstant(value);
    if (t == nullptr || t->type != Tensor::Type::kInt64) return std::nullopt;
    return t->ints;
  }
  // Whether `value` is the size of axis `axis` of `of`: Gather(Shape(of), axis), through Casts
  // (and an Unsqueeze of it, where `unsqueezed`).
  bool IsAxisSize(const std::string& value, const std::string& of, int64_t axis,
                  bool unsqueezed = false) const {
    std::string v = value;
    if (unsqueezed) {
      const Node* u = Of(value, "Unsqueeze");
      if (u == nullptr || u->inputs.empty()) return false;
      v = u->inputs[0];
    }
    const Node* g = Of(v, "Gather");
    if (g == nullptr || g->inputs.size() != 2) return false;
    const Node* shape = Of(g->inputs[0], "Shape");
    const std::optional<std::vector<int64_t>> index = Ints(g->inputs[1]);
    return shape != nullptr && shape->inputs.size() == 1 && shape->inputs[0] == of && index &&
           index->size() == 1 && (*index)[0] == axis;
  }

 private:
  const Graph& graph_;
  std::map<std::string, const Node*> producer_;
};

}  // namespace

// The [B, L] ids the bags read: the graph input, or one input of several (a Slice of the one
// input along axis 1, of constant bounds); their L, or nullopt for another value.
std::optional<int64_t> IdsLength(const Graph& graph, const Producers& producers,
                                 const std::string& ids) {
  if (ids == graph.input) {
    if (!graph.input_ids || graph.input_rank != 2) return std::nullopt;
    return graph.input_dims.c;
  }
  const Node* slice = producers.Of(ids, "Slice");
  if (slice == nullptr || slice->inputs.size() != 4 || slice->inputs[0] != kMultiInput ||
      graph.input != kMultiInput || producers.Ints(slice->inputs[3]) != std::vector<int64_t>{1}) {
    return std::nullopt;
  }
  const std::optional<std::vector<int64_t>> begin = producers.Ints(slice->inputs[1]);
  const std::optional<std::vector<int64_t>> end = producers.Ints(slice->inputs[2]);
  if (!begin || !end || begin->size() != 1 || end->size() != 1 || (*end)[0] <= (*begin)[0]) {
    return std::nullopt;
  }
  return (*end)[0] - (*begin)[0];
}

void FuseEmbeddingBag(Graph& graph) {
  const Producers producers(graph);
  std::map<size_t, std::vector<Node>> replacements;
  std::set<std::string> candidates;
  std::set<std::string> names;
  for (const Node& node : graph.nodes) {
    names.insert(node.name);
    names.insert(node.outputs.begin(), node.outputs.end());
  }
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& loop = graph.nodes[n];
    const auto mode = loop.attributes.find("embedding_bag");
    if (loop.op != "Loop" || mode == loop.attributes.end() || loop.inputs.size() != 6) continue;
    const std::string* how = std::get_if<std::string>(&mode->second);
    const std::string &table = loop.inputs[2], &flat = loop.inputs[3], &offsets = loop.inputs[4],
                      &ends = loop.inputs[5];
    // The ids flattened: Reshape(ids, [-1]).
    const Node* reshape = producers.Of(flat, "Reshape");
    if (how == nullptr || reshape == nullptr || reshape->inputs.size() != 2 ||
        producers.Ints(reshape->inputs[1]) != std::vector<int64_t>{-1}) {
      continue;
    }
    const std::string& ids = reshape->inputs[0];
    const std::optional<int64_t> ids_length = IdsLength(graph, producers, ids);
    if (!ids_length) continue;
    const int64_t length = *ids_length;  // L of the [B, L] ids.
    // The offsets: Concat(0, L, 2L, ..., the total) and the ends: their Slice from 1 to the
    // end; the loop runs once per end (bag).
    const Node* concat = producers.Of(offsets, "Concat");
    const Node* slice = producers.Of(ends, "Slice");
    const int64_t kEnd = std::numeric_limits<int64_t>::max();
    if (concat == nullptr || concat->inputs.size() != 2 || slice == nullptr ||
        slice->inputs.size() < 3 || slice->inputs.size() > 5 || slice->inputs[0] != offsets ||
        producers.Ints(slice->inputs[1]) != std::vector<int64_t>{1} ||
        producers.Ints(slice->inputs[2]) != std::vector<int64_t>{kEnd} ||
        (slice->inputs.size() > 3 && producers.Ints(slice->inputs[3]) != std::vector<int64_t>{0}) ||
        (slice->inputs.size() > 4 && producers.Ints(slice->inputs[4]) != std::vector<int64_t>{1}) ||
        !producers.IsAxisSize(concat->inputs[1], flat, 0, /*unsqueezed=*/true) ||
        !producers.IsAxisSize(loop.inputs[0], ends, 0)) {
      continue;
    }
    bool equal_bags = false;
    if (const std::optional<std::vector<int64_t>> starts = producers.Ints(concat->inputs[0])) {
      equal_bags = !starts->empty();
      for (size_t k = 0; k < starts->size(); ++k) {
        equal_bags = equal_bags && (*starts)[k] == static_cast<int64_t>(k) * length;
      }
    } else if (const Node* range = producers.Of(concat->inputs[0], "Range");
               range != nullptr && range->inputs.size() == 3) {
      // A dynamic batch: Range(0, B * L, L), L the ids' second dimension, B * L the product of
      // their Shape.
      const Node* zero = producers.Of(range->inputs[0], "Cast");
      const std::optional<std::vector<int64_t>> start =
          producers.Ints(zero != nullptr ? zero->inputs[0] : range->inputs[0]);
      const Node* product = producers.Of(range->inputs[1], "ReduceProd");
      const Node* shape = product != nullptr && product->inputs.size() == 1
                              ? producers.Of(product->inputs[0], "Shape")
                              : nullptr;
      equal_bags = start == std::vector<int64_t>{0} && shape != nullptr &&
                   shape->inputs.size() == 1 && shape->inputs[0] == ids &&
                   producers.IsAxisSize(range->inputs[2], ids, 1);
    }
    const NamedConstant* weights = graph.FindNamedConstant(table);
    if (!equal_bags || weights == nullptr || weights->value.type != Tensor::Type::kFloat ||
        weights->value.shape.size() != 2) {
      continue;
    }
    auto fresh = [&](const std::string& stem) {
      std::string name = stem;
      for (int i = 1; names.count(name) > 0; ++i) name = absl::StrCat(stem, "_", i);
      names.insert(name);
      return name;
    };
    Node lookup;
    lookup.op = "Gather";
    lookup.name = fresh(loop.name + "/rows");
    lookup.inputs = {table, ids};
    lookup.outputs = {lookup.name};
    lookup.attributes["axis"] = int64_t{0};
    Node reduce;
    reduce.op = *how == "sum" ? "ReduceSum" : *how == "mean" ? "ReduceMean" : "ReduceMax";
    reduce.name = loop.name;
    reduce.inputs = {lookup.name};
    reduce.outputs = loop.outputs;
    reduce.attributes["axes"] = std::vector<int64_t>{1};
    reduce.attributes["keepdims"] = int64_t{0};
    replacements[n] = {std::move(lookup), std::move(reduce)};
    AddProducers(graph, {loop.inputs[0], loop.inputs[1], flat, offsets, ends}, candidates);
  }
  if (replacements.empty()) return;
  ReplaceNodes(graph, std::move(replacements));
  RemoveUnreadNodes(graph, candidates);
}

}  // namespace graph
}  // namespace dptrain
