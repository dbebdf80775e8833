// FuseTorchRecurrent (graph_rewrites.h): torch's export of an nn.LSTM or nn.GRU layer read back
// as one TorchLSTM or TorchGRU node (recurrent_ops.h) on the state_dict's tensors; and
// UnsortPackedSequences: pack_padded_sequence's sort by length taken out again.
#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "worker/graph/graph_rewrites.h"

namespace dptrain {
namespace graph {

namespace {

// The values some node reads.
std::set<std::string> ReadValues(const Graph& graph) {
  std::set<std::string> read;
  for (const Node& node : graph.nodes) {
    for (const std::string& in : node.inputs) {
      if (!in.empty()) read.insert(in);
    }
  }
  return read;
}

// What FuseTorchRecurrent reads of the graph: which node writes each value, and the constants.
class RecurrentPattern {
 public:
  explicit RecurrentPattern(const Graph& graph) : graph_(graph) {
    for (size_t n = 0; n < graph.nodes.size(); ++n) {
      for (const std::string& o : graph.nodes[n].outputs) producer_[o] = n;
    }
  }

  // The node writing `value` if its op is `op`, else null.
  const Node* Producer(const std::string& value, absl::string_view op) const {
    const auto it = producer_.find(value);
    if (it == producer_.end() || graph_.nodes[it->second].op != op) return nullptr;
    return &graph_.nodes[it->second];
  }

  // The one int64 of a constant input, or nullopt.
  std::optional<int64_t> OneInt(const Node& node, size_t input) const {
    if (input >= node.inputs.size()) return std::nullopt;
    const Tensor* t = graph_.FindConstant(node.inputs[input]);
    if (t == nullptr || t->type != Tensor::Type::kInt64 || t->ints.size() != 1) return std::nullopt;
    return t->ints[0];
  }

  // x.unsqueeze(0) as exported (axes as input 1 or attribute): its input, or nullopt.
  std::optional<std::string> UnsqueezedAtZero(const std::string& value) const {
    const Node* u = Producer(value, "Unsqueeze");
    if (u == nullptr || u->inputs.empty()) return std::nullopt;
    const absl::StatusOr<std::vector<int64_t>> axes = IntsAttribute(*u, "axes", {});
    const bool zero = u->inputs.size() == 2 ? OneInt(*u, 1) == int64_t{0}
                                            : axes.ok() && *axes == std::vector<int64_t>{0};
    if (!zero) return std::nullopt;
    return u->inputs[0];
  }

  // Concat along axis 0 of `count` values: them, or empty.
  std::vector<std::string> ConcatParts(const std::string& value, size_t count) const {
    const Node* c = Producer(value, "Concat");
    if (c == nullptr || c->inputs.size() != count) return {};
    const absl::StatusOr<int64_t> axis = IntAttribute(*c, "axis", -1);
    if (!axis.ok() || *axis != 0) return {};
    return c->inputs;
  }

  // A state tensor S of PyTorch's gate rows re-ordered to ONNX's as torch.onnx.export writes
  // it: Concat(S[a0:b0], S[a1:b1], S[a2:b2]) with the ranges given (an LSTM's i, f, g, o -> i, o,
  // f, g; a GRU's r, z, n -> z, r, n) and S of `rows` rows. S's name, or nullopt.
  // `columns`: S's second axis (a weight; -1: any), or 0 for a bias of one axis.
  std::optional<std::string> TorchGateRows(const std::string& value,
                                           const std::array<std::array<int64_t, 2>, 3>& ranges,
                                           int64_t rows, int64_t columns) const {
    const std::vector<std::string> parts = ConcatParts(value, 3);
    if (parts.empty()) return std::nullopt;
    std::string source;
    for (int k = 0; k < 3; ++k) {
      const Node* s = Producer(parts[k], "Slice");
      if (s == nullptr || s->inputs.size() < 3 || s->inputs.size() > 5) return std::nullopt;
      if (OneInt(*s, 1) != ranges[k][0] || OneInt(*s, 2) != ranges[k][1]) return std::nullopt;
      if (s->inputs.size() > 3 && OneInt(*s, 3) != int64_t{0}) return std::nullopt;
      if (s->inputs.size() > 4 && OneInt(*s, 4) != int64_t{1}) return std::nullopt;
      if (k > 0 && s->inputs[0] != source) return std::nullopt;
      source = s->inputs[0];
    }
    const NamedConstant* c = graph_.FindNamedConstant(source);
    if (c == nullptr || !c->state || c->value.type != Tensor::Type::kFloat ||
        c->value.shape.size() != static_cast<size_t>(columns == 0 ? 1 : 2) ||
        c->value.shape[0] != rows || (columns > 0 && c->value.shape[1] != columns)) {
      return std::nullopt;
    }
    return source;
  }

  // An ONNX W, R or B input of `directions` directions as torch writes it: one unsqueezed
  // value, or a Concat of two. The per-direction values, or empty.
  std::vector<std::string> PerDirection(const std::string& value, int64_t directions) const {
    const std::vector<std::string> parts =
        directions == 1 ? std::vector<std::string>{value} : ConcatParts(value, 2);
    std::vector<std::string> out;
    for (const std::string& p : parts) {
      const std::optional<std::string> v = UnsqueezedAtZero(p);
      if (!v) return {};
      out.push_back(*v);
    }
    return out.size() == static_cast<size_t>(directions) ? out : std::vector<std::string>{};
  }

  // An absent initial state, or zeros: a zero constant (not a learned one: an nn.Parameter
  // expanded is left to be refused), a ConstantOfShape of 0 (a dynamic batch's), or an Expand or
  // a Slice (a layer's part of the stack's zeros) of such.
  bool ZeroState(const std::string& value, int depth = 0) const {
    if (value.empty()) return true;
    if (depth > 4) return false;
    for (const char* op : {"Expand", "Slice"}) {
      if (const Node* n = Producer(value, op); n != nullptr && !n->inputs.empty()) {
        return ZeroState(n->inputs[0], depth + 1);
      }
    }
    if (const Node* n = Producer(value, "ConstantOfShape"); n != nullptr) {
      const auto it = n->attributes.find("value_float");
      const auto int_value = n->attributes.find("value_int");
      const float* v = it == n->attributes.end() ? nullptr : std::get_if<float>(&it->second);
      return int_value == n->attributes.end() &&
             (it == n->attributes.end() || (v != nullptr && *v == 0.0f));
    }
    const NamedConstant* c = graph_.FindNamedConstant(value);
    if (c == nullptr || c->state || c->value.type != Tensor::Type::kFloat) return false;
    return std::all_of(c->value.floats.begin(), c->value.floats.end(),
                       [](float v) { return v == 0.0f; });
  }

 private:
  const Graph& graph_;
  std::map<std::string, size_t> producer_;
};

}  // namespace

namespace {

// Who reads each value: (node index, input index) pairs.
std::map<std::string, std::vector<std::pair<size_t, size_t>>> Readers(const Graph& graph) {
  std::map<std::string, std::vector<std::pair<size_t, size_t>>> readers;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    for (size_t k = 0; k < graph.nodes[n].inputs.size(); ++k) {
      if (!graph.nodes[n].inputs[k].empty()) readers[graph.nodes[n].inputs[k]].push_back({n, k});
    }
  }
  return readers;
}

}  // namespace

void UnsortPackedSequences(Graph& graph) {
  const auto readers = Readers(graph);
  auto reads_of = [&](const std::string& v) {
    const auto it = readers.find(v);
    return it == readers.end() ? std::vector<std::pair<size_t, size_t>>{} : it->second;
  };
  // `value` and every Cast of it (and of those): the same numbers in another integer type.
  auto with_casts = [&](const std::string& value, std::set<size_t>& casts) {
    std::vector<std::string> all = {value};
    std::set<std::string> seen = {value};  // A malformed graph's cycle ends here.
    for (size_t i = 0; i < all.size(); ++i) {
      for (const auto& [n, k] : reads_of(all[i])) {
        const Node& cast = graph.nodes[n];
        if (cast.op != "Cast" || cast.outputs.size() != 1 || !seen.insert(cast.outputs[0]).second) {
          continue;
        }
        casts.insert(n);
        all.push_back(cast.outputs[0]);
      }
    }
    return std::set<std::string>(all.begin(), all.end());
  };
  std::map<std::string, std::string> renamed;  // A value read instead of another.
  std::set<std::string> candidates;            // Nodes that may now be unread.
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& top = graph.nodes[n];
    if (top.op != "TopK" || top.inputs.size() != 2 || top.outputs.size() != 2) continue;
    const absl::StatusOr<int64_t> largest = IntAttribute(top, "largest", 1);
    if (!largest.ok() || *largest != 1) continue;
    std::set<size_t> pattern_nodes = {n};
    const std::set<std::string> sorted = with_casts(top.outputs[0], pattern_nodes);
    const std::set<std::string> order = with_casts(top.outputs[1], pattern_nodes);
    // The order only gathers (the batch into sorted order), builds the inverse order (which
    // only gathers back) or gives its size (the inverse's arange, with a dynamic batch); the
    // sorted lengths go only to recurrent layers' sequence_lens or are gathered back
    // (pad_packed_sequence's lengths).
    bool matched = true;
    std::vector<size_t> gathers;  // Of the batch, by the order or its inverse.
    std::set<std::string> inverse;
    for (const std::string& v : order) {
      for (const auto& [r, k] : reads_of(v)) {
        const Node& reader = graph.nodes[r];
        if (pattern_nodes.count(r)) continue;
        if (reader.op == "Gather" && k == 1 && reader.outputs.size() == 1) {
          gathers.push_back(r);
        } else if (reader.op == "Shape") {
          pattern_nodes.insert(r);
        } else if (reader.op == "ScatterElements" && k == 1 && reader.outputs.size() == 1) {
          pattern_nodes.insert(r);
          const std::set<std::string> inv = with_casts(reader.outputs[0], pattern_nodes);
          inverse.insert(inv.begin(), inv.end());
        } else {
          matched = false;
        }
      }
    }
    std::vector<size_t> layers, unsorted_lengths;
    for (const std::string& v : inverse) {
      for (const auto& [r, k] : reads_of(v)) {
        const Node& reader = graph.nodes[r];
        if (pattern_nodes.count(r)) continue;
        matched = matched && reader.op == "Gather" && k == 1 && reader.outputs.size() == 1;
        if (!matched) break;
        (sorted.count(reader.inputs[0]) ? unsorted_lengths : gathers).push_back(r);
      }
    }
    for (const std::string& v : sorted) {
      for (const auto& [r, k] : reads_of(v)) {
        const Node& reader = graph.nodes[r];
        if (pattern_nodes.count(r)) continue;
        const bool layer = (reader.op == "LSTM" || reader.op == "GRU") && k == 4;
        const bool unsort = reader.op == "Gather" && k == 0 && reader.inputs.size() == 2 &&
                            inverse.count(reader.inputs[1]) > 0;
        matched = matched && (layer || unsort);
        if (layer) layers.push_back(r);
      }
    }
    if (!matched || layers.empty() || gathers.empty()) continue;
    // Each sample in its own place: the layers read the unsorted batch and the lengths in its
    // order, and the gathers into and out of the sorted order read what they would permute.
    std::map<std::string, std::string> mine;
    for (size_t r : layers) mine[graph.nodes[r].inputs[4]] = top.inputs[0];
    for (size_t r : unsorted_lengths) mine[graph.nodes[r].outputs[0]] = top.inputs[0];
    for (size_t r : gathers) mine[graph.nodes[r].outputs[0]] = graph.nodes[r].inputs[0];
    for (size_t r : unsorted_lengths) pattern_nodes.insert(r);
    for (size_t r : gathers) pattern_nodes.insert(r);
    if (std::any_of(mine.begin(), mine.end(), [](const auto& m) { return m.first == m.second; })) {
      continue;  // A value gathered from itself: a malformed graph, left to be refused.
    }
    renamed.insert(mine.begin(), mine.end());
    // Everything the pattern computed from (k, the inverse's constants) may now be unread.
    std::vector<std::string> pending;
    for (size_t p : pattern_nodes) {
      candidates.insert(graph.nodes[p].name);
      for (size_t k = 0; k < graph.nodes[p].inputs.size(); ++k) {
        if (graph.nodes[p].op == "Gather" && k == 0) continue;  // The data: read on.
        pending.push_back(graph.nodes[p].inputs[k]);
      }
    }
    AddProducers(graph, std::move(pending), candidates);
  }
  if (renamed.empty()) return;
  // Each renamed value's final name, a chain of renames followed to its end; a cycle (only a
  // malformed graph has one) leaves the graph as it was, to be refused.
  std::map<std::string, std::string> final_name;
  for (const auto& [from, to] : renamed) {
    std::string v = to;
    size_t steps = 0;
    for (auto it = renamed.find(v); it != renamed.end(); it = renamed.find(v)) {
      if (++steps > renamed.size()) return;
      v = it->second;
    }
    final_name[from] = v;
  }
  auto resolve = [&](const std::string& v) {
    const auto it = final_name.find(v);
    return it == final_name.end() ? v : it->second;
  };
  for (Node& node : graph.nodes) {
    for (std::string& in : node.inputs) {
      if (!in.empty()) in = resolve(in);
    }
  }
  graph.output = resolve(graph.output);
  RemoveUnreadNodes(graph, candidates);
}

void FuseTorchRecurrent(Graph& graph) {
  const RecurrentPattern pattern(graph);
  std::map<size_t, std::vector<Node>> replacements;  // Per LSTM or GRU node index.
  std::set<std::string> candidates;                  // Nodes (by name) that may now be unread.
  const std::set<std::string> read = ReadValues(graph);
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& rnn = graph.nodes[n];
    const bool lstm = rnn.op == "LSTM";
    if ((!lstm && rnn.op != "GRU") || rnn.inputs.size() < 3) continue;
    const absl::StatusOr<int64_t> hidden = IntAttribute(rnn, "hidden_size", 0);
    const absl::StatusOr<std::string> direction = StringAttribute(rnn, "direction", "forward");
    const absl::StatusOr<int64_t> layout = IntAttribute(rnn, "layout", 0);
    const absl::StatusOr<int64_t> forget = IntAttribute(rnn, "input_forget", 0);
    const absl::StatusOr<int64_t> before_reset = IntAttribute(rnn, "linear_before_reset", 0);
    if (!hidden.ok() || *hidden < 1 || !direction.ok() ||
        (*direction != "forward" && *direction != "bidirectional") || !layout.ok() ||
        *layout != 0 || !forget.ok() || *forget != 0 || !before_reset.ok() ||
        *before_reset != (lstm ? 0 : 1) || rnn.attributes.count("activations") ||
        rnn.attributes.count("clip")) {
      continue;
    }
    const int64_t h = *hidden, directions = *direction == "forward" ? 1 : 2;
    const int64_t rows = (lstm ? 4 : 3) * h;
    const std::array<std::array<int64_t, 2>, 3> ranges =
        lstm ? std::array<std::array<int64_t, 2>, 3>{{{0, h}, {3 * h, 4 * h}, {h, 3 * h}}}
             : std::array<std::array<int64_t, 2>, 3>{{{h, 2 * h}, {0, h}, {2 * h, 3 * h}}};
    auto input = [&](size_t k) { return k < rnn.inputs.size() ? rnn.inputs[k] : std::string(); };
    const std::vector<std::string> w = pattern.PerDirection(input(1), directions);
    const std::vector<std::string> r = pattern.PerDirection(input(2), directions);
    const std::vector<std::string> b =
        input(3).empty() ? std::vector<std::string>{} : pattern.PerDirection(input(3), directions);
    if (w.empty() || r.empty() || (!input(3).empty() && b.empty())) continue;
    std::vector<std::string> inputs = {input(0)};
    bool matched = true;
    for (int64_t d = 0; d < directions && matched; ++d) {
      const std::optional<std::string> w_ih = pattern.TorchGateRows(w[d], ranges, rows, -1);
      const std::optional<std::string> w_hh = pattern.TorchGateRows(r[d], ranges, rows, h);
      matched = w_ih && w_hh;
      if (!matched) break;
      inputs.push_back(*w_ih);
      inputs.push_back(*w_hh);
      if (b.empty()) continue;
      const std::vector<std::string> halves = pattern.ConcatParts(b[d], 2);
      std::optional<std::string> b_ih, b_hh;
      if (!halves.empty()) {
        b_ih = pattern.TorchGateRows(halves[0], ranges, rows, 0);
        b_hh = pattern.TorchGateRows(halves[1], ranges, rows, 0);
      }
      matched = b_ih && b_hh;
      if (!matched) break;
      inputs.push_back(*b_ih);
      inputs.push_back(*b_hh);
    }
    if (!input(4).empty()) inputs.push_back(input(4));  // Each sample's length, last.
    if (!matched || !pattern.ZeroState(input(5)) || (lstm && !pattern.ZeroState(input(6))) ||
        rnn.inputs.size() > (lstm ? 7u : 6u)) {
      continue;
    }
    std::vector<Node> made;
    static const char* const kSuffix[3] = {"", "/Y_h", "/Y_c"};
    for (size_t k = 0; k < rnn.outputs.size() && k < (lstm ? 3u : 2u); ++k) {
      const std::string& out = rnn.outputs[k];
      if (out.empty() || (read.count(out) == 0 && out != graph.output)) continue;
      Node node;
      node.op = lstm ? "TorchLSTM" : "TorchGRU";
      node.name = rnn.name + kSuffix[k];
      node.inputs = inputs;
      node.outputs = {out};
      node.attributes["hidden_size"] = h;
      node.attributes["directions"] = directions;
      node.attributes["output"] = static_cast<int64_t>(k);
      if (!input(4).empty()) node.attributes["sequence_lens"] = int64_t{1};
      made.push_back(std::move(node));
    }
    replacements[n] = std::move(made);
    // Everything the weights and initial states were computed from may now be unread.
    AddProducers(graph, std::vector<std::string>(rnn.inputs.begin() + 1, rnn.inputs.end()),
                 candidates);
  }
  if (replacements.empty()) return;
  ReplaceNodes(graph, std::move(replacements));
  // The weights' re-ordering and the initial states' expansion, now unread, go (and what only
  // they read).
  RemoveUnreadNodes(graph, candidates);
}

}  // namespace graph
}  // namespace dptrain
