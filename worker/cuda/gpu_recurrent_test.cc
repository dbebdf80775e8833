// nn.LSTM and nn.GRU layers on the GPU (gpu_recurrent.h). Without a GPU: every form gets its
// twin, and an any-shape node that nothing on the GPU runs is refused in one line; on a GPU,
// GpuTwinTest compares each form against the CPU executor at two batch sizes: one direction or
// both, with and without biases (learned or held), each output, with each sample's length.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/cuda/gpu_graph.h"
#include "worker/cuda/gpu_twin_testing.h"
#include "worker/graph/executor.h"
#include "worker/graph/graph_check.h"
#include "worker/graph/op_registry.h"

namespace dptrain {
namespace cuda {
namespace {

using graph::MakeNode;
using Ints = std::vector<int64_t>;

struct Form {
  std::string op;  // TorchLSTM or TorchGRU.
  int64_t directions = 1, output = 0;
  bool biases = true, held_biases = false, lengths = false;
  bool fixed_hh = false;  // W_hh a buffer of the model (not learned).
  std::string Name() const {
    return absl::StrCat(op, " directions ", directions, " output ", output, " biases ", biases,
                        held_biases ? " (held)" : "", lengths ? " with lengths" : "",
                        fixed_hh ? ", W_hh fixed" : "");
  }
};

// [B, 5, 3] made sequence-first, then one layer of hidden size 4. With lengths: each sample's
// trunc(clip(30 mean(x) + 9, 1, 5)), computed from the input (any_shape_ops_test's).
graph::Graph Recurrent(const Form& f) {
  const int64_t rows = f.op == "TorchLSTM" ? 16 : 12;
  std::vector<graph::Node> nodes;
  std::vector<graph::NamedConstant> constants;
  if (f.lengths) {
    nodes = {
        MakeNode("ReduceMean", "m", {"x"}, {"m"}, {{"axes", Ints{1, 2}}, {"keepdims", int64_t{0}}}),
        MakeNode("Mul", "m10", {"m", "scale"}, {"m10"}),
        MakeNode("Add", "m3", {"m10", "shift"}, {"m3"}),
        MakeNode("Clip", "c", {"m3", "one", "five"}, {"c"}),
        MakeNode("Cast", "len", {"c"}, {"len"}, {{"to", int64_t{7}}})};
    constants = {graph::FloatScalar("scale", 30.0f), graph::FloatScalar("shift", 9.0f),
                 graph::FloatScalar("one", 1.0f), graph::FloatScalar("five", 5.0f)};
  }
  std::vector<std::string> inputs = {"t"};
  for (int64_t d = 0; d < f.directions; ++d) {
    const std::string s = d == 0 ? "" : "_reverse";
    std::vector<std::pair<std::string, Ints>> tensors = {{"w_ih" + s, {rows, 3}},
                                                         {"w_hh" + s, {rows, 4}}};
    if (f.biases) {
      tensors.push_back({"b_ih" + s, {rows}});
      tensors.push_back({"b_hh" + s, {rows}});
    }
    for (size_t k = 0; k < tensors.size(); ++k) {
      inputs.push_back(tensors[k].first);
      graph::NamedConstant c =
          graph::RandomConstant(tensors[k].first, tensors[k].second, 1 + 10 * d + k);
      c.state = !(k >= 2 && f.held_biases);
      c.fixed = k == 1 && f.fixed_hh;
      constants.push_back(std::move(c));
    }
  }
  std::map<std::string, graph::Attribute> attributes = {
      {"hidden_size", int64_t{4}}, {"output", f.output}, {"directions", f.directions}};
  if (f.lengths) {
    inputs.push_back("len");
    attributes["sequence_lens"] = int64_t{1};
  }
  nodes.push_back(MakeNode("Transpose", "seq", {"x"}, {"t"}, {{"perm", Ints{1, 0, 2}}}));
  nodes.push_back(MakeNode(f.op, "rnn", inputs, {"y"}, attributes));
  graph::Graph g = graph::Chain({5, 3, 1}, std::move(nodes), std::move(constants));
  g.input_rank = 3;
  return g;
}

std::vector<Form> AllForms() {
  std::vector<Form> forms;
  for (const char* op : {"TorchLSTM", "TorchGRU"}) {
    const int64_t outputs = std::string(op) == "TorchLSTM" ? 3 : 2;
    for (int64_t directions : {1, 2}) {
      for (int64_t output = 0; output < outputs; ++output) {
        for (bool lengths : {false, true}) {
          forms.push_back({op, directions, output, true, false, lengths});
        }
      }
      forms.push_back({op, directions, 0, false, false, false});  // No biases.
      forms.push_back({op, directions, 0, true, true, true});     // Frozen (held) biases.
      forms.push_back({op, directions, 1, true, false, true, true});  // W_hh a buffer.
    }
  }
  return forms;
}

TEST(GpuGraphTest, RecurrentLayersGetTwins) {
  for (const Form& f : AllForms()) {
    SCOPED_TRACE(f.Name());
    absl::StatusOr<std::unique_ptr<graph::Executor<float>>> cpu =
        graph::Executor<float>::Create(Recurrent(f), graph::BuiltinOps());
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    absl::StatusOr<std::unique_ptr<GpuGraph>> gpu = GpuGraph::Create(**cpu, GpuOps());
    EXPECT_TRUE(gpu.ok()) << gpu.status();
  }
}

// A node on values whose batch is not the first axis, that nothing on the GPU runs (here: a
// ReLU, with a registry that lacks it), is refused in one line naming it, before anything runs.
TEST(GpuGraphTest, AnyShapeNodeWithoutATwinIsRefusedInOneLine) {
  graph::Graph g = graph::Chain(
      {5, 3, 1}, {MakeNode("Transpose", "seq", {"x"}, {"t"}, {{"perm", Ints{1, 0, 2}}}),
                  MakeNode("Relu", "act", {"t"}, {"y"})});
  g.input_rank = 3;
  absl::StatusOr<std::unique_ptr<graph::Executor<float>>> cpu =
      graph::Executor<float>::Create(g, graph::BuiltinOps());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  absl::StatusOr<std::unique_ptr<GpuGraph>> gpu = GpuGraph::Create(**cpu, GpuOpRegistry());
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(gpu.status().message(),
            "node 'act' (Relu) works on values whose batch is not the first axis, of rank above 4, "
            "or row by row of their last axis (attention, transformers): no CUDA version yet; "
            "--device=cpu trains it");
}

// Every step's h and the last h of one LSTM (two nodes reading the same weights, as the importer
// makes them: tied on the GPU), combined: mean over time of Y plus Y_h.
graph::Graph SequenceAndLastState() {
  Form f{"TorchLSTM", 2, 0, true, false, true};
  graph::Graph g = Recurrent(f);
  graph::Node last = g.nodes.back();
  last.name = "rnn_last";
  last.outputs = {"y_h"};
  last.attributes["output"] = int64_t{1};
  g.nodes.back().outputs = {"y_all"};
  g.nodes.push_back(last);
  g.nodes.push_back(MakeNode("ReduceMean", "mean_t", {"y_all"}, {"y_mean"},
                             {{"axes", Ints{0}}, {"keepdims", int64_t{0}}}));
  g.nodes.push_back(MakeNode("Add", "y", {"y_mean", "y_h"}, {"y"}));
  g.output = "y";
  return g;
}

TEST(GpuGraphTest, TiedRecurrentLayersGetTwins) {
  absl::StatusOr<std::unique_ptr<graph::Executor<float>>> cpu =
      graph::Executor<float>::Create(SequenceAndLastState(), graph::BuiltinOps());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  absl::StatusOr<std::unique_ptr<GpuGraph>> gpu = GpuGraph::Create(**cpu, GpuOps());
  EXPECT_TRUE(gpu.ok()) << gpu.status();
}

TEST_F(GpuTwinTest, RecurrentLayers) {
  for (const Form& f : AllForms()) {
    SCOPED_TRACE(f.Name());
    Check(Recurrent(f));
    Check(Recurrent(f), 5);
  }
}

// Several steps on the same twins, the batch size changing (buffers reused and grown).
TEST_F(GpuTwinTest, RecurrentLayersStepAfterStep) {
  for (const Form& f : {Form{"TorchLSTM", 2, 0, true, false, true},
                        Form{"TorchGRU", 2, 1, true, false, true}, Form{"TorchGRU", 1, 0}}) {
    SCOPED_TRACE(f.Name());
    CheckSteps(Recurrent(f), {5, 3, 6});
  }
}

TEST_F(GpuTwinTest, TiedRecurrentLayers) { CheckSteps(SequenceAndLastState(), {3, 5}); }

}  // namespace
}  // namespace cuda
}  // namespace dptrain
