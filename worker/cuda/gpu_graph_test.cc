// Graph models on the GPU (gpu_graph.h). Without a GPU: the fixtures' graphs get their CUDA
// twins with the CPU executor's layout, name for name, and a graph with ops that have none is
// refused with one line naming the node (at the model's creation, before any GPU work). On a GPU:
// one training step of each fixture equals PyTorch's (loss, gradients and updated running
// statistics, the bounds of the CPU's onnx_import_test), and with Dropout on, the GPU step equals
// the CPU graph model's (the masks are the same bits), step after step.
#include "worker/cuda/gpu_graph.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "worker/cuda/cuda_model.h"
#include "worker/cuda/gpu_twin_testing.h"
#include "worker/graph/builtin_models.h"
#include "worker/graph/graph_check.h"
#include "worker/graph/graph_model.h"
#include "worker/graph/onnx_fixtures_testing.h"
#include "worker/graph/onnx_import.h"
#include "worker/graph/op_registry.h"
#include "worker/nn/layer_check.h"
#include "worker/nn/model.h"

namespace dptrain {
namespace cuda {
namespace {

namespace fixtures = graph::testing_fixtures;

graph::Graph ReadFixture(const std::string& name) {
  absl::StatusOr<graph::Graph> g =
      graph::ReadOnnxGraph(fixtures::OnnxPath(name), graph::BuiltinOps());
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return graph::Graph{};
  // The fixtures' buffers read by arithmetic (as onnx_import_test marks them).
  if (name == "scaled") {
    EXPECT_TRUE(graph::MarkBuffers(*g, {"mean"}).ok());
  }
  return *std::move(g);
}

// The CPU executor of fixture `name`: the plan its GPU twin follows.
absl::StatusOr<std::unique_ptr<graph::Executor<float>>> Plan(const std::string& name) {
  return graph::Executor<float>::Create(ReadFixture(name), graph::BuiltinOps());
}

// The classifier fixtures whose every node has a twin.
std::vector<std::string> ClassifierFixtures() {
  return absl::StrSplit(
      "vgg resnet branching gated pooling elementwise shuffle dynamic scaled convnext norms "
      "attention attention_dynamic mha mha_dynamic relpos text text_bag text_bag_dynamic text_cnn "
      "text_pad text_two_inputs tabular_two_inputs tabular_text_bag tabular_text_bag_dynamic "
      "tabular_mixed text_mask functional shared text_lstm text_lstm_dynamic text_lstm_packed "
      "text_bilstm text_bigru text_gru_packed",
      ' ');
}

class GpuGraphLayoutTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuGraphLayoutTest, TwinsHaveTheCpuLayout) {
  absl::StatusOr<std::unique_ptr<graph::Executor<float>>> cpu = Plan(GetParam());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  absl::StatusOr<std::unique_ptr<GpuGraph>> gpu = GpuGraph::Create(**cpu, GpuOps());
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const std::vector<nn::TensorSpec> params = (*gpu)->ParamSpecs();
  ASSERT_EQ(params.size(), (*cpu)->params().size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].name, (*cpu)->params()[i].name);
    EXPECT_EQ(params[i].shape, (*cpu)->params()[i].shape);
  }
  EXPECT_EQ((*gpu)->BufferSpecs().size(), (*cpu)->buffers().size());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuGraphLayoutTest, ::testing::ValuesIn([] {
                           std::vector<std::string> all = ClassifierFixtures();
                           all.push_back("tabular_regression");  // Regression (mse).
                           return all;
                         }()));

// Every CPU op with a batch-first version has a twin in GpuOps(); a registry without one
// refuses the node in one line.
TEST(GpuGraphTest, AnOpWithoutATwinIsOneLineNamingTheNode) {
  absl::StatusOr<std::unique_ptr<graph::Executor<float>>> cpu = Plan("vgg");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const graph::OpRegistry ops = graph::BuiltinOps();
  const GpuOpRegistry all = GpuOps();
  for (const std::string& op : ops.ops()) {
    // Only the any-shape ops whose twin GpuGraph picks by what the node does (moves, broadcast
    // binary ops, reductions, masks, TopK, LSTM and GRU layers).
    if (op == "Transpose" || op == "Gather" || op == "Expand" || op == "Equal" || op == "Not" ||
        op == "Where" || op == "ReduceSum" || op == "ReduceMax" || op == "ReduceMin" ||
        op == "ReduceL2" || op == "Max" || op == "Min" || op == "TopK" || op == "TorchLSTM" ||
        op == "TorchGRU") {
      continue;
    }
    EXPECT_TRUE(all.Has(op)) << op;
  }
  absl::StatusOr<std::unique_ptr<GpuGraph>> gpu = GpuGraph::Create(**cpu, GpuOpRegistry());
  ASSERT_FALSE(gpu.ok());
  const std::string message(gpu.status().message());
  EXPECT_NE(message.find("node '"), std::string::npos) << message;
  EXPECT_NE(message.find("no CUDA version yet; --device=cpu trains it"), std::string::npos)
      << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

// The built-in networks as graphs (worker/graph/builtin_models.h) get a twin for every node,
// with the layout of the Sequential that CudaModel::Create converts today, name for name.
class BuiltinGraphTest : public ::testing::TestWithParam<std::string> {};

nn::ModelOptions BuiltinOptions(const std::string& name) {
  nn::ModelOptions options;
  options.name = name;
  options.seed = 5;
  if (name == "resnet18") options.shape = {{3, 12, 12}, 7};  // Small: one step on a GPU.
  return options;
}

TEST_P(BuiltinGraphTest, TwinsHaveTheSequentialsLayout) {
  const nn::ModelOptions options = BuiltinOptions(GetParam());
  absl::StatusOr<graph::Graph> g = graph::BuiltinGraph(options);
  ASSERT_TRUE(g.ok()) << g.status();
  auto cpu = graph::Executor<float>::Create(*g, graph::BuiltinOps());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  absl::StatusOr<std::unique_ptr<GpuGraph>> gpu = GpuGraph::Create(**cpu, GpuOps());
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  absl::StatusOr<nn::InitialNetwork> net = nn::BuildInitialNetwork(options);
  ASSERT_TRUE(net.ok()) << net.status();
  const std::vector<nn::ParamInfo> want = nn::DescribeParams(net->net);
  const std::vector<nn::TensorSpec> params = (*gpu)->ParamSpecs();
  ASSERT_EQ(params.size(), want.size());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].name, want[i].name);
    EXPECT_EQ(params[i].shape, want[i].shape);
  }
  EXPECT_EQ((*gpu)->BufferSpecs().size(), nn::DescribeBuffers(net->net).size());
  EXPECT_EQ((*cpu)->initial_params(), net->weights);
}

// On a GPU: two SGD steps of the graph path equal the Sequential path's (deterministic cuDNN;
// the same CUDA layers run in both, the stem's Conv/BatchNorm/ReLU as separate twins here),
// so CudaModel::Create can move onto the graph once this passes (issue 27).
TEST_P(BuiltinGraphTest, StepsEqualTheSequentialPath) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no usable GPU here (" << why << ")";
  const nn::ModelOptions options = BuiltinOptions(GetParam());
  DeviceOptions device;
  device.deterministic = true;
  absl::StatusOr<std::unique_ptr<CudaModel>> seq = CudaModel::Create(options, device);
  ASSERT_TRUE(seq.ok()) << seq.status();
  absl::StatusOr<std::unique_ptr<CudaModel>> gra =
      CudaModel::CreateBuiltinFromGraph(options, device);
  ASSERT_TRUE(gra.ok()) << gra.status();
  ASSERT_EQ((*seq)->weights(), (*gra)->weights());
  const int batch = 6;
  const nn::Dims in = (*seq)->input_dims();
  std::vector<float> images(static_cast<size_t>(batch) * in.size());
  for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<float>((i * 7919) % 101) / 101;
  std::vector<nn::Label> labels(batch);
  for (int i = 0; i < batch; ++i) labels[i] = static_cast<nn::Label>(i % (*seq)->num_classes());
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(absl::StrCat(GetParam(), " step ", step));
    absl::StatusOr<nn::BatchResult> a = (*seq)->TrainStep(images.data(), labels.data(), batch);
    absl::StatusOr<nn::BatchResult> b = (*gra)->TrainStep(images.data(), labels.data(), batch);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
    EXPECT_NEAR(a->loss, b->loss, 1e-5 * std::max(1.0, std::abs(a->loss)));
    const absl::Span<const float> ga = (*seq)->grads(), gb = (*gra)->grads();
    ASSERT_EQ(ga.size(), gb.size());
    double diff = 0, norm = 0;
    for (size_t i = 0; i < ga.size(); ++i) {
      diff += (double{ga[i]} - gb[i]) * (double{ga[i]} - gb[i]);
      norm += double{ga[i]} * ga[i];
    }
    EXPECT_LE(std::sqrt(diff / std::max(norm, 1e-30)), 1e-5);
    ASSERT_TRUE((*seq)->ApplySgd(0.05f).ok());
    ASSERT_TRUE((*gra)->ApplySgd(0.05f).ok());
  }
  const std::vector<float>& ba = (*seq)->buffer_values();
  const std::vector<float>& bb = (*gra)->buffer_values();
  ASSERT_EQ(ba.size(), bb.size());
  for (size_t i = 0; i < ba.size(); ++i) EXPECT_NEAR(ba[i], bb[i], 1e-4 * (1 + std::abs(ba[i])));
}

INSTANTIATE_TEST_SUITE_P(Builtins, BuiltinGraphTest, ::testing::Values("mlp", "lenet", "resnet18"));

// Tied weights (the "shared" fixture: a module applied twice, its batch norm's running
// statistics updated by both uses) get their twins: each later use's gradient into the first's.
// A Linear applied twice (one weight and bias read by two nodes, tanh between).
graph::Graph TiedLinear() {
  graph::Graph g = graph::Chain(
      {6, 1, 1},
      {graph::MakeNode("Gemm", "first", {"x", "w", "b"}, {"h"}, {{"transB", int64_t{1}}}),
       graph::MakeNode("Tanh", "t", {"h"}, {"t"}),
       graph::MakeNode("Gemm", "again", {"t", "w", "b"}, {"y"}, {{"transB", int64_t{1}}})},
      {graph::RandomConstant("w", {6, 6}, 81), graph::RandomConstant("b", {6}, 82)});
  g.input_rank = 2;
  return g;
}

TEST(GpuGraphTest, TiedWeightsGetTwins) {
  for (const graph::Graph& g : {ReadFixture("shared"), TiedLinear()}) {
    absl::StatusOr<std::unique_ptr<graph::Executor<float>>> cpu =
        graph::Executor<float>::Create(g, graph::BuiltinOps());
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    absl::StatusOr<std::unique_ptr<GpuGraph>> gpu = GpuGraph::Create(**cpu, GpuOps());
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    EXPECT_EQ((*gpu)->ParamSpecs().size(), (*cpu)->params().size());
  }
}

// Each use's gradient summed into the weight's, on the GPU as on the CPU.
TEST_F(GpuTwinTest, TiedWeights) { Check(TiedLinear()); }

// One training step of fixture `name` on the GPU (strict fp32, deterministic cuDNN) against
// PyTorch's.
class GpuGraphParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuGraphParityTest, OneTrainStepMatchesPyTorch) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no usable GPU here (" << why << ")";
  const std::string name = GetParam();
  absl::StatusOr<SafetensorsContents> ref = LoadSafetensors(fixtures::ReferencePath(name));
  ASSERT_TRUE(ref.ok()) << ref.status();
  graph::GraphModelOptions options;
  options.name = name;
  options.dropout = false;  // PyTorch's reference step ran with dropout off.
  DeviceOptions device;
  device.deterministic = true;
  absl::StatusOr<std::unique_ptr<CudaModel>> made =
      CudaModel::CreateFromGraph(ReadFixture(name), graph::BuiltinOps(), options, device);
  ASSERT_TRUE(made.ok()) << made.status();
  CudaModel& model = **made;
  EXPECT_EQ(model.num_classes(), ref->Find("logits")->shape[1]);
  fixtures::ExpectTrainStepMatches(model, *ref);
  const fixtures::Batch batch = fixtures::ReferenceBatch(*ref);
  const int n = static_cast<int>(batch.labels.size());
  absl::StatusOr<nn::BatchResult> eval =
      model.Evaluate(batch.images.data(), batch.labels.data(), n);
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_TRUE(std::isfinite(eval->loss));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuGraphParityTest, ::testing::ValuesIn(ClassifierFixtures()));

// Fixture `name` as a model trained by SGD at 0.05 on the GPU (deterministic cuDNN) and on
// the CPU, from the same options.
struct ModelPair {
  std::unique_ptr<CudaModel> gpu;
  std::unique_ptr<nn::Model> cpu;
};
ModelPair SgdModels(const std::string& name, graph::GraphModelOptions options) {
  options.name = name;
  OptimizerOptions sgd;
  sgd.name = "sgd";
  sgd.learning_rate = 0.05;
  options.optimizer = sgd;
  const graph::Graph g = ReadFixture(name);
  DeviceOptions device;
  device.deterministic = true;
  absl::StatusOr<std::unique_ptr<CudaModel>> gpu =
      CudaModel::CreateFromGraph(g, graph::BuiltinOps(), options, device);
  EXPECT_TRUE(gpu.ok()) << gpu.status();
  absl::StatusOr<std::unique_ptr<nn::Model>> cpu =
      graph::CreateGraphModel(g, graph::BuiltinOps(), options);
  EXPECT_TRUE(cpu.ok()) << cpu.status();
  if (!gpu.ok() || !cpu.ok()) return {};
  return {*std::move(gpu), *std::move(cpu)};
}

// One step of both models on the same batch, then SGD at 0.05 on both: the losses agree
// within `loss_bound` (relative; absolute below 1) and the gradients within `grad_bound`
// (nn::ExpectAllClose). `on_gpu` and `on_cpu` get the two results for further checks.
void StepBoth(ModelPair& models, const float* x, nn::Targets targets, int n, double loss_bound,
              double grad_bound, nn::BatchResult* on_gpu, nn::BatchResult* on_cpu) {
  absl::StatusOr<nn::BatchResult> gpu = models.gpu->TrainStep(x, targets, n);
  absl::StatusOr<nn::BatchResult> cpu = models.cpu->TrainStep(x, targets, n);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_NEAR(gpu->loss, cpu->loss, loss_bound * std::max(1.0, std::abs(cpu->loss)));
  const absl::Span<const float> gpu_grads = models.gpu->grads();
  const absl::Span<const float> cpu_grads = models.cpu->grads();
  nn::ExpectAllClose("gradient", fixtures::ToDouble(gpu_grads.data(), gpu_grads.size()),
                     fixtures::ToDouble(cpu_grads.data(), cpu_grads.size()), grad_bound);
  ASSERT_TRUE(models.gpu->ApplyUpdate(0.05f).ok());
  ASSERT_TRUE(models.cpu->ApplyUpdate(0.05f).ok());
  *on_gpu = *gpu;
  *on_cpu = *cpu;
}

// Dropout on: the GPU draws the CPU's masks, so three SGD steps of the VGG-style net (it has
// Dropout) stay within fp32 rounding of the CPU graph model's; the gradients read on the host
// are those copied down parameter by parameter during backward.
TEST(GpuGraphTest, DropoutMasksAreTheCpuModelsOnes) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no usable GPU here (" << why << ")";
  absl::StatusOr<SafetensorsContents> ref = LoadSafetensors(fixtures::ReferencePath("vgg"));
  ASSERT_TRUE(ref.ok()) << ref.status();
  graph::GraphModelOptions options;
  options.seed = 7;
  ModelPair models = SgdModels("vgg", options);
  ASSERT_TRUE(models.gpu && models.cpu);
  // As a synchroniser does: from now on each parameter's gradient is copied down as soon as
  // its node's backward is enqueued (one part per parameter).
  models.gpu->gradient_exchange();
  const fixtures::Batch batch = fixtures::ReferenceBatch(*ref);
  const int n = static_cast<int>(batch.labels.size());
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    nn::BatchResult on_gpu, on_cpu;
    ASSERT_NO_FATAL_FAILURE(StepBoth(models, batch.images.data(), batch.labels.data(), n, 1e-4,
                                     1e-3, &on_gpu, &on_cpu));
  }
}

// The element-wise losses on the GPU (nn.MSELoss, nn.L1Loss, nn.BCEWithLogitsLoss), against
// target values in [0, 1] and against class labels: two SGD steps of the regression fixture
// equal the CPU graph model's (loss, gradients).
TEST(GpuGraphTest, ElementWiseLossesAreTheCpuModels) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no usable GPU here (" << why << ")";
  for (graph::Loss loss : {graph::Loss::kMse, graph::Loss::kL1, graph::Loss::kBce}) {
    for (bool labels : {false, true}) {
      SCOPED_TRACE(absl::StrCat("loss ", static_cast<int>(loss), labels ? " on labels" : ""));
      graph::GraphModelOptions options;
      options.loss = loss;
      options.dropout = false;
      ModelPair models = SgdModels("tabular_regression", options);
      ASSERT_TRUE(models.gpu && models.cpu);
      const int n = 6, outputs = models.cpu->num_classes();
      std::mt19937 gen(3);
      std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
      std::vector<float> x(n * models.cpu->input_dims().size()), targets(n * outputs);
      for (float& v : x) v = 3 * uniform(gen) - 1.5f;
      for (float& t : targets) t = uniform(gen);  // In [0, 1]: bce's probabilities.
      std::vector<nn::Label> classes(n);
      for (int i = 0; i < n; ++i) classes[i] = static_cast<nn::Label>(i % outputs);
      const nn::Targets scored =
          labels ? nn::Targets(classes.data()) : nn::Targets::Values(targets.data());
      for (int step = 0; step < 2; ++step) {
        SCOPED_TRACE(absl::StrCat("step ", step));
        nn::BatchResult on_gpu, on_cpu;
        ASSERT_NO_FATAL_FAILURE(
            StepBoth(models, x.data(), scored, n, 1e-5, 1e-4, &on_gpu, &on_cpu));
        EXPECT_EQ(on_gpu.correct, on_cpu.correct);
      }
    }
  }
}

// Class weights on the GPU (nn.CrossEntropyLoss(weight=w, label_smoothing=e)), a class of
// weight 0 among the labels: two SGD steps of the VGG-style fixture equal the CPU model's (loss,
// its weight, gradients); a batch whose labels all weigh 0 gives loss and gradient 0 there too.
TEST(GpuGraphTest, ClassWeightsAreTheCpuModels) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no usable GPU here (" << why << ")";
  absl::StatusOr<SafetensorsContents> ref = LoadSafetensors(fixtures::ReferencePath("vgg"));
  ASSERT_TRUE(ref.ok()) << ref.status();
  const fixtures::Batch batch = fixtures::ReferenceBatch(*ref);
  const int n = static_cast<int>(batch.labels.size());
  for (double smoothing : {0.0, 0.1}) {
    SCOPED_TRACE(absl::StrCat("label smoothing ", smoothing));
    graph::GraphModelOptions options;
    options.dropout = false;
    options.label_smoothing = smoothing;
    options.class_weights = {1, 2, 0.5, 0, 3, 1, 1, 0.25, 2, 1};
    options.class_weights[batch.labels[0]] = 0;  // A zero weight among the labels.
    ModelPair models = SgdModels("vgg", options);
    ASSERT_TRUE(models.gpu && models.cpu);
    for (int step = 0; step < 2; ++step) {
      SCOPED_TRACE(absl::StrCat("step ", step));
      nn::BatchResult on_gpu, on_cpu;
      ASSERT_NO_FATAL_FAILURE(StepBoth(models, batch.images.data(), batch.labels.data(), n, 1e-4,
                                       1e-3, &on_gpu, &on_cpu));
      EXPECT_DOUBLE_EQ(on_gpu.weight, on_cpu.weight);
      EXPECT_EQ(on_gpu.correct, on_cpu.correct);
    }
    // Every label of weight 0: loss 0, gradient 0, weight 0 (PyTorch gives NaN).
    const std::vector<nn::Label> zero(n, batch.labels[0]);
    absl::StatusOr<nn::BatchResult> none =
        models.gpu->TrainStep(batch.images.data(), zero.data(), n);
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_EQ(none->loss, 0);
    EXPECT_EQ(none->weight, 0);
    for (float g : models.gpu->grads()) ASSERT_EQ(g, 0.0f);
  }
}

using graph::Chain;
using graph::FloatScalar;
using graph::MakeNode;
using graph::RandomConstant;
using Ints = std::vector<int64_t>;

TEST_F(GpuTwinTest, ElementWiseFunctions) {
  Check(
      Chain({2, 3, 4}, {MakeNode("Tanh", "t", {"x"}, {"t"}), MakeNode("Erf", "e", {"t"}, {"y"})}));
  Check(Chain({2, 3, 4},
              {MakeNode("HardSigmoid", "h", {"x"}, {"y"}, {{"alpha", 1.5f}, {"beta", 0.4f}})}));
  Check(Chain({2, 3, 4},
              {MakeNode("Mul", "m", {"x", "k"}, {"s"}), MakeNode("HardSwish", "h", {"s"}, {"y"})},
              {FloatScalar("k", 4.0f)}));
  Check(Chain({2, 3, 4}, {MakeNode("LeakyRelu", "l", {"x"}, {"y"}, {{"alpha", 0.2f}})}));
  Check(Chain({2, 3, 4}, {MakeNode("Clip", "c", {"x", "lo", "hi"}, {"y"})},
              {FloatScalar("lo", -0.2f), FloatScalar("hi", 0.3f)}));
  Check(Chain({2, 3, 4}, {MakeNode("Cast", "c", {"x"}, {"y"}, {{"to", int64_t{1}}})}));
  for (const char* op : {"Elu", "Selu", "Softplus", "Softsign", "Sin", "Cos"}) {
    SCOPED_TRACE(op);
    Check(Chain({2, 3, 4}, {MakeNode(op, "e", {"x"}, {"y"})}));
  }
}

TEST_F(GpuTwinTest, BinaryOpsInEveryForm) {
  for (const char* op : {"Add", "Sub", "Mul", "Div"}) {
    SCOPED_TRACE(op);
    Check(Chain({2, 3, 4},
                {MakeNode("Sigmoid", "s", {"x"}, {"s"}), MakeNode(op, "b", {"x", "s"}, {"y"})}));
    Check(Chain({3, 4, 5},
                {MakeNode("GlobalAveragePool", "g", {"x"}, {"g"}),
                 MakeNode("Sigmoid", "s", {"g"}, {"s"}), MakeNode(op, "b", {"x", "s"}, {"y"})}));
    Check(Chain({3, 4, 5},
                {MakeNode("GlobalAveragePool", "g", {"x"}, {"g"}),
                 MakeNode("Sigmoid", "s", {"g"}, {"s"}), MakeNode(op, "b", {"s", "x"}, {"y"})}));
    Check(Chain({2, 3, 4}, {MakeNode(op, "b", {"x", "k"}, {"y"})}, {FloatScalar("k", 0.5f)}));
    Check(Chain({2, 3, 4},
                {MakeNode("Sigmoid", "s", {"x"}, {"s"}), MakeNode(op, "b", {"k", "s"}, {"y"})},
                {FloatScalar("k", 2.0f)}));
  }
}

TEST_F(GpuTwinTest, PadSoftmaxConcatAndStagedWeights) {
  Check(Chain({2, 3, 4}, {MakeNode("Pad", "p", {"x", "pads"}, {"y"})},
              {graph::IntConstant("pads", {0, 0, 1, 2, 0, 0, 2, 1})}));
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    Check(Chain({4, 2, 3}, {MakeNode(op, "s", {"x"}, {"y"}, {{"axis", int64_t{1}}})}));
  }
  // Two branches side by side, the second a bias-free convolution (its zero bias staged).
  graph::Graph g = Chain(
      {2, 4, 4},
      {MakeNode("Conv", "a", {"x", "wa", "ba"}, {"a"}), MakeNode("Conv", "b", {"x", "wb"}, {"b"}),
       MakeNode("Concat", "c", {"a", "b"}, {"y"}, {{"axis", int64_t{1}}})},
      {RandomConstant("wa", {3, 2, 1, 1}, 3), RandomConstant("ba", {3}, 4),
       RandomConstant("wb", {2, 2, 3, 3}, 5)});
  g.nodes[1].attributes["pads"] = Ints{1, 1, 1, 1};
  Check(g);
  // Parameters apart (bias first) and a MatMul by an [in, out] weight: both staged.
  Check(Chain({2, 3, 3},
              {MakeNode("Conv", "conv", {"x", "w", "b"}, {"c"}),
               MakeNode("Flatten", "f", {"c"}, {"f"}), MakeNode("MatMul", "m", {"f", "k"}, {"y"})},
              {RandomConstant("b", {3}, 6), RandomConstant("w", {3, 2, 1, 1}, 7),
               RandomConstant("k", {27, 5}, 8)}));
  // Grouped and depthwise convolutions (cuDNN's group count), with and without a bias.
  Check(Chain({4, 5, 6},
              {MakeNode("Conv", "conv", {"x", "w", "b"}, {"y"},
                        {{"group", int64_t{2}}, {"pads", Ints{1, 1, 1, 1}}})},
              {RandomConstant("w", {6, 2, 3, 3}, 21), RandomConstant("b", {6}, 22)}));
  Check(Chain(
      {3, 7, 7},
      {MakeNode("Conv", "dw", {"x", "w"}, {"y"},
                {{"group", int64_t{3}}, {"strides", Ints{2, 2}}, {"pads", Ints{1, 1, 1, 1}}})},
      {RandomConstant("w", {3, 1, 3, 3}, 23)}));
  // MaxPool with ceil_mode (our kernels): 8 x 8 by 3 / 2 gives 4 windows a side (3 without
  // ceil_mode), the last one partly outside the input; and with padding.
  for (const Ints& pads : {Ints{0, 0, 0, 0}, Ints{1, 1, 1, 1}}) {
    Check(Chain({2, 8, 8}, {MakeNode("MaxPool", "p", {"x"}, {"y"},
                                     {{"kernel_shape", Ints{3, 3}},
                                      {"strides", Ints{2, 2}},
                                      {"pads", pads},
                                      {"ceil_mode", int64_t{1}}})}));
  }
  // AveragePool with ceil_mode and count_include_pad=0 (our kernels, the CPU's divisors).
  for (int64_t include : {0, 1}) {
    Check(Chain({2, 6, 6}, {MakeNode("AveragePool", "p", {"x"}, {"y"},
                                     {{"kernel_shape", Ints{3, 3}},
                                      {"strides", Ints{2, 2}},
                                      {"pads", Ints{1, 1, 1, 1}},
                                      {"ceil_mode", int64_t{1}},
                                      {"count_include_pad", include}})}));
  }
  // LayerNormalization over [N, F] with a bias and over a whole image without one.
  Check(Chain({6, 1, 1}, {MakeNode("LayerNormalization", "ln", {"x", "s", "b"}, {"y"})},
              {RandomConstant("s", {6}, 31, 0.5, 1.0), RandomConstant("b", {6}, 32)}));
  Check(Chain({2, 3, 4},
              {MakeNode("LayerNormalization", "ln", {"x", "s"}, {"y"}, {{"axis", int64_t{1}}})},
              {RandomConstant("s", {2, 3, 4}, 33, 0.5, 1.0)}));
  // Dropout in training: the CPU's masks.
  Check(Chain({2, 3, 4}, {MakeNode("Dropout", "d", {"x"}, {"y"}, {{"ratio", 0.3f}})}), 5);
}

TEST_F(GpuTwinTest, SliceOfEachAxisAndChannelShuffle) {
  for (int64_t axis : {1, 2, 3}) {
    SCOPED_TRACE(absl::StrCat("axis ", axis));
    Check(Chain({6, 5, 4}, {MakeNode("Slice", "s", {"x", "b", "e", "a"}, {"y"})},
                {graph::IntConstant("b", {1}), graph::IntConstant("e", {-1}),
                 graph::IntConstant("a", {axis})}));
  }
  Check(Chain({6, 3, 2}, {MakeNode("ChannelShuffle", "cs", {"x", "s1", "s2"}, {"y"})},
              {graph::IntConstant("s1", {4, 2, 3, 3, 2}), graph::IntConstant("s2", {4, 6, 3, 2})}));
}

// Tensors of the model as operands (learned, a buffer, held), per-pixel operands, PRelu, the
// channel mean and InstanceNormalization.
TEST_F(GpuTwinTest, GraphOperandsPReluChannelMeanAndInstanceNorm) {
  using Ints = std::vector<int64_t>;
  using Names = std::vector<std::string>;
  for (bool state : {false, true}) {
    for (bool fixed : {false, true}) {
      if (fixed && !state) continue;
      for (const Ints& shape : std::vector<Ints>{{}, {3, 1, 1}, {3, 2, 4}}) {
        SCOPED_TRACE(absl::StrCat("state ", state, " fixed ", fixed, " rank ", shape.size()));
        graph::NamedConstant t = RandomConstant("t", shape, 21, 0.5, 1.0);  // In [0.5, 1.5].
        t.state = state;
        t.fixed = fixed;
        Check(Chain({3, 2, 4}, {MakeNode("Mul", "m", {"t", "x"}, {"y"})}, {t}));
        Check(Chain({3, 2, 4}, {MakeNode("Mul", "m", {"x", "t"}, {"y"})}, {t}));
        Check(Chain({3, 2, 4}, {MakeNode("Div", "d", {"x", "t"}, {"y"})}, {t}));
      }
    }
  }
  for (const Ints& shape : std::vector<Ints>{{1}, {3, 1, 1}}) {
    for (bool state : {false, true}) {
      graph::NamedConstant slope = RandomConstant("slope", shape, 22, 0.2, 0.25);
      slope.state = state;
      Check(Chain({3, 2, 4}, {MakeNode("PRelu", "p", {"x", "slope"}, {"y"})}, {slope}));
    }
  }
  // A layer norm over each pixel's channels: the channel mean and per-pixel broadcasts.
  for (bool swapped : {false, true}) {
    Check(Chain({4, 2, 3},
                {MakeNode("ReduceMean", "mean", {"x"}, {"u"}, {{"axes", Ints{1}}}),
                 MakeNode("Sub", "sub", swapped ? Names{"u", "x"} : Names{"x", "u"}, {"y"})}));
  }
  graph::NamedConstant scale = RandomConstant("in.weight", {3}, 23, 0.5, 1.0);
  graph::NamedConstant bias = RandomConstant("in.bias", {3}, 24);
  auto instance_norm = [&] {
    return Chain({3, 2, 4},
                 {MakeNode("InstanceNormalization", "in", {"x", "in.weight", "in.bias"}, {"y"})},
                 {scale, bias});
  };
  Check(instance_norm());  // Held constants.
  scale.state = bias.state = true;
  Check(instance_norm());  // Learned.
  scale.fixed = bias.fixed = true;
  Check(instance_norm());  // Buffers.
}

}  // namespace
}  // namespace cuda
}  // namespace dptrain
