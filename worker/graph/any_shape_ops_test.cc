// Values of any rank with the batch on any axis (value_shape.h) and the ops that take them
// (any_shape_ops.h): where a Reshape finds the batch, and each op forward and backward through
// the executor (double gradients against central finite differences, float against double) at
// a batch other than the one the graph's constants were written for, and their refusals.
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/graph/executor.h"
#include "worker/graph/graph_check.h"
#include "worker/graph/graph_model.h"
#include "worker/graph/op_registry.h"
#include "worker/graph/value_shape.h"
#include "worker/nn/layer_check.h"

namespace dptrain {
namespace graph {
namespace {

using Ints = std::vector<int64_t>;

ValueShape Make(Ints dims, int batch_axis, int64_t outer = 1, int64_t inner = 1) {
  ValueShape s;
  s.dims = std::move(dims);
  s.batch_axis = batch_axis;
  s.batch_outer = outer;
  s.batch_inner = inner;
  return s;
}

std::string Reshaped(const ValueShape& in, const Ints& target) {
  absl::StatusOr<ValueShape> s = ReshapedShape(in, target);
  return s.ok() ? s->ToString() : std::string(s.status().message());
}

TEST(ValueShapeTest, ReshapeFindsTheBatch) {
  // Batch-first values keep the rule graphs always imported with: the first entry is the batch.
  EXPECT_EQ(Reshaped(Make({1, 16, 4, 4}, 0), {2, 16, -1}), "[B, 16, 16]");
  EXPECT_EQ(Reshaped(Make({1, 17, 48}, 0), {2, 17, 3, 2, 8}), "[B, 17, 3, 2, 8]");
  EXPECT_EQ(Reshaped(Make({1, 12}, 0), {kBatchSize, 3, 4}), "[B, 3, 4]");
  // nn.MultiheadAttention as exported with a batch of 2: [17, B, 16] -> view(17, B * 2, 8),
  // then back through [17 * B, 16] to [17, B, 16].
  EXPECT_EQ(Reshaped(Make({17, 1, 16}, 1), {17, 4, 8}), "[17, B*2, 8]");
  EXPECT_EQ(Reshaped(Make({17, 2, 8}, 1, 1, 2), {34, 16}), "[17*B, 16]");
  EXPECT_EQ(Reshaped(Make({17, 16}, 0, 17, 1), {17, 2, 16}), "[17, B, 16]");
  // x.view(B * H, N, d) of a batch-first [B, H, N, d] value.
  EXPECT_EQ(Reshaped(Make({1, 2, 17, 8}, 0), {4, 17, 8}), "[B*2, 17, 8]");
  // A dynamic export names the batch; 0 copies the batch axis.
  EXPECT_EQ(Reshaped(Make({17, 1, 16}, 1), {17, kBatchSize, 2, -1}), "[17, B, 2, 8]");
  EXPECT_EQ(Reshaped(Make({17, 2, 8}, 1, 1, 2), {0, 0, 4, 2}), "[17, B*2, 4, 2]");
  // nn.MultiheadAttention exported with a dynamic batch: bsz * num_heads and tgt_len * bsz
  // come from shape arithmetic as multiples of the batch; where the batch lies in the merged
  // axis follows from the elements in front of it.
  EXPECT_EQ(Reshaped(Make({17, 1, 16}, 1), {17, BatchMultiple(2), 8}), "[17, B*2, 8]");
  EXPECT_EQ(Reshaped(Make({17, 2, 8}, 1, 1, 2), {BatchMultiple(17), 16}), "[17*B, 16]");
  EXPECT_EQ(Reshaped(Make({17, 16}, 0, 17, 1), {17, kBatchSize, 16}), "[17, B, 16]");
  EXPECT_EQ(Reshaped(Make({1, 2, 17, 8}, 0), {BatchMultiple(2), 17, 8}), "[B*2, 17, 8]");
  // Swin's attn.view(-1, heads, N, N) of [B, windows, heads, N, N]: the -1 leads with the batch.
  EXPECT_EQ(Reshaped(Make({1, 9, 3, 49, 49}, 0), {-1, 3, 49, 49}), "[B*9, 3, 49, 49]");
}

TEST(ValueShapeTest, ReshapeRefusals) {
  // Exported with a batch of 1, the batch could be either part of [17, 2, 8]'s first two axes.
  EXPECT_EQ(Reshaped(Make({17, 1, 16}, 1), {17, 2, 8}),
            "target shape [17, 2, 8] for a value of shape [17, B, 16] unsupported: cannot tell "
            "which axis holds the batch ([17*B, 2, 8] or [17, B*2, 8]): export with a batch size "
            "that no axis of the model has, or with a dynamic batch axis");
  EXPECT_EQ(Reshaped(Make({17, 1, 16}, 1), {17, 32, -1}),
            "target shape [17, 32, -1] for a value of shape [17, B, 16] unsupported: both the "
            "batch and a -1 to infer (export with a dynamic batch axis)");
  EXPECT_EQ(Reshaped(Make({1, 12}, 0), {-1, kBatchSize}),
            "target shape [-1, B] for a value of shape [B, 12] unsupported: moves the batch's "
            "elements");
  EXPECT_EQ(Reshaped(Make({1, 17, 16}, 0), {17, BatchMultiple(16)}),
            "target shape [17, B*16] for a value of shape [B, 17, 16] unsupported: moves the "
            "batch's elements");
  // A 0 (copy the input's axis) in a fixed-batch target: no division by a zero batch.
  EXPECT_EQ(Reshaped(Make({1, 12}, 0), {3, 0, 5}),
            "target shape [3, 0, 5] for input [12, 1, 1] of each sample unsupported: changes the "
            "number of elements of a sample");
  EXPECT_EQ(Reshaped(Make({4, 1, 6}, 1), {0, 6, 4}),
            "target shape [0, 6, 4] for a value of shape [4, B, 6] unsupported: splits the "
            "batch");
  EXPECT_EQ(Reshaped(Make({1, 12}, 0), {2, 5}),
            "target shape [2, 5] for input [12, 1, 1] of each sample unsupported: changes the "
            "number of elements of a sample");
}

TEST(ValueShapeTest, DimsForOps) {
  EXPECT_EQ(Make({1, 3, 4, 5}, 0).dims_for_ops(), (nn::Dims{3, 4, 5}));
  EXPECT_EQ(Make({1, 6}, 0).dims_for_ops(), (nn::Dims{6, 1, 1}));
  EXPECT_TRUE(Make({1, 3, 4}, 0).IsBatchFirst());
  EXPECT_FALSE(Make({4, 1, 3}, 1).IsBatchFirst());
  EXPECT_EQ(Make({4, 1, 3}, 1).dims_for_ops(), (nn::Dims{12, 1, 1}));
  EXPECT_FALSE(Make({1, 2, 3, 4, 5}, 0).IsBatchFirst());
  EXPECT_EQ(Make({17, 2, 8}, 1, 1, 2).Concrete(3), (Ints{17, 6, 8}));
  EXPECT_EQ(Make({17, 16}, 0, 17, 1).Concrete(3), (Ints{51, 16}));
  EXPECT_EQ(ValueShape::BatchFirst({5, 1, 1}, 4).ToString(), "[B, 5, 1, 1]");
  EXPECT_EQ(ValueShape::BatchFirst({5, 3, 1}, 2).ToString(), "[B, 5, 3]");  // Grows to fit.
}

// A classifier's output is [B, classes]: a value whose batch lies elsewhere is not read as
// per-sample logits (its per-sample element count would pass for a class count).
TEST(ValueShapeTest, ClassifierOutputIsBatchFirst) {
  Graph g;
  g.output = "logits";
  EXPECT_TRUE(CheckClassifierOutput(g, Make({1, 10}, 0)).ok());
  EXPECT_TRUE(CheckClassifierOutput(g, Make({1, 10, 1, 1}, 0)).ok());
  EXPECT_EQ(CheckClassifierOutput(g, Make({17, 1, 10}, 1)).message(),
            "graph output 'logits' has shape [17, B, 10], expected [B, classes] (or [B, targets])");
  EXPECT_EQ(CheckClassifierOutput(g, Make({1, 17, 10}, 0)).message(),
            "graph output 'logits' has shape [B, 17, 10], expected [B, classes] (or [B, targets])");
}

class AnyShapeOpsTest : public ::testing::Test {
 protected:
  // A graph from x (per-sample dims `dims`, rank `rank`) through `nodes`.
  static Graph Of(nn::Dims dims, int rank, std::vector<Node> nodes,
                  std::vector<NamedConstant> constants = {}) {
    Graph g = Chain(dims, std::move(nodes), std::move(constants));
    g.input_rank = rank;
    return g;
  }
  static NamedConstant Learned(const std::string& name, Ints shape, uint64_t seed) {
    NamedConstant c = RandomConstant(name, std::move(shape), seed);
    c.state = true;
    return c;
  }
  void Check(const Graph& graph) { CheckGraphGradients(graph, registry_); }
  std::string BuildError(const Graph& graph) {
    absl::StatusOr<std::unique_ptr<Executor<float>>> e = Executor<float>::Create(graph, registry_);
    EXPECT_FALSE(e.ok());
    return std::string(e.status().message());
  }
  std::string OutputShape(const Graph& graph) {
    absl::StatusOr<std::unique_ptr<Executor<double>>> e =
        Executor<double>::Create(graph, registry_);
    if (!e.ok()) return std::string(e.status().message());
    return (*e)->value_shapes()[(*e)->output_value()].ToString();
  }
  const OpRegistry registry_ = BuiltinOps();
};

// One attention head on [N, 4 tokens, 6 features], the way timm writes it: x W^T per token
// (a Gemm over the last axis), q k^T by a MatMul of two computed values, softmax over the last
// axis, times v, a layer norm of each token.
TEST_F(AnyShapeOpsTest, SelfAttentionOfOneHead) {
  const Graph g =
      Of({4, 6, 1}, 3,
         {MakeNode("Gemm", "q", {"x", "wq", "bq"}, {"q"}, {{"transB", int64_t{1}}}),
          MakeNode("Gemm", "k", {"x", "wk"}, {"k"}, {{"transB", int64_t{1}}}),
          MakeNode("Transpose", "kt", {"k"}, {"kt"}, {{"perm", Ints{0, 2, 1}}}),
          MakeNode("MatMul", "scores", {"q", "kt"}, {"s"}),
          MakeNode("Mul", "scale", {"s", "c"}, {"s2"}),
          MakeNode("Softmax", "attn", {"s2"}, {"a"}, {{"axis", int64_t{-1}}}),
          MakeNode("MatMul", "mix", {"a", "x"}, {"m"}),
          MakeNode("LayerNormalization", "ln", {"m", "g", "b"}, {"y"}, {{"axis", int64_t{-1}}})},
         {RandomConstant("wq", {5, 6}, 1), RandomConstant("bq", {5}, 2),
          RandomConstant("wk", {5, 6}, 3), FloatScalar("c", 0.7f),
          RandomConstant("g", {6}, 4, 0.5, 1.0), RandomConstant("b", {6}, 5)});
  EXPECT_EQ(OutputShape(g), "[B, 4, 6]");
  Check(g);
}

// nn.MultiheadAttention's layout at a batch (3) other than the export's (2): sequence-first
// [4, B, 6], the batch merged with 2 heads ([4, B*2, 3]), heads-first for the products, then
// merged with the tokens ([4*B, 6]) for the output projection and split back.
TEST_F(AnyShapeOpsTest, MultiheadLayoutWithTheBatchMerged) {
  const Graph g =
      Of({4, 6, 1}, 3,
         {MakeNode("Transpose", "seq_first", {"x"}, {"t"}, {{"perm", Ints{1, 0, 2}}}),
          MakeNode("Reshape", "heads", {"t", "s1"}, {"h"}),
          MakeNode("Transpose", "heads_first", {"h"}, {"hf"}, {{"perm", Ints{1, 0, 2}}}),
          MakeNode("Transpose", "kt", {"hf"}, {"kt"}, {{"perm", Ints{0, 2, 1}}}),
          MakeNode("MatMul", "scores", {"hf", "kt"}, {"s"}),
          MakeNode("Softmax", "attn", {"s"}, {"a"}, {{"axis", int64_t{-1}}}),
          MakeNode("MatMul", "mix", {"a", "hf"}, {"m"}),
          MakeNode("Transpose", "back", {"m"}, {"mb"}, {{"perm", Ints{1, 0, 2}}}),
          MakeNode("Reshape", "tokens", {"mb", "s2"}, {"tk"}),
          MakeNode("Gemm", "proj", {"tk", "w", "bias"}, {"p"}, {{"transB", int64_t{1}}}),
          MakeNode("Reshape", "split", {"p", "s3"}, {"sp"}),
          MakeNode("Transpose", "batch_first", {"sp"}, {"y"}, {{"perm", Ints{1, 0, 2}}})},
         {IntConstant("s1", {4, 4, 3}), IntConstant("s2", {8, 6}), IntConstant("s3", {4, 2, 6}),
          RandomConstant("w", {6, 6}, 6), RandomConstant("bias", {6}, 7)});
  EXPECT_EQ(OutputShape(g), "[B, 4, 6]");
  Check(g);
}

// timm's qkv: Reshape to 5-D, a permute that moves the batch to axis 1, Split (as Slices along
// axis 0) and Squeeze; a class token expanded over the batch and concatenated; a positional
// embedding and a bias broadcast; the head on token 0 (Gather).
TEST_F(AnyShapeOpsTest, TokensClassTokenAndHead) {
  const Graph g = Of(
      {3, 4, 1}, 3,
      {MakeNode("Expand", "cls", {"cls_token", "target"}, {"c"}),
       MakeNode("Concat", "cat", {"c", "x"}, {"t"}, {{"axis", int64_t{1}}}),
       MakeNode("Add", "pos", {"t", "pos_embed"}, {"t1"}),
       MakeNode("Add", "bias", {"bias", "t1"}, {"t2"}),
       MakeNode("Reshape", "qkv", {"t2", "s5"}, {"r"}),
       MakeNode("Transpose", "perm", {"r"}, {"p"}, {{"perm", Ints{2, 0, 3, 1, 4}}}),
       MakeNode("Slice", "q0", {"p", "zero", "one", "zero"}, {"q5"}),
       MakeNode("Squeeze", "q", {"q5", "zero"}, {"q"}), MakeNode("Mul", "gate", {"q", "q"}, {"qq"}),
       MakeNode("Sub", "minus", {"one_f", "qq"}, {"d"}),
       MakeNode("Div", "div", {"d", "two_f"}, {"e"}),
       MakeNode("Div", "over", {"two_f", "e2"}, {"f"}),
       MakeNode("Transpose", "tok", {"f"}, {"tk"}, {{"perm", Ints{0, 2, 1, 3}}}),
       MakeNode("Reshape", "merge", {"tk", "s3"}, {"m"}),
       MakeNode("Gather", "head", {"m", "index"}, {"y"}, {{"axis", int64_t{1}}})},
      {Learned("cls_token", {1, 1, 4}, 8), IntConstant("target", {2, 1, 1}),
       Learned("pos_embed", {1, 4, 4}, 9), Learned("bias", {4}, 10),
       IntConstant("s5", {2, 4, 2, 1, 2}), IntConstant("zero", {0}), IntConstant("one", {1}),
       FloatScalar("one_f", 1.0f), FloatScalar("two_f", 2.0f), IntConstant("s3", {2, 4, 2}),
       IntConstant("index", {3})});
  Graph fixed = g;
  // e2 = 3 + e * e keeps the divisor away from zero.
  fixed.nodes.insert(fixed.nodes.begin() + 11, {MakeNode("Mul", "sq", {"e", "e"}, {"ee"}),
                                                MakeNode("Add", "shift", {"ee", "three"}, {"e2"})});
  fixed.constants.push_back(FloatScalar("three", 3.0f));
  EXPECT_EQ(OutputShape(fixed), "[B, 1, 2]");  // 1-D indices keep the axis.
  Check(fixed);
}

TEST_F(AnyShapeOpsTest, SliceGatherAndConcatAlongAnyAxis) {
  // [N, 2, 3, 4]: every other column of rows 1..2 (steps), the last column (negative axis and
  // index) of the same rows, joined along the last axis, then a softmax of each row.
  const Graph g = Of({2, 3, 4}, 4,
                     {MakeNode("Slice", "cols", {"x", "b", "e", "a", "st"}, {"s"}),
                      MakeNode("Gather", "last", {"x", "minus"}, {"l"}, {{"axis", int64_t{-1}}}),
                      MakeNode("Slice", "rows", {"l", "b1", "e1", "a1"}, {"l2"}),
                      MakeNode("Squeeze", "sq", {"l2", "minus"}, {"l1"}),
                      MakeNode("Unsqueeze", "u", {"l1", "minus"}, {"l3"}),
                      MakeNode("Concat", "cat", {"s", "l3"}, {"c"}, {{"axis", int64_t{-1}}}),
                      MakeNode("Softmax", "sm", {"c"}, {"y"}, {{"axis", int64_t{-1}}})},
                     {IntConstant("b", {1, 0}), IntConstant("e", {3, 4}), IntConstant("a", {2, -1}),
                      IntConstant("st", {1, 2}), IntConstant("minus", {-1}), IntConstant("b1", {1}),
                      IntConstant("e1", {3}), IntConstant("a1", {2})});
  EXPECT_EQ(OutputShape(g), "[B, 2, 2, 3]");
  Check(g);
}

// A layer norm written out (as torch exports nn.LayerNorm below opset 17) on a value whose batch
// is not first: ReduceMean over the last axis kept, Sub and Div of the [4, B, 1] statistics
// broadcast into [4, B, 6], Pow, Sqrt; and a mean over two axes not kept.
TEST_F(AnyShapeOpsTest, LayerNormWrittenOutAndReduceMean) {
  const Graph g = Of(
      {4, 6, 1}, 3,
      {MakeNode("Transpose", "seq_first", {"x"}, {"t"}, {{"perm", Ints{1, 0, 2}}}),
       MakeNode("ReduceMean", "mean", {"t"}, {"m"}, {{"axes", Ints{-1}}}),
       MakeNode("Sub", "centre", {"t", "m"}, {"c"}),
       MakeNode("Pow", "square", {"c", "two"}, {"c2"}),
       MakeNode("ReduceMean", "var", {"c2"}, {"v"}, {{"axes", Ints{-1}}}),
       MakeNode("Add", "eps", {"v", "eps_value"}, {"v1"}), MakeNode("Sqrt", "std", {"v1"}, {"sd"}),
       MakeNode("Div", "norm", {"c", "sd"}, {"n"}), MakeNode("Mul", "scale", {"n", "g"}, {"y0"}),
       MakeNode("ReduceMean", "pool", {"y0"}, {"y"},
                {{"axes", Ints{0, 2}}, {"keepdims", int64_t{0}}})},
      {FloatScalar("two", 2.0f), FloatScalar("eps_value", 1e-5f), Learned("g", {6}, 11)});
  EXPECT_EQ(OutputShape(g), "[B]");
  Check(g);
  Graph every = g;
  every.nodes.back().attributes["axes"] = Ints{0, 1, 2};
  EXPECT_EQ(BuildError(every),
            "node 'pool' (ReduceMean): axes [0, 1, 2] of [4, B, 6] unsupported (each once, not "
            "the batch's)");
}

// Batch-first values keep their batch-first nodes where those mean the same (CUDA twins):
// ReduceMean over the channels kept, Concat along -1 of [N, F]; other axes of lower ranks
// are any-shape nodes with the axes the rank says.
TEST_F(AnyShapeOpsTest, BatchFirstVersionsWhereTheyMeanTheSame) {
  auto twin_free = [&](const Graph& g) {
    auto e = Executor<double>::Create(g, registry_);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? (*e)->nodes()[0].batch_first : false;
  };
  const Graph channel_mean =
      Of({5, 1, 1}, 2, {MakeNode("ReduceMean", "m", {"x"}, {"y"}, {{"axes", Ints{-1}}})});
  EXPECT_TRUE(twin_free(channel_mean));
  EXPECT_EQ(OutputShape(channel_mean), "[B, 1]");
  const Graph two_axes =
      Of({4, 6, 1}, 3, {MakeNode("ReduceMean", "m", {"x"}, {"y"}, {{"axes", Ints{-1, -2}}})});
  EXPECT_FALSE(twin_free(two_axes));
  EXPECT_EQ(OutputShape(two_axes), "[B, 1, 1]");
  Check(two_axes);
  const Graph cat = Of({3, 1, 1}, 2,
                       {MakeNode("Relu", "r", {"x"}, {"a"}),
                        MakeNode("Concat", "c", {"x", "a"}, {"y"}, {{"axis", int64_t{-1}}})});
  EXPECT_EQ(OutputShape(cat), "[B, 6]");
  Check(cat);
}

// A relative-position bias (Swin, BEiT): rows of a learned table gathered by constant indices
// make a value without a batch ([4, 4, 2] -> [2, 4, 4] -> [1, 2, 4, 4]) added into each sample's
// scores; the table gets the sum over the batch of its rows' gradients. An int64 entry of the
// model's state that no node reads (the index buffer, read through shape arithmetic) is carried
// as a fixed buffer.
TEST_F(AnyShapeOpsTest, ABiasWithoutABatchBroadcastIntoEachSample) {
  Tensor index;
  index.type = Tensor::Type::kInt64;
  index.shape = {16};
  for (int i = 0; i < 16; ++i) index.ints.push_back((i * 5) % 9);
  NamedConstant index_buffer{"relative_position_index", index, /*state=*/true};
  Graph g = Of({2, 4, 4}, 4,
               {MakeNode("Gather", "bias", {"table", "relative_position_index"}, {"b"}),
                MakeNode("Reshape", "view", {"b", "s"}, {"bv"}),
                MakeNode("Transpose", "heads_first", {"bv"}, {"bt"}, {{"perm", Ints{2, 0, 1}}}),
                MakeNode("Unsqueeze", "u", {"bt", "zero"}, {"bu"}),
                MakeNode("Add", "add", {"x", "bu"}, {"y0"}),
                MakeNode("Softmax", "sm", {"y0"}, {"y"}, {{"axis", int64_t{-1}}})},
               {Learned("table", {9, 2}, 12), index_buffer, IntConstant("s", {4, 4, -1}),
                IntConstant("zero", {0})});
  EXPECT_EQ(OutputShape(g), "[B, 2, 4, 4]");
  Check(g);
  auto e = Executor<float>::Create(g, registry_);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->value_shapes()[1].ToString(), "[16, 2]");  // The gathered rows: no batch.
  ASSERT_EQ((*e)->buffers().size(), 1u);
  EXPECT_EQ((*e)->buffers()[0].name, "relative_position_index");
  EXPECT_EQ((*e)->initial_buffers()[1], 5.0f);
}

// Values, not only gradients: x - x.mean(-1, keepdim=True) on [4, B, 6] (the batch on axis 1)
// subtracts each sample's own mean (a broadcast that repeated sample 0's passed the
// finite-difference checks: they test a function's gradients, not which function).
TEST_F(AnyShapeOpsTest, EachSampleKeepsItsOwnStatistic) {
  const Graph g = Of({4, 6, 1}, 3,
                     {MakeNode("Transpose", "t", {"x"}, {"t"}, {{"perm", Ints{1, 0, 2}}}),
                      MakeNode("ReduceMean", "m", {"t"}, {"m"}, {{"axes", Ints{-1}}}),
                      MakeNode("Sub", "c", {"t", "m"}, {"y"})});
  auto e = Executor<double>::Create(g, registry_);
  ASSERT_TRUE(e.ok()) << e.status();
  const int batch = 3;
  std::vector<double> x(batch * 24);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(1.3 * i) + static_cast<double>(i / 24);
  (*e)->Bind(nullptr, nullptr, nullptr);
  const nn::TensorRef<double> y = ForwardOk(**e, x.data(), batch, false);
  for (int n = 0; n < 4; ++n) {
    for (int b = 0; b < batch; ++b) {
      double mean = 0;
      for (int d = 0; d < 6; ++d) mean += x[(b * 4 + n) * 6 + d] / 6;
      for (int d = 0; d < 6; ++d) {
        EXPECT_NEAR(y.data[(n * batch + b) * 6 + d], x[(b * 4 + n) * 6 + d] - mean, 1e-12);
      }
    }
  }
}

// nn.Embedding's export: Gather(table, ids) with the ids the graph's input [B, 4]. The output
// is each id's row; the table's gradient sums the output gradients of every lookup of a row
// (ids repeat here) and is zero for rows never looked up; ids that are not rows are refused
// before anything runs, naming the node, the sample and the position.
TEST_F(AnyShapeOpsTest, EmbeddingLookupOfComputedIds) {
  Graph g = Of({4, 1, 1}, 2, {MakeNode("Gather", "embed", {"table", "x"}, {"y"})},
               {RandomConstant("table", {6, 3}, 5)});
  g.constants[0].state = true;  // Learned, as an initializer is.
  g.input_ids = true;
  auto e = Executor<double>::Create(g, registry_);
  ASSERT_TRUE(e.ok()) << e.status();
  Executor<double>& ex = **e;
  EXPECT_TRUE(ex.input_ids());
  EXPECT_EQ(ex.value_shapes()[1].ToString(), "[B, 4, 3]");
  ASSERT_EQ(ex.params().size(), 1u);
  std::vector<double> params = ex.initial_params(), grads(params.size(), -7.0);
  ex.Bind(params.data(), grads.data(), nullptr);
  const int batch = 2;
  const std::vector<double> ids = {5, 0, 2, 5, 1, 5, 0, 0};
  const nn::TensorRef<double> y = ForwardOk(ex, ids.data(), batch, true);
  ASSERT_EQ(y.size(), 8 * 3);
  for (int j = 0; j < 8; ++j) {
    for (int d = 0; d < 3; ++d) {
      EXPECT_EQ(y.data[j * 3 + d], params[static_cast<int>(ids[j]) * 3 + d]) << j;
    }
  }
  std::vector<double> gy(8 * 3);
  for (size_t i = 0; i < gy.size(); ++i) gy[i] = 0.25 * static_cast<double>(i) - 1.0;
  ex.Backward({gy.data(), batch, ex.output_dims()}, false);
  for (int row = 0; row < 6; ++row) {
    for (int d = 0; d < 3; ++d) {
      double sum = 0;
      for (int j = 0; j < 8; ++j) sum += ids[j] == row ? gy[j * 3 + d] : 0.0;
      EXPECT_EQ(grads[row * 3 + d], sum) << row;  // Row 3 and 4: never looked up, zero.
    }
  }

  auto error = [&](std::vector<double> bad) {
    absl::StatusOr<nn::TensorRef<double>> r = ex.Forward(bad.data(), batch, true);
    return r.ok() ? std::string("ok") : std::string(r.status().message());
  };
  EXPECT_EQ(
      error({0, 1, 2, 3, 4, 5, 6, 0}),
      "node 'embed' (Gather): id 6 (sample 1 of the batch, position 2) is not a row of the table "
      "'table' (an integer in [0, 6))");
  EXPECT_EQ(
      error({0, -1, 2, 3, 4, 5, 0, 0}),
      "node 'embed' (Gather): id -1 (sample 0 of the batch, position 1) is not a row of the table "
      "'table' (an integer in [0, 6))");
  EXPECT_EQ(
      error({0, 1, 2.5, 3, 4, 5, 0, 0}),
      "node 'embed' (Gather): id 2.5 (sample 0 of the batch, position 2) is not a row of the table "
      "'table' (an integer in [0, 6))");
  EXPECT_EQ(
      error({0, 1, 2, 3, 4, 5, 0, std::nan("")}),
      "node 'embed' (Gather): id nan (sample 1 of the batch, position 3) is not a row of the table "
      "'table' (an integer in [0, 6))");
  EXPECT_EQ(error({0, 1, 2, 3, 4, 5, 0, 0}), "ok");
}

// A masked mean as exported (h * keep).sum(1) / keep.sum(1): ReduceSum with the axes as an
// input, keepdims or not, at a batch (3) other than the export's.
TEST_F(AnyShapeOpsTest, ReduceSum) {
  const Graph g =
      Of({4, 6, 1}, 3,
         {MakeNode("ReduceSum", "sum", {"x", "axes"}, {"s"}, {{"keepdims", int64_t{0}}}),
          MakeNode("ReduceSum", "total", {"x", "last"}, {"t"}),
          MakeNode("ReduceSum", "pool", {"t", "axes"}, {"p"}),
          MakeNode("Add", "y", {"s", "p"}, {"y"})},
         {IntConstant("axes", {1}), IntConstant("last", {-1})});
  EXPECT_EQ(OutputShape(g), "[B, 6]");
  Check(g);
  auto e = Executor<double>::Create(g, registry_);
  ASSERT_TRUE(e.ok()) << e.status();
  (*e)->Bind(nullptr, nullptr, nullptr);
  std::vector<double> x(2 * 24);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i);
  const nn::TensorRef<double> y = ForwardOk(**e, x.data(), 2, false);
  // Sample 1, feature 2: the column's sum (26 + 32 + 38 + 44) plus every element of the sample.
  EXPECT_EQ(y.data[6 + 2], 26 + 32 + 38 + 44 + (24 + 47) * 24 / 2);
}

// A text CNN's layers on [N, C, L]: Conv1d (a 1-D window: kernel_shape [3], pads [1, 1]),
// MaxPool1d, and the max over time (ReduceMax, keepdims 0; its gradient to the largest element).
TEST_F(AnyShapeOpsTest, Conv1dMaxPool1dAndReduceMax) {
  const Graph g = Of(
      {4, 7, 1}, 3,
      {MakeNode("Conv", "conv", {"x", "w", "b"}, {"c"},
                {{"kernel_shape", Ints{3}}, {"pads", Ints{1, 1}}, {"strides", Ints{1}}}),
       MakeNode("MaxPool", "pool", {"c"}, {"p"}, {{"kernel_shape", Ints{2}}, {"strides", Ints{2}}}),
       MakeNode("ReduceMax", "max", {"p"}, {"y"}, {{"axes", Ints{2}}, {"keepdims", int64_t{0}}})},
      {RandomConstant("w", {5, 4, 3}, 1), RandomConstant("b", {5}, 2)});
  EXPECT_EQ(OutputShape(g), "[B, 5]");
  Check(g);
  auto e = Executor<double>::Create(g, registry_);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ((*e)->params()[0].shape, (Ints{5, 4, 3}));  // The state_dict's Conv1d weight.
  EXPECT_EQ((*e)->value_shapes()[1].ToString(), "[B, 5, 7]");
  EXPECT_EQ((*e)->value_shapes()[2].ToString(), "[B, 5, 3]");
  // NaN wins the max, wherever it lies (PyTorch's max); a Conv1d without kernel_shape takes
  // its 1-D strides and pads.
  const Graph max = Of(
      {2, 3, 1}, 3,
      {MakeNode("ReduceMax", "m", {"x"}, {"y"}, {{"axes", Ints{-1}}, {"keepdims", int64_t{0}}})});
  auto m = Executor<double>::Create(max, registry_);
  ASSERT_TRUE(m.ok()) << m.status();
  (*m)->Bind(nullptr, nullptr, nullptr);
  const std::vector<double> x = {1, std::nan(""), 3, 4, 6, 5};
  const nn::TensorRef<double> y = ForwardOk(**m, x.data(), 1, false);
  EXPECT_TRUE(std::isnan(y.data[0]));
  EXPECT_EQ(y.data[1], 6);
  // ReduceMin the same way (x.min(dim)), and both against finite differences.
  Graph min = max;
  min.nodes[0].op = "ReduceMin";
  auto mn = Executor<double>::Create(min, registry_);
  ASSERT_TRUE(mn.ok()) << mn.status();
  (*mn)->Bind(nullptr, nullptr, nullptr);
  const nn::TensorRef<double> z = ForwardOk(**mn, x.data(), 1, false);
  EXPECT_TRUE(std::isnan(z.data[0]));
  EXPECT_EQ(z.data[1], 4);
  Check(min);
  // ReduceL2 (F.normalize's norm) over two axes, kept, against finite differences.
  Check(Of(
      {4, 5, 1}, 3,
      {MakeNode("ReduceL2", "n", {"x"}, {"y"}, {{"axes", Ints{1, 2}}, {"keepdims", int64_t{1}}})}));
  const Graph strided = Of(
      {4, 7, 1}, 3,
      {MakeNode("Conv", "conv", {"x", "w"}, {"y"}, {{"strides", Ints{2}}, {"pads", Ints{1, 1}}})},
      {RandomConstant("w", {5, 4, 3}, 1)});
  EXPECT_EQ(OutputShape(strided), "[B, 5, 4]");
  EXPECT_EQ(
      BuildError(Of({4, 7, 1}, 3, {MakeNode("ReduceMax", "m", {"x"}, {"y"}, {{"axes", Ints{0}}})})),
      "node 'm' (ReduceMax): axes [0] of [B, 4, 7] unsupported (each once, not the batch's)");
}

// TopK's values (k-max pooling): in order, ties to the lower index, NaN largest; the gradient
// to the elements taken, against finite differences (largest along the last axis, smallest
// along another).
TEST_F(AnyShapeOpsTest, TopKValues) {
  const Graph top =
      Of({2, 5, 1}, 3, {MakeNode("TopK", "k", {"x", "three"}, {"y", "i"}, {{"axis", int64_t{-1}}})},
         {IntConstant("three", {3})});
  EXPECT_EQ(OutputShape(top), "[B, 2, 3]");
  auto e = Executor<double>::Create(top, registry_);
  ASSERT_TRUE(e.ok()) << e.status();
  (*e)->Bind(nullptr, nullptr, nullptr);
  const std::vector<double> x = {1, 5, 5, 2, 4, 0, std::nan(""), -1, 7, 3};
  const nn::TensorRef<double> y = ForwardOk(**e, x.data(), 1, false);
  ASSERT_EQ(y.size(), 6);
  EXPECT_EQ(std::vector<double>(y.data, y.data + 3), (std::vector<double>{5, 5, 4}));
  EXPECT_TRUE(std::isnan(y.data[3]));
  EXPECT_EQ(std::vector<double>(y.data + 4, y.data + 6), (std::vector<double>{7, 3}));
  Check(top);
  Check(Of(
      {4, 6, 1}, 3,
      {MakeNode("TopK", "k", {"x", "two"}, {"y"}, {{"axis", int64_t{1}}, {"largest", int64_t{0}}})},
      {IntConstant("two", {2})}));
  EXPECT_EQ(BuildError(Of({4, 6, 1}, 3,
                          {MakeNode("TopK", "k", {"x", "two"}, {"y"}, {{"axis", int64_t{0}}})},
                          {IntConstant("two", {2})})),
            "node 'k' (TopK): axis 0 of [B, 4, 6] unsupported (an axis other than the batch's)");
  EXPECT_EQ(BuildError(Of({4, 6, 1}, 3, {MakeNode("TopK", "k", {"x", "seven"}, {"y"})},
                          {IntConstant("seven", {7})})),
            "node 'k' (TopK): k int64[1] is not one number in [1, 6], the size of axis -1");
}

// One nn.LSTM or nn.GRU layer (TorchLSTM, TorchGRU: what FuseTorchRecurrent makes of torch's
// export) on [B, 5, 3] made sequence-first, one direction or both, with and without biases:
// each output (every step's h, the last h, the LSTM's last c) forward and backward through time
// against finite differences, the input's gradient and every weight's.
TEST_F(AnyShapeOpsTest, TorchLstmAndGruThroughTime) {
  for (const char* op : {"TorchLSTM", "TorchGRU"}) {
    const int64_t rows = std::string(op) == "TorchLSTM" ? 16 : 12;
    for (int64_t directions : {1, 2}) {
      for (bool biases : {true, false}) {
        for (int64_t output = 0; output < (rows == 16 ? 3 : 2); ++output) {
          SCOPED_TRACE(
              absl::StrCat(op, " directions ", directions, " biases ", biases, " output ", output));
          std::vector<std::string> inputs = {"t"};
          std::vector<NamedConstant> weights;
          for (int64_t d = 0; d < directions; ++d) {
            const std::string s = d == 0 ? "" : "_reverse";
            inputs.push_back("w_ih" + s);
            inputs.push_back("w_hh" + s);
            weights.push_back(Learned("w_ih" + s, {rows, 3}, 1 + 10 * d));
            weights.push_back(Learned("w_hh" + s, {rows, 4}, 2 + 10 * d));
            if (!biases) continue;
            inputs.push_back("b_ih" + s);
            inputs.push_back("b_hh" + s);
            weights.push_back(Learned("b_ih" + s, {rows}, 3 + 10 * d));
            weights.push_back(Learned("b_hh" + s, {rows}, 4 + 10 * d));
          }
          const Graph g = Of(
              {5, 3, 1}, 3,
              {MakeNode("Transpose", "seq", {"x"}, {"t"}, {{"perm", Ints{1, 0, 2}}}),
               MakeNode(
                   op, "rnn", inputs, {"y"},
                   {{"hidden_size", int64_t{4}}, {"output", output}, {"directions", directions}})},
              weights);
          EXPECT_EQ(OutputShape(g), output == 0 ? absl::StrCat("[5, ", directions, ", B, 4]")
                                                : absl::StrCat("[", directions, ", B, 4]"));
          Check(g);
        }
      }
    }
  }
  EXPECT_EQ(BuildError(Of({5, 3, 1}, 3,
                          {MakeNode("TorchLSTM", "lstm", {"x", "w_ih", "w_hh"}, {"y"},
                                    {{"hidden_size", int64_t{4}}})},
                          {Learned("w_ih", {16, 3}, 1), Learned("w_hh", {16, 4}, 2)})),
            "node 'lstm' (TorchLSTM): input of shape [B, 5, 3]: [T, B, features] only");
}

// The same layers with each sample's length (packed sequences): lengths computed from the
// input, trunc(clip(30 * mean(x) + 9, 1, 5)) (lengths 2, 2, 5 for this input: steps past a
// sample's length leave its state, its Y zero, the reverse direction starting at its own last
// step), every output against finite differences; a length outside [1, T] fails the step
// naming the sample.
TEST_F(AnyShapeOpsTest, TorchLstmAndGruWithSequenceLengths) {
  const std::vector<Node> lengths = {
      MakeNode("ReduceMean", "m", {"x"}, {"m"}, {{"axes", Ints{1, 2}}, {"keepdims", int64_t{0}}}),
      MakeNode("Mul", "m10", {"m", "scale"}, {"m10"}),
      MakeNode("Add", "m3", {"m10", "shift"}, {"m3"}),
      MakeNode("Clip", "c", {"m3", "one", "five"}, {"c"}),
      MakeNode("Cast", "len", {"c"}, {"len"}, {{"to", int64_t{7}}})};
  const std::vector<NamedConstant> scalars = {FloatScalar("scale", 30.0f),
                                              FloatScalar("shift", 9.0f), FloatScalar("one", 1.0f),
                                              FloatScalar("five", 5.0f)};
  {
    Graph g = Of({5, 3, 1}, 3, lengths, scalars);
    auto e = Executor<double>::Create(g, registry_);
    ASSERT_TRUE(e.ok()) << e.status();
    (*e)->Bind(nullptr, nullptr, nullptr);
    const std::vector<double> x = nn::RandomVector(3 * 15, 1.0, 1);  // CheckGraphGradients's.
    const nn::TensorRef<double> y = ForwardOk(**e, x.data(), 3, false);
    EXPECT_EQ(std::vector<double>(y.data, y.data + y.size()), (std::vector<double>{2, 2, 5}));
  }
  for (const char* op : {"TorchLSTM", "TorchGRU"}) {
    const int64_t rows = std::string(op) == "TorchLSTM" ? 16 : 12;
    for (int64_t directions : {1, 2}) {
      for (int64_t output = 0; output < (rows == 16 ? 3 : 2); ++output) {
        SCOPED_TRACE(absl::StrCat(op, " directions ", directions, " output ", output));
        std::vector<std::string> inputs = {"t"};
        std::vector<NamedConstant> constants = scalars;
        for (int64_t d = 0; d < directions; ++d) {
          const std::string s = d == 0 ? "" : "_reverse";
          for (const char* w : {"w_ih", "w_hh", "b_ih", "b_hh"}) inputs.push_back(w + s);
          constants.push_back(Learned("w_ih" + s, {rows, 3}, 1 + 10 * d));
          constants.push_back(Learned("w_hh" + s, {rows, 4}, 2 + 10 * d));
          constants.push_back(Learned("b_ih" + s, {rows}, 3 + 10 * d));
          constants.push_back(Learned("b_hh" + s, {rows}, 4 + 10 * d));
        }
        inputs.push_back("len");
        std::vector<Node> nodes = lengths;
        nodes.push_back(MakeNode("Transpose", "seq", {"x"}, {"t"}, {{"perm", Ints{1, 0, 2}}}));
        nodes.push_back(MakeNode(op, "rnn", inputs, {"y"},
                                 {{"hidden_size", int64_t{4}},
                                  {"output", output},
                                  {"directions", directions},
                                  {"sequence_lens", int64_t{1}}}));
        Check(Of({5, 3, 1}, 3, nodes, constants));
      }
    }
  }
  // Lengths of 0 (clip from 0) are refused when the step runs.
  std::vector<Node> nodes = lengths;
  nodes[3] = MakeNode("Clip", "c", {"m3", "zero", "zero"}, {"c"});
  nodes.push_back(MakeNode("Transpose", "seq", {"x"}, {"t"}, {{"perm", Ints{1, 0, 2}}}));
  nodes.push_back(MakeNode("TorchGRU", "rnn", {"t", "w_ih", "w_hh", "len"}, {"y"},
                           {{"hidden_size", int64_t{4}}, {"sequence_lens", int64_t{1}}}));
  std::vector<NamedConstant> constants = scalars;
  constants.push_back(FloatScalar("zero", 0.0f));
  constants.push_back(Learned("w_ih", {12, 3}, 1));
  constants.push_back(Learned("w_hh", {12, 4}, 2));
  auto e = Executor<double>::Create(Of({5, 3, 1}, 3, nodes, constants), registry_);
  ASSERT_TRUE(e.ok()) << e.status();
  std::vector<double> params((*e)->num_params()), grads(params.size());
  (*e)->Bind(params.data(), grads.data(), nullptr);
  const std::vector<double> x(3 * 15, 0.5);
  absl::StatusOr<nn::TensorRef<double>> y = (*e)->Forward(x.data(), 3, true);
  ASSERT_FALSE(y.ok());
  EXPECT_EQ(y.status().message(),
            "node 'rnn' (TorchGRU): sample 0 of the batch has sequence length 0, not a whole "
            "number in [1, 5] (pack_padded_sequence needs at least one step per sample)");
}

// Expand of a computed value along its size-1 axes (a padding mask to every head), the batch
// kept whatever the target says there (the export's batch, 2); its gradient sums the copies.
TEST_F(AnyShapeOpsTest, ExpandOfAComputedValue) {
  const Graph g = Of({4, 6, 1}, 3,
                     {MakeNode("ReduceMean", "m", {"x"}, {"m"}, {{"axes", Ints{-1}}}),
                      MakeNode("Unsqueeze", "u", {"m", "one"}, {"u"}),
                      MakeNode("Expand", "heads", {"u", "target"}, {"e"}),
                      MakeNode("Mul", "y", {"e", "w"}, {"y"})},
                     {IntConstant("one", {1}), IntConstant("target", {2, 3, 4, 5}),
                      RandomConstant("w", {3, 4, 5}, 3)});
  EXPECT_EQ(OutputShape(g), "[B, 3, 4, 5]");
  Check(g);
  EXPECT_EQ(BuildError(Of({4, 6, 1}, 3, {MakeNode("Expand", "e", {"x", "bad"}, {"y"})},
                          {IntConstant("bad", {2, 5, 6})})),
            "node 'e' (Expand): Expand of [B, 4, 6] to [2, 5, 6] unsupported: the shapes do not "
            "broadcast");
}

// A padding mask as nn.TransformerEncoder exports it: ids == pad (Equal), Not, Cast to bool,
// and Where into the scores (masked_fill): values by hand; then Where's gradients (to a
// computed branch where it was taken) against finite differences, with a constant of one value
// written at the export's batch (2) read at batch 3.
TEST_F(AnyShapeOpsTest, MasksEqualNotCastWhere) {
  const Graph masks =
      Of({4, 1, 1}, 2,
         {MakeNode("Equal", "pad", {"x", "zero"}, {"p"}), MakeNode("Not", "keep", {"p"}, {"k"}),
          MakeNode("Cast", "b", {"x"}, {"b"}, {{"to", int64_t{9}}}),
          MakeNode("Where", "fill", {"p", "minus", "x"}, {"f"}),
          MakeNode("Concat", "all", {"p", "k", "b", "f"}, {"y"}, {{"axis", int64_t{1}}})},
         {IntConstant("zero", {0}), FloatScalar("minus", -100.0f)});
  auto e = Executor<double>::Create(masks, registry_);
  ASSERT_TRUE(e.ok()) << e.status();
  (*e)->Bind(nullptr, nullptr, nullptr);
  const std::vector<double> x = {3, 0, 7, 0, 0, 0, 1, 2};
  const nn::TensorRef<double> y = ForwardOk(**e, x.data(), 2, false);
  EXPECT_EQ(std::vector<double>(y.data, y.data + y.size()),
            (std::vector<double>{0, 1, 0, 1, 1, 0, 1, 0, 1, 0, 1, 0, 3,    -100, 7, -100,  //
                                 1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 1, 1, -100, -100, 1, 2}));
  NamedConstant uniform = RandomConstant("uniform", {2, 4, 6}, 1);
  std::fill(uniform.value.floats.begin(), uniform.value.floats.end(), -3.0f);
  const Graph where = Of(
      {4, 6, 1}, 3,
      {MakeNode("Relu", "r", {"x"}, {"r"}),
       MakeNode("Cast", "c", {"r"}, {"c"}, {{"to", int64_t{9}}}),
       MakeNode("Mul", "sq", {"x", "x"}, {"sq"}), MakeNode("Where", "a", {"c", "x", "two"}, {"a"}),
       MakeNode("Where", "b", {"c", "uniform", "sq"}, {"b"}),
       MakeNode("Add", "y", {"a", "b"}, {"y"})},
      {FloatScalar("two", 2.0f), uniform});
  EXPECT_EQ(OutputShape(where), "[B, 4, 6]");
  Check(where);
  EXPECT_EQ(BuildError(Of({4, 6, 1}, 3, {MakeNode("Where", "w", {"x", "x", "bad"}, {"y"})},
                          {RandomConstant("bad", {2, 4, 6}, 2)})),
            "node 'w' (Where): the constant float[2,4,6] of input 2 does not broadcast to "
            "[B, 4, 6]");
  EXPECT_EQ(BuildError(Of({4, 6, 1}, 3, {MakeNode("Equal", "q", {"x", "x"}, {"y"})})),
            "node 'q' (Equal): Equal of two computed values unsupported");
  // A cast to an integer type (int64, int32, uint8): trunc(x), as NumPy's astype; no gradient.
  for (const int64_t to : {7, 6, 2}) {
    const Graph cast = Of({5, 1, 1}, 2, {MakeNode("Cast", "i", {"x"}, {"y"}, {{"to", to}})});
    auto c = Executor<double>::Create(cast, registry_);
    ASSERT_TRUE(c.ok()) << c.status();
    (*c)->Bind(nullptr, nullptr, nullptr);
    const std::vector<double> v = {2.7, -1.5, 0.0, 3.0, 0.25, -0.75, 9.999, 1e6, -2.0, 5.5};
    const nn::TensorRef<double> t = ForwardOk(**c, v.data(), 2, false);
    EXPECT_EQ(std::vector<double>(t.data, t.data + t.size()),
              (std::vector<double>{2, -1, 0, 3, 0, 0, 9, 1e6, -2, 5}));
    const std::vector<double> ones(10, 1.0);
    const nn::TensorRef<double> dx = (*c)->Backward({ones.data(), 2, {5, 1, 1}}, true);
    EXPECT_EQ(std::vector<double>(dx.data, dx.data + dx.size()), std::vector<double>(10, 0.0));
  }
  // One value throughout makes a scalar only of a constant whose batch entry alone is off: one
  // that would widen another axis is refused.
  NamedConstant wider = RandomConstant("wider", {1, 3, 6}, 3);
  std::fill(wider.value.floats.begin(), wider.value.floats.end(), 1.0f);
  EXPECT_EQ(
      BuildError(Of({4, 6, 1}, 3, {MakeNode("Where", "w", {"x", "x", "wider"}, {"y"})}, {wider})),
      "node 'w' (Where): the constant float[1,3,6] of input 2 does not broadcast to "
      "[B, 4, 6]");
}

TEST_F(AnyShapeOpsTest, Refusals) {
  const Graph transposed =
      Of({3, 4, 5}, 4, {MakeNode("Transpose", "t", {"x"}, {"t"}, {{"perm", Ints{1, 0, 2, 3}}})});
  Graph conv = transposed;
  conv.nodes.push_back(MakeNode("Conv", "conv", {"t", "w"}, {"y"}));
  conv.constants.push_back(RandomConstant("w", {2, 1, 1, 1}, 1));
  EXPECT_EQ(BuildError(conv),
            "node 'conv' (Conv): input 't' has shape [3, B, 4, 5]: this op takes values of rank "
            "2 to 4 with the batch first (B) only");
  EXPECT_EQ(BuildError(Of({3, 4, 5}, 4,
                          {MakeNode("Transpose", "t", {"x"}, {"y"}, {{"perm", Ints{1, 0, 2}}})})),
            "node 't' (Transpose): perm [1, 0, 2] is not a permutation of the 4 axes of "
            "[B, 3, 4, 5]");
  EXPECT_EQ(BuildError(Of({3, 4, 1}, 3,
                          {MakeNode("Gather", "g", {"x", "i"}, {"y"}, {{"axis", int64_t{0}}})},
                          {IntConstant("i", {0})})),
            "node 'g' (Gather): axis 0 of [B, 3, 4] unsupported (an axis other than the "
            "batch's)");
  EXPECT_EQ(BuildError(Of({3, 4, 1}, 3,
                          {MakeNode("Gather", "g", {"x", "i"}, {"y"}, {{"axis", int64_t{1}}})},
                          {IntConstant("i", {3})})),
            "node 'g' (Gather): index 3 out of range for axis 1 of [B, 3, 4]");
  Graph mm = transposed;
  mm.nodes.push_back(MakeNode("MatMul", "mm", {"x", "t"}, {"y"}));
  EXPECT_EQ(BuildError(mm),
            "node 'mm' (MatMul): MatMul of [B, 3, 4, 5] and [3, B, 4, 5] unsupported: the "
            "leading axes (the batch among them) must be the same");
  EXPECT_EQ(BuildError(Of({3, 4, 1}, 3, {MakeNode("Add", "a", {"x", "p"}, {"y"})},
                          {RandomConstant("p", {2, 3, 4}, 2)})),
            "node 'a' (Add): operand 'p' of shape [2, 3, 4] does not broadcast to [B, 3, 4] "
            "(without the batch)");
  EXPECT_EQ(BuildError(Of({3, 4, 1}, 3, {MakeNode("Expand", "e", {"c", "s"}, {"y"})},
                          {Learned("c", {2, 1, 4}, 3), IntConstant("s", {2, 3, 4})})),
            "node 'e' (Expand): Expand of float[2,1,4] to [2, 3, 4] unsupported: the tensor "
            "must have one element along the batch axis");
  EXPECT_EQ(
      BuildError(Of({3, 4, 5}, 4, {MakeNode("Transpose", "t", {"x"}, {"y"}, {{"perm", Ints{}}})})),
      "node 't' (Transpose): perm [] is not a permutation of the 4 axes of [B, 3, 4, 5]");
  NamedConstant empty = Learned("c", {1, 1, 4}, 3);
  empty.value.shape = {1, 0, 4};
  empty.value.floats.clear();
  EXPECT_EQ(BuildError(Of({3, 4, 1}, 3, {MakeNode("Expand", "e", {"c", "s"}, {"y"})},
                          {empty, IntConstant("s", {2, 3, 4})})),
            "node 'e' (Expand): Expand of float[1,0,4]: empty");
  EXPECT_EQ(BuildError(Of({3, 4, 1}, 3, {MakeNode("Expand", "e", {"c", "s"}, {"y"})},
                          {Learned("c", {1, 3, 4}, 3), IntConstant("s", {1, 3, 4})})),
            "node 'e' (Expand): Expand of float[1,3,4] to [1, 3, 4] unsupported: the first "
            "entry must be the batch (export with a batch of 2 or more)");
  Graph ln = transposed;
  ln.nodes.push_back(
      MakeNode("LayerNormalization", "ln", {"t", "g"}, {"y"}, {{"axis", int64_t{2}}}));
  ln.constants.push_back(RandomConstant("g", {4, 5}, 4));
  EXPECT_EQ(BuildError(ln),
            "node 'ln' (LayerNormalization): axis 2 of a value of shape [3, B, 4, 5] "
            "unsupported (the last axis only)");
}

}  // namespace
}  // namespace graph
}  // namespace dptrain
