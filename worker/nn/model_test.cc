#include "worker/nn/model.h"

#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/graph/builtin_models.h"

namespace dptrain {
namespace nn {
namespace {

constexpr int kImage = 28 * 28;

std::unique_ptr<Model> MustCreate(const std::string& name, uint64_t seed = 0) {
  absl::StatusOr<std::unique_ptr<Model>> model = graph::CreateBuiltinModel({name, seed});
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

struct Expected {
  std::string name;
  std::vector<int64_t> shape;
};

void ExpectParams(const Model& model, const std::vector<Expected>& expected, int64_t total) {
  const std::vector<ParamInfo>& params = model.params();
  ASSERT_EQ(params.size(), expected.size());
  int64_t offset = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].name, expected[i].name);
    EXPECT_EQ(params[i].shape, expected[i].shape) << params[i].name;
    const int64_t size = std::accumulate(expected[i].shape.begin(), expected[i].shape.end(),
                                         int64_t{1}, std::multiplies<int64_t>());
    EXPECT_EQ(params[i].size, size) << params[i].name;
    EXPECT_EQ(params[i].offset, offset) << params[i].name;
    offset += size;
  }
  EXPECT_EQ(offset, total);
  auto& m = const_cast<Model&>(model);
  EXPECT_EQ(static_cast<int64_t>(m.weights().size()), total);
  EXPECT_EQ(static_cast<int64_t>(model.grads().size()), total);
}

TEST(ModelTest, MlpParamsAsPyTorch) {
  auto model = MustCreate("mlp");
  EXPECT_EQ(model->name(), "mlp");
  ExpectParams(
      *model,
      {{"1.weight", {256, 784}}, {"1.bias", {256}}, {"3.weight", {10, 256}}, {"3.bias", {10}}},
      203530);
}

TEST(ModelTest, LeNetParamsAsPyTorch) {
  auto model = MustCreate("lenet");
  EXPECT_EQ(model->name(), "lenet");
  EXPECT_TRUE(model->buffers().empty());
  EXPECT_TRUE(model->buffer_values().empty());
  ExpectParams(*model,
               {{"0.weight", {6, 1, 5, 5}},
                {"0.bias", {6}},
                {"3.weight", {16, 6, 5, 5}},
                {"3.bias", {16}},
                {"7.weight", {120, 400}},
                {"7.bias", {120}},
                {"9.weight", {84, 120}},
                {"9.bias", {84}},
                {"11.weight", {10, 84}},
                {"11.bias", {10}}},
               61706);
}

// Every built-in network takes the data's shape: CIFAR-100-like 3x32x32 with 100 classes,
// and refuses a label beyond them.
TEST(ModelTest, BuiltInsTakeTheDataShape) {
  for (const std::string name : {"mlp", "lenet", "resnet18"}) {
    SCOPED_TRACE(name);
    ModelOptions options{name, 1};
    options.shape = {{3, 32, 32}, 100};
    absl::StatusOr<std::unique_ptr<Model>> model = graph::CreateBuiltinModel(options);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ((*model)->input_dims(), (Dims{3, 32, 32}));
    EXPECT_EQ((*model)->num_classes(), 100);
    EXPECT_EQ((*model)->params().back().shape, (std::vector<int64_t>{100}));  // The last bias.
    if (name == "lenet") {
      EXPECT_EQ((*model)->params()[4].shape, (std::vector<int64_t>{120, 16 * 6 * 6}));
    }
    if (name == "mlp") {
      EXPECT_EQ((*model)->params()[0].shape, (std::vector<int64_t>{256, 3 * 32 * 32}));
    }
    std::vector<float> images(2 * 3 * 32 * 32, 0.5f);
    std::vector<nn::Label> labels = {99, 3};
    absl::StatusOr<BatchResult> step = (*model)->TrainStep(images.data(), labels.data(), 2);
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_NEAR(step->loss, std::log(100.0), 1.0);
    labels[1] = 100;
    EXPECT_EQ((*model)->TrainStep(images.data(), labels.data(), 2).status().message(),
              "label 100 of sample 1 is not in [0, 100)");
    labels[1] = -1;  // Labels are int32: a negative one is refused too, never indexed.
    EXPECT_EQ((*model)->TrainStep(images.data(), labels.data(), 2).status().message(),
              "label -1 of sample 1 is not in [0, 100)");
  }
  ModelOptions tiny{"lenet", 1};
  tiny.shape = {{1, 8, 8}, 10};
  EXPECT_EQ(graph::CreateBuiltinModel(tiny).status().message(),
            "lenet needs images of at least 12x12, got [1, 8, 8]");
  tiny.shape = {{1, 28, 28}, 1};
  EXPECT_FALSE(graph::CreateBuiltinModel(tiny).ok());
}

TEST(ModelTest, UnknownModel) {
  absl::StatusOr<std::unique_ptr<Model>> model = graph::CreateBuiltinModel({"resnet"});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.status().message(), "unknown model 'resnet' (expected mlp, lenet or resnet18)");
  EXPECT_FALSE(graph::CreateBuiltinModel({"mlp", 0, -1}).ok());
}

TEST(ModelTest, SameSeedSameWeights) {
  for (const char* name : {"mlp", "lenet"}) {
    auto a = MustCreate(name, 5), b = MustCreate(name, 5), c = MustCreate(name, 6);
    EXPECT_EQ(a->weights(), b->weights()) << name;
    EXPECT_NE(a->weights(), c->weights()) << name;
    for (float g : a->grads()) ASSERT_EQ(g, 0.0f);
  }
}

TEST(ModelTest, MlpInitIsNormalWithZeroBias) {
  auto model = MustCreate("mlp", 1);
  for (const ParamInfo& p : model->params()) {
    const float* v = model->weights().data() + p.offset;
    if (p.shape.size() == 1) {
      for (int64_t i = 0; i < p.size; ++i) ASSERT_EQ(v[i], 0.0f) << p.name;
      continue;
    }
    double sum = 0, sq = 0;
    for (int64_t i = 0; i < p.size; ++i) {
      sum += v[i];
      sq += double{v[i]} * v[i];
    }
    EXPECT_NEAR(sum / p.size, 0.0, 0.002) << p.name;
    EXPECT_NEAR(std::sqrt(sq / p.size), 0.01, 0.0015) << p.name;
  }
}

TEST(ModelTest, LeNetInitIsXavierUniformWithZeroBias) {
  auto model = MustCreate("lenet", 1);
  for (const ParamInfo& p : model->params()) {
    const float* v = model->weights().data() + p.offset;
    if (p.shape.size() == 1) {
      for (int64_t i = 0; i < p.size; ++i) ASSERT_EQ(v[i], 0.0f) << p.name;
      continue;
    }
    int64_t receptive = 1;
    for (size_t d = 2; d < p.shape.size(); ++d) receptive *= p.shape[d];
    const double bound = std::sqrt(6.0 / ((p.shape[0] + p.shape[1]) * receptive));
    double max_abs = 0;
    for (int64_t i = 0; i < p.size; ++i) max_abs = std::max(max_abs, std::abs(double{v[i]}));
    EXPECT_LE(max_abs, bound) << p.name;
    EXPECT_GT(max_abs, 0.9 * bound) << p.name;
  }
}

TEST(ModelTest, RejectsBadArguments) {
  auto model = MustCreate("mlp");
  std::vector<float> images(2 * kImage, 0.5f);
  std::vector<nn::Label> labels = {1, 10};
  EXPECT_EQ(model->TrainStep(images.data(), labels.data(), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model->Evaluate(images.data(), labels.data(), -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model->TrainStep(nullptr, labels.data(), 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model->TrainStep(images.data(), labels.data(), 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  for (float g : model->grads()) ASSERT_EQ(g, 0.0f);
  EXPECT_TRUE(model->TrainStep(images.data(), labels.data(), 1).ok());
}

TEST(ModelTest, EvaluateMatchesTrainStepAndKeepsGrads) {
  for (const char* name : {"mlp", "lenet"}) {
    auto model = MustCreate(name, 3);
    std::vector<float> images(4 * kImage);
    for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<float>((i * 37) % 101) / 101;
    const std::vector<nn::Label> labels = {0, 3, 9, 3};
    absl::StatusOr<BatchResult> train = model->TrainStep(images.data(), labels.data(), 4);
    ASSERT_TRUE(train.ok()) << train.status();
    const std::vector<float> grads(model->grads().begin(), model->grads().end());
    absl::StatusOr<BatchResult> eval = model->Evaluate(images.data(), labels.data(), 4);
    ASSERT_TRUE(eval.ok()) << eval.status();
    EXPECT_EQ(eval->loss, train->loss) << name;
    EXPECT_EQ(eval->correct, train->correct) << name;
    EXPECT_EQ(model->grads(), grads) << name;
    EXPECT_NEAR(train->loss, std::log(10.0), 0.5) << name;  // Near chance at initialisation.
  }
}

TEST(ModelTest, UsesReplacedWeights) {
  auto model = MustCreate("lenet");
  std::vector<float> images(3 * kImage, 0.25f);
  const std::vector<nn::Label> labels = {2, 2, 7};
  ASSERT_TRUE(model->TrainStep(images.data(), labels.data(), 3).ok());
  // A new vector (new storage), as a parameter-server client might assign: all zeros gives
  // uniform logits, loss log(10), and last-bias gradient mean(softmax - onehot).
  model->weights() = std::vector<float>(model->weights().size(), 0.0f);
  absl::StatusOr<BatchResult> r = model->TrainStep(images.data(), labels.data(), 3);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->loss, std::log(10.0), 1e-6);
  const ParamInfo& bias = model->params().back();
  const float* g = model->grads().data() + bias.offset;
  EXPECT_NEAR(g[0], 0.1, 1e-6);
  EXPECT_NEAR(g[2], 0.1 - 2.0 / 3, 1e-6);
  EXPECT_NEAR(g[7], 0.1 - 1.0 / 3, 1e-6);

  model->weights().push_back(1.0f);
  EXPECT_EQ(model->TrainStep(images.data(), labels.data(), 3).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// All-reduce mode's checkpoints take the replica's optimizer state from the model and give it
// back on resume: a model that imports another's state continues bit-identically.
TEST(ModelTest, ExportsAndImportsTheOptimizerState) {
  ModelOptions options{"mlp", 3};
  OptimizerOptions adam;
  adam.name = "adam";
  adam.learning_rate = 0.01;
  options.optimizer = adam;
  auto a = graph::CreateBuiltinModel(options), b = graph::CreateBuiltinModel(options);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<float> images(4 * kImage);
  for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<float>(i % 13) / 13;
  const std::vector<nn::Label> labels = {1, 4, 4, 9};
  auto step = [&](Model& m) {
    ASSERT_TRUE(m.TrainStep(images.data(), labels.data(), 4).ok());
    ASSERT_TRUE(m.ApplyUpdate(0.01f).ok());
  };
  for (int i = 0; i < 3; ++i) step(**a);
  absl::StatusOr<OptimizerState> state = (*a)->ExportOptimizerState();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->steps, 3);
  EXPECT_EQ(state->exp_avg.size(), (*a)->weights().size());
  (*b)->weights() = (*a)->weights();
  ASSERT_TRUE((*b)->ImportOptimizerState(*state).ok());
  step(**a);
  step(**b);
  EXPECT_EQ((*a)->weights(), (*b)->weights());

  // Without the state, Adam's bias correction and moments start over: different weights.
  auto c = graph::CreateBuiltinModel(options);
  ASSERT_TRUE(c.ok());
  (*c)->weights() = (*b)->weights();
  step(**b);
  step(**c);
  EXPECT_NE((*b)->weights(), (*c)->weights());

  OptimizerState wrong = *state;
  wrong.exp_avg.pop_back();
  EXPECT_EQ((*b)->ImportOptimizerState(wrong).code(), absl::StatusCode::kInvalidArgument);
  wrong = *state;
  wrong.steps = -1;
  EXPECT_EQ((*b)->ImportOptimizerState(wrong).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MustCreate("mlp")->ExportOptimizerState().status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// A batch larger than the training batches is evaluated in pieces of their size (so that the
// layers' buffers do not grow for it): the same correct count and, to rounding, the same loss
// as in one piece.
TEST(ModelTest, EvaluatesLargeBatchesInPiecesOfTheTrainingBatch) {
  for (const std::string name : {"mlp", "lenet"}) {
    SCOPED_TRACE(name);
    const int kEval = 11;
    std::vector<float> images(kEval * kImage);
    std::vector<nn::Label> labels(kEval);
    for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<float>((i * 37) % 101) / 101;
    for (int i = 0; i < kEval; ++i) labels[i] = static_cast<nn::Label>((i * 3) % 10);
    auto whole = MustCreate(name, 3);
    auto pieces = MustCreate(name, 3);
    ASSERT_TRUE(pieces->TrainStep(images.data(), labels.data(), 4).ok());  // Pieces of 4.
    absl::StatusOr<BatchResult> a = whole->Evaluate(images.data(), labels.data(), kEval);
    absl::StatusOr<BatchResult> b = pieces->Evaluate(images.data(), labels.data(), kEval);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->correct, b->correct);
    EXPECT_NEAR(a->loss, b->loss, 1e-6 * std::max(1.0, std::fabs(a->loss)));
  }
}

}  // namespace
}  // namespace nn
}  // namespace dptrain
