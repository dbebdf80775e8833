// Every builtin op forward and backward through the executor: double gradients against central
// finite differences (input and parameters), float against double, and each factory's refusals.
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "worker/graph/executor.h"
#include "worker/graph/graph_check.h"
#include "worker/graph/op_registry.h"

namespace dptrain {
namespace graph {
namespace {

using Ints = std::vector<int64_t>;

class OpsTest : public ::testing::Test {
 protected:
  void Check(const Graph& graph, const GraphCheckOptions& options = {}) {
    CheckGraphGradients(graph, registry_, options);
  }
  // The error of building `graph` (float).
  std::string BuildError(const Graph& graph) {
    absl::StatusOr<std::unique_ptr<Executor<float>>> e = Executor<float>::Create(graph, registry_);
    EXPECT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(e.status().message());
  }
  const OpRegistry registry_ = BuiltinOps();
};

TEST_F(OpsTest, ConvWithBiasStrideAndPadding) {
  Check(Chain({3, 7, 6},
              {MakeNode("Conv", "conv", {"x", "w", "b"}, {"y"},
                        {{"kernel_shape", Ints{3, 3}},
                         {"strides", Ints{2, 2}},
                         {"pads", Ints{1, 1, 1, 1}},
                         {"group", int64_t{1}},
                         {"dilations", Ints{1, 1}}})},
              {RandomConstant("w", {4, 3, 3, 3}, 11), RandomConstant("b", {4}, 12)}));
}

TEST_F(OpsTest, ConvWithoutBiasAsymmetricKernel) {
  // No bias: the layer's zero bias is staged beside the weight and gets no gradient.
  Check(Chain({2, 5, 6},
              {MakeNode("Conv", "conv", {"x", "w"}, {"y"}, {{"pads", Ints{1, 0, 1, 0}}})},
              {RandomConstant("w", {3, 2, 2, 3}, 13)}));
}

TEST_F(OpsTest, ConvWithParametersApartIsStaged) {
  // The bias comes first in the constants, so the layer's [weight, bias] block is a copy.
  Check(Chain({2, 4, 4}, {MakeNode("Conv", "conv", {"x", "w", "b"}, {"y"})},
              {RandomConstant("b", {3}, 14), RandomConstant("w", {3, 2, 1, 1}, 15)}));
}

// group > 1: grouped (2 groups of 2 -> 3 channels) and depthwise (one 3x3 filter per
// channel, stride 2), with and without a bias.
TEST_F(OpsTest, GroupedAndDepthwiseConv) {
  Check(Chain({4, 5, 6},
              {MakeNode("Conv", "conv", {"x", "w", "b"}, {"y"},
                        {{"group", int64_t{2}}, {"pads", Ints{1, 1, 1, 1}}})},
              {RandomConstant("w", {6, 2, 3, 3}, 21), RandomConstant("b", {6}, 22)}));
  Check(Chain(
      {3, 7, 7},
      {MakeNode("Conv", "dw", {"x", "w"}, {"y"},
                {{"group", int64_t{3}}, {"strides", Ints{2, 2}}, {"pads", Ints{1, 1, 1, 1}}})},
      {RandomConstant("w", {3, 1, 3, 3}, 23)}));
  const std::string error = BuildError(
      Chain({4, 5, 6}, {MakeNode("Conv", "conv", {"x", "w"}, {"y"}, {{"group", int64_t{3}}})},
            {RandomConstant("w", {6, 2, 1, 1}, 24)}));
  EXPECT_NE(error.find("group 3 does not divide the 4 input and 6 output channels"),
            std::string::npos)
      << error;
}

TEST_F(OpsTest, GemmTransposedAsPyTorchLinear) {
  Check(Chain({6, 1, 1}, {MakeNode("Gemm", "fc", {"x", "w", "b"}, {"y"}, {{"transB", int64_t{1}}})},
              {RandomConstant("w", {5, 6}, 16), RandomConstant("b", {5}, 17)}));
}

TEST_F(OpsTest, GemmPlainWithRowBias) {
  // B is [in, out]: staged transposed for nn::Linear's [out, in].
  Check(Chain({4, 1, 1},
              {MakeNode("Gemm", "fc", {"x", "w", "b"}, {"y"},
                        {{"alpha", 1.0f}, {"beta", 1.0f}, {"transB", int64_t{0}}})},
              {RandomConstant("w", {4, 3}, 18), RandomConstant("b", {1, 3}, 19)}));
}

TEST_F(OpsTest, MatMulOfAFlattenedSample) {
  Check(Chain({2, 2, 2}, {MakeNode("MatMul", "mm", {"x", "w"}, {"y"})},
              {RandomConstant("w", {8, 3}, 20)}));
}

TEST_F(OpsTest, ElementWise) {
  for (const char* op : {"Relu", "Sigmoid", "Tanh", "Identity"}) {
    SCOPED_TRACE(op);
    Check(Chain({2, 3, 4}, {MakeNode(op, "e", {"x"}, {"y"})}));
  }
}

TEST_F(OpsTest, ErfHardSigmoidHardSwishCastAndReduceMean) {
  for (const char* op : {"Erf", "HardSwish", "Cast", "Sin", "Cos"}) {
    SCOPED_TRACE(op);
    std::map<std::string, Attribute> attributes;
    if (std::string(op) == "Cast") attributes["to"] = int64_t{1};
    Check(Chain({2, 3, 4}, {MakeNode(op, "e", {"x"}, {"y"}, attributes)}));
  }
  // Inputs reach past +-3, so that HardSwish's three pieces all show.
  GraphCheckOptions wide;
  wide.batch = 4;
  Check(Chain({2, 3, 4},
              {MakeNode("Mul", "m", {"x", "k"}, {"s"}), MakeNode("HardSwish", "h", {"s"}, {"y"})},
              {FloatScalar("k", 8.0f)}),
        wide);
  Check(Chain({2, 3, 4},
              {MakeNode("HardSigmoid", "h", {"x"}, {"y"}, {{"alpha", 1.5f}, {"beta", 0.4f}})}));
  for (int64_t keepdims : {0, 1}) {
    Check(Chain({3, 4, 5}, {MakeNode("ReduceMean", "m", {"x"}, {"y"},
                                     {{"axes", Ints{-1, 2}}, {"keepdims", keepdims}})}));
  }
  // Other axes: any_shape_ops.h's ReduceMean (the batch's refused).
  Check(Chain({3, 4, 5}, {MakeNode("ReduceMean", "m", {"x"}, {"y"},
                                   {{"axes", Ints{1}}, {"keepdims", int64_t{0}}})}));
  EXPECT_EQ(BuildError(Chain({3, 4, 5}, {MakeNode("ReduceMean", "m", {"x"}, {"y"},
                                                  {{"axes", Ints{0}}, {"keepdims", int64_t{0}}})})),
            "node 'm' (ReduceMean): axes [0] of [B, 3, 4, 5] unsupported (each once, not the "
            "batch's)");
  EXPECT_NE(
      BuildError(Chain({3, 4, 5}, {MakeNode("Cast", "c", {"x"}, {"y"}, {{"to", int64_t{8}}})}))
          .find("cast to ONNX type 8 unsupported"),
      std::string::npos);
}

// Over the channels at every pixel, and over the features of a [N, C] value (axis -1).
TEST_F(OpsTest, SoftmaxAndLogSoftmax) {
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    SCOPED_TRACE(op);
    Check(Chain({4, 2, 3}, {MakeNode(op, "s", {"x"}, {"y"}, {{"axis", int64_t{1}}})}));
    Check(Chain({5, 1, 1}, {MakeNode(op, "s", {"x"}, {"y"})}));  // Default axis -1.
    // Over the last axis of [N, 4, 2, 3]: each row of 3, the rows taken as the batch.
    Check(Chain({4, 2, 3}, {MakeNode(op, "s", {"x"}, {"y"})}));
  }
}

// Elu (alpha 1 and 0.5), Selu, Softplus (inputs past its threshold of 20 too), Softsign.
TEST_F(OpsTest, EluSeluSoftplusSoftsign) {
  for (const char* op : {"Elu", "Selu", "Softplus", "Softsign"}) {
    SCOPED_TRACE(op);
    Check(Chain({2, 3, 4}, {MakeNode(op, "e", {"x"}, {"y"})}));
  }
  Check(Chain({2, 3, 4}, {MakeNode("Elu", "e", {"x"}, {"y"}, {{"alpha", 0.5f}})}));
  GraphCheckOptions wide;
  Check(Chain({2, 3, 4},
              {MakeNode("Mul", "m", {"x", "k"}, {"s"}), MakeNode("Softplus", "p", {"s"}, {"y"})},
              {FloatScalar("k", 60.0f)}),
        wide);
}

// Exp, Neg, Abs on any input; Log, Sqrt and Reciprocal behind an Exp (positive, away from 0,
// as their domains want); Pow with a float exponent on positive values and an integer one
// (PyTorch's x ** 3) on any; and Pow's refusals.
TEST_F(OpsTest, ExpLogSqrtNegAbsReciprocalPow) {
  for (const char* op : {"Exp", "Neg", "Abs"}) {
    SCOPED_TRACE(op);
    Check(Chain({2, 3, 4}, {MakeNode(op, "f", {"x"}, {"y"})}));
  }
  for (const char* op : {"Log", "Sqrt", "Reciprocal"}) {
    SCOPED_TRACE(op);
    Check(Chain({2, 3, 4}, {MakeNode("Exp", "e", {"x"}, {"p"}), MakeNode(op, "f", {"p"}, {"y"})}));
  }
  Check(Chain({2, 3, 4},
              {MakeNode("Exp", "e", {"x"}, {"p"}), MakeNode("Pow", "f", {"p", "k"}, {"y"})},
              {FloatScalar("k", 0.5f)}));
  Check(Chain({2, 3, 4}, {MakeNode("Pow", "f", {"x", "k"}, {"y"})}, {IntConstant("k", {3})}));
  Check(Chain({2, 3, 4}, {MakeNode("Pow", "f", {"x", "k"}, {"y"})}, {FloatScalar("k", 0.0f)}));
  EXPECT_NE(BuildError(Chain({2, 3, 4}, {MakeNode("Relu", "r", {"x"}, {"e"}),
                                         MakeNode("Pow", "f", {"x", "e"}, {"y"})}))
                .find("the exponent must be a constant"),
            std::string::npos);
  EXPECT_NE(BuildError(Chain({2, 3, 4}, {MakeNode("Pow", "f", {"x", "k"}, {"y"})},
                             {IntConstant("k", {2, 3})}))
                .find("the exponent is not a scalar"),
            std::string::npos);
}

TEST_F(OpsTest, LeakyReluAndClip) {
  Check(Chain({2, 3, 4}, {MakeNode("LeakyRelu", "l", {"x"}, {"y"}, {{"alpha", 0.2f}})}));
  Check(Chain({2, 3, 4}, {MakeNode("LeakyRelu", "l", {"x"}, {"y"})}));  // alpha 0.01.
  // The bounds as PyTorch's export gives them (constant inputs), inside the inputs' range, so
  // that some values are clipped (gradient 0) and some pass.
  Check(Chain({2, 3, 4}, {MakeNode("Clip", "c", {"x", "lo", "hi"}, {"y"})},
              {FloatScalar("lo", -0.2f), FloatScalar("hi", 0.3f)}));
  Check(
      Chain({2, 3, 4}, {MakeNode("Clip", "c", {"x", "", "hi"}, {"y"})}, {FloatScalar("hi", 0.1f)}));
  Check(Chain({2, 3, 4}, {MakeNode("Clip", "c", {"x"}, {"y"}, {{"min", -0.1f}, {"max", 0.25f}})}));
  // An integer bound (int64, as `count.clamp(min=1)` of an integer tensor exports it).
  Check(Chain({2, 3, 4}, {MakeNode("Clip", "c", {"x", "zero", "hi"}, {"y"})},
              {IntConstant("zero", {0}), FloatScalar("hi", 0.3f)}));
  EXPECT_NE(BuildError(Chain({2, 3, 4},
                             {MakeNode("Clip", "c", {"x"}, {"y"}, {{"min", 1.0f}, {"max", 0.5f}})}))
                .find("min 1 is above max 0.5"),
            std::string::npos);
}

// Sub, Mul, Div (and Add) of two runtime values of equal dims, either order; the divisor is a
// sigmoid (kept away from zero).
TEST_F(OpsTest, BinaryOpsOfEqualDims) {
  for (const char* op : {"Add", "Sub", "Mul", "Div"}) {
    SCOPED_TRACE(op);
    Check(Chain({2, 3, 4},
                {MakeNode("Sigmoid", "s", {"x"}, {"s"}), MakeNode(op, "b", {"x", "s"}, {"y"})}));
    if (std::string(op) != "Div") {
      Check(Chain({2, 3, 4},
                  {MakeNode("Tanh", "t", {"x"}, {"t"}), MakeNode(op, "b", {"t", "x"}, {"y"})}));
    }
  }
}

// A [C, 1, 1] operand against a [C, H, W] one, as a squeeze-and-excitation gate
// (x * sigmoid(pool(x))), in either position: its gradient is summed over the plane.
TEST_F(OpsTest, BinaryOpsBroadcastPerChannel) {
  for (const char* op : {"Add", "Sub", "Mul", "Div"}) {
    SCOPED_TRACE(op);
    Check(Chain({3, 4, 5},
                {MakeNode("GlobalAveragePool", "g", {"x"}, {"g"}),
                 MakeNode("Sigmoid", "s", {"g"}, {"s"}), MakeNode(op, "b", {"x", "s"}, {"y"})}));
    if (std::string(op) != "Div") {
      Check(Chain({3, 4, 5}, {MakeNode("GlobalAveragePool", "g", {"x"}, {"g"}),
                              MakeNode(op, "b", {"g", "x"}, {"y"})}));
    }
  }
  const std::string error = BuildError(
      Chain({3, 4, 5},
            {MakeNode("MaxPool", "p", {"x"}, {"p"}, {{"kernel_shape", std::vector<int64_t>{2, 2}}}),
             MakeNode("Mul", "m", {"x", "p"}, {"y"})}));
  EXPECT_NE(error.find("one of size 1 along the other's axes it does not match"), std::string::npos)
      << error;
}

// A runtime value and a constant scalar (x * 0.5, 1 - x, x / 4 as exported): no parameter.
TEST_F(OpsTest, BinaryOpsWithAScalarConstant) {
  for (const char* op : {"Add", "Sub", "Mul", "Div"}) {
    SCOPED_TRACE(op);
    Check(Chain({2, 3, 4}, {MakeNode(op, "b", {"x", "c"}, {"y"})}, {FloatScalar("c", 0.7f)}));
    if (std::string(op) != "Div") {
      Check(Chain({2, 3, 4}, {MakeNode(op, "b", {"c", "x"}, {"y"})}, {FloatScalar("c", 0.7f)}));
    }
  }
  NamedConstant vector = RandomConstant("v", {2}, 2);
  EXPECT_EQ(BuildError(Chain({3, 1, 1}, {MakeNode("Mul", "m", {"x", "v"}, {"y"})}, {vector})),
            "node 'm' (Mul): operand 'v' of shape [2] does not broadcast to [B, 3] (without the "
            "batch)");
}

// A tensor of the model as an operand: learned where it is model state (an initializer: ReZero's
// alpha, ConvNeXt's layer scale, a positional embedding), kept where it is a fixed buffer
// (--onnx_buffers: a normalisation's mean) or a constant of the graph; scalar, per channel or
// one value per element of a sample.
TEST_F(OpsTest, BinaryOpsWithATensorOfTheModel) {
  auto state = [](NamedConstant c, bool fixed = false) {
    c.state = true;
    c.fixed = fixed;
    return c;
  };
  for (const char* op : {"Add", "Sub", "Mul", "Div"}) {
    SCOPED_TRACE(op);
    const double offset = std::string(op) == "Div" ? 2.0 : 0.0;  // Away from 0 as a divisor.
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{}, {3, 1, 1}, {1, 3, 1, 1}, {3, 2, 4}, {1, 3, 2, 4}}) {
      SCOPED_TRACE(shape.size());
      const NamedConstant t = RandomConstant("t", shape, 3, 0.5, offset);
      for (bool swapped : {false, true}) {
        const std::vector<std::string> inputs =
            swapped ? std::vector<std::string>{"t", "x"} : std::vector<std::string>{"x", "t"};
        if (std::string(op) == "Div" && swapped) continue;  // x near 0 as a divisor.
        Check(Chain({3, 2, 4}, {MakeNode(op, "b", inputs, {"y"})}, {state(t)}));
        Check(Chain({3, 2, 4}, {MakeNode(op, "b", inputs, {"y"})}, {state(t, true)}));
        Check(Chain({3, 2, 4}, {MakeNode(op, "b", inputs, {"y"})}, {t}));
      }
    }
  }
  // [F] against the features of [N, F].
  NamedConstant bias = RandomConstant("bias", {5}, 4);
  bias.state = true;
  Check(Chain({5, 1, 1}, {MakeNode("Add", "b", {"x", "bias"}, {"y"})}, {bias}));

  // Learned: a parameter named as the state; fixed: a buffer; a constant: neither.
  auto layout = [&](const NamedConstant& t) {
    auto e = Executor<double>::Create(
        Chain({3, 2, 4}, {MakeNode("Mul", "b", {"x", "t"}, {"y"})}, {t}), registry_);
    EXPECT_TRUE(e.ok()) << e.status();
    return std::make_pair((*e)->params().size(), (*e)->buffers().size());
  };
  const NamedConstant gamma = RandomConstant("t", {3, 1, 1}, 5);
  // GeM pooling's learned exponent (x.pow(self.p)) cannot be learned: refused, not frozen.
  NamedConstant p = FloatScalar("p", 3.0f);
  EXPECT_EQ(BuildError(Chain({3, 2, 4}, {MakeNode("Pow", "pow", {"x", "p"}, {"y"})}, {state(p)})),
            "node 'pow' (Pow): input 1 ('p') is an initializer of the model, here its exponent, "
            "which cannot be learned: if it is a buffer, name it one (gpu_worker "
            "--onnx_buffers) to keep it fixed");
  Check(Chain({3, 2, 4}, {MakeNode("Pow", "pow", {"x", "p"}, {"y"})}, {state(p, true)}));
  EXPECT_EQ(layout(state(gamma)), std::make_pair(size_t{1}, size_t{0}));
  EXPECT_EQ(layout(state(gamma, true)), std::make_pair(size_t{0}, size_t{1}));
  EXPECT_EQ(layout(gamma), std::make_pair(size_t{0}, size_t{0}));
}

TEST_F(OpsTest, BatchNormalizationTrainingAndEvaluation) {
  const std::vector<NamedConstant> constants = {
      RandomConstant("bn.weight", {3}, 21, 0.5, 1.0), RandomConstant("bn.bias", {3}, 22),
      RandomConstant("bn.running_mean", {3}, 23),
      RandomConstant("bn.running_var", {3}, 24, 0.5, 1.0)};
  const Graph g =
      Chain({3, 2, 3},
            {MakeNode("BatchNormalization", "bn",
                      {"x", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"},
                      {"y", "mean_out", "var_out"},
                      {{"epsilon", 1e-5f}, {"momentum", 0.9f}, {"training_mode", int64_t{1}}})},
            constants);
  Check(g);
  GraphCheckOptions eval;
  eval.training = false;
  Check(g, eval);

  absl::StatusOr<std::unique_ptr<Executor<double>>> e = Executor<double>::Create(g, registry_);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_EQ((*e)->buffers().size(), 3u);
  EXPECT_EQ((*e)->buffers()[0].name, "bn.running_mean");
  EXPECT_EQ((*e)->buffers()[1].name, "bn.running_var");
  EXPECT_EQ((*e)->buffers()[2].name, "bn.num_batches_tracked");
  EXPECT_EQ((*e)->params()[0].name, "bn.weight");
}

// torchvision's MobileNetV3: eps=1e-3, momentum=0.01 (ONNX's momentum 0.99).
TEST_F(OpsTest, BatchNormalizationOtherEpsilonAndMomentum) {
  const Graph g =
      Chain({3, 2, 3},
            {MakeNode("BatchNormalization", "bn", {"x", "s", "b", "m", "v"}, {"y"},
                      {{"epsilon", 1e-3f}, {"momentum", 0.99f}, {"training_mode", int64_t{1}}})},
            {RandomConstant("s", {3}, 21, 0.5, 1.0), RandomConstant("b", {3}, 22),
             RandomConstant("m", {3}, 23), RandomConstant("v", {3}, 24, 0.5, 1.0)});
  Check(g);
  GraphCheckOptions eval;
  eval.training = false;
  Check(g, eval);
  // The layer sees PyTorch's numbers (decimal, not the float attributes' nearest values).
  absl::StatusOr<std::unique_ptr<Executor<double>>> e = Executor<double>::Create(g, registry_);
  ASSERT_TRUE(e.ok()) << e.status();
  std::vector<std::string> layers;
  for (const auto& node : (*e)->nodes()) layers.push_back(node.impl->twin().layer->ToString());
  EXPECT_EQ(layers, std::vector<std::string>{"BatchNorm2d(3, eps=0.001, momentum=0.01, "
                                             "affine=True, track_running_stats=True)"});
}

TEST_F(OpsTest, BatchNormalizationOfFeatures) {
  // BatchNorm1d on [N, F] is a batch norm over {F, 1, 1} samples.
  Check(Chain({4, 1, 1}, {MakeNode("BatchNormalization", "bn", {"x", "s", "b", "m", "v"}, {"y"})},
              {RandomConstant("s", {4}, 25, 0.5, 1.0), RandomConstant("b", {4}, 26),
               RandomConstant("m", {4}, 27), RandomConstant("v", {4}, 28, 0.5, 1.0)}),
        {/*batch=*/5});
}

// One value per channel in training (a batch of one [F] feature vector, or one sample of a
// 1x1 map) has no batch variance: refused as PyTorch refuses it, naming the node; evaluation
// and two values are fine.
TEST_F(OpsTest, BatchNormalizationRefusesOneValuePerChannelInTraining) {
  const Graph g =
      Chain({4, 1, 1}, {MakeNode("BatchNormalization", "bn", {"x", "s", "b", "m", "v"}, {"y"})},
            {RandomConstant("s", {4}, 25, 0.5, 1.0), RandomConstant("b", {4}, 26),
             RandomConstant("m", {4}, 27), RandomConstant("v", {4}, 28, 0.5, 1.0)});
  absl::StatusOr<std::unique_ptr<Executor<float>>> e = Executor<float>::Create(g, registry_);
  ASSERT_TRUE(e.ok()) << e.status();
  std::vector<float> params((*e)->num_params()), grads(params.size()), buffers((*e)->num_buffers());
  (*e)->Bind(params.data(), grads.data(), buffers.data());
  const std::vector<float> x = {0.5f, 1, 2, 3, 4, 5, 6, 7};
  absl::StatusOr<nn::TensorRef<float>> y = (*e)->Forward(x.data(), 1, /*training=*/true);
  ASSERT_FALSE(y.ok());
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(y.status().message(),
            "node 'bn' (BatchNormalization): BatchNorm2d: expected more than 1 value per channel "
            "when training, got input [1, 4, 1, 1] (one sample, one pixel: a batch of 2 or more "
            "trains)");
  EXPECT_TRUE((*e)->Forward(x.data(), 1, /*training=*/false).ok());
  EXPECT_TRUE((*e)->Forward(x.data(), 2, /*training=*/true).ok());
}

TEST_F(OpsTest, Pooling) {
  Check(Chain({2, 7, 6}, {MakeNode("MaxPool", "p", {"x"}, {"y"},
                                   {{"kernel_shape", Ints{3, 3}},
                                    {"strides", Ints{2, 2}},
                                    {"pads", Ints{1, 1, 1, 1}},
                                    {"ceil_mode", int64_t{0}}})}));
  Check(Chain({2, 7, 6}, {MakeNode("AveragePool", "p", {"x"}, {"y"},
                                   {{"kernel_shape", Ints{3, 2}},
                                    {"strides", Ints{2, 1}},
                                    {"pads", Ints{1, 1, 1, 1}},
                                    {"count_include_pad", int64_t{1}}})}));
  Check(Chain({3, 4, 5}, {MakeNode("GlobalAveragePool", "p", {"x"}, {"y"})}));
}

// AveragePool with ceil_mode and count_include_pad=0 (ONNX's default; PyTorch's
// count_include_pad=False, as ResNet-D's shortcut pooling), with and without padding.
TEST_F(OpsTest, AveragePoolCeilModeAndCountExcludePad) {
  for (int64_t include : {0, 1}) {
    Check(Chain({2, 6, 6}, {MakeNode("AveragePool", "p", {"x"}, {"y"},
                                     {{"kernel_shape", Ints{3, 3}},
                                      {"strides", Ints{2, 2}},
                                      {"pads", Ints{1, 1, 1, 1}},
                                      {"ceil_mode", int64_t{1}},
                                      {"count_include_pad", include}})}));
  }
  Check(Chain({2, 5, 7}, {MakeNode("AveragePool", "p", {"x"}, {"y"},
                                   {{"kernel_shape", Ints{2, 2}},
                                    {"strides", Ints{2, 2}},
                                    {"ceil_mode", int64_t{1}}})}));
}

// LayerNormalization over each whole sample: nn.LayerNorm(F) on [N, F] (axis -1) with a
// bias, and nn.LayerNorm([C, H, W]) (axis 1) without one; scale around 1.
TEST_F(OpsTest, LayerNormalization) {
  Check(Chain({6, 1, 1}, {MakeNode("LayerNormalization", "ln", {"x", "s", "b"}, {"y"})},
              {RandomConstant("s", {6}, 31, 0.5, 1.0), RandomConstant("b", {6}, 32)}));
  Check(Chain({2, 3, 4},
              {MakeNode("LayerNormalization", "ln", {"x", "s"}, {"y"},
                        {{"axis", int64_t{1}}, {"epsilon", 1e-3f}})},
              {RandomConstant("s", {2, 3, 4}, 33, 0.5, 1.0)}));
  // nn.LayerNorm(4) of [N, 2, 3, 4]: over the last axis of each of the 2 x 3 rows.
  Check(Chain({2, 3, 4}, {MakeNode("LayerNormalization", "ln", {"x", "s", "b"}, {"y"})},
              {RandomConstant("s", {4}, 34, 0.5, 1.0), RandomConstant("b", {4}, 36)}));
  EXPECT_NE(BuildError(Chain({6, 1, 1}, {MakeNode("LayerNormalization", "ln", {"x", "s"}, {"y"})},
                             {RandomConstant("s", {5}, 35)}))
                .find("expected 6 values"),
            std::string::npos);
}

// torchvision's GoogLeNet/SqueezeNet pooling: MaxPool2d(3, 2, ceil_mode=True), 7x7 -> 3x3.
TEST_F(OpsTest, MaxPoolCeilMode) {
  Check(Chain({2, 7, 7}, {MakeNode("MaxPool", "p", {"x"}, {"y"},
                                   {{"kernel_shape", Ints{3, 3}},
                                    {"strides", Ints{2, 2}},
                                    {"ceil_mode", int64_t{1}}})}));
}

TEST_F(OpsTest, PadThenAveragePoolIsCountIncludePad) {
  Check(Chain({2, 5, 5},
              {MakeNode("Pad", "pad", {"x", "pads"}, {"p"}, {{"mode", std::string("constant")}}),
               MakeNode("AveragePool", "avg", {"p"}, {"y"},
                        {{"kernel_shape", Ints{3, 3}}, {"strides", Ints{1, 1}}})},
              {IntConstant("pads", {0, 0, 1, 2, 0, 0, 1, 0})}));
}

TEST_F(OpsTest, FlattenAndReshapeFeedALinear) {
  Check(Chain({2, 3, 2},
              {MakeNode("Flatten", "flat", {"x"}, {"f"}, {{"axis", int64_t{1}}}),
               MakeNode("Gemm", "fc", {"f", "w"}, {"y"}, {{"transB", int64_t{1}}})},
              {RandomConstant("w", {4, 12}, 29)}));
  // x.view(x.size(0), -1) as traced: the export batch (2) first.
  Check(Chain({2, 3, 2},
              {MakeNode("Reshape", "view", {"x", "shape"}, {"f"}),
               MakeNode("Gemm", "fc", {"f", "w"}, {"y"}, {{"transB", int64_t{1}}})},
              {IntConstant("shape", {2, -1}), RandomConstant("w", {4, 12}, 30)}));
  // 0 copies the input's dimension: [N, 2, 6] as {2, 6, 1}.
  Check(Chain({2, 3, 2}, {MakeNode("Reshape", "view", {"x", "shape"}, {"y"})},
              {IntConstant("shape", {-1, 0, -1})}));
}

TEST_F(OpsTest, DropoutIsTheIdentityAtRatioZeroAndInEvaluation) {
  Tensor zero;
  zero.floats = {0.0f};
  Check(Chain({3, 2, 2}, {MakeNode("Dropout", "d", {"x", "ratio"}, {"y", "mask"})},
              {{"ratio", zero}}));
  GraphCheckOptions eval;
  eval.training = false;
  Check(Chain({3, 2, 2}, {MakeNode("Dropout", "d", {"x"}, {"y"}, {{"ratio", 0.5f}})}), eval);
}

TEST_F(OpsTest, DropoutDrawsSeededMasks) {
  const Graph g = Chain({1000, 1, 1}, {MakeNode("Dropout", "d", {"x"}, {"y"}, {{"ratio", 0.25f}})});
  ExecutorOptions options;
  options.seed = 5;
  auto run = [&](const ExecutorOptions& o, int steps) {
    auto e = Executor<double>::Create(g, registry_, o);
    EXPECT_TRUE(e.ok()) << e.status();
    (*e)->Bind(nullptr, nullptr, nullptr);
    std::vector<double> x(2000, 1.0), g2(2000);
    for (size_t i = 0; i < g2.size(); ++i) g2[i] = static_cast<double>(i);
    nn::TensorRef<double> y;
    for (int s = 0; s < steps; ++s) y = ForwardOk(**e, x.data(), 2, /*training=*/true);
    std::vector<double> out(y.data, y.data + y.size());
    nn::TensorRef<double> dx = (*e)->Backward({g2.data(), 2, y.dims}, true);
    for (size_t i = 0; i < out.size(); ++i) {
      // Kept elements are scaled by 1 / (1 - 0.25); the gradient takes the same mask.
      EXPECT_TRUE(out[i] == 0.0 || std::abs(out[i] - 4.0 / 3.0) < 1e-12) << out[i];
      EXPECT_DOUBLE_EQ(dx.data[i], out[i] * g2[i]);
    }
    return out;
  };
  const std::vector<double> first = run(options, 1);
  int dropped = 0;
  for (double v : first) dropped += v == 0.0;
  EXPECT_NEAR(dropped, 500, 80);      // 2000 elements at 0.25.
  EXPECT_EQ(run(options, 1), first);  // The same seed, the same mask.
  EXPECT_NE(run(options, 2), first);  // A new mask each step.
  ExecutorOptions other = options;
  other.seed = 6;
  EXPECT_NE(run(other, 1), first);
}

TEST_F(OpsTest, FactoriesRefuseWhatTheyDoNotImplement) {
  const NamedConstant w = RandomConstant("w", {4, 2, 3, 3}, 31);
  EXPECT_EQ(
      BuildError(Chain(
          {2, 5, 5}, {MakeNode("Conv", "c", {"x", "w"}, {"y"}, {{"dilations", Ints{2, 2}}})}, {w})),
      "node 'c' (Conv): dilations [2, 2] unsupported (1 only)");
  EXPECT_EQ(BuildError(Chain(
                {2, 5, 5}, {MakeNode("Conv", "c", {"x", "w"}, {"y"}, {{"pads", Ints{1, 1, 0, 0}}})},
                {w})),
            "node 'c' (Conv): pads [1, 1, 0, 0] unsupported (symmetric 2-D padding only)");
  EXPECT_EQ(BuildError(Chain({2, 5, 5},
                             {MakeNode("Conv", "c", {"x", "w"}, {"y"},
                                       {{"auto_pad", std::string("SAME_UPPER")}})},
                             {w})),
            "node 'c' (Conv): auto_pad SAME_UPPER unsupported (NOTSET or VALID only)");
  EXPECT_EQ(BuildError(Chain({3, 5, 5}, {MakeNode("Conv", "c", {"x", "w"}, {"y"})}, {w})),
            "node 'c' (Conv): weight [4, 2, 3, 3] does not fit input [3, 5, 5]");
  EXPECT_EQ(BuildError(Chain(
                {2, 5, 5}, {MakeNode("Conv", "c", {"x", "w"}, {"y"}, {{"foo", int64_t{1}}})}, {w})),
            "node 'c' (Conv): unsupported attribute 'foo'");
  EXPECT_EQ(BuildError(Chain(
                {2, 5, 5}, {MakeNode("AveragePool", "p", {"x"}, {"y"},
                                     {{"kernel_shape", Ints{2, 2}}, {"ceil_mode", int64_t{2}}})})),
            "node 'p' (AveragePool): ceil_mode=2 unsupported");
  EXPECT_EQ(BuildError(Chain({2, 5, 5}, {MakeNode("AveragePool", "p", {"x"}, {"y"},
                                                  {{"kernel_shape", Ints{3, 3}},
                                                   {"count_include_pad", int64_t{3}}})})),
            "node 'p' (AveragePool): count_include_pad=3 unsupported");
  EXPECT_TRUE(absl::StrContains(
      BuildError(Chain({3, 1, 1},
                       {MakeNode("BatchNormalization", "bn", {"x", "s", "b", "m", "v"}, {"y"},
                                 {{"momentum", 0.0f}})},
                       {RandomConstant("s", {3}, 1), RandomConstant("b", {3}, 2),
                        RandomConstant("m", {3}, 3), RandomConstant("v", {3}, 4)})),
      "node 'bn' (BatchNormalization): momentum 0 unsupported: ONNX's momentum must lie in "
      "(0, 1] (PyTorch's momentum=None"));
  EXPECT_EQ(BuildError(Chain({3, 1, 1},
                             {MakeNode("BatchNormalization", "bn", {"x", "s", "b", "m", "v"}, {"y"},
                                       {{"epsilon", -1.0f}})},
                             {RandomConstant("s", {3}, 1), RandomConstant("b", {3}, 2),
                              RandomConstant("m", {3}, 3), RandomConstant("v", {3}, 4)})),
            "node 'bn' (BatchNormalization): epsilon -1 must be positive");
  EXPECT_EQ(BuildError(Chain({2, 3, 2}, {MakeNode("Reshape", "r", {"x", "s"}, {"y"})},
                             {IntConstant("s", {-1, 5})})),
            "node 'r' (Reshape): target shape [-1, 5] for input [2, 3, 2] of each sample "
            "unsupported: changes the number of elements of a sample");
  EXPECT_EQ(
      BuildError(Chain({6, 1, 1}, {MakeNode("Gemm", "fc", {"x", "w"}, {"y"}, {{"alpha", 2.0f}})},
                       {RandomConstant("w", {6, 2}, 5)})),
      "node 'fc' (Gemm): alpha 2, beta 1, transA 0 unsupported (1, 1, 0 only)");
  // Channels are padded by any_shape_ops.h's Pad; the batch, or negative pads, by none.
  Check(Chain({2, 3, 3}, {MakeNode("Pad", "p", {"x", "pads"}, {"y"})},
              {IntConstant("pads", {0, 1, 0, 2, 0, 0, 1, 0})}));
  EXPECT_EQ(BuildError(Chain({2, 3, 3}, {MakeNode("Pad", "p", {"x", "pads"}, {"y"})},
                             {IntConstant("pads", {1, 0, 0, 0, 0, 0, 0, 0})})),
            "node 'p' (Pad): pads [1, 0, 0, 0, 0, 0, 0, 0] of [B, 2, 3, 3] unsupported "
            "(non-negative, not of the batch axis)");
  EXPECT_EQ(BuildError(Chain({2, 3, 3}, {MakeNode("Relu", "r", {"w"}, {"y"})}, {w})),
            "node 'r' (Relu): input 0 ('w') must be a computed value, not a constant");
}

// The output of `graph` (double) for input values 0, 1, 2, ... of `batch` samples.
std::vector<double> ForwardOfIota(const Graph& graph, const OpRegistry& registry, int batch) {
  auto e = Executor<double>::Create(graph, registry);
  EXPECT_TRUE(e.ok()) << e.status();
  if (!e.ok()) return {};
  (*e)->Bind(nullptr, nullptr, nullptr);
  std::vector<double> x(batch * graph.input_dims.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i);
  nn::TensorRef<double> y = ForwardOk(**e, x.data(), batch, /*training=*/true);
  return std::vector<double>(y.data, y.data + y.size());
}

TEST_F(OpsTest, SliceOfOneAndOfSeveralAxes) {
  // x.chunk(2, 1)'s second half (opset 10+: starts, ends, axes as inputs).
  Check(Chain({6, 2, 3}, {MakeNode("Slice", "s", {"x", "b", "e", "a"}, {"y"})},
              {IntConstant("b", {3}), IntConstant("e", {6}), IntConstant("a", {1})}));
  // Rows 1..2 and the last two columns (negative start; an end past the size is clamped, as
  // x[:, :, 1:, -2:] exports with INT64_MAX), steps given.
  Check(Chain({2, 4, 5}, {MakeNode("Slice", "s", {"x", "b", "e", "a", "st"}, {"y"})},
              {IntConstant("b", {1, -2}), IntConstant("e", {3, INT64_MAX}),
               IntConstant("a", {2, 3}), IntConstant("st", {1, 1})}));
  // Before opset 10: attributes; no axes means 0, 1, ...: the batch axis is refused.
  Check(Chain({3, 4, 1},
              {MakeNode("Slice", "s", {"x"}, {"y"},
                        {{"starts", Ints{0, 1}}, {"ends", Ints{2, 4}}, {"axes", Ints{1, 2}}})}));
}

TEST_F(OpsTest, SliceValues) {
  // [2, 3, 2] per sample, iota input: sample n, channel c, row h, column w holds
  // 12 n + 4 c + 2 h + w. Channels 1..2, row 1.
  const Graph g =
      Chain({3, 2, 2}, {MakeNode("Slice", "s", {"x", "b", "e", "a"}, {"y"})},
            {IntConstant("b", {1, 1}), IntConstant("e", {3, 2}), IntConstant("a", {1, 2})});
  EXPECT_EQ(ForwardOfIota(g, registry_, 2), (std::vector<double>{6, 7, 10, 11, 18, 19, 22, 23}));
  // x.flip(3) as exported (step -1 from -1 to -INT64_MAX), and every other row from the last
  // down (step -2): the ONNX clamping of negative steps.
  const Graph flip = Chain({2, 2, 3}, {MakeNode("Slice", "s", {"x", "b", "e", "a", "st"}, {"y"})},
                           {IntConstant("b", {-1}), IntConstant("e", {-INT64_MAX}),
                            IntConstant("a", {3}), IntConstant("st", {-1})});
  EXPECT_EQ(ForwardOfIota(flip, registry_, 1),
            (std::vector<double>{2, 1, 0, 5, 4, 3, 8, 7, 6, 11, 10, 9}));
  Check(flip);
  const Graph down = Chain({2, 5, 1}, {MakeNode("Slice", "s", {"x", "b", "e", "a", "st"}, {"y"})},
                           {IntConstant("b", {INT64_MAX}), IntConstant("e", {-INT64_MAX}),
                            IntConstant("a", {2}), IntConstant("st", {-2})});
  EXPECT_EQ(ForwardOfIota(down, registry_, 1), (std::vector<double>{4, 2, 0, 9, 7, 5}));
  Check(down);
}

TEST_F(OpsTest, SliceRefusals) {
  auto error = [&](Ints b, Ints e, Ints a, Ints st) {
    return BuildError(Chain(
        {4, 3, 3}, {MakeNode("Slice", "s", {"x", "b", "e", "a", "st"}, {"y"})},
        {IntConstant("b", b), IntConstant("e", e), IntConstant("a", a), IntConstant("st", st)}));
  };
  EXPECT_EQ(
      error({0}, {1}, {0}, {1}),
      "node 's' (Slice): axis 0 of [B, 4, 3, 3] unsupported (an axis other than the batch's)");
  EXPECT_EQ(
      error({0}, {1}, {-4}, {1}),
      "node 's' (Slice): axis -4 of [B, 4, 3, 3] unsupported (an axis other than the batch's)");
  EXPECT_EQ(error({0}, {4}, {1}, {0}), "node 's' (Slice): step 0 unsupported");
  EXPECT_EQ(error({3}, {2}, {2}, {1}),
            "node 's' (Slice): the slice [3, 2) step 1 of axis 2 (size 3) is empty");
  EXPECT_EQ(error({0}, {2}, {2}, {-1}),
            "node 's' (Slice): the slice [0, 2) step -1 of axis 2 (size 3) is empty");
  EXPECT_EQ(error({0, 0}, {1}, {1, 2}, {1, 1}),
            "node 's' (Slice): starts [0, 0], ends [1], axes [1, 2] and steps [1, 1] differ in "
            "length");
  EXPECT_EQ(error({0, 0}, {1, 1}, {1, 1}, {1, 1}), "node 's' (Slice): axis 1 given twice");
}

// ChannelShuffle of x with the two Reshape targets as constants.
Graph Shuffle(nn::Dims dims, Ints split, Ints merged) {
  return Chain(dims, {MakeNode("ChannelShuffle", "shuffle", {"x", "s1", "s2"}, {"y"})},
               {IntConstant("s1", split), IntConstant("s2", merged)});
}

TEST_F(OpsTest, ChannelShuffle) {
  Check(Shuffle({6, 2, 3}, {4, 2, 3, 2, 3}, {4, 6, 2, 3}));
  Check(Shuffle({6, 1, 2}, {4, 3, 2, 1, 2}, {4, -1, 1, 2}));
  // x.view(n, 2, 3, 1, 1).transpose(1, 2).reshape(n, 6, 1, 1) of channels 0..5: 0 3 1 4 2 5.
  EXPECT_EQ(ForwardOfIota(Shuffle({6, 1, 1}, {1, 2, 3, 1, 1}, {1, 6, 1, 1}), registry_, 1),
            (std::vector<double>{0, 3, 1, 4, 2, 5}));
  EXPECT_TRUE(absl::StrContains(BuildError(Shuffle({6, 2, 2}, {1, 2, 3, 2, 2}, {-1, -1, 2, 2})),
                                "unsupported (expected [n, g, c / g, h, w] and [n, c, h, w])"));
  EXPECT_EQ(BuildError(Shuffle({6, 2, 2}, {1, 4, 1, 2, 2}, {1, 6, 2, 2})),
            "node 'shuffle' (ChannelShuffle): a channel shuffle reshaping [6, 2, 2] to [1, 4, 1, "
            "2, 2] and back to [1, 6, 2, 2] unsupported (expected [n, g, c / g, h, w] and [n, c, "
            "h, w])");
}

// A layer norm over each pixel's channels as SinkChannelsLast leaves it (graph_rewrites.h): the
// channel mean kept as one channel, per-pixel broadcasts, [C] weights on the channels, and a
// Linear at each pixel as a 1x1 Conv of its [out, in] weight.
TEST_F(OpsTest, ChannelsFirstLayerNormAndPixelLinear) {
  Check(Chain({4, 2, 3}, {MakeNode("ReduceMean", "m", {"x"}, {"y"},
                                   {{"axes", Ints{1}}, {"keepdims", int64_t{1}}})}));
  const Graph ln = Chain(
      {4, 2, 3},
      {MakeNode("ReduceMean", "mean", {"x"}, {"u"}, {{"axes", Ints{1}}, {"keepdims", int64_t{1}}}),
       MakeNode("Sub", "sub", {"x", "u"}, {"d"}), MakeNode("Mul", "sq", {"d", "d"}, {"d2"}),
       MakeNode("ReduceMean", "var", {"d2"}, {"v"}, {{"axes", Ints{1}}, {"keepdims", int64_t{1}}}),
       MakeNode("Add", "eps", {"v", "e"}, {"ve"}), MakeNode("Sqrt", "sqrt", {"ve"}, {"s"}),
       MakeNode("Div", "div", {"d", "s"}, {"n"}),
       MakeNode("Mul", "scale", {"n", "w"}, {"nw"}, {{"operand_shape", Ints{4, 1, 1}}}),
       MakeNode("Add", "shift", {"b", "nw"}, {"y0"}, {{"operand_shape", Ints{4, 1, 1}}}),
       MakeNode("Conv", "fc", {"y0", "fc.weight", "fc.bias"}, {"y"},
                {{"kernel_shape", Ints{1, 1}}})},
      {FloatScalar("e", 1e-6f), RandomConstant("w", {4}, 7, 0.5, 1.0), RandomConstant("b", {4}, 8),
       RandomConstant("fc.weight", {5, 4}, 9), RandomConstant("fc.bias", {5}, 10)});
  Graph learned = ln;
  for (NamedConstant& c : learned.constants) c.state = c.name != "e";
  Check(learned);
  auto e = Executor<double>::Create(learned, registry_);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->output_dims(), (nn::Dims{5, 2, 3}));
  std::set<std::string> params;
  for (const nn::ParamInfo& p : (*e)->params()) params.insert(p.name);
  EXPECT_EQ(params, (std::set<std::string>{"w", "b", "fc.weight", "fc.bias"}));
  EXPECT_EQ((*e)->params()[2].shape, (std::vector<int64_t>{5, 4}));  // Saved as the Linear's.

  // [C] without operand_shape lines up with the last axis in ONNX: refused against [4, 2, 3].
  EXPECT_EQ(BuildError(Chain({4, 2, 3}, {MakeNode("Mul", "scale", {"x", "w"}, {"y"})},
                             {RandomConstant("w", {4}, 7)})),
            "node 'scale' (Mul): operand 'w' of shape [4] does not broadcast to [B, 4, 2, 3] "
            "(without the batch)");
}

// nn.InstanceNorm2d (affine: learned scale and B), GroupNorm's form (constant scale and B over
// [N, G, C/G * H * W]) and nn.PReLU (a learned slope, one or one per channel).
TEST_F(OpsTest, InstanceNormalizationAndPRelu) {
  NamedConstant scale = RandomConstant("in.weight", {3}, 11, 0.5, 1.0);
  NamedConstant bias = RandomConstant("in.bias", {3}, 12);
  const Graph affine = Chain({3, 2, 4},
                             {MakeNode("InstanceNormalization", "in", {"x", "in.weight", "in.bias"},
                                       {"y"}, {{"epsilon", 1e-5f}})},
                             {scale, bias});
  Check(affine);  // Constants of the graph: held.
  Graph learned = affine;
  for (NamedConstant& c : learned.constants) c.state = true;
  Check(learned);
  auto e = Executor<double>::Create(learned, registry_);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->params().size(), 2u);
  Graph half = learned;
  half.constants[1].state = false;
  EXPECT_EQ(BuildError(half),
            "node 'in' (InstanceNormalization): scale and B must both be "
            "learned, both buffers or both constants");
  EXPECT_EQ(BuildError(Chain(
                {4, 2, 4},
                {MakeNode("InstanceNormalization", "in", {"x", "in.weight", "in.bias"}, {"y"})},
                {scale, bias})),
            "node 'in' (InstanceNormalization): scale is float[3], expected 4 values (one per "
            "channel)");

  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{1}, {3, 1, 1}}) {
    NamedConstant slope = RandomConstant("prelu.weight", shape, 13, 0.2, 0.25);
    slope.state = true;
    Check(Chain({3, 2, 4}, {MakeNode("PRelu", "p", {"x", "prelu.weight"}, {"y"})}, {slope}));
  }
  EXPECT_EQ(BuildError(Chain({3, 2, 4}, {MakeNode("Relu", "r", {"x"}, {"s"}),
                                         MakeNode("PRelu", "p", {"x", "s"}, {"y"})})),
            "node 'p' (PRelu): the slope (input 1) must be a tensor of the model");
}

// Squeeze and Unsqueeze of computed values: views whose shape follows from the axes and the
// value's rank, which the executor keeps (the input's rank here: Graph::input_rank).
TEST_F(OpsTest, SqueezeAndUnsqueeze) {
  auto shape_of = [&](nn::Dims in, int rank, const char* op, Ints axes) -> std::string {
    std::vector<NamedConstant> constants;
    std::vector<std::string> inputs = {"x"};
    if (!axes.empty()) {
      constants.push_back(IntConstant("axes", axes));
      inputs.push_back("axes");
    }
    Graph g = Chain(in, {MakeNode(op, "s", inputs, {"y"})}, constants);
    g.input_rank = rank;
    auto e = Executor<double>::Create(g, registry_);
    return e.ok() ? (*e)->value_shapes()[(*e)->output_value()].ToString()
                  : std::string(e.status().message());
  };
  // x.squeeze(-1).squeeze(-1) of [N, C, 1, 1]; x.squeeze(); x.unsqueeze(-1) of [N, C].
  EXPECT_EQ(shape_of({5, 1, 1}, 4, "Squeeze", {-1}), "[B, 5, 1]");
  EXPECT_EQ(shape_of({5, 1, 1}, 4, "Squeeze", {2, 3}), "[B, 5]");
  EXPECT_EQ(shape_of({1, 4, 3}, 4, "Squeeze", {}), "[B, 4, 3]");
  EXPECT_EQ(shape_of({5, 1, 1}, 2, "Unsqueeze", {-1}), "[B, 5, 1]");
  EXPECT_EQ(shape_of({5, 1, 3}, 4, "Squeeze", {-2}), "[B, 5, 3]");
  EXPECT_EQ(shape_of({5, 3, 1}, 3, "Unsqueeze", {1}), "[B, 1, 5, 3]");
  EXPECT_EQ(shape_of({5, 1, 1}, 2, "Unsqueeze", {-2}), "[B, 1, 5]");
  EXPECT_EQ(shape_of({5, 1, 1}, 2, "Unsqueeze", {0}), "[1, B, 5]");  // The batch moves.
  EXPECT_EQ(shape_of({5, 1, 1}, 4, "Squeeze", {0}),
            "node 's' (Squeeze): axes [0] do not fit [B, 5, 1, 1] (the batch axis, a dimension "
            "not of size 1, an axis out of range or given twice, or a rank above 6)");
  EXPECT_EQ(shape_of({5, 4, 3}, 4, "Squeeze", {2}),
            "node 's' (Squeeze): axes [2] do not fit [B, 5, 4, 3] (the batch axis, a dimension "
            "not of size 1, an axis out of range or given twice, or a rank above 6)");
  EXPECT_EQ(shape_of({5, 4, 3}, 4, "Unsqueeze", {1, 1}),
            "node 's' (Unsqueeze): axes [1, 1] do not fit [B, 5, 4, 3] (the batch axis, a "
            "dimension not of size 1, an axis out of range or given twice, or a rank above 6)");
  Check(Chain({3, 1, 4},
              {MakeNode("Squeeze", "s", {"x", "axes"}, {"y"}),
               MakeNode("Unsqueeze", "u", {"y", "axes"}, {"z"})},
              {IntConstant("axes", {2})}));
}

}  // namespace
}  // namespace graph
}  // namespace dptrain
