// What the graph rewrites (graph_rewrites.h) share: removing what only a rewritten pattern read.
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "worker/graph/graph_rewrites.h"

namespace dptrain {
namespace graph {

void AddProducers(const Graph& graph, std::vector<std::string> values,
                  std::set<std::string>& names) {
  std::map<std::string, size_t> producer;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    for (const std::string& o : graph.nodes[n].outputs) producer[o] = n;
  }
  while (!values.empty()) {
    const std::string value = values.back();
    values.pop_back();
    const auto p = producer.find(value);
    if (p == producer.end() || !names.insert(graph.nodes[p->second].name).second) continue;
    for (const std::string& in : graph.nodes[p->second].inputs) values.push_back(in);
  }
}

void ReplaceNodes(Graph& graph, std::map<size_t, std::vector<Node>> replacements) {
  std::vector<Node> nodes;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const auto it = replacements.find(n);
    if (it == replacements.end()) {
      nodes.push_back(std::move(graph.nodes[n]));
      continue;
    }
    for (Node& made : it->second) nodes.push_back(std::move(made));
  }
  graph.nodes = std::move(nodes);
}

void RemoveUnreadNodes(Graph& graph, const std::set<std::string>& candidates) {
  bool removed = true;
  while (removed) {
    removed = false;
    std::set<std::string> read;
    for (const Node& node : graph.nodes) {
      for (const std::string& in : node.inputs) {
        if (!in.empty()) read.insert(in);
      }
    }
    std::vector<Node> kept;
    for (Node& node : graph.nodes) {
      bool unread = candidates.count(node.name) > 0;
      for (const std::string& o : node.outputs) {
        unread = unread && read.count(o) == 0 && o != graph.output;
      }
      if (unread) {
        removed = true;
        continue;
      }
      kept.push_back(std::move(node));
    }
    graph.nodes = std::move(kept);
  }
}

}  // namespace graph
}  // namespace dptrain
