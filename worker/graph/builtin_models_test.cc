// The built-in networks as graphs: the layout, names and initial weights of the Sequentials they
// replace (which the CUDA backend still builds from), the same numbers as those layers run one
// after the other, the fused Residual node against the same block in plain ops (double) and
// against finite differences, and the errors. The PyTorch fixtures of the built-ins
// (worker/nn/pytorch_parity_test, resnet_test) run through CreateBuiltinModel too.
#include "worker/graph/builtin_models.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "worker/graph/executor.h"
#include "worker/graph/graph_check.h"
#include "worker/graph/op_registry.h"
#include "worker/nn/model.h"
#include "worker/nn/softmax_cross_entropy.h"

namespace dptrain {
namespace graph {
namespace {

std::vector<float> RandomFloats(size_t n, uint64_t seed, float lo = 0.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

void ExpectSameInfos(const std::vector<nn::ParamInfo>& a, const std::vector<nn::ParamInfo>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name) << i;
    EXPECT_EQ(a[i].shape, b[i].shape) << a[i].name;
    EXPECT_EQ(a[i].offset, b[i].offset) << a[i].name;
    EXPECT_EQ(a[i].size, b[i].size) << a[i].name;
  }
}

struct Case {
  std::string name;
  nn::NetworkShape shape;
};

class BuiltinModelTest : public ::testing::TestWithParam<Case> {};

TEST_P(BuiltinModelTest, LayoutNamesAndInitialWeightsAreTheSequentials) {
  nn::ModelOptions options;
  options.name = GetParam().name;
  options.shape = GetParam().shape;
  options.seed = 11;
  for (const char* init : {"default", "kaiming"}) {
    options.init = init;
    absl::StatusOr<std::unique_ptr<nn::Model>> model = CreateBuiltinModel(options);
    ASSERT_TRUE(model.ok()) << model.status();
    absl::StatusOr<nn::InitialNetwork> net = nn::BuildInitialNetwork(options);
    ASSERT_TRUE(net.ok()) << net.status();
    ExpectSameInfos((*model)->params(), nn::DescribeParams(net->net));
    ExpectSameInfos((*model)->buffers(), nn::DescribeBuffers(net->net));
    EXPECT_EQ((*model)->weights(), net->weights) << init;
    std::vector<float> buffers(net->net.num_buffers());
    net->net.InitBuffers(buffers.data());
    EXPECT_EQ((*model)->buffer_values(), buffers);
    EXPECT_EQ((*model)->name(), options.name);
    EXPECT_EQ((*model)->num_classes(), options.shape.classes);
    EXPECT_EQ((*model)->input_dims().size(), options.shape.input.size());
  }
}

// One training step and one evaluation equal, bit for bit, what the network's layers compute
// when run one after the other as a Sequential (the path the built-ins took before they were
// graphs, and the one the CUDA backend converts).
TEST_P(BuiltinModelTest, OneStepEqualsTheSequentialBitForBit) {
  // With --label_smoothing too: the models' loss is the one given (nn::ModelOptions).
  for (const double smoothing : {0.0, 0.1}) {
    SCOPED_TRACE(smoothing);
    nn::ModelOptions options;
    options.name = GetParam().name;
    options.shape = GetParam().shape;
    options.seed = 3;
    options.label_smoothing = smoothing;
    absl::StatusOr<std::unique_ptr<nn::Model>> model = CreateBuiltinModel(options);
    ASSERT_TRUE(model.ok()) << model.status();
    absl::StatusOr<nn::InitialNetwork> initial = nn::BuildInitialNetwork(options);
    ASSERT_TRUE(initial.ok());
    nn::Sequential<float>& net = initial->net;
    std::vector<float> grads(net.num_params()), buffers(net.num_buffers());
    net.InitBuffers(buffers.data());
    net.BindBuffers(buffers.data());
    net.BindParams(initial->weights.data(), grads.data());

    const int batch = 3, classes = options.shape.classes;
    const std::vector<float> images = RandomFloats(int64_t{batch} * options.shape.input.size(), 5);
    const std::vector<nn::Label> labels = {1, 0, static_cast<nn::Label>(classes - 1)};

    absl::StatusOr<nn::BatchResult> step = (*model)->TrainStep(images.data(), labels.data(), batch);
    ASSERT_TRUE(step.ok()) << step.status();
    nn::TensorRef<float> logits = net.Forward(images.data(), batch, /*training=*/true);
    std::vector<float> grad_logits(logits.size());
    const nn::LossOutput loss = nn::SoftmaxCrossEntropy<float>(
        logits.data, labels.data(), batch, classes, grad_logits.data(), smoothing);
    net.Backward({grad_logits.data(), batch, logits.dims});
    EXPECT_EQ(step->loss, loss.loss);
    EXPECT_EQ(step->correct, loss.correct);
    const absl::Span<const float> model_grads = (*model)->grads();
    ASSERT_EQ(model_grads.size(), grads.size());
    int64_t differ = 0;
    for (size_t i = 0; i < grads.size(); ++i) differ += model_grads[i] != grads[i];
    EXPECT_EQ(differ, 0) << "of " << grads.size() << " gradient elements";
    EXPECT_EQ((*model)->buffer_values(), buffers);

    absl::StatusOr<nn::BatchResult> eval = (*model)->Evaluate(images.data(), labels.data(), batch);
    ASSERT_TRUE(eval.ok());
    logits = net.Forward(images.data(), batch, /*training=*/false);
    const nn::LossOutput eval_loss = nn::SoftmaxCrossEntropy<float>(
        logits.data, labels.data(), batch, classes, nullptr, smoothing);
    // Evaluate averages per piece in double: equal up to that rounding.
    EXPECT_NEAR(eval->loss, eval_loss.loss, 1e-6 * eval_loss.loss);
    EXPECT_EQ(eval->correct, eval_loss.correct);
  }
}

INSTANTIATE_TEST_SUITE_P(Builtins, BuiltinModelTest,
                         ::testing::Values(Case{"mlp", {}}, Case{"lenet", {}}, Case{"resnet18", {}},
                                           Case{"mlp", {{3, 32, 32}, 100}},
                                           Case{"lenet", {{3, 32, 32}, 10}},
                                           Case{"resnet18", {{3, 12, 10}, 7}}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(info.param.name, "_", info.param.shape.input.c, "x",
                                               info.param.shape.input.h, "x",
                                               info.param.shape.input.w);
                         });

// Random weights for a ResNetGraph (variances positive).
Graph WithRandomWeights(Graph g, uint64_t seed) {
  for (NamedConstant& c : g.constants) {
    const bool var = absl::EndsWith(c.name, "running_var");
    c.value.floats =
        RandomFloats(c.value.floats.size(), seed++, var ? 0.5f : -0.5f, var ? 1.5f : 0.5f);
  }
  return g;
}

// The fused Residual node computes what the same block computes in plain ops (Conv,
// BatchNormalization, Relu, Add), in double: output, input gradient, every parameter gradient
// and the updated running statistics; both lay out the same.
TEST(ResidualNode, EqualsTheBlockInPlainOps) {
  const nn::ResNetConfig config{{3, 8, 7}, {4, 6}, 2, 5};
  absl::StatusOr<Graph> fused = ResNetGraph(config, true);
  absl::StatusOr<Graph> plain = ResNetGraph(config, false);
  ASSERT_TRUE(fused.ok() && plain.ok());
  const OpRegistry registry = BuiltinOps();
  auto a = Executor<double>::Create(WithRandomWeights(*fused, 1), registry);
  auto b = Executor<double>::Create(WithRandomWeights(*plain, 1), registry);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectSameInfos((*a)->params(), (*b)->params());
  ExpectSameInfos((*a)->buffers(), (*b)->buffers());
  ASSERT_EQ((*a)->initial_params(), (*b)->initial_params());
  ASSERT_EQ((*a)->initial_buffers(), (*b)->initial_buffers());

  const int batch = 4;
  std::vector<double> params = (*a)->initial_params();
  std::vector<double> ga(params.size()), gb(params.size());
  std::vector<double> ba = (*a)->initial_buffers(), bb = (*b)->initial_buffers();
  (*a)->Bind(params.data(), ga.data(), ba.data());
  (*b)->Bind(params.data(), gb.data(), bb.data());
  const std::vector<float> x32 = RandomFloats(batch * config.input.size(), 9, -1, 1);
  const std::vector<double> x(x32.begin(), x32.end());
  const nn::TensorRef<double> ya = ForwardOk(**a, x.data(), batch, true);
  const nn::TensorRef<double> yb = ForwardOk(**b, x.data(), batch, true);
  ASSERT_EQ(ya.size(), yb.size());
  for (int64_t i = 0; i < ya.size(); ++i) EXPECT_NEAR(ya.data[i], yb.data[i], 1e-12) << i;
  const std::vector<float> g32 = RandomFloats(ya.size(), 10, -1, 1);
  const std::vector<double> g(g32.begin(), g32.end());
  const nn::TensorRef<double> dxa = (*a)->Backward({g.data(), batch, ya.dims}, true);
  const nn::TensorRef<double> dxb = (*b)->Backward({g.data(), batch, yb.dims}, true);
  for (int64_t i = 0; i < dxa.size(); ++i) EXPECT_NEAR(dxa.data[i], dxb.data[i], 1e-11) << i;
  double worst = 0;
  for (size_t i = 0; i < ga.size(); ++i) worst = std::max(worst, std::abs(ga[i] - gb[i]));
  EXPECT_LT(worst, 1e-10);
  for (size_t i = 0; i < ba.size(); ++i) EXPECT_NEAR(ba[i], bb[i], 1e-12) << i;
}

// In evaluation mode: in training mode the batch norms make every convolution bias's gradient
// exactly zero, which finite differences only see as noise (training mode is covered above,
// against plain ops, whose Conv and BatchNormalization ops have their own checks).
TEST(ResidualNode, GradientsMatchFiniteDifferences) {
  absl::StatusOr<Graph> g = ResNetGraph({{2, 5, 5}, {2, 3}, 1, 3});
  ASSERT_TRUE(g.ok());
  GraphCheckOptions options;
  options.training = false;
  options.batch = 2;
  options.fd_tolerance = 1e-5;
  options.max_fd_checks = 60;
  CheckGraphGradients(WithRandomWeights(*g, 4), BuiltinOps(), options);
}

// A ResNet whose last stage is 1x1 (2x2 images, one strided stage): a batch of one leaves the
// Residual node's batch norms one value per channel, which training refuses naming the node, as
// PyTorch does; evaluation and two samples are fine.
TEST(ResidualNode, ABatchOfOneDoesNotTrainWhereTheMapIsOnePixel) {
  absl::StatusOr<Graph> g = ResNetGraph({{2, 2, 2}, {2, 3}, 1, 3});
  ASSERT_TRUE(g.ok()) << g.status();
  auto e = Executor<float>::Create(WithRandomWeights(*g, 1), BuiltinOps());
  ASSERT_TRUE(e.ok()) << e.status();
  std::vector<float> params = (*e)->initial_params(), grads(params.size());
  std::vector<float> buffers = (*e)->initial_buffers();
  (*e)->Bind(params.data(), grads.data(), buffers.data());
  const std::vector<float> x = RandomFloats(2 * 8, 3, -1.0f, 1.0f);
  absl::StatusOr<nn::TensorRef<float>> one = (*e)->Forward(x.data(), 1, /*training=*/true);
  ASSERT_FALSE(one.ok());
  EXPECT_EQ(one.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(one.status().message(),
                                "(Residual): BatchNorm2d: expected more than 1 value per channel "
                                "when training, got input [1, 3, 1, 1]"))
      << one.status();
  EXPECT_TRUE((*e)->Forward(x.data(), 1, /*training=*/false).ok());
  EXPECT_TRUE((*e)->Forward(x.data(), 2, /*training=*/true).ok());
}

TEST(ResidualNode, RefusesWhatTheBlockCannotBe) {
  absl::StatusOr<Graph> g = ResNetGraph({{4, 6, 6}, {4}, 1, 3});
  ASSERT_TRUE(g.ok());
  Node* residual = nullptr;
  for (Node& n : g->nodes) {
    if (n.op == "Residual") residual = &n;
  }
  ASSERT_NE(residual, nullptr);
  residual->attributes["stride"] = int64_t{2};
  auto e = Executor<float>::Create(*g, BuiltinOps());
  ASSERT_FALSE(e.ok());
  EXPECT_TRUE(absl::StrContains(e.status().message(), "identity shortcut needs")) << e.status();
  residual->attributes.erase("stride");
  // A shortcut bias without its weight (the block's layout has no conv3: the bias would be
  // bound where bn1's scale lies).
  residual->inputs[6] = residual->inputs[2];
  e = Executor<float>::Create(*g, BuiltinOps());
  ASSERT_FALSE(e.ok());
  EXPECT_TRUE(absl::StrContains(e.status().message(),
                                "needs both its weight (input 5) and its "
                                "bias (input 6), or neither"))
      << e.status();
  residual->inputs[6] = "";
  residual->inputs.pop_back();
  e = Executor<float>::Create(*g, BuiltinOps());
  ASSERT_FALSE(e.ok());
  EXPECT_TRUE(absl::StrContains(e.status().message(), "expected 15")) << e.status();
}

// Running means not named "...running_mean": the two batch norms' counters are told apart by
// the node's name.
TEST(ResidualNode, CountersOfUnnamedBatchNormsAreNamedAfterTheNode) {
  absl::StatusOr<Graph> g = ResNetGraph({{4, 6, 6}, {4}, 1, 3});
  ASSERT_TRUE(g.ok());
  for (NamedConstant& c : g->constants) {
    if (absl::StartsWith(c.name, "1.0.") && absl::EndsWith(c.name, "running_mean")) {
      const std::string old = c.name;
      c.name = old + "_m";
      for (Node& n : g->nodes) {
        for (std::string& in : n.inputs) in = in == old ? c.name : in;
      }
    }
  }
  auto e = Executor<float>::Create(*g, BuiltinOps());
  ASSERT_TRUE(e.ok()) << e.status();
  std::vector<std::string> names;
  for (const nn::ParamInfo& b : (*e)->buffers()) names.push_back(b.name);
  EXPECT_NE(std::find(names.begin(), names.end(), "1.0.bn1.num_batches_tracked"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "1.0.bn2.num_batches_tracked"), names.end());
}

TEST(BuiltinGraph, ErrorsNameTheProblem) {
  BuiltinGraphOptions o;
  o.name = "vgg";
  EXPECT_EQ(std::string(BuiltinGraph(o).status().message()),
            "unknown model 'vgg' (expected mlp, lenet or resnet18)");
  o.name = "lenet";
  o.shape = {{1, 8, 8}, 10};
  EXPECT_EQ(std::string(BuiltinGraph(o).status().message()),
            "lenet needs images of at least 12x12, got [1, 8, 8]");
  o.shape = {};
  o.init = "uniform";
  EXPECT_TRUE(absl::StrContains(BuiltinGraph(o).status().message(), "unknown init 'uniform'"));
  nn::ModelOptions m;
  m.name = "mlp";
  m.threads = -1;
  EXPECT_FALSE(CreateBuiltinModel(m).ok());
}

}  // namespace
}  // namespace graph
}  // namespace dptrain
