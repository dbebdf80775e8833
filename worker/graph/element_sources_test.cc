// The any-shape nodes as data: for every node that only moves elements (element_sources.h) or
// applies a broadcast binary op (binary_elements.h) in every ONNX fixture and in graphs written
// here (Transpose, Gather by constant indices, Slice with steps both ways, Concat of three, Pad,
// Expand; Add, Sub, Mul, Div, Max, Min in each operand form), at a batch other than the
// export's, what the CUDA kernels compute (the same per-element functions, run here on the
// host, at the node's sources or operand indices) equals the CPU node's Forward and Backward,
// bit for bit.
#include "worker/graph/element_sources.h"

#include <dirent.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/graph/binary_elements.h"
#include "worker/graph/executor.h"
#include "worker/graph/graph_check.h"
#include "worker/graph/onnx_fixtures_testing.h"
#include "worker/graph/onnx_import.h"
#include "worker/graph/op_registry.h"
#include "worker/graph/reduce_elements.h"

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

// The executor's tensors, bound.
struct Bound {
  std::vector<float> params, grads, buffers;
};

// One moving node at kBatch samples: the gather equals Forward, the readers' sums equal
// Backward (the inputs' gradients, and a learned operand's), on random values.
void CheckNode(const Executor<float>& e, const Executor<float>::NodeState& node, Bound& bound,
               std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<std::vector<float>> in;
  std::vector<nn::TensorRef<float>> refs;
  std::vector<const float*> pointers;
  Ints sizes;
  // A node without runtime inputs gets the graph's input, for the batch size (node.h).
  const std::vector<int> values = node.inputs.empty() ? std::vector<int>{0} : node.inputs;
  for (int v : values) {
    sizes.push_back(ValueSize(e, v, kBatch));
    in.emplace_back(sizes.back());
    for (float& x : in.back()) x = uniform(rng);
  }
  for (size_t i = 0; i < in.size(); ++i) {
    const int v = values[i];  // A value without a batch is held once (value_shape.h).
    refs.push_back(
        {in[i].data(), e.value_shapes()[v].batch_axis < 0 ? 1 : kBatch, e.value_dims()[v]});
    pointers.push_back(in[i].data());
  }
  // The operand, if any, as the input after the runtime ones (where a GPU twin finds it).
  const TwinSpec<float> spec = node.impl->twin();
  float* operand_grad = nullptr;
  if (spec.operand_size > 0) {
    sizes.push_back(spec.operand_size);
    switch (spec.operand_source) {
      case OperandSource::kParam:
        pointers.push_back(bound.params.data() + node.param_offsets[0]);
        operand_grad = bound.grads.data() + node.param_offsets[0];
        break;
      case OperandSource::kBuffer:
        pointers.push_back(bound.buffers.data() + node.buffer_offsets[0]);
        break;
      default:
        pointers.push_back(spec.held_operand);
    }
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
  const std::vector<bool> need(node.inputs.size(), true);
  const std::vector<nn::TensorRef<float>> dx =
      node.impl->Backward(ctx, {dy.data(), y.batch, y.dims}, need);
  const std::vector<ElementReaders> readers = Readers(sources, sizes);
  ASSERT_EQ(readers.size(), sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    const float* grad = i < dx.size() ? dx[i].data : i < in.size() ? nullptr : operand_grad;
    // An input read for its batch size only has an empty gradient (no readers), a held or
    // fixed operand none.
    if (grad == nullptr) {
      EXPECT_TRUE(readers[i].readers.empty() || i >= in.size()) << "input " << i;
      continue;
    }
    if (i < dx.size()) {
      ASSERT_EQ(dx[i].size(), sizes[i]) << "input " << i;
    }
    for (int64_t j = 0; j < sizes[i]; ++j) {
      ASSERT_EQ(ReadersSum(readers[i].offsets.data(), readers[i].readers.data(), dy.data(), j),
                grad[j])
          << "input " << i << ", element " << j;
    }
  }
}

// One broadcast binary node at kBatch samples: binary_elements.h's functions at the operand
// indices equal Forward, and their gradients (the operand's: the readers' sums) Backward.
void CheckBinaryNode(const Executor<float>& e, const Executor<float>::NodeState& node, Bound& bound,
                     std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(0.5f, 1.5f);  // Away from 0: Div.
  std::vector<std::vector<float>> in;
  std::vector<nn::TensorRef<float>> refs;
  for (int v : node.inputs) {
    in.emplace_back(ValueSize(e, v, kBatch));
    for (float& x : in.back()) x = uniform(rng);
    refs.push_back(
        {in.back().data(), e.value_shapes()[v].batch_axis < 0 ? 1 : kBatch, e.value_dims()[v]});
  }
  const TwinSpec<float> spec = node.impl->twin();
  ASSERT_TRUE(spec.binary.has_value());
  const int op = static_cast<int>(*spec.binary);
  const bool has_operand = spec.operand_size > 0;
  const size_t full = has_operand || !spec.swapped ? 0 : 1;
  const float* x = in[full].data();
  const float* other = nullptr;
  int64_t other_size = 0;
  float* other_grad = nullptr;
  if (has_operand) {
    other_size = spec.operand_size;
    switch (spec.operand_source) {
      case OperandSource::kParam:
        other = bound.params.data() + node.param_offsets[0];
        other_grad = bound.grads.data() + node.param_offsets[0];
        break;
      case OperandSource::kBuffer:
        other = bound.buffers.data() + node.buffer_offsets[0];
        break;
      default:
        other = spec.held_operand;
    }
  } else {
    other = in[1 - full].data();
    other_size = static_cast<int64_t>(in[1 - full].size());
  }
  Ints indices;
  ASSERT_TRUE(node.impl->OperandIndices(refs[full].batch, indices));
  nn::LayerContext<float> ctx;
  const nn::TensorRef<float> y = node.impl->Forward(ctx, refs, true);
  ASSERT_EQ(y.size(), static_cast<int64_t>(indices.size()));
  for (int64_t k = 0; k < y.size(); ++k) {
    ASSERT_EQ(BinaryValue(op, spec.swapped, x[k], other[indices[k]]), y.data[k]) << k;
  }
  std::vector<float> dy(indices.size());
  for (float& v : dy) v = uniform(rng) - 1.0f;
  const std::vector<bool> need(node.inputs.size(), true);
  const std::vector<nn::TensorRef<float>> dx =
      node.impl->Backward(ctx, {dy.data(), y.batch, y.dims}, need);
  for (int64_t k = 0; k < y.size(); ++k) {
    float gx, gc;
    BinaryGrads(op, spec.swapped, x[k], other[indices[k]], dy[k], gx, gc);
    ASSERT_EQ(gx, dx[full].data[k]) << k;
  }
  if (!has_operand) other_grad = const_cast<float*>(dx[1 - full].data);
  if (other_grad == nullptr) return;  // A held or fixed operand.
  const std::vector<ElementReaders> readers = Readers(indices, {other_size});
  ASSERT_EQ(readers.size(), 1u);
  for (int64_t o = 0; o < other_size; ++o) {
    ASSERT_EQ(OperandGradSum(op, spec.swapped, readers[0].offsets.data(), readers[0].readers.data(),
                             x, other[o], dy.data(), o),
              other_grad[o])
        << "operand element " << o;
  }
}

// One reduction at kBatch samples: reduce_elements.h's functions over each output element's
// readers equal Forward (and a max's or min's choice), their gradients Backward.
void CheckReduceNode(const Executor<float>& e, const Executor<float>::NodeState& node,
                     std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const int v = node.inputs[0];
  std::vector<float> x(ValueSize(e, v, kBatch));
  for (float& f : x) f = uniform(rng);
  if (x.size() > 3) x[3] = x[1];  // A tie, which a max or min resolves to the first.
  const nn::TensorRef<float> ref{x.data(), e.value_shapes()[v].batch_axis < 0 ? 1 : kBatch,
                                 e.value_dims()[v]};
  const TwinSpec<float> spec = node.impl->twin();
  const float scale = static_cast<float>(spec.reduce_scale);
  Ints out_of;
  ASSERT_TRUE(node.impl->ReducedIndices(ref.batch, out_of));
  ASSERT_EQ(out_of.size(), x.size());
  nn::LayerContext<float> ctx;
  const nn::TensorRef<float> y = node.impl->Forward(ctx, absl::MakeConstSpan(&ref, 1), true);
  const std::vector<ElementReaders> readers = Readers(out_of, {y.size()});
  ASSERT_EQ(readers.size(), 1u);
  Ints arg(y.size(), -1);
  for (int64_t o = 0; o < y.size(); ++o) {
    ASSERT_EQ(ReducedValue(spec.reduction, readers[0].offsets.data(), readers[0].readers.data(),
                           x.data(), scale, o, &arg[o]),
              y.data[o])
        << "output element " << o;
  }
  std::vector<float> dy(y.size());
  for (float& f : dy) f = uniform(rng);
  const std::vector<float> y_copy(y.data, y.data + y.size());
  const std::vector<nn::TensorRef<float>> dx =
      node.impl->Backward(ctx, {dy.data(), y.batch, y.dims}, {true});
  ASSERT_EQ(dx[0].size(), static_cast<int64_t>(x.size()));
  for (int64_t k = 0; k < dx[0].size(); ++k) {
    ASSERT_EQ(ReducedGrad(spec.reduction, out_of.data(), x.data(), y_copy.data(), arg.data(),
                          dy.data(), scale, k),
              dx[0].data[k])
        << "input element " << k;
  }
}

// One embedding lookup at kBatch samples, ids in range with repeats and the padding row among
// them: LookedUp equals Forward; the table's gradient is LookupGradSum at each row looked up
// (ReadersOfRows, the padding row left out) and zero elsewhere.
void CheckLookupNode(const Executor<float>& e, const Executor<float>::NodeState& node, Bound& bound,
                     std::mt19937& rng) {
  const TwinSpec<float> spec = node.impl->twin();
  const int v = node.inputs[0];
  std::vector<float> ids(ValueSize(e, v, kBatch));
  for (size_t j = 0; j < ids.size(); ++j) {
    ids[j] = static_cast<float>(j % 3 == 0 ? 0 : rng() % spec.lookup_rows);
  }
  if (spec.lookup_padding >= 0 && ids.size() > 1) ids[1] = static_cast<float>(spec.lookup_padding);
  const nn::TensorRef<float> ref{ids.data(), kBatch, e.value_dims()[v]};
  ASSERT_TRUE(node.impl->CheckInputs(absl::MakeConstSpan(&ref, 1), /*training=*/true).ok());
  ASSERT_EQ(spec.operand_source, OperandSource::kParam);  // The fixtures' tables are learned.
  const float* table = bound.params.data() + node.param_offsets[0];
  float* table_grad = bound.grads.data() + node.param_offsets[0];
  nn::LayerContext<float> ctx;
  const nn::TensorRef<float> y = node.impl->Forward(ctx, absl::MakeConstSpan(&ref, 1), true);
  ASSERT_EQ(y.size(), static_cast<int64_t>(ids.size()) * spec.lookup_row);
  for (int64_t k = 0; k < y.size(); ++k) {
    ASSERT_EQ(LookedUp(table, ids.data(), spec.lookup_row, k), y.data[k]) << k;
  }
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> dy(y.size());
  for (float& f : dy) f = uniform(rng);
  node.impl->Backward(ctx, {dy.data(), y.batch, y.dims}, {false});
  const LookupReaders r = ReadersOfRows(ids.data(), static_cast<int64_t>(ids.size()),
                                        spec.lookup_rows, spec.lookup_padding);
  std::vector<float> expected(spec.lookup_rows * spec.lookup_row, 0.0f);
  for (size_t u = 0; u < r.rows.size(); ++u) {
    for (int64_t i = 0; i < spec.lookup_row; ++i) {
      expected[r.rows[u] * spec.lookup_row + i] = LookupGradSum(
          r.offsets.data(), r.readers.data(), dy.data(), spec.lookup_row, int64_t(u), i);
    }
  }
  for (size_t i = 0; i < expected.size(); ++i) ASSERT_EQ(expected[i], table_grad[i]) << i;
}

// One TopK at kBatch samples, with ties and a NaN in its rows: TopKNext, called k times per row,
// picks what Forward outputs; the gradient goes to those elements.
void CheckTopKNode(const Executor<float>& e, const Executor<float>::NodeState& node,
                   std::mt19937& rng) {
  const TwinSpec<float> spec = node.impl->twin();
  const int v = node.inputs[0];
  std::vector<float> x(ValueSize(e, v, kBatch));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(rng() % 5);  // Ties.
  x[x.size() / 2] = std::nanf("");
  const nn::TensorRef<float> ref{x.data(), kBatch, e.value_dims()[v]};
  const std::vector<int64_t> shape = e.value_shapes()[v].Concrete(kBatch);
  const int axis = static_cast<int>(spec.topk[0]);
  const int64_t k = spec.topk[1], n = shape[axis];
  int64_t outer = 1, inner = 1;
  for (int a = 0; a < axis; ++a) outer *= shape[a];
  for (size_t a = axis + 1; a < shape.size(); ++a) inner *= shape[a];
  nn::LayerContext<float> ctx;
  const nn::TensorRef<float> y = node.impl->Forward(ctx, absl::MakeConstSpan(&ref, 1), true);
  ASSERT_EQ(y.size(), outer * k * inner);
  std::vector<float> dy(y.size()), expected_dx(x.size(), 0.0f);
  for (size_t j = 0; j < dy.size(); ++j) dy[j] = static_cast<float>(j + 1);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const float* row = x.data() + o * n * inner + i;
      int64_t prev = -1;
      for (int64_t j = 0; j < k; ++j) {
        prev = TopKNext(row, n, inner, spec.topk[2] != 0, prev);
        const int64_t at = (o * k + j) * inner + i;
        ASSERT_GE(prev, 0);
        const float want = row[prev * inner];
        ASSERT_TRUE(want == y.data[at] || (std::isnan(want) && std::isnan(y.data[at]))) << at;
        expected_dx[(o * n + prev) * inner + i] = dy[at];
      }
    }
  }
  const std::vector<nn::TensorRef<float>> dx =
      node.impl->Backward(ctx, {dy.data(), y.batch, y.dims}, {true});
  ASSERT_EQ(dx[0].size(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(expected_dx[i], dx[0].data[i]) << i;
}

// Every moving node (CheckNode), broadcast binary node (CheckBinaryNode), reduction
// (CheckReduceNode), embedding lookup (CheckLookupNode) and TopK (CheckTopKNode) of `graph`;
// returns the names of the nodes checked.
std::vector<std::string> CheckMovingNodes(const Graph& graph) {
  absl::StatusOr<std::unique_ptr<Executor<float>>> made =
      Executor<float>::Create(graph, BuiltinOps());
  EXPECT_TRUE(made.ok()) << made.status();
  if (!made.ok()) return {};
  Executor<float>& e = **made;
  Bound bound{e.initial_params(), std::vector<float>(e.initial_params().size()),
              e.initial_buffers()};
  e.Bind(bound.params.data(), bound.grads.data(), bound.buffers.data());
  std::mt19937 rng(7);
  std::vector<std::string> checked;
  for (const auto& node : e.nodes()) {
    Ints sources;
    SCOPED_TRACE(node.name + " (" + node.op + ")");
    if (node.impl->ElementSources(kBatch, sources)) {
      checked.push_back(node.name);
      CheckNode(e, node, bound, rng);
    } else if (node.impl->OperandIndices(kBatch, sources)) {
      checked.push_back(node.name);
      CheckBinaryNode(e, node, bound, rng);
    } else if (node.impl->ReducedIndices(kBatch, sources)) {
      checked.push_back(node.name);
      CheckReduceNode(e, node, rng);
    } else if (node.impl->twin().lookup_row > 0) {
      checked.push_back(node.name);
      CheckLookupNode(e, node, bound, rng);
    } else if (node.impl->twin().topk[1] > 0) {
      checked.push_back(node.name);
      CheckTopKNode(e, node, rng);
    }
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

// Embedding lookups: nn.Embedding (text_lstm), and with padding_idx (text_pad: the importer
// marks its row of zeros, whose gradient stays zero).
TEST(ElementSourcesTest, EmbeddingLookupsOfTheFixtures) {
  for (const char* name : {"text_lstm", "text_pad"}) {
    absl::StatusOr<Graph> g = ReadOnnxGraph(testing_fixtures::OnnxPath(name), BuiltinOps());
    ASSERT_TRUE(g.ok()) << g.status();
    const std::vector<std::string> checked = CheckMovingNodes(*g);
    EXPECT_NE(std::find(checked.begin(), checked.end(), "/embed/Gather"), checked.end()) << name;
  }
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
  // The means and the Adds of the [B] means are checked too.
  EXPECT_EQ(CheckMovingNodes(g),
            (std::vector<std::string>{"t", "down", "picked", "three", "pad", "s_mean", "c_mean",
                                      "p_mean", "a1", "y"}));
}

// Tensors of the model moved: a class token expanded over the batch, rows of a bias table
// picked by constant indices, repeated; learned (their gradients: the sums of their readers) or
// buffers. (Held constants are folded before: a move of constants is a constant.)
TEST(ElementSourcesTest, MovesOfTensorsOfTheModel) {
  for (bool fixed : {false, true}) {
    NamedConstant token = RandomConstant("cls_token", {1, 1, 4}, 3);
    NamedConstant table = RandomConstant("table", {5, 4}, 4);
    token.state = table.state = true;
    token.fixed = table.fixed = fixed;
    Graph g =
        Chain({3, 4, 1},
              {MakeNode("Expand", "cls", {"cls_token", "target"}, {"c"}),  // [B, 1, 4]
               MakeNode("Concat", "cat", {"c", "x"}, {"t"}, {{"axis", int64_t{1}}}),
               MakeNode("Gather", "bias", {"table", "rows"}, {"b"}),  // [4, 4]: no batch
               MakeNode("Add", "y", {"t", "b"}, {"y"})},
              {token, IntConstant("target", {2, 1, 1}), table, IntConstant("rows", {4, 0, 4, 2})});
    g.input_rank = 3;
    // The Concat along axis 1 of batch-first values is the batch-first op (not a move).
    EXPECT_EQ(CheckMovingNodes(g), (std::vector<std::string>{"cls", "bias", "y"})) << fixed;
  }
}

// Every broadcast binary op and operand form on a sequence-first [4, B, 6] value: a computed
// statistic broadcast both ways, a scalar, a learned and a fixed tensor broadcast (swapped or
// not), two computed values of one shape (Max, Min, Div).
TEST(ElementSourcesTest, BroadcastBinaryOps) {
  NamedConstant scale = RandomConstant("scale", {6}, 5, 0.5, 1.0);
  NamedConstant shift = RandomConstant("shift", {4, 1, 6}, 6);
  scale.state = shift.state = true;
  shift.fixed = true;
  Graph g =
      Chain({4, 6, 1},
            {MakeNode("Transpose", "t", {"x"}, {"t"}, {{"perm", Ints{1, 0, 2}}}),
             MakeNode("ReduceMean", "m", {"t"}, {"m"}, {{"axes", Ints{-1}}}),  // [4, B, 1]
             MakeNode("Sub", "c", {"t", "m"}, {"c"}), MakeNode("Sub", "c2", {"m", "t"}, {"c2"}),
             MakeNode("Div", "d", {"c", "k"}, {"d"}), MakeNode("Mul", "e", {"scale", "d"}, {"e"}),
             MakeNode("Add", "f", {"e", "shift"}, {"f"}), MakeNode("Max", "hi", {"f", "c2"}, {"h"}),
             MakeNode("Min", "lo", {"h", "t"}, {"l"}), MakeNode("Div", "q", {"l", "t"}, {"q"}),
             MakeNode("Transpose", "y", {"q"}, {"y"}, {{"perm", Ints{1, 0, 2}}})},
            {FloatScalar("k", 0.7f), scale, shift});
  g.input_rank = 3;
  EXPECT_EQ(CheckMovingNodes(g),
            (std::vector<std::string>{"t", "m", "c", "c2", "d", "e", "f", "hi", "lo", "q", "y"}));
}

// Every reduction over axes other than the batch's, kept or not, of a sequence-first value.
TEST(ElementSourcesTest, Reductions) {
  for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceL2"}) {
    for (int64_t keep : {0, 1}) {
      std::vector<Node> nodes = {
          MakeNode("Transpose", "t", {"x"}, {"t"}, {{"perm", Ints{1, 0, 2}}}),
          MakeNode(op, "r", {"t"}, {"r"}, {{"axes", Ints{0, 2}}, {"keepdims", keep}})};
      if (keep) nodes.push_back(MakeNode("ReduceMean", "y", {"r"}, {"y"}, {{"axes", Ints{-1}}}));
      Graph g = Chain({4, 6, 1}, nodes);
      g.input_rank = 3;
      EXPECT_EQ(CheckMovingNodes(g).size(), keep ? 3u : 2u) << op;
    }
  }
}

// PyTorch 1.13: torch.topk(tensor([1, nan, 0, 3]), 2, largest=False) is [0, 1] (indices 2, 0),
// largest=True [nan, 3] (1, 3): NaN counts as the largest either way.
TEST(ElementSourcesTest, TopKOrderIsPyTorchs) {
  const float row[] = {1.0f, std::nanf(""), 0.0f, 3.0f};
  EXPECT_EQ(TopKNext(row, 4, 1, false, -1), 2);
  EXPECT_EQ(TopKNext(row, 4, 1, false, 2), 0);
  EXPECT_EQ(TopKNext(row, 4, 1, false, 3), 1);  // NaN last among the smallest.
  EXPECT_EQ(TopKNext(row, 4, 1, true, -1), 1);
  EXPECT_EQ(TopKNext(row, 4, 1, true, 1), 3);
  const float ties[] = {2.0f, 5.0f, 2.0f};
  EXPECT_EQ(TopKNext(ties, 3, 1, false, -1), 0);  // Ties to the lower index.
  EXPECT_EQ(TopKNext(ties, 3, 1, false, 0), 2);
}

// TopK of the largest and of the smallest, along axes 0 and 2 of a sequence-first value.
TEST(ElementSourcesTest, TopK) {
  for (int64_t largest : {1, 0}) {
    for (int64_t axis : {0, 2}) {
      Graph g = Chain(
          {4, 6, 1},
          {MakeNode("Transpose", "t", {"x"}, {"t"}, {{"perm", Ints{1, 0, 2}}}),
           MakeNode("TopK", "top", {"t", "k"}, {"y"}, {{"axis", axis}, {"largest", largest}})},
          {IntConstant("k", {3})});
      g.input_rank = 3;
      EXPECT_EQ(CheckMovingNodes(g), (std::vector<std::string>{"t", "top"}));
    }
  }
}

// Expand of a computed value along its size-1 axes (a padding mask to every head).
TEST(ElementSourcesTest, ExpandOfAComputedValue) {
  Graph g = Chain({1, 3, 1},
                  {MakeNode("Expand", "heads", {"x", "shape"}, {"h"}),  // [B, 2, 3, 4]
                   MakeNode("ReduceMean", "y", {"h"}, {"y"}, {{"axes", Ints{1, 2, 3}}})},
                  {IntConstant("shape", {2, 2, 3, 4})});
  g.input_rank = 4;
  EXPECT_EQ(CheckMovingNodes(g), (std::vector<std::string>{"heads", "y"}));
}

}  // namespace
}  // namespace graph
}  // namespace dptrain
