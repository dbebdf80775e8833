// The ops that only move elements, as data (element_sources.h): for every such node of every
// ONNX fixture and of graphs written here (Transpose, Gather by constant indices, Slice with
// steps both ways, Concat of three, Pad, Expand), at a batch other than the export's, the
// gather and readers' sums that the CUDA kernels compute (the same per-element functions, run
// here on the host) equal the CPU node's Forward and Backward, bit for bit.
#include "worker/graph/element_sources.h"

#include <dirent.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/graph/executor.h"
#include "worker/graph/graph_check.h"
#include "worker/graph/onnx_fixtures_testing.h"
#include "worker/graph/onnx_import.h"
#include "worker/graph/op_registry.h"

namespace dptrain {
namespace graph {
namespace {

using Ints = std::vector<int64_t>;
constexpr int kBatch = 3;

TEST(ElementSourcesTest, ReadersListEachElementsReadersInOrder) {
  // Output: in0[2], zero, in1[0], in0[2], in0[0].
  const Ints sources = {ElementSource(0, 2), kZeroSource, ElementSource(1, 0), ElementSource(0, 2),
                        ElementSource(0, 0)};
  const std::vector<ElementReaders> r = Readers(sources, {3, 2});
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].offsets, (Ints{0, 1, 1, 3}));
  EXPECT_EQ(r[0].readers, (Ints{4, 0, 3}));
  EXPECT_EQ(r[1].offsets, (Ints{0, 1, 1}));
  EXPECT_EQ(r[1].readers, (Ints{2}));
  const float dy[] = {1, 2, 4, 8, 16};
  EXPECT_EQ(ReadersSum(r[0].offsets.data(), r[0].readers.data(), dy, 2), 9.0f);
  EXPECT_EQ(ReadersSum(r[0].offsets.data(), r[0].readers.data(), dy, 1), 0.0f);
  // A source out of range is a bug of its node: no readers rather than a write out of bounds.
  EXPECT_TRUE(Readers({ElementSource(0, 3)}, {3}).empty());
  EXPECT_TRUE(Readers({ElementSource(2, 0)}, {3, 2}).empty());
}

int64_t ValueSize(const Executor<float>& e, int v, int batch) {
  const ValueShape& s = e.value_shapes()[v];
  if (s.batch_axis < 0) return s.per_sample();
  int64_t n = 1;
  for (int64_t d : s.Concrete(batch)) n *= d;
  return n;
}

// One moving node at kBatch samples: the gather equals Forward, the readers'
// sums equal Backward, on random values.
void CheckNode(const Executor<float>& e, const Executor<float>::NodeState& node,
               std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<std::vector<float>> in;
  std::vector<nn::TensorRef<float>> refs;
  std::vector<const float*> pointers;
  Ints sizes;
  for (int v : node.inputs) {
    sizes.push_back(ValueSize(e, v, kBatch));
    in.emplace_back(sizes.back());
    for (float& x : in.back()) x = uniform(rng);
  }
  for (size_t i = 0; i < in.size(); ++i) {
    const int v = node.inputs[i];  // A value without a batch is held once (value_shape.h).
    refs.push_back(
        {in[i].data(), e.value_shapes()[v].batch_axis < 0 ? 1 : kBatch, e.value_dims()[v]});
    pointers.push_back(in[i].data());
  }
  Ints sources;  // For the batch Forward reads, as a GPU twin asks.
  ASSERT_TRUE(node.impl->ElementSources(refs[0].batch, sources));
  nn::LayerContext<float> ctx;
  const nn::TensorRef<float> y = node.impl->Forward(ctx, refs, true);
  ASSERT_EQ(y.size(), static_cast<int64_t>(sources.size()));
  ASSERT_EQ(static_cast<int64_t>(sources.size()), ValueSize(e, node.output, kBatch));
  for (int64_t k = 0; k < y.size(); ++k) {
    ASSERT_EQ(MovedElement(sources.data(), pointers.data(), k), y.data[k]) << "element " << k;
  }
  std::vector<float> dy(sources.size());
  for (float& x : dy) x = uniform(rng);
  const std::vector<bool> need(in.size(), true);
  const std::vector<nn::TensorRef<float>> dx =
      node.impl->Backward(ctx, {dy.data(), y.batch, y.dims}, need);
  const std::vector<ElementReaders> readers = Readers(sources, sizes);
  ASSERT_EQ(readers.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(dx[i].size(), sizes[i]) << "input " << i;
    for (int64_t j = 0; j < sizes[i]; ++j) {
      ASSERT_EQ(ReadersSum(readers[i].offsets.data(), readers[i].readers.data(), dy.data(), j),
                dx[i].data[j])
          << "input " << i << ", element " << j;
    }
  }
}

// Every moving node of `graph` (CheckNode); returns the names of the nodes checked.
std::vector<std::string> CheckMovingNodes(const Graph& graph) {
  absl::StatusOr<std::unique_ptr<Executor<float>>> made =
      Executor<float>::Create(graph, BuiltinOps());
  EXPECT_TRUE(made.ok()) << made.status();
  if (!made.ok()) return {};
  std::mt19937 rng(7);
  std::vector<std::string> checked;
  for (const auto& node : (*made)->nodes()) {
    Ints sources;
    if (!node.impl->ElementSources(kBatch, sources)) continue;
    checked.push_back(node.name);
    SCOPED_TRACE(node.name + " (" + node.op + ")");
    CheckNode(**made, node, rng);
  }
  return checked;
}

TEST(ElementSourcesTest, EveryMovingNodeOfTheFixtures) {
  const std::string dir = testing_fixtures::kTestdata;
  DIR* d = opendir(dir.c_str());
  ASSERT_NE(d, nullptr) << dir;
  int fixtures = 0, nodes = 0;
  while (dirent* entry = readdir(d)) {
    const std::string file = entry->d_name;
    const std::string suffix = ".onnx";
    if (file.size() <= suffix.size() || file.substr(file.size() - suffix.size()) != suffix) {
      continue;
    }
    SCOPED_TRACE(file);
    absl::StatusOr<Graph> g = ReadOnnxGraph(dir + "/" + file, BuiltinOps());
    ASSERT_TRUE(g.ok()) << g.status();
    ++fixtures;
    nodes += static_cast<int>(CheckMovingNodes(*g).size());
  }
  closedir(d);
  EXPECT_GE(fixtures, 30);
  EXPECT_GE(nodes, 20);  // The attention, text and tabular fixtures' Transposes, Slices, ...
}

// Graphs at a batch other than the one their constants name; input [B, 2, 3, 4].
TEST(ElementSourcesTest, MovesOfEveryKind) {
  Graph g = Chain(
      {2, 3, 4},
      {MakeNode("Transpose", "t", {"x"}, {"t"}, {{"perm", Ints{2, 0, 3, 1}}}),  // [3, B, 4, 2]
       MakeNode("Slice", "down", {"x", "b", "e", "a", "st"}, {"s"}),            // Steps -1 and 2.
       MakeNode("Gather", "picked", {"x", "idx"}, {"gx"}, {{"axis", int64_t{2}}}),  // 2 again.
       MakeNode("Concat", "three", {"gx", "gx", "x"}, {"c"}, {{"axis", int64_t{2}}}),
       MakeNode("Pad", "pad", {"t", "pads"}, {"p"}),
       MakeNode("ReduceMean", "s_mean", {"s"}, {"r1"},
                {{"axes", Ints{1, 2, 3}}, {"keepdims", int64_t{0}}}),
       MakeNode("ReduceMean", "c_mean", {"c"}, {"r2"},
                {{"axes", Ints{1, 2, 3}}, {"keepdims", int64_t{0}}}),
       MakeNode("ReduceMean", "p_mean", {"p"}, {"r3"},
                {{"axes", Ints{0, 2, 3}}, {"keepdims", int64_t{0}}}),
       MakeNode("Add", "a1", {"r1", "r2"}, {"q1"}), MakeNode("Add", "y", {"q1", "r3"}, {"y"})},
      {IntConstant("b", {-1, 0}), IntConstant("e", {-4, 4}), IntConstant("a", {2, 3}),
       IntConstant("st", {-1, 2}), IntConstant("idx", {2, 0, 2}),
       IntConstant("pads", {0, 0, 1, 0, 2, 0, 0, 3})});
  g.input_rank = 4;
  EXPECT_EQ(CheckMovingNodes(g), (std::vector<std::string>{"t", "down", "picked", "three", "pad"}));
}

// Expand of a computed value along its size-1 axes (a padding mask to every head).
TEST(ElementSourcesTest, ExpandOfAComputedValue) {
  Graph g = Chain({1, 3, 1},
                  {MakeNode("Expand", "heads", {"x", "shape"}, {"h"}),  // [B, 2, 3, 4]
                   MakeNode("ReduceMean", "y", {"h"}, {"y"}, {{"axes", Ints{1, 2, 3}}})},
                  {IntConstant("shape", {2, 2, 3, 4})});
  g.input_rank = 4;
  EXPECT_EQ(CheckMovingNodes(g), (std::vector<std::string>{"heads"}));
}

}  // namespace
}  // namespace graph
}  // namespace dptrain
