// Graphs whose values are not batch-first on the GPU (gpu_graph.h's AnyShapeTwin): moves of
// elements, broadcast binary ops, layers on rows, batched products, reductions, embedding
// lookups and masks. Without a GPU: each graph gets its twins (and what cannot is refused in one
// line); on a GPU, GpuTwinTest compares each against the CPU executor at two batch sizes.
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/cuda/gpu_graph.h"
#include "worker/cuda/gpu_twin_testing.h"
#include "worker/graph/element_sources.h"
#include "worker/graph/executor.h"
#include "worker/graph/graph_check.h"
#include "worker/graph/op_registry.h"

namespace dptrain {
namespace cuda {
namespace {

using graph::Chain;
using graph::FloatScalar;
using graph::MakeNode;
using graph::RandomConstant;
using Ints = std::vector<int64_t>;

// Moves of values of any shape (graph/element_sources.h), one gather each, beside the
// element-wise twins on values whose batch is not first: [B, 2, 3, 4] transposed to
// [3, B, 4, 2], a ReLU there, sliced down and by steps, padded, transposed back; a Gather by
// repeated indices concatenated along axis 2; a size-1 axis expanded.
graph::Graph MovesOfValuesOfAnyShape() {
  graph::Graph g =
      Chain({2, 3, 4},
            {MakeNode("Transpose", "t", {"x"}, {"t"}, {{"perm", Ints{2, 0, 3, 1}}}),
             MakeNode("Relu", "r", {"t"}, {"r"}), MakeNode("Tanh", "th", {"r"}, {"th"}),
             MakeNode("Slice", "s", {"th", "b", "e", "a", "st"}, {"s"}),  // [3, B, 2, 2]
             MakeNode("Pad", "p", {"s", "pads"}, {"p"}),                  // [5, B, 3, 5]
             MakeNode("Transpose", "y", {"p"}, {"y"}, {{"perm", Ints{1, 0, 2, 3}}})},
            {graph::IntConstant("b", {-1, 0}), graph::IntConstant("e", {-4, 4}),
             graph::IntConstant("a", {0, 2}), graph::IntConstant("st", {-1, 2}),
             graph::IntConstant("pads", {0, 0, 1, 0, 2, 0, 0, 3})});
  g.input_rank = 4;
  return g;
}

graph::Graph GatherConcatAndExpand() {
  graph::Graph g =
      Chain({1, 3, 4},
            {MakeNode("Expand", "wide", {"x", "shape"}, {"w"}),  // [B, 2, 3, 4]
             MakeNode("Gather", "g", {"w", "idx"}, {"g"}, {{"axis", int64_t{2}}}),
             MakeNode("Concat", "y", {"g", "g", "w"}, {"y"}, {{"axis", int64_t{2}}})},
            {graph::IntConstant("shape", {2, 2, 3, 4}), graph::IntConstant("idx", {2, 0, 2})});
  g.input_rank = 4;
  return g;
}

// A learned class token expanded over the batch (a node without runtime inputs: the graph's
// input gives the batch size) and put in front of the tokens; rows of a learned bias table
// picked by constant indices (a value without a batch, whatever the graph's), transposed and
// added to every sample (a relative-position bias).
graph::Graph ClassToken() {
  graph::NamedConstant token = RandomConstant("cls_token", {1, 1, 4}, 31);
  graph::NamedConstant table = RandomConstant("bias_table", {5, 4}, 32);
  token.state = table.state = true;
  graph::Graph g =
      Chain({3, 4, 1},
            {MakeNode("Expand", "cls", {"cls_token", "target"}, {"c"}),
             MakeNode("Concat", "cat", {"c", "x"}, {"t"}, {{"axis", int64_t{1}}}),
             MakeNode("Gather", "bias", {"bias_table", "rows"}, {"b"}),  // [4, 4]: no batch.
             MakeNode("Transpose", "bt", {"b"}, {"bt"}, {{"perm", Ints{1, 0}}}),
             MakeNode("Add", "a", {"t", "bt"}, {"a"}), MakeNode("Tanh", "y", {"a"}, {"y"})},
            {token, graph::IntConstant("target", {2, 1, 1}), table,
             graph::IntConstant("rows", {3, 0, 3, 1})});
  g.input_rank = 3;
  return g;
}

// Layers on each row of the last axis: a Linear per token of [B, 4, 6] (Gemm), its layer norm,
// then sequence-first [4, B, 5]: a softmax of each row, a MatMul by a weight, a log-softmax.
graph::Graph RowwiseLayers() {
  graph::Graph g =
      Chain({4, 6, 1},
            {MakeNode("Gemm", "q", {"x", "w", "b"}, {"q"}, {{"transB", int64_t{1}}}),
             MakeNode("LayerNormalization", "ln", {"q", "g", "bb"}, {"n"}, {{"axis", int64_t{-1}}}),
             MakeNode("Transpose", "seq", {"n"}, {"t"}, {{"perm", Ints{1, 0, 2}}}),
             MakeNode("Softmax", "sm", {"t"}, {"s"}, {{"axis", int64_t{-1}}}),
             MakeNode("MatMul", "m", {"s", "w2"}, {"m"}),
             MakeNode("LogSoftmax", "ls", {"m"}, {"l"}, {{"axis", int64_t{-1}}}),
             MakeNode("Transpose", "y", {"l"}, {"y"}, {{"perm", Ints{1, 0, 2}}})},
            {RandomConstant("w", {5, 6}, 41), RandomConstant("b", {5}, 42),
             RandomConstant("g", {5}, 43, 0.5, 1.0), RandomConstant("bb", {5}, 44),
             RandomConstant("w2", {5, 3}, 45)});
  g.input_rank = 3;
  return g;
}

// Every broadcast binary op and operand form on a sequence-first [4, B, 6] value: a computed
// [4, B, 1] slice broadcast both ways, a scalar, a learned tensor (swapped), a fixed one, two
// computed values of one shape (Max, Min, Div).
graph::Graph BroadcastBinaryOps() {
  graph::NamedConstant scale = RandomConstant("scale", {6}, 51, 0.5, 1.0);
  graph::NamedConstant shift = RandomConstant("shift", {4, 1, 6}, 52);
  scale.state = shift.state = true;
  shift.fixed = true;
  graph::Graph g =
      Chain({4, 6, 1},
            {MakeNode("Transpose", "t", {"x"}, {"t"}, {{"perm", Ints{1, 0, 2}}}),
             MakeNode("Slice", "m", {"t", "zero", "one", "two"}, {"m"}),  // [4, B, 1]
             MakeNode("Sub", "c", {"t", "m"}, {"c"}), MakeNode("Sub", "c2", {"m", "t"}, {"c2"}),
             MakeNode("Div", "d", {"c", "k"}, {"d"}), MakeNode("Mul", "e", {"scale", "d"}, {"e"}),
             MakeNode("Add", "f", {"e", "shift"}, {"f"}), MakeNode("Max", "hi", {"f", "c2"}, {"h"}),
             MakeNode("Min", "lo", {"h", "t"}, {"l"}), MakeNode("Sigmoid", "s", {"t"}, {"s"}),
             MakeNode("Div", "q", {"l", "s"}, {"q"}),
             MakeNode("Transpose", "y", {"q"}, {"y"}, {{"perm", Ints{1, 0, 2}}})},
            {graph::IntConstant("zero", {0}), graph::IntConstant("one", {1}),
             graph::IntConstant("two", {2}), FloatScalar("k", 0.7f), scale, shift});
  g.input_rank = 3;
  return g;
}

// One attention head on [B, 4 tokens, 6 features]: q and k per token, q k^T (a MatMul of two
// computed values), scaled, a softmax of each row, times the tokens, a layer norm per token.
graph::Graph AttentionHead() {
  graph::Graph g =
      Chain({4, 6, 1},
            {MakeNode("Gemm", "q", {"x", "wq", "bq"}, {"q"}, {{"transB", int64_t{1}}}),
             MakeNode("Gemm", "k", {"x", "wk"}, {"k"}, {{"transB", int64_t{1}}}),
             MakeNode("Transpose", "kt", {"k"}, {"kt"}, {{"perm", Ints{0, 2, 1}}}),
             MakeNode("MatMul", "scores", {"q", "kt"}, {"s"}),
             MakeNode("Mul", "scale", {"s", "c"}, {"s2"}),
             MakeNode("Softmax", "attn", {"s2"}, {"a"}, {{"axis", int64_t{-1}}}),
             MakeNode("MatMul", "mix", {"a", "x"}, {"m"}),
             MakeNode("LayerNormalization", "y", {"m", "g", "b"}, {"y"}, {{"axis", int64_t{-1}}})},
            {RandomConstant("wq", {5, 6}, 61), RandomConstant("bq", {5}, 62),
             RandomConstant("wk", {5, 6}, 63), FloatScalar("c", 0.7f),
             RandomConstant("g", {6}, 64, 0.5, 1.0), RandomConstant("b", {6}, 65)});
  g.input_rank = 3;
  return g;
}

// Every reduction over axes other than the batch's on a sequence-first [4, B, 6] value: means,
// maxima, an L2 norm, minima and sums, combined by broadcast binary ops.
graph::Graph Reductions() {
  auto reduce = [](const char* op, const std::string& in, const std::string& out, Ints axes) {
    return MakeNode(op, out, {in}, {out}, {{"axes", axes}});
  };
  graph::Graph g = Chain(
      {4, 6, 1}, {MakeNode("Transpose", "t", {"x"}, {"t"}, {{"perm", Ints{1, 0, 2}}}),
                  reduce("ReduceMean", "t", "mean", {2}), reduce("ReduceMax", "t", "max", {0}),
                  reduce("ReduceL2", "t", "l2", {0, 2}), MakeNode("Add", "a", {"max", "l2"}, {"a"}),
                  MakeNode("Sub", "b", {"t", "mean"}, {"b"}),
                  MakeNode("Mul", "c", {"b", "a"}, {"c"}), reduce("ReduceMin", "c", "min", {0}),
                  reduce("ReduceSum", "c", "sum", {0}), MakeNode("Add", "d", {"min", "sum"}, {"d"}),
                  MakeNode("Transpose", "y", {"d"}, {"y"}, {{"perm", Ints{1, 0, 2}}})});
  g.input_rank = 3;
  return g;
}

// An embedding lookup of [B, 5] ids in a learned table of 7 rows (row 2 the padding_idx, its
// gradient zero), the mean over the tokens.
graph::Graph Lookup() {
  graph::NamedConstant table = RandomConstant("table", {7, 4}, 71);
  table.state = true;
  graph::Graph g = Chain(
      {5, 1, 1},
      {MakeNode("Gather", "embed", {"table", "x"}, {"e"}, {{"padding_idx", int64_t{2}}}),
       MakeNode("ReduceMean", "y", {"e"}, {"y"}, {{"axes", Ints{1}}, {"keepdims", int64_t{0}}})},
      {table});
  g.input_rank = 2;
  g.input_ids = true;
  return g;
}

// Masks on a sequence-first value: trunc(3 x) (a cast to int64), == 1, Not, a cast to bool,
// times the value (the mask passes no gradient), masked_fill both ways (Where with a constant).
graph::Graph Masks() {
  graph::Graph g = Chain(
      {4, 6, 1},
      {MakeNode("Transpose", "t", {"x"}, {"t"}, {{"perm", Ints{1, 0, 2}}}),
       MakeNode("Mul", "s", {"t", "three"}, {"s"}),
       MakeNode("Cast", "i", {"s"}, {"i"}, {{"to", int64_t{7}}}),
       MakeNode("Equal", "e", {"i", "one"}, {"e"}), MakeNode("Not", "n", {"e"}, {"n"}),
       MakeNode("Cast", "b", {"n"}, {"b"}, {{"to", int64_t{9}}}),
       MakeNode("Mul", "m", {"t", "b"}, {"m"}), MakeNode("Where", "w", {"b", "m", "fill"}, {"w"}),
       MakeNode("Where", "w2", {"e", "fill", "w"}, {"w2"}),
       MakeNode("Transpose", "y", {"w2"}, {"y"}, {{"perm", Ints{1, 0, 2}}})},
      {FloatScalar("three", 3.0f), graph::IntConstant("one", {1}), FloatScalar("fill", -2.0f)});
  g.input_rank = 3;
  return g;
}

// TopK of the largest along the tokens and of the smallest along the features of a
// sequence-first [4, B, 6] value (a text CNN's k-max pooling).
graph::Graph TopK() {
  graph::Graph g = Chain(
      {4, 6, 1},
      {MakeNode("Transpose", "t", {"x"}, {"t"}, {{"perm", Ints{1, 0, 2}}}),
       MakeNode("TopK", "top", {"t", "k"}, {"a"}, {{"axis", int64_t{0}}}),
       MakeNode("TopK", "low", {"a", "k"}, {"b"}, {{"axis", int64_t{2}}, {"largest", int64_t{0}}}),
       MakeNode("Transpose", "y", {"b"}, {"y"}, {{"perm", Ints{1, 0, 2}}})},
      {graph::IntConstant("k", {3})});
  g.input_rank = 3;
  return g;
}

// Without a GPU: such graphs get their twins (a MoveTwin for each move, a row-wise twin for
// each layer on rows, a broadcast twin for each binary op, a batched product, a
// reduction, an embedding lookup, a mask, a TopK), a Concat of more
// inputs than the gather takes is refused in one line.
TEST(GpuGraphTest, MovesOfAnyShapeGetTwins) {
  for (const graph::Graph& g :
       {MovesOfValuesOfAnyShape(), GatherConcatAndExpand(), ClassToken(), RowwiseLayers(),
        BroadcastBinaryOps(), AttentionHead(), Reductions(), Lookup(), Masks(), TopK()}) {
    absl::StatusOr<std::unique_ptr<graph::Executor<float>>> cpu =
        graph::Executor<float>::Create(g, graph::BuiltinOps());
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    absl::StatusOr<std::unique_ptr<GpuGraph>> gpu = GpuGraph::Create(**cpu, GpuOps());
    EXPECT_TRUE(gpu.ok()) << gpu.status();
  }
  std::vector<std::string> many(graph::kMaxSourceInputs + 1, "x");
  graph::Graph g =
      Chain({2, 3, 4}, {MakeNode("Concat", "cat", many, {"y"}, {{"axis", int64_t{2}}})});
  g.input_rank = 4;
  absl::StatusOr<std::unique_ptr<graph::Executor<float>>> cpu =
      graph::Executor<float>::Create(g, graph::BuiltinOps());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  absl::StatusOr<std::unique_ptr<GpuGraph>> gpu = GpuGraph::Create(**cpu, GpuOps());
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().message(),
            "node 'cat' (Concat): moves elements of 17 inputs (at most 16) (no CUDA version yet; "
            "--device=cpu trains it)");
}

TEST_F(GpuTwinTest, MovesOfValuesOfAnyShape) {
  Check(MovesOfValuesOfAnyShape());
  Check(MovesOfValuesOfAnyShape(), 5);  // A second batch size: a second plan.
  Check(GatherConcatAndExpand());
  Check(ClassToken());  // The token's gradient: the sum over the batch.
}

TEST_F(GpuTwinTest, EmbeddingLookup) {
  const std::vector<float> ids = {0, 2, 6, 2, 3, 1, 1, 1, 0, 5, 6, 6, 2, 4, 3};  // 3 x 5.
  Check(Lookup(), 3, &ids);
}

TEST_F(GpuTwinTest, Masks) { Check(Masks()); }

TEST_F(GpuTwinTest, TopK) {
  Check(TopK());
  Check(TopK(), 5);
}

TEST_F(GpuTwinTest, Reductions) {
  Check(Reductions());
  Check(Reductions(), 5);
}

TEST_F(GpuTwinTest, AttentionHead) {
  Check(AttentionHead());
  Check(AttentionHead(), 5);
}

TEST_F(GpuTwinTest, BroadcastBinaryOps) {
  Check(BroadcastBinaryOps());
  Check(BroadcastBinaryOps(), 5);
}

TEST_F(GpuTwinTest, LayersOnEachRowOfTheLastAxis) {
  Check(RowwiseLayers());
  Check(RowwiseLayers(), 5);
}

}  // namespace
}  // namespace cuda
}  // namespace dptrain
