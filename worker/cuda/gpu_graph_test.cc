// Graph models on the GPU (gpu_graph.h). Without a GPU: the fixtures' graphs get their CUDA
// twins with the CPU executor's layout, name for name, and a graph with ops that have none is
// refused with one line naming the node (at the model's creation, before any GPU work). On a GPU:
// one training step of each fixture equals PyTorch's (loss, gradients and updated running
// statistics, the bounds of the CPU's onnx_import_test), and with Dropout on, the GPU step equals
// the CPU graph model's (the masks are the same bits), step after step.
#include "worker/cuda/gpu_graph.h"

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/cuda/cuda_model.h"
#include "worker/graph/graph_model.h"
#include "worker/graph/onnx_fixtures_testing.h"
#include "worker/graph/onnx_import.h"
#include "worker/graph/op_registry.h"
#include "worker/nn/layer_check.h"

namespace dptrain {
namespace cuda {
namespace {

namespace fixtures = graph::testing_fixtures;

bool HaveGpu(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaSuccess && count > 0) return true;
  *why = e == cudaSuccess ? "no CUDA device" : cudaGetErrorString(e);
  return false;
}

graph::Graph ReadFixture(const std::string& name) {
  absl::StatusOr<graph::Graph> g =
      graph::ReadOnnxGraph(fixtures::OnnxPath(name), graph::BuiltinOps());
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *std::move(g) : graph::Graph{};
}

// The CPU executor of fixture `name`: the plan its GPU twin follows.
absl::StatusOr<std::unique_ptr<graph::Executor<float>>> Plan(const std::string& name) {
  return graph::Executor<float>::Create(ReadFixture(name), graph::BuiltinOps());
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

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuGraphLayoutTest, ::testing::Values("vgg", "resnet"));

// "gated" has LeakyRelu, Clip, Erf, HardSwish, grouped Conv...; "branching" Pad, Tanh, MatMul
// by an [in, out] weight: none has a twin yet.
class GpuGraphRefusalTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuGraphRefusalTest, AnOpWithoutATwinIsOneLineNamingTheNode) {
  absl::StatusOr<std::unique_ptr<graph::Executor<float>>> cpu = Plan(GetParam());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  absl::StatusOr<std::unique_ptr<GpuGraph>> gpu = GpuGraph::Create(**cpu, GpuOps());
  ASSERT_FALSE(gpu.ok());
  const std::string message(gpu.status().message());
  EXPECT_NE(message.find("node '"), std::string::npos) << message;
  EXPECT_NE(message.find("no CUDA version yet; --device=cpu trains it"), std::string::npos)
      << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuGraphRefusalTest, ::testing::Values("gated", "branching"));

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

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuGraphParityTest, ::testing::Values("vgg", "resnet"));

// Dropout on: the GPU draws the CPU's masks, so three SGD steps of the VGG-style net (it has
// Dropout) stay within fp32 rounding of the CPU graph model's.
TEST(GpuGraphTest, DropoutMasksAreTheCpuModelsOnes) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no usable GPU here (" << why << ")";
  absl::StatusOr<SafetensorsContents> ref = LoadSafetensors(fixtures::ReferencePath("vgg"));
  ASSERT_TRUE(ref.ok()) << ref.status();
  graph::GraphModelOptions options;
  options.name = "vgg";
  options.seed = 7;
  OptimizerOptions sgd;
  sgd.name = "sgd";
  sgd.learning_rate = 0.05;
  options.optimizer = sgd;
  const graph::Graph g = ReadFixture("vgg");
  DeviceOptions device;
  device.deterministic = true;
  absl::StatusOr<std::unique_ptr<CudaModel>> gpu =
      CudaModel::CreateFromGraph(g, graph::BuiltinOps(), options, device);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  absl::StatusOr<std::unique_ptr<nn::Model>> cpu =
      graph::CreateGraphModel(g, graph::BuiltinOps(), options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const fixtures::Batch batch = fixtures::ReferenceBatch(*ref);
  const int n = static_cast<int>(batch.labels.size());
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    absl::StatusOr<nn::BatchResult> on_gpu =
        (*gpu)->TrainStep(batch.images.data(), batch.labels.data(), n);
    absl::StatusOr<nn::BatchResult> on_cpu =
        (*cpu)->TrainStep(batch.images.data(), batch.labels.data(), n);
    ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
    ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
    EXPECT_NEAR(on_gpu->loss, on_cpu->loss, 1e-4 * std::max(1.0, std::abs(on_cpu->loss)));
    nn::ExpectAllClose("gradient",
                       fixtures::ToDouble((*gpu)->grads().data(), (*gpu)->grads().size()),
                       fixtures::ToDouble((*cpu)->grads().data(), (*cpu)->grads().size()), 1e-3);
    ASSERT_TRUE((*gpu)->ApplyUpdate(0.05f).ok());
    ASSERT_TRUE((*cpu)->ApplyUpdate(0.05f).ok());
  }
}

}  // namespace
}  // namespace cuda
}  // namespace dptrain
