// The executor on branching graphs (a value feeding several nodes, Add and Concat joins, a
// branch that does not reach the output) against finite differences, the parameter layout, and
// the graph-level errors; also the registry and the graph rewrites the ONNX importer applies.
#include "worker/graph/executor.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/graph/constant_folding.h"
#include "worker/graph/graph_check.h"
#include "worker/graph/graph_rewrites.h"
#include "worker/graph/layer_ops.h"
#include "worker/graph/op_registry.h"

namespace dptrain {
namespace graph {
namespace {

using Ints = std::vector<int64_t>;

Graph MakeGraph(nn::Dims dims, std::vector<Node> nodes, std::vector<NamedConstant> constants,
                const std::string& output) {
  Graph g;
  g.name = "test";
  g.input = "x";
  g.input_dims = dims;
  g.output = output;
  g.nodes = std::move(nodes);
  g.constants = std::move(constants);
  return g;
}

// x -> conv -> relu -> (+ x) -> relu: a residual block whose input feeds two nodes.
Graph Residual() {
  return MakeGraph(
      {3, 5, 5},
      {MakeNode("Conv", "conv", {"x", "conv.weight"}, {"c"}, {{"pads", Ints{1, 1, 1, 1}}}),
       MakeNode("BatchNormalization", "bn",
                {"c", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"}, {"n"}),
       MakeNode("Relu", "relu1", {"n"}, {"r"}), MakeNode("Add", "add", {"r", "x"}, {"s"}),
       MakeNode("Relu", "relu2", {"s"}, {"y"})},
      {RandomConstant("conv.weight", {3, 3, 3, 3}, 1),
       RandomConstant("bn.weight", {3}, 3, 0.5, 1.0), RandomConstant("bn.bias", {3}, 4),
       RandomConstant("bn.running_mean", {3}, 5),
       RandomConstant("bn.running_var", {3}, 6, 0.5, 1.0)},
      "y");
}

class ExecutorTest : public ::testing::Test {
 protected:
  std::string BuildError(const Graph& graph) {
    absl::StatusOr<std::unique_ptr<Executor<float>>> e = Executor<float>::Create(graph, registry_);
    EXPECT_FALSE(e.ok());
    return std::string(e.status().message());
  }
  const OpRegistry registry_ = BuiltinOps();
};

TEST_F(ExecutorTest, ResidualAddAccumulatesTheInputGradient) {
  CheckGraphGradients(Residual(), registry_);
}

TEST_F(ExecutorTest, ConcatOfBranchesAndAddOfAValueWithItself) {
  // Three branches of x concatenated on channels, then z + z, then a linear head.
  const Graph g = MakeGraph(
      {2, 4, 4},
      {MakeNode("Conv", "b1", {"x", "w1"}, {"a"}),
       MakeNode("Conv", "b2", {"x", "w2", "bias2"}, {"b"}, {{"pads", Ints{1, 1, 1, 1}}}),
       MakeNode("Tanh", "b3", {"x"}, {"c"}),
       MakeNode("Concat", "cat", {"a", "b", "c"}, {"z"}, {{"axis", int64_t{1}}}),
       MakeNode("Add", "twice", {"z", "z"}, {"zz"}), MakeNode("Sigmoid", "s", {"zz"}, {"s"}),
       MakeNode("Flatten", "flat", {"s"}, {"f"}),
       MakeNode("Gemm", "fc", {"f", "fc.weight", "fc.bias"}, {"y"}, {{"transB", int64_t{1}}})},
      {RandomConstant("w1", {3, 2, 1, 1}, 7), RandomConstant("w2", {1, 2, 3, 3}, 8),
       RandomConstant("bias2", {1}, 9), RandomConstant("fc.weight", {5, 96}, 10, 0.2),
       RandomConstant("fc.bias", {5}, 11)},
      "y");
  CheckGraphGradients(g, registry_);
}

TEST_F(ExecutorTest, AJoinsGradientOutlivesTheOtherBranchsBackward) {
  // The layers write their input gradients into one shared pair of buffers. Add passes its
  // gradient (which lies in the pair: the Relu after it wrote it there) straight to both
  // inputs; the short branch's producer (node "short", first in order) reads it only after the
  // long branch's four nodes have written the pair back and forth, so the executor must have
  // copied it out (a torchvision ResNet exported with its downsample first has this shape).
  const Graph g =
      MakeGraph({2, 4, 4},
                {MakeNode("Conv", "short", {"x", "ws"}, {"a"}),
                 MakeNode("Conv", "c1", {"x", "w1"}, {"h1"}, {{"pads", Ints{1, 1, 1, 1}}}),
                 MakeNode("Relu", "r1", {"h1"}, {"g1"}),
                 MakeNode("Conv", "c2", {"g1", "w2"}, {"h2"}, {{"pads", Ints{1, 1, 1, 1}}}),
                 MakeNode("Sigmoid", "r2", {"h2"}, {"g2"}),
                 MakeNode("Add", "add", {"a", "g2"}, {"s"}), MakeNode("Relu", "out", {"s"}, {"y"})},
                {RandomConstant("ws", {3, 2, 1, 1}, 21), RandomConstant("w1", {3, 2, 3, 3}, 22),
                 RandomConstant("w2", {3, 3, 3, 3}, 23)},
                "y");
  CheckGraphGradients(g, registry_);
}

// A tied weight (one module applied twice, as PyTorch exports it: one initializer read by two
// nodes): laid out once, its gradient the sum of both uses', against finite differences.
TEST_F(ExecutorTest, TiedWeightsSumTheirUsesGradients) {
  const Graph g = MakeGraph(
      {3, 5, 5},
      {MakeNode("Conv", "conv_a", {"x", "w", "b"}, {"a"}, {{"pads", Ints{1, 1, 1, 1}}}),
       MakeNode("Tanh", "t", {"a"}, {"ta"}),
       MakeNode("Conv", "conv_b", {"ta", "w", "b"}, {"c"}, {{"pads", Ints{1, 1, 1, 1}}}),
       MakeNode("Flatten", "flat", {"c"}, {"f"}),
       MakeNode("Gemm", "fc", {"f", "fc.weight"}, {"h"}, {{"transB", int64_t{1}}}),
       MakeNode("Sigmoid", "s", {"h"}, {"sh"}),
       MakeNode("Gemm", "fc_again", {"sh", "sq.weight"}, {"y"}, {{"transB", int64_t{1}}})},
      {RandomConstant("w", {3, 3, 3, 3}, 31), RandomConstant("b", {3}, 32),
       RandomConstant("fc.weight", {4, 75}, 33, 0.2), RandomConstant("sq.weight", {4, 4}, 34)},
      "y");
  CheckGraphGradients(g, registry_);
  absl::StatusOr<std::unique_ptr<Executor<float>>> e = Executor<float>::Create(g, registry_);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ((*e)->params().size(), 4u);  // w and b once.
  EXPECT_EQ((*e)->num_params(), 81 + 3 + 300 + 16);
  // And a Gemm weight used twice (a square layer applied twice).
  Graph twice = g;
  twice.nodes.back().inputs[1] = "sq.weight";
  twice.nodes.insert(twice.nodes.end() - 1, MakeNode("Gemm", "sq_first", {"sh", "sq.weight"},
                                                     {"sh2"}, {{"transB", int64_t{1}}}));
  twice.nodes.back().inputs[0] = "sh2";
  CheckGraphGradients(twice, registry_);
}

TEST_F(ExecutorTest, OutputThatAlsoFeedsANode) {
  // The output "h" also feeds a dead branch, whose parameters get zero gradients.
  const Graph g =
      MakeGraph({4, 1, 1},
                {MakeNode("Gemm", "fc", {"x", "w", "b"}, {"h"}, {{"transB", int64_t{1}}}),
                 MakeNode("Gemm", "dead", {"h", "w2"}, {"unused"}, {{"transB", int64_t{1}}}),
                 MakeNode("Relu", "relu", {"h"}, {"r"})},
                {RandomConstant("w", {3, 4}, 12), RandomConstant("b", {3}, 13),
                 RandomConstant("w2", {2, 3}, 14)},
                "h");
  CheckGraphGradients(g, registry_);
}

TEST_F(ExecutorTest, ParametersFollowTheConstantsAndBuffersTheNodes) {
  absl::StatusOr<std::unique_ptr<Executor<float>>> e =
      Executor<float>::Create(Residual(), registry_);
  ASSERT_TRUE(e.ok()) << e.status();
  const std::vector<nn::ParamInfo>& params = (*e)->params();
  ASSERT_EQ(params.size(), 3u);
  EXPECT_EQ(params[0].name, "conv.weight");
  EXPECT_EQ(params[0].shape, (Ints{3, 3, 3, 3}));
  EXPECT_EQ(params[1].name, "bn.weight");
  EXPECT_EQ(params[1].offset, 81);
  EXPECT_EQ(params[2].name, "bn.bias");
  EXPECT_EQ((*e)->num_params(), 81 + 3 + 3);
  EXPECT_EQ((*e)->initial_params()[81], Residual().constants[1].value.floats[0]);
  ASSERT_EQ((*e)->buffers().size(), 3u);
  EXPECT_EQ((*e)->num_buffers(), 7);
  EXPECT_EQ((*e)->initial_buffers()[6], 0.0f);  // num_batches_tracked
  EXPECT_EQ((*e)->output_dims(), (nn::Dims{3, 5, 5}));
}

TEST_F(ExecutorTest, GraphErrorsNameTheNode) {
  Graph g = Residual();
  g.nodes[2].op = "CumSum";
  EXPECT_EQ(BuildError(g), "unsupported op 'CumSum' (node 'relu1')");

  g = Residual();
  std::swap(g.nodes[2], g.nodes[3]);  // add reads "r" before relu1 defines it.
  EXPECT_EQ(BuildError(g), "node 'add' (Add): input 'r' is not defined before the node");

  g = Residual();
  g.nodes[1].outputs = {"n", "mean_out"};
  g.nodes[2].inputs = {"mean_out"};
  EXPECT_EQ(BuildError(g),
            "node 'relu1' (Relu): input 'mean_out' is output 1 of node 'bn' (BatchNormalization), "
            "which is not computed");

  g = Residual();
  g.nodes[3].inputs = {"r", "c2"};
  g.nodes.insert(g.nodes.begin() + 3,
                 MakeNode("MaxPool", "pool", {"x"}, {"c2"}, {{"kernel_shape", Ints{2, 2}}}));
  EXPECT_EQ(BuildError(g),
            "node 'add' (Add): operands of shapes [B, 3, 5, 5] and [B, 3, 4, 4] unsupported: two "
            "computed values of one shape, or one of size 1 along the other's axes it does not "
            "match");

  g = Residual();
  g.output = "nothing";
  EXPECT_EQ(BuildError(g), "graph output 'nothing' is not a node output");

  g = Residual();
  g.nodes[4].outputs = {"r"};
  EXPECT_EQ(BuildError(g), "node 'relu2' (Relu): output 'r' is defined twice");
}

TEST(OpRegistryTest, OneEntryPerOp) {
  OpRegistry r = BuiltinOps();
  EXPECT_TRUE(r.Has("Conv"));
  EXPECT_FALSE(r.Has("CumSum"));
  EXPECT_EQ(r.Register("Conv", ConvOp()).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(r.Register("CumSum", OpFactory{}).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<std::string> ops = r.ops();
  EXPECT_EQ(ops.size(), 65u);
  OpRegistry empty;
  Node node = MakeNode("Conv", "c", {"x"}, {"y"});
  EXPECT_EQ(CheckOpSupported(empty, node).message(), "unsupported op 'Conv' (node 'c')");
}

TEST(GraphRewritesTest, FoldsTheTracedViewShape) {
  // x.view(x.size(0), -1) as traced: Unsqueeze(2), Unsqueeze(-1), Concat -> [2, -1].
  Graph g = MakeGraph({3, 2, 2},
                      {MakeNode("Unsqueeze", "u0", {"n", "axes"}, {"n1"}),
                       MakeNode("Unsqueeze", "u1", {"m", "axes"}, {"m1"}),
                       MakeNode("Concat", "cat", {"n1", "m1"}, {"shape"}, {{"axis", int64_t{0}}}),
                       MakeNode("Reshape", "view", {"x", "shape"}, {"y"})},
                      {}, "y");
  Tensor scalar;
  scalar.type = Tensor::Type::kInt64;
  scalar.ints = {2};
  g.constants.push_back({"n", scalar});
  scalar.ints = {-1};
  g.constants.push_back({"m", scalar});
  g.constants.push_back(IntConstant("axes", {0}));
  ASSERT_TRUE(FoldShapeConstants(g).ok());
  ASSERT_EQ(g.nodes.size(), 1u);
  EXPECT_EQ(g.nodes[0].op, "Reshape");
  const Tensor* shape = g.FindConstant("shape");
  ASSERT_NE(shape, nullptr);
  EXPECT_EQ(shape->ints, (Ints{2, -1}));
  EXPECT_EQ(shape->shape, (Ints{2}));
}

TEST(GraphRewritesTest, FusesTransposeMatMulAndBiasAddIntoGemm) {
  Graph g = MakeGraph(
      {4, 1, 1},
      {MakeNode("Transpose", "t", {"fc.weight"}, {"wt"}, {{"perm", Ints{1, 0}}}),
       MakeNode("MatMul", "mm", {"x", "wt"}, {"h"}), MakeNode("Add", "add", {"b", "h"}, {"y"})},
      {RandomConstant("fc.weight", {3, 4}, 1), RandomConstant("b", {3}, 2)}, "y");
  FuseLinear(g);
  ASSERT_EQ(g.nodes.size(), 1u);
  EXPECT_EQ(g.nodes[0].op, "Gemm");
  EXPECT_EQ(g.nodes[0].name, "mm");
  EXPECT_EQ(g.nodes[0].inputs, (std::vector<std::string>{"x", "fc.weight", "b"}));
  EXPECT_EQ(g.nodes[0].outputs, (std::vector<std::string>{"y"}));
  EXPECT_EQ(std::get<int64_t>(g.nodes[0].attributes.at("transB")), 1);
  CheckGraphGradients(g, BuiltinOps());
}

Tensor IntScalar(int64_t v) {
  Tensor t;
  t.type = Tensor::Type::kInt64;
  t.ints = {v};
  return t;
}

// x.chunk(2, dim=1)[1] as torch 1.13 exports it (opset 13): the split point computed from the
// Shape of x at run time, (c + 1) / 2 * 1 and * 2.
Graph Chunk(nn::Dims dims, int64_t dim) {
  Graph g = MakeGraph(
      dims,
      {MakeNode("Relu", "r", {"x"}, {"h"}), MakeNode("Shape", "shape", {"h"}, {"s"}),
       MakeNode("Gather", "size", {"s", "dim"}, {"c"}, {{"axis", int64_t{0}}}),
       MakeNode("Add", "plus", {"c", "one"}, {"c1"}), MakeNode("Div", "half", {"c1", "two"}, {"k"}),
       MakeNode("Mul", "start", {"k", "one"}, {"b"}), MakeNode("Mul", "end", {"k", "two"}, {"e"}),
       MakeNode("Slice", "slice", {"h", "b", "e", "dim"}, {"y"})},
      {}, "y");
  Tensor d = IntScalar(dim);
  d.shape = {1};
  g.constants.push_back({"dim", d});
  g.constants.push_back({"one", IntScalar(1)});
  g.constants.push_back({"two", IntScalar(2)});
  return g;
}

TEST(ShapeArithmeticTest, TheExecutorEvaluatesShapesOfComputedValues) {
  const OpRegistry registry = BuiltinOps();
  auto e = Executor<double>::Create(Chunk({5, 2, 2}, 1), registry);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->num_nodes(), 2);                      // Relu and Slice; the rest were evaluated.
  EXPECT_EQ((*e)->output_dims(), (nn::Dims{2, 2, 2}));  // Channels 3..4 of 5.
  CheckGraphGradients(Chunk({4, 3, 2}, 2), registry);   // Rows 2..3 of 3.

  // The batch size is no constant; a Shape read other than by Gather is refused.
  auto error = [&](const Graph& g) {
    auto e = Executor<float>::Create(g, registry);
    EXPECT_FALSE(e.ok());
    return std::string(e.status().message());
  };
  // The batch size (dimension 0) flows into a target shape's first entry only.
  EXPECT_EQ(error(Chunk({4, 2, 2}, 0)),
            "node 'plus' (Add): computes with the batch size (dimension 0 of a Shape), known "
            "only at run time, other than multiplying it by a positive constant: unsupported "
            "(export the model with a fixed batch size of 2 or more)");
  // Values keep their rank: -1 is the last axis (W); past the rank is refused.
  auto last = Executor<double>::Create(Chunk({4, 2, 6}, -1), registry);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ((*last)->output_dims(), (nn::Dims{4, 2, 3}));  // Columns 3..5 of 6.
  EXPECT_EQ(error(Chunk({4, 2, 2}, 4)),
            "node 'size' (Gather): dimension 4 of a Shape of rank 4 is out of range");
  Graph g = Chunk({4, 2, 2}, 1);
  g.nodes[2] = MakeNode("Add", "size", {"s", "one"}, {"c"});
  EXPECT_EQ(error(g),
            "node 'size' (Add): computes with the batch size (dimension 0 of a Shape), known "
            "only at run time, other than multiplying it by a positive constant: unsupported "
            "(export the model with a fixed batch size of 2 or more)");
  g.nodes[2] = MakeNode("Gather", "size", {"s", "dim"}, {"c"});
  g.nodes[3] = MakeNode("Div", "plus", {"c", "zero"}, {"c1"});
  g.constants.push_back({"zero", IntScalar(0)});
  EXPECT_EQ(error(g), "node 'plus' (Div): division by zero");
}

// x.view(x.size(0), -1) exported with a dynamic batch axis: Shape, Gather 0, Unsqueeze, Concat
// with -1, Reshape; the batch size may stand only first in a target shape.
TEST(ShapeArithmeticTest, TheBatchSizeAsAReshapesFirstEntry) {
  auto view = [](const std::string& first, const std::string& second) {
    Graph g = MakeGraph(
        {3, 2, 2},
        {MakeNode("Shape", "shape", {"x"}, {"s"}), MakeNode("Gather", "size", {"s", "zero"}, {"n"}),
         MakeNode("Unsqueeze", "u", {"n", "axes"}, {"n1"}),
         MakeNode("Concat", "cat", {first, second}, {"target"}, {{"axis", int64_t{0}}}),
         MakeNode("Reshape", "view", {"x", "target"}, {"y"})},
        {IntConstant("axes", {0}), IntConstant("minus", {-1})}, "y");
    g.constants.push_back({"zero", IntScalar(0)});
    return g;
  };
  const OpRegistry registry = BuiltinOps();
  auto e = Executor<double>::Create(view("n1", "minus"), registry);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->output_dims(), (nn::Dims{12, 1, 1}));
  auto bad = Executor<double>::Create(view("minus", "n1"), registry);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "node 'view' (Reshape): target shape [-1, B] for a value of shape [B, 3, 2, 2] "
            "unsupported: moves the batch's elements");
  Graph slice = view("n1", "minus");
  slice.nodes[4] = MakeNode("Slice", "view", {"x", "zero1", "n1", "one1"}, {"y"});
  slice.constants.push_back(IntConstant("zero1", {0}));
  slice.constants.push_back(IntConstant("one1", {1}));
  auto sliced = Executor<double>::Create(slice, registry);
  ASSERT_FALSE(sliced.ok());
  EXPECT_EQ(sliced.status().message(),
            "node 'view' (Slice): input 2 ('n1') holds the batch size (dimension 0 of a Shape), "
            "known only at run time, unsupported here");
}

TEST(GraphRewritesTest, FusesTheChannelShuffle) {
  // torchvision's channel_shuffle(x, 2) on [4, 3, 2] (batch 1 at export).
  Graph g = MakeGraph(
      {4, 3, 2},
      {MakeNode("Relu", "r", {"x"}, {"h"}), MakeNode("Reshape", "split", {"h", "s5"}, {"v"}),
       MakeNode("Transpose", "t", {"v"}, {"vt"}, {{"perm", Ints{0, 2, 1, 3, 4}}}),
       MakeNode("Reshape", "merge", {"vt", "s4"}, {"y"})},
      {IntConstant("s5", {1, 2, 2, 3, 2}), IntConstant("s4", {1, -1, 3, 2})}, "y");
  Graph other_perm = g;
  other_perm.nodes[2].attributes["perm"] = Ints{0, 1, 2, 4, 3};
  FuseChannelShuffle(g);
  ASSERT_EQ(g.nodes.size(), 2u);
  EXPECT_EQ(g.nodes[1].op, "ChannelShuffle");
  EXPECT_EQ(g.nodes[1].name, "t");
  EXPECT_EQ(g.nodes[1].inputs, (std::vector<std::string>{"h", "s5", "s4"}));
  EXPECT_EQ(g.nodes[1].outputs, (std::vector<std::string>{"y"}));
  CheckGraphGradients(g, BuiltinOps());
  FuseChannelShuffle(other_perm);  // Not a channel shuffle: left alone.
  EXPECT_EQ(other_perm.nodes.size(), 4u);
}

// x.permute(0, 2, 3, 1), a layer norm written out over the last axis, a Linear, x.permute(0, 3,
// 1, 2) (as ConvNeXt's blocks export): moved channels-first without the transposes; a region
// that mixes in a channels-first value is left alone.
Graph ChannelsLastBlock() {
  return MakeGraph(
      {4, 2, 3},
      {MakeNode("Relu", "r", {"x"}, {"h"}),
       MakeNode("Transpose", "to_last", {"h"}, {"t"}, {{"perm", Ints{0, 2, 3, 1}}}),
       MakeNode("ReduceMean", "mean", {"t"}, {"u"}, {{"axes", Ints{-1}}}),
       MakeNode("Sub", "sub", {"t", "u"}, {"d"}), MakeNode("Pow", "sq", {"d", "two"}, {"d2"}),
       MakeNode("ReduceMean", "var", {"d2"}, {"v"}, {{"axes", Ints{-1}}}),
       MakeNode("Add", "eps", {"v", "e"}, {"ve"}), MakeNode("Sqrt", "sqrt", {"ve"}, {"s"}),
       MakeNode("Div", "div", {"d", "s"}, {"n"}), MakeNode("Mul", "scale", {"n", "w"}, {"nw"}),
       MakeNode("Add", "shift", {"nw", "b"}, {"y0"}),
       MakeNode("Gemm", "fc", {"y0", "fc.weight", "fc.bias"}, {"y1"}, {{"transB", int64_t{1}}}),
       MakeNode("Transpose", "to_first", {"y1"}, {"y2"}, {{"perm", Ints{0, 3, 1, 2}}}),
       MakeNode("Relu", "out", {"y2"}, {"y"})},
      {FloatScalar("two", 2.0f), FloatScalar("e", 1e-6f), RandomConstant("w", {4}, 7, 0.5, 1.0),
       RandomConstant("b", {4}, 8), RandomConstant("fc.weight", {5, 4}, 9),
       RandomConstant("fc.bias", {5}, 10)},
      "y");
}

TEST(GraphRewritesTest, SinksChannelsLastRegions) {
  Graph g = ChannelsLastBlock();
  SinkChannelsLast(g);
  std::vector<std::string> ops;
  for (const Node& n : g.nodes) ops.push_back(n.op);
  EXPECT_EQ(ops, (std::vector<std::string>{"Relu", "ReduceMean", "Sub", "Pow", "ReduceMean", "Add",
                                           "Sqrt", "Div", "Mul", "Add", "Conv", "Relu"}));
  EXPECT_EQ(g.nodes[1].inputs, (std::vector<std::string>{"h"}));
  EXPECT_EQ(g.nodes.back().inputs, (std::vector<std::string>{"y1"}));
  EXPECT_EQ(std::get<std::vector<int64_t>>(g.nodes[8].attributes.at("operand_shape")),
            (Ints{4, 1, 1}));
  EXPECT_EQ(g.nodes[5].attributes.count("operand_shape"), 0u);  // The scalar eps.
  CheckGraphGradients(g, BuiltinOps());

  // A channels-first value joining the region: not moved (and the Transpose is refused).
  Graph mixed = ChannelsLastBlock();
  mixed.nodes[3] = MakeNode("Sub", "sub", {"t", "h"}, {"d"});
  SinkChannelsLast(mixed);
  EXPECT_EQ(mixed.nodes.size(), 14u);
  EXPECT_EQ(mixed.nodes[1].op, "Transpose");
  // A region value leaving other than through the closing Transpose: not moved either.
  Graph leaking = ChannelsLastBlock();
  leaking.output = "y1";
  leaking.nodes.pop_back();
  leaking.nodes.pop_back();
  SinkChannelsLast(leaking);
  EXPECT_EQ(leaking.nodes[1].op, "Transpose");
}

// Nodes evaluated away (a Shape) ahead of two branches whose gradients pass through the shared
// buffer pair: Backward must know which built node runs next, not which graph node.
TEST(ShapeArithmeticTest, BranchesAfterAnEvaluatedShapeGetTheirGradients) {
  for (int shapes = 1; shapes <= 2; ++shapes) {
    SCOPED_TRACE(shapes);
    std::vector<Node> nodes;
    for (int k = 0; k < shapes; ++k) {
      nodes.push_back(MakeNode("Shape", absl::StrCat("shape", k), {"x"}, {absl::StrCat("s", k)}));
    }
    for (Node n :
         {MakeNode("Conv", "conv1", {"x", "w1"}, {"a"}, {{"pads", Ints{1, 1, 1, 1}}}),
          MakeNode("Relu", "relu1", {"a"}, {"r1"}), MakeNode("Relu", "relu2", {"x"}, {"b"}),
          MakeNode("Conv", "conv2", {"r1", "w2"}, {"c"}, {{"pads", Ints{1, 1, 1, 1}}}),
          MakeNode("Add", "add", {"c", "b"}, {"y"})}) {
      nodes.push_back(std::move(n));
    }
    const Graph g = MakeGraph(
        {2, 4, 4}, std::move(nodes),
        {RandomConstant("w1", {2, 2, 3, 3}, 1), RandomConstant("w2", {2, 2, 3, 3}, 2)}, "y");
    CheckGraphGradients(g, BuiltinOps());
  }
}

// The int64 chains exports compute targets with: x.expand(B, -1, -1)'s (Reshape, Shape of a
// constant, ConstantOfShape, Mul, Equal, Where: -1 becomes 1), a window's padding (Mod with the
// divisor's sign, a scalar minus a [1] giving [1]) and shape[0:2] (Slice).
TEST(GraphRewritesTest, FoldsExpandTargetsAndPaddingArithmetic) {
  Tensor one_d;
  one_d.type = Tensor::Type::kInt64;
  one_d.shape = {1};
  one_d.ints = {3};
  Graph g =
      MakeGraph({3, 1, 1},
                {MakeNode("Reshape", "flat", {"target", "minus1"}, {"t"}),
                 MakeNode("Shape", "shape", {"t"}, {"s"}),
                 MakeNode("ConstantOfShape", "ones", {"s"}, {"o"}, {{"value_int", int64_t{1}}}),
                 MakeNode("Mul", "neg", {"o", "minus_scalar"}, {"m"}),
                 MakeNode("Equal", "eq", {"t", "m"}, {"e"}),
                 MakeNode("Where", "where", {"e", "o", "t"}, {"w"}),
                 MakeNode("Mod", "mod", {"minus_scalar", "seven"}, {"r"}),
                 MakeNode("Sub", "pad", {"seven", "three_1d"}, {"p"}),
                 MakeNode("Slice", "lead", {"target", "zero", "two"}, {"l"}),
                 MakeNode("Relu", "r", {"x"}, {"y"})},
                {IntConstant("target", {2, -1, -1}),
                 IntConstant("minus1", {-1}),
                 {"minus_scalar", IntScalar(-1)},
                 {"seven", IntScalar(7)},
                 {"three_1d", one_d},
                 IntConstant("zero", {0}),
                 IntConstant("two", {2})},
                "y");
  ASSERT_TRUE(FoldShapeConstants(g).ok());
  ASSERT_EQ(g.nodes.size(), 1u);  // Only the Relu is left.
  auto value = [&](const std::string& name) {
    const Tensor* t = g.FindConstant(name);
    return t == nullptr ? std::string("missing")
                        : absl::StrCat(ShapeText(t->shape), " ", ShapeText(t->ints));
  };
  EXPECT_EQ(value("w"), "[3] [2, 1, 1]");
  EXPECT_EQ(value("r"), "[] [6]");  // -1 mod 7, Python's sign.
  EXPECT_EQ(value("p"), "[1] [4]");
  EXPECT_EQ(value("l"), "[2] [2, -1]");

  // A float ConstantOfShape (zeros, ones) is no shape arithmetic, but a constant to fold
  // (constant_folding.h): a float tensor, not int64 zeros.
  Graph ones =
      MakeGraph({3, 1, 1},
                {MakeNode("ConstantOfShape", "ones", {"target"}, {"z"}, {{"value_float", 1.0f}}),
                 MakeNode("Relu", "r", {"x"}, {"y"})},
                {IntConstant("target", {2, 3})}, "y");
  ASSERT_TRUE(FoldShapeConstants(ones).ok());
  EXPECT_EQ(ones.nodes.size(), 1u);
  const Tensor* z = ones.FindConstant("z");
  ASSERT_NE(z, nullptr);
  EXPECT_EQ(z->type, Tensor::Type::kFloat);
  EXPECT_EQ(z->floats, std::vector<float>(6, 1.0f));
}

// nn.LayerNorm(6) as torch exports it below opset 17, on [N, 4, 6]: nine nodes become one
// LayerNormalization with the same output; a pattern whose intermediate is read elsewhere (or
// without the learned weight) is left alone.
TEST(GraphRewritesTest, FusesALayerNormWrittenOut) {
  auto written_out = [](bool leak) {
    NamedConstant w = RandomConstant("ln.weight", {6}, 1, 0.5, 1.0);
    NamedConstant b = RandomConstant("ln.bias", {6}, 2);
    w.state = b.state = true;
    std::vector<Node> nodes = {MakeNode("ReduceMean", "mean", {"x"}, {"m"}, {{"axes", Ints{-1}}}),
                               MakeNode("Sub", "sub", {"x", "m"}, {"d"}),
                               MakeNode("Pow", "pow", {"d", "two"}, {"p"}),
                               MakeNode("ReduceMean", "var", {"p"}, {"v"}, {{"axes", Ints{-1}}}),
                               MakeNode("Add", "eps", {"v", "eps_value"}, {"ve"}),
                               MakeNode("Sqrt", "sqrt", {"ve"}, {"s"}),
                               MakeNode("Div", "div", {"d", "s"}, {"n"}),
                               MakeNode("Mul", "scale", {"n", "ln.weight"}, {"sc"}),
                               MakeNode("Add", "shift", {"sc", "ln.bias"}, {"y0"}),
                               MakeNode("Relu", "relu", {"y0"}, {"y"})};
    if (leak) nodes.push_back(MakeNode("Add", "leak", {"y", "d"}, {"y2"}));
    Graph g = MakeGraph({4, 6, 1}, std::move(nodes),
                        {FloatScalar("two", 2.0f), FloatScalar("eps_value", 1e-5f), w, b},
                        leak ? "y2" : "y");
    g.input_rank = 3;
    return g;
  };
  const Graph plain = written_out(false);
  Graph fused = plain;
  FuseLayerNorm(fused);
  ASSERT_EQ(fused.nodes.size(), 2u);
  EXPECT_EQ(fused.nodes[0].op, "LayerNormalization");
  EXPECT_EQ(fused.nodes[0].inputs, (std::vector<std::string>{"x", "ln.weight", "ln.bias"}));
  EXPECT_EQ(fused.nodes[0].outputs, (std::vector<std::string>{"y0"}));
  // The same outputs and gradients as the nine nodes, in double.
  const OpRegistry registry = BuiltinOps();
  auto a = Executor<double>::Create(plain, registry);
  auto f = Executor<double>::Create(fused, registry);
  ASSERT_TRUE(a.ok() && f.ok()) << a.status() << f.status();
  ASSERT_EQ((*a)->num_params(), (*f)->num_params());
  const int batch = 3;
  std::vector<double> x(batch * 24), pa((*a)->initial_params()), pf((*f)->initial_params());
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7 * i) * 2;
  std::vector<double> ga(pa.size()), gf(pf.size());
  (*a)->Bind(pa.data(), ga.data(), nullptr);
  (*f)->Bind(pf.data(), gf.data(), nullptr);
  const nn::TensorRef<double> ya = ForwardOk(**a, x.data(), batch, true);
  const nn::TensorRef<double> yf = ForwardOk(**f, x.data(), batch, true);
  ASSERT_EQ(ya.size(), yf.size());
  std::vector<double> g(ya.size());
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_NEAR(ya.data[i], yf.data[i], 1e-12) << i;
    g[i] = std::cos(0.3 * i);
  }
  (*a)->Backward({g.data(), batch, ya.dims}, false);
  (*f)->Backward({g.data(), batch, yf.dims}, false);
  for (size_t i = 0; i < ga.size(); ++i) EXPECT_NEAR(ga[i], gf[i], 1e-12) << i;

  Graph leaking = written_out(true);
  FuseLayerNorm(leaking);
  EXPECT_EQ(leaking.nodes.size(), 11u);  // d is read outside the pattern: left alone.
}

// Constants computed on constants, as Swin's window masks are (constant_folding.h): Range,
// N-d Slice with an open end (INT64_MAX) and a negative step, Transpose, Where with
// broadcasting, ScatterND, Cast, a float ConstantOfShape.
TEST(ConstantFoldingTest, FoldsTheOpsOfAnExportedMask) {
  auto fold = [](const Node& node, std::vector<Tensor> inputs) {
    std::vector<const Tensor*> in;
    for (const Tensor& t : inputs) in.push_back(&t);
    absl::StatusOr<Tensor> t = FoldConstantNode(node, in);
    if (!t.ok()) return std::string(t.status().message());
    std::string values;
    for (int64_t v : t->ints) absl::StrAppend(&values, " ", v);
    for (float v : t->floats) absl::StrAppend(&values, " ", v);
    return absl::StrCat(ShapeText(t->shape), values);
  };
  auto ints = [](std::vector<int64_t> shape, std::vector<int64_t> values) {
    Tensor t;
    t.type = Tensor::Type::kInt64;
    t.shape = std::move(shape);
    t.ints = std::move(values);
    return t;
  };
  auto floats = [](std::vector<int64_t> shape, std::vector<float> values) {
    Tensor t;
    t.shape = std::move(shape);
    t.floats = std::move(values);
    return t;
  };
  EXPECT_EQ(fold(MakeNode("Range", "r", {"a", "b", "c"}, {"y"}),
                 {ints({}, {2}), ints({}, {9}), ints({}, {3})}),
            "[3] 2 5 8");
  const Tensor grid = ints({2, 3}, {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(fold(MakeNode("Slice", "s", {"x", "b", "e", "a"}, {"y"}),
                 {grid, ints({1}, {-2}), ints({1}, {std::numeric_limits<int64_t>::max()}),
                  ints({1}, {1})}),
            "[2, 2] 1 2 4 5");
  EXPECT_EQ(fold(MakeNode("Slice", "s", {"x", "b", "e", "a", "st"}, {"y"}),
                 {grid, ints({1}, {-1}), ints({1}, {-std::numeric_limits<int64_t>::max()}),
                  ints({1}, {1}), ints({1}, {-1})}),
            "[2, 3] 2 1 0 5 4 3");
  EXPECT_EQ(fold(MakeNode("Transpose", "t", {"x"}, {"y"}), {grid}), "[3, 2] 0 3 1 4 2 5");
  EXPECT_EQ(fold(MakeNode("Where", "w", {"c", "x", "y"}, {"z"}),
                 {ints({2, 1}, {1, 0}), floats({3}, {1, 2, 3}), floats({}, {-1})}),
            "[2, 3] 1 2 3 -1 -1 -1");
  EXPECT_EQ(fold(MakeNode("ScatterND", "s", {"x", "i", "u"}, {"y"}),
                 {floats({2, 2}, {0, 0, 0, 0}), ints({2, 2}, {0, 1, 1, 0}), floats({2}, {7, 8})}),
            "[2, 2] 0 7 8 0");
  EXPECT_EQ(fold(MakeNode("Cast", "c", {"x"}, {"y"}, {{"to", int64_t{1}}}), {grid}),
            "[2, 3] 0 1 2 3 4 5");
  EXPECT_EQ(fold(MakeNode("Not", "n", {"x"}, {"y"}), {ints({2}, {0, 3})}), "[2] 1 0");
  EXPECT_EQ(fold(MakeNode("Range", "r", {"a", "b", "c"}, {"y"}),
                 {ints({}, {0}), ints({}, {5}), ints({}, {0})}),
            "node 'r' (Range): folding constants: a zero delta");
  EXPECT_EQ(fold(MakeNode("Range", "r", {"a", "b", "c"}, {"y"}),
                 {ints({0}, {}), ints({}, {5}), ints({}, {1})}),
            "node 'r' (Range): folding constants: Range takes three scalars");
  EXPECT_EQ(fold(MakeNode("Gather", "g", {"x"}, {"y"}), {grid}),
            "node 'g' (Gather): folding constants: Gather takes two inputs");
  EXPECT_EQ(fold(MakeNode("Slice", "s", {"x", "b", "e", "a", "st"}, {"y"}),
                 {grid, ints({1}, {0}), ints({1}, {3}), ints({1}, {1}),
                  ints({1}, {std::numeric_limits<int64_t>::max()})}),
            "[2, 1] 0 3");
  EXPECT_EQ(
      fold(MakeNode("Add", "a", {"x", "y"}, {"z"}), {ints({2}, {1, 2}), ints({3}, {1, 2, 3})}),
      "node 'a' (Add): folding constants: shapes that do not broadcast");
}

// torch.einsum's attention products become a MatMul with Transposes where an operand or the
// output is in another order; the result is the sum the equation says (checked in double at
// batch 1) and its gradients pass the finite-difference check.
TEST(GraphRewritesTest, EinsumOfABatchedMatrixProduct) {
  auto graph = [](const std::string& equation) {
    Graph g =
        MakeGraph({2, 3, 4},
                  {MakeNode("Relu", "a", {"x"}, {"a"}), MakeNode("Sigmoid", "b", {"x"}, {"b"}),
                   MakeNode("Einsum", "e", {"a", "b"}, {"y"}, {{"equation", equation}})},
                  {}, "y");
    g.input_rank = 4;
    EinsumToMatMul(g);
    return g;
  };
  const Graph qk = graph("bhid,bhjd->bhij");  // q k^T: [B, 2, 3, 3].
  ASSERT_EQ(qk.nodes.size(), 4u);
  EXPECT_EQ(qk.nodes[2].op, "Transpose");
  EXPECT_EQ(qk.nodes[3].op, "MatMul");
  EXPECT_EQ(qk.nodes[3].outputs, (std::vector<std::string>{"y"}));
  auto e = Executor<double>::Create(qk, BuiltinOps());
  ASSERT_TRUE(e.ok()) << e.status();
  std::vector<double> x(24);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.9 * i);
  (*e)->Bind(nullptr, nullptr, nullptr);
  const nn::TensorRef<double> y = ForwardOk(**e, x.data(), 1, false);
  ASSERT_EQ(y.size(), 18);
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < 3; ++i) {
      for (int j = 0; j < 3; ++j) {
        double sum = 0;
        for (int d = 0; d < 4; ++d) {
          const double a = std::max(0.0, x[(h * 3 + i) * 4 + d]);
          const double b = 1 / (1 + std::exp(-x[(h * 3 + j) * 4 + d]));
          sum += a * b;
        }
        EXPECT_NEAR(y.data[(h * 3 + i) * 3 + j], sum, 1e-12);
      }
    }
  }
  CheckGraphGradients(qk, BuiltinOps());
  // An output in another order: a Transpose after the MatMul; other forms are left alone.
  const Graph swapped = graph("bhid,bhjd->bhji");
  EXPECT_EQ(swapped.nodes.back().op, "Transpose");
  CheckGraphGradients(swapped, BuiltinOps());
  EXPECT_EQ(graph("bhid,bhjd->bh").nodes.back().op, "Einsum");
  // MaxViT writes capitals and spaces.
  EXPECT_EQ(graph("B H I D, B H J D -> B H I J").nodes.back().op, "MatMul");
}

// Malformed shape arithmetic in a file: one error naming the node, no read past a vector.
TEST(GraphRewritesTest, MalformedShapeArithmeticIsRefused) {
  auto fold = [](Node node, std::vector<NamedConstant> constants) {
    Graph g = MakeGraph({3, 1, 1}, {std::move(node), MakeNode("Relu", "r", {"x"}, {"y"})},
                        std::move(constants), "y");
    return std::string(FoldShapeConstants(g).message());
  };
  Tensor empty;
  empty.type = Tensor::Type::kInt64;
  empty.shape = {0};
  // An empty operand gives an empty result, as NumPy's (Swin's masks slice empty windows).
  EXPECT_EQ(
      fold(MakeNode("Add", "add", {"e", "one"}, {"z"}), {{"e", empty}, {"one", IntScalar(1)}}), "");
  EXPECT_EQ(fold(MakeNode("Unsqueeze", "u", {"one", "axes"}, {"z"}),
                 {{"one", IntScalar(1)}, IntConstant("axes", {1, 1})}),
            "node 'u' (Unsqueeze): an axis given twice");
}

}  // namespace
}  // namespace graph
}  // namespace dptrain
