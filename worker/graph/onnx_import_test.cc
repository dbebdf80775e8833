// ONNX models as PyTorch exports them, against PyTorch itself: the fixtures
// (tools/make_onnx_fixtures.py) hold each model's ONNX file and PyTorch's loss, gradients and
// updated buffers of one train-mode step from the file's weights, computed in float64. PyTorch is
// not needed to run this test. Also the importer's errors and the nn::Model around the graph.
#include "worker/graph/onnx_import.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "onnx/onnx_pb.h"
#include "worker/graph/graph_check.h"
#include "worker/graph/onnx_fixtures_testing.h"
#include "worker/graph/op_registry.h"
#include "worker/nn/batch_sample.h"
#include "worker/nn/layer_check.h"
#include "worker/nn/safetensors.h"

namespace dptrain {
namespace graph {
namespace {

using testing_fixtures::ExpectDoubleStepMatches;
using testing_fixtures::ExpectGradientsMatch;
using testing_fixtures::ExpectTrainStepMatches;
using testing_fixtures::FloatLossTolerance;
using testing_fixtures::kTestdata;
using testing_fixtures::OnnxPath;
using testing_fixtures::ReferenceBatch;
using testing_fixtures::ReferencePath;
using Batch = testing_fixtures::Batch;

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Writes `bytes` to a fresh file under the test's temporary directory.
std::string WriteTemp(const std::string& name, const std::string& bytes) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// One train step of model `name` in `dir` on `threads` against PyTorch's reference, by the
// float model (its gradients too where `float_gradients`) and by the executor in double.
void CheckParity(const std::string& dir, const std::string& name, int threads,
                 bool float_gradients = true) {
  // The fixtures' buffers read by arithmetic, which a user names with --onnx_buffers.
  const std::vector<std::string> buffers =
      name == "scaled" ? std::vector<std::string>{"mean"} : std::vector<std::string>{};
  SCOPED_TRACE(absl::StrCat(name, " on ", threads, " threads"));
  absl::StatusOr<SafetensorsContents> ref = LoadSafetensors(ReferencePath(name, dir));
  ASSERT_TRUE(ref.ok()) << ref.status();
  OnnxModelOptions options;
  options.dropout = false;  // PyTorch's reference step ran with dropout off too.
  options.threads = threads;
  options.buffers = buffers;
  // A regression fixture's step is nn.MSELoss's against its targets.
  if (ReferenceBatch(*ref).regression()) options.loss = Loss::kMse;
  absl::StatusOr<std::unique_ptr<nn::Model>> made = LoadOnnxModel(OnnxPath(name, dir), options);
  ASSERT_TRUE(made.ok()) << made.status();
  nn::Model& model = **made;
  EXPECT_EQ(model.name(), name);
  // [batch, 3, 32, 32] (or 64s), or [batch, tokens] of ids, or [batch, features] (tabular_*).
  const std::vector<int64_t>& input = ref->Find("input")->shape;
  if (input.size() == 2) {
    EXPECT_EQ(model.input_is_ids(), !absl::StartsWith(name, "tabular"));
    EXPECT_EQ(model.input_dims(), (nn::Dims{static_cast<int>(input[1]), 1, 1}));
  } else {
    ASSERT_EQ(input.size(), 4u);
    EXPECT_FALSE(model.input_is_ids());
    EXPECT_EQ(model.input_dims(),
              (nn::Dims{3, static_cast<int>(input[2]), static_cast<int>(input[3])}));
  }
  EXPECT_EQ(model.num_classes(), ref->Find("logits")->shape[1]);

  // The file's weights and buffers are the state PyTorch started from.
  for (const nn::ParamInfo& p : model.params()) {
    const LoadedTensor* state = ref->Find("state." + p.name);
    ASSERT_NE(state, nullptr) << p.name;
    EXPECT_EQ(std::vector<float>(model.weights().begin() + p.offset,
                                 model.weights().begin() + p.offset + p.size),
              state->data)
        << p.name;
  }
  for (const nn::ParamInfo& b : model.buffers()) {
    const LoadedTensor* state = ref->Find("state." + b.name);
    ASSERT_NE(state, nullptr) << b.name;
    EXPECT_EQ(b.shape, state->shape) << b.name;
    EXPECT_EQ(std::vector<float>(model.buffer_values().begin() + b.offset,
                                 model.buffer_values().begin() + b.offset + b.size),
              state->data)
        << b.name;
  }
  // Every state_dict entry is a parameter or a buffer.
  size_t state_entries = 0;
  for (const LoadedTensor& t : ref->tensors) state_entries += absl::StartsWith(t.name, "state.");
  EXPECT_EQ(model.params().size() + model.buffers().size(), state_entries);

  if (float_gradients) {
    ExpectTrainStepMatches(model, *ref);
  } else {
    const Batch batch = ReferenceBatch(*ref);
    absl::StatusOr<nn::BatchResult> step =
        model.TrainStep(batch.images.data(), batch.scored(), batch.size);
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_NEAR(step->loss, ref->Find("loss")->data[0], FloatLossTolerance(*ref));
  }
  absl::StatusOr<Graph> graph = ReadOnnxGraph(OnnxPath(name, dir), BuiltinOps());
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_TRUE(MarkBuffers(*graph, buffers).ok());
  ExpectDoubleStepMatches(*graph, *ref);

  const Batch batch = ReferenceBatch(*ref);
  // Evaluation reads the updated running statistics and leaves the gradients alone.
  const std::vector<float> grads(model.grads().begin(), model.grads().end());
  absl::StatusOr<nn::BatchResult> eval =
      model.Evaluate(batch.images.data(), batch.scored(), batch.size);
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_TRUE(std::isfinite(eval->loss));
  EXPECT_EQ(std::vector<float>(model.grads().begin(), model.grads().end()), grads);
}

class OnnxParityTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(OnnxParityTest, OneTrainStepMatchesPyTorch) {
  CheckParity(kTestdata, std::get<0>(GetParam()), std::get<1>(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, OnnxParityTest,
    ::testing::Combine(::testing::Values("vgg", "resnet", "branching", "gated", "pooling", "shared",
                                         "elementwise", "shuffle", "dynamic", "scaled", "convnext",
                                         "attention", "attention_dynamic", "mha", "mha_dynamic",
                                         "relpos", "text", "text_mask", "text_cnn", "text_lstm",
                                         "text_bigru", "text_bilstm", "text_lstm_dynamic",
                                         "text_lstm_packed", "text_gru_packed", "norms",
                                         "functional", "text_bag", "text_bag_dynamic",
                                         "tabular_mixed", "text_pad", "tabular_regression",
                                         "text_two_inputs", "tabular_two_inputs",
                                         "tabular_text_bag", "tabular_text_bag_dynamic"),
                       ::testing::Values(0, 2)));

// Fixtures too large for the repository, written on request, e.g. the full ResNet-18:
//   /usr/bin/python3 tools/make_onnx_fixtures.py --out_dir=/tmp/onnx --resnet18 [--opset=11]
//   bazel test //worker/graph:onnx_import_test --test_env=DPTRAIN_ONNX_FIXTURES=/tmp/onnx
// checks every <m>.onnx there that has its <m>_reference.safetensors: the float model's loss,
// and the whole step in double (ExpectDoubleStepMatches says why not the float gradients: e.g.
// --torchvision=squeezenet1_1,googlenet).
// The models in $DPTRAIN_ONNX_FIXTURES, sorted (none when it is not set).
std::vector<std::string> EnvironmentFixtures() {
  std::vector<std::string> names;
  const char* dir = std::getenv("DPTRAIN_ONNX_FIXTURES");
  std::error_code error;
  if (dir == nullptr || !std::filesystem::is_directory(dir, error)) return names;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string file = entry.path().filename().string();
    if (!absl::EndsWith(file, ".onnx")) continue;
    const std::string name = file.substr(0, file.size() - 5);
    if (std::filesystem::exists(ReferencePath(name, dir))) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(OnnxParityTest, FixturesNamedByTheEnvironmentExist) {
  const char* dir = std::getenv("DPTRAIN_ONNX_FIXTURES");
  if (dir == nullptr) GTEST_SKIP() << "DPTRAIN_ONNX_FIXTURES is not set";
  EXPECT_FALSE(EnvironmentFixtures().empty()) << "no <m>.onnx with its reference in " << dir;
}

// One test per model there (named after it, so each passes or fails on its own line).
class EnvironmentFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EnvironmentFixtureTest, OneTrainStepMatchesPyTorch) {
  CheckParity(std::getenv("DPTRAIN_ONNX_FIXTURES"), GetParam(), 0, /*float_gradients=*/false);
}

INSTANTIATE_TEST_SUITE_P(FromEnvironment, EnvironmentFixtureTest,
                         ::testing::ValuesIn(EnvironmentFixtures()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(EnvironmentFixtureTest);

// The file cannot tell a parameter from a buffer: what Add, Sub, Mul and Div read is learned
// unless named a buffer, and the worker lists what it learns.
TEST(OnnxModelTest, InitializersReadByArithmeticAreLearnedUnlessBuffers) {
  absl::StatusOr<Graph> graph = ReadOnnxGraph(OnnxPath("scaled"), BuiltinOps());
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(LearnedOperands(*graph), (std::vector<std::string>{"pos", "gamma", "alpha", "mean"}));
  ASSERT_TRUE(MarkBuffers(*graph, {"mean"}).ok());
  EXPECT_EQ(LearnedOperands(*graph), (std::vector<std::string>{"pos", "gamma", "alpha"}));
  EXPECT_EQ(MarkBuffers(*graph, {"conv1.weight"}).message(),
            "'conv1.weight' is read by no Add, Sub, Mul, Div, PRelu or InstanceNormalization (a "
            "layer's weight is its parameter): marking it as a buffer would change nothing");
  EXPECT_EQ(MarkBuffers(*graph, {"nope"}).message(),
            "'nope' is not an initializer of the model (a tensor of its state_dict), so it "
            "cannot be marked as a buffer");
  OnnxModelOptions options;
  options.buffers = {"mean"};
  absl::StatusOr<std::unique_ptr<nn::Model>> model = LoadOnnxModel(OnnxPath("scaled"), options);
  ASSERT_TRUE(model.ok()) << model.status();
  std::set<std::string> params, buffers;
  for (const nn::ParamInfo& p : (*model)->params()) params.insert(p.name);
  for (const nn::ParamInfo& b : (*model)->buffers()) buffers.insert(b.name);
  EXPECT_EQ(params, (std::set<std::string>{"pos", "conv1.weight", "conv1.bias", "conv2.weight",
                                           "conv2.bias", "gamma", "alpha", "se.weight", "se.bias",
                                           "fc.weight", "bias"}));
  EXPECT_EQ(buffers, (std::set<std::string>{"mean"}));
  options.buffers = {"nope"};
  EXPECT_EQ(LoadOnnxModel(OnnxPath("scaled"), options).status().message(),
            "worker/graph/testdata/scaled.onnx: 'nope' is not an initializer of the model (a "
            "tensor of its state_dict), so it cannot be marked as a buffer");
}

TEST(OnnxModelTest, MseLossMatchesPyTorch) {
  absl::StatusOr<SafetensorsContents> ref = LoadSafetensors(ReferencePath("branching"));
  ASSERT_TRUE(ref.ok()) << ref.status();
  OnnxModelOptions options;
  options.loss = Loss::kMse;
  absl::StatusOr<std::unique_ptr<nn::Model>> model = LoadOnnxModel(OnnxPath("branching"), options);
  ASSERT_TRUE(model.ok()) << model.status();
  const Batch batch = ReferenceBatch(*ref);
  absl::StatusOr<nn::BatchResult> step = (*model)->TrainStep(
      batch.images.data(), batch.labels.data(), static_cast<int>(batch.labels.size()));
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_NEAR(step->loss, ref->Find("mse_loss")->data[0], 1e-5);
  ExpectGradientsMatch(**model, *ref, "mse_grad.");
  // Label smoothing is cross-entropy's: refused with mse, and outside [0, 1).
  options.label_smoothing = 0.1;
  EXPECT_EQ(LoadOnnxModel(OnnxPath("branching"), options).status().message(),
            "worker/graph/testdata/branching.onnx: label smoothing applies to softmax "
            "cross-entropy only");
  options.loss = Loss::kSoftmaxCrossEntropy;
  options.label_smoothing = 1;
  EXPECT_EQ(LoadOnnxModel(OnnxPath("branching"), options).status().message(),
            "worker/graph/testdata/branching.onnx: label smoothing must be in [0, 1), got 1");
}

// Regression: nn.MSELoss and nn.L1Loss against target values (an MLP with three outputs),
// nn.BCEWithLogitsLoss against probabilities, and the loss that cannot take them refused.
TEST(OnnxModelTest, RegressionLossesMatchPyTorch) {
  absl::StatusOr<SafetensorsContents> ref = LoadSafetensors(ReferencePath("tabular_regression"));
  ASSERT_TRUE(ref.ok()) << ref.status();
  const Batch batch = ReferenceBatch(*ref);
  ASSERT_TRUE(batch.regression());
  OnnxModelOptions options;
  options.loss = Loss::kL1;
  absl::StatusOr<std::unique_ptr<nn::Model>> model =
      LoadOnnxModel(OnnxPath("tabular_regression"), options);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->num_classes(), 3);
  absl::StatusOr<nn::BatchResult> step =
      (*model)->TrainStep(batch.images.data(), batch.scored(), batch.size);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_NEAR(step->loss, ref->Find("l1_loss")->data[0], 1e-5);
  EXPECT_EQ(step->correct, 0);
  ExpectGradientsMatch(**model, *ref, "l1_grad.");
  // Evaluation scores the same batch alike (no dropout, no batch norm in this MLP).
  absl::StatusOr<nn::BatchResult> eval =
      (*model)->Evaluate(batch.images.data(), batch.scored(), batch.size);
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_NEAR(eval->loss, ref->Find("l1_loss")->data[0], 1e-5);

  // nn.BCEWithLogitsLoss against probabilities (multi-label targets), from the same weights.
  options.loss = Loss::kBce;
  model = LoadOnnxModel(OnnxPath("tabular_regression"), options);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<float>& probabilities = ref->Find("bce_targets")->data;
  ASSERT_EQ(probabilities.size(), batch.targets.size());
  step = (*model)->TrainStep(batch.images.data(), nn::Targets::Values(probabilities.data()),
                             batch.size);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_NEAR(step->loss, ref->Find("bce_loss")->data[0], 1e-5);
  ExpectGradientsMatch(**model, *ref, "bce_grad.");

  // The outputs as classes: nn.CrossEntropyLoss(weight=w, label_smoothing=0.1).
  options.loss = Loss::kSoftmaxCrossEntropy;
  options.label_smoothing = 0.1;
  const std::vector<float>& w = ref->Find("class_weights")->data;
  options.class_weights.assign(w.begin(), w.end());
  model = LoadOnnxModel(OnnxPath("tabular_regression"), options);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<nn::Label> classes;
  for (float l : ref->Find("class_labels")->data) classes.push_back(static_cast<nn::Label>(l));
  step = (*model)->TrainStep(batch.images.data(), classes.data(), batch.size);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_NEAR(step->loss, ref->Find("weighted_loss")->data[0], 1e-5);
  ExpectGradientsMatch(**model, *ref, "weighted_grad.");
  eval = (*model)->Evaluate(batch.images.data(), classes.data(), batch.size);
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_NEAR(eval->loss, ref->Find("weighted_loss")->data[0], 1e-5);
  // One weight per output, each finite and >= 0, with softmax cross-entropy only.
  options.class_weights = {1, 2};
  EXPECT_EQ(LoadOnnxModel(OnnxPath("tabular_regression"), options).status().message(),
            "worker/graph/testdata/tabular_regression.onnx: 2 class weights for a model of 3 "
            "outputs (classes)");
  options.class_weights = {1, -1, 1};
  EXPECT_EQ(LoadOnnxModel(OnnxPath("tabular_regression"), options).status().message(),
            "worker/graph/testdata/tabular_regression.onnx: class weight -1 (class 1) is not "
            "finite and >= 0");
  options.label_smoothing = 0;
  options.loss = Loss::kMse;
  EXPECT_EQ(LoadOnnxModel(OnnxPath("tabular_regression"), options).status().message(),
            "worker/graph/testdata/tabular_regression.onnx: class weights apply to softmax "
            "cross-entropy only");
  options.class_weights.clear();

  // Softmax cross-entropy takes class labels: target values are refused, the gradient untouched.
  options.loss = Loss::kSoftmaxCrossEntropy;
  model = LoadOnnxModel(OnnxPath("tabular_regression"), options);
  ASSERT_TRUE(model.ok()) << model.status();
  step = (*model)->TrainStep(batch.images.data(), batch.scored(), batch.size);
  EXPECT_EQ(step.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(step.status().message(),
            "tabular_regression: target values (regression) need a loss that takes them (mse, "
            "l1, bce), not softmax cross-entropy, which takes class labels");
  for (float g : (*model)->grads()) ASSERT_EQ(g, 0.0f);
  // Neither labels nor targets, or both: refused.
  nn::Targets both = batch.scored();
  const nn::Label labels[4] = {0, 1, 2, 0};
  both.labels = labels;
  EXPECT_EQ((*model)->TrainStep(batch.images.data(), both, batch.size).status().message(),
            "null images, or not exactly one of labels and targets");
  EXPECT_EQ((*model)->TrainStep(batch.images.data(), nullptr, batch.size).status().message(),
            "null images, or not exactly one of labels and targets");
}

TEST(OnnxModelTest, ParamsAreTheInitializersInFileOrder) {
  absl::StatusOr<std::unique_ptr<nn::Model>> model = LoadOnnxModel(OnnxPath("resnet"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<nn::ParamInfo>& params = (*model)->params();
  ASSERT_GE(params.size(), 3u);
  EXPECT_EQ(params[0].name, "conv1.weight");
  EXPECT_EQ(params[0].shape, (std::vector<int64_t>{8, 3, 7, 7}));
  EXPECT_EQ(params[1].name, "bn1.weight");
  EXPECT_EQ(params.back().name, "fc.bias");
  int64_t offset = 0;
  for (const nn::ParamInfo& p : params) {
    EXPECT_EQ(p.offset, offset) << p.name;
    offset += p.size;
  }
  EXPECT_EQ(offset, static_cast<int64_t>((*model)->weights().size()));
  const std::vector<nn::ParamInfo>& buffers = (*model)->buffers();
  ASSERT_EQ(buffers.size() % 3, 0u);
  EXPECT_EQ(buffers[0].name, "bn1.running_mean");
  EXPECT_EQ(buffers[1].name, "bn1.running_var");
  EXPECT_EQ(buffers[2].name, "bn1.num_batches_tracked");
  EXPECT_EQ(buffers[2].shape, std::vector<int64_t>{});
}

TEST(OnnxModelTest, SavedWeightsCarryTheStateDictNames) {
  // What SaveModel writes is a whole PyTorch state_dict of the exported module: every entry by
  // name and shape (num_batches_tracked too), so load_state_dict(strict=True) takes it.
  absl::StatusOr<std::unique_ptr<nn::Model>> model = LoadOnnxModel(OnnxPath("resnet"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(dir != nullptr ? dir : "/tmp", "/resnet.safetensors");
  ASSERT_TRUE(nn::SaveModel(**model, path).ok());
  absl::StatusOr<SafetensorsContents> saved = LoadSafetensors(path);
  ASSERT_TRUE(saved.ok()) << saved.status();
  absl::StatusOr<SafetensorsContents> ref = LoadSafetensors(ReferencePath("resnet"));
  ASSERT_TRUE(ref.ok()) << ref.status();
  std::set<std::string> state_dict, written;
  for (const LoadedTensor& t : ref->tensors) {
    if (absl::StartsWith(t.name, "state.")) {
      state_dict.insert(t.name.substr(6));
      const LoadedTensor* mine = saved->Find(t.name.substr(6));
      ASSERT_NE(mine, nullptr) << t.name;
      EXPECT_EQ(mine->shape, t.shape) << t.name;
    }
  }
  for (const LoadedTensor& t : saved->tensors) written.insert(t.name);
  EXPECT_EQ(written, state_dict);
  // And back: a model loads them by name.
  ASSERT_TRUE(nn::LoadModel(path, **model).ok());
}

TEST(OnnxModelTest, ApplyUpdateUsesTheOptimizer) {
  OnnxModelOptions options;
  options.optimizer = OptimizerOptions{"sgd", /*learning_rate=*/0.5f};
  absl::StatusOr<std::unique_ptr<nn::Model>> made = LoadOnnxModel(OnnxPath("branching"), options);
  ASSERT_TRUE(made.ok()) << made.status();
  nn::Model& model = **made;
  absl::StatusOr<SafetensorsContents> ref = LoadSafetensors(ReferencePath("branching"));
  ASSERT_TRUE(ref.ok()) << ref.status();
  const Batch batch = ReferenceBatch(*ref);
  ASSERT_TRUE(model.TrainStep(batch.images.data(), batch.labels.data(), 4).ok());
  const std::vector<float> before = model.weights();
  ASSERT_TRUE(model.ApplyUpdate(0.25f).ok());
  for (size_t i = 0; i < before.size(); ++i) {
    ASSERT_FLOAT_EQ(model.weights()[i], before[i] - 0.25f * model.grads()[i]) << i;
  }
  absl::StatusOr<OptimizerState> state = model.ExportOptimizerState();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->steps, 1);

  absl::StatusOr<std::unique_ptr<nn::Model>> plain = LoadOnnxModel(OnnxPath("branching"), {});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ((*plain)->ApplyUpdate(0.1f).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(OnnxModelTest, DropoutMasksAreDeterministicPerSeed) {
  absl::StatusOr<SafetensorsContents> ref = LoadSafetensors(ReferencePath("vgg"));
  ASSERT_TRUE(ref.ok()) << ref.status();
  const Batch batch = ReferenceBatch(*ref);
  auto loss_with_seed = [&](uint64_t seed) {
    OnnxModelOptions options;
    options.seed = seed;
    absl::StatusOr<std::unique_ptr<nn::Model>> model = LoadOnnxModel(OnnxPath("vgg"), options);
    EXPECT_TRUE(model.ok()) << model.status();
    return (*model)->TrainStep(batch.images.data(), batch.labels.data(), 4)->loss;
  };
  EXPECT_EQ(loss_with_seed(7), loss_with_seed(7));
  EXPECT_NE(loss_with_seed(7), loss_with_seed(8));
  EXPECT_NE(loss_with_seed(7), ref->Find("loss")->data[0]);  // Dropout(0.5) is on.
}

TEST(OnnxModelTest, LabelOutOfRangeNamesTheSample) {
  absl::StatusOr<std::unique_ptr<nn::Model>> model = LoadOnnxModel(OnnxPath("branching"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> images(4 * 3 * 32 * 32, 0.5f);
  std::vector<nn::Label> labels = {0, 6, 7, 1};  // 7 classes.
  absl::StatusOr<nn::BatchResult> step = (*model)->TrainStep(images.data(), labels.data(), 4);
  EXPECT_EQ(step.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(step.status().message(), "sample 2")) << step.status();
  EXPECT_EQ((*model)->Evaluate(images.data(), labels.data(), 4).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A packed GRU exported with a dynamic batch (its sort by length taken out: no constant of the
// export's batch left) runs at other batch sizes, each sample as it would run alone; a sample
// of padding only (length 0, which pack_padded_sequence refuses too) is refused naming it.
TEST(OnnxModelTest, PackedSequencesAtAnyBatchSize) {
  absl::StatusOr<std::unique_ptr<nn::Model>> model = LoadOnnxModel(OnnxPath("text_gru_packed"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> ids(3 * 12, 0.0f);
  const int lengths[3] = {5, 12, 1};
  for (int n = 0; n < 3; ++n) {
    for (int t = 0; t < lengths[n]; ++t) ids[n * 12 + t] = static_cast<float>(1 + (7 * n + t) % 49);
  }
  const std::vector<nn::Label> labels = {4, 0, 2};
  absl::StatusOr<nn::BatchResult> together = (*model)->Evaluate(ids.data(), labels.data(), 3);
  ASSERT_TRUE(together.ok()) << together.status();
  double alone = 0;
  for (int n = 0; n < 3; ++n) {
    absl::StatusOr<nn::BatchResult> one = (*model)->Evaluate(&ids[n * 12], &labels[n], 1);
    ASSERT_TRUE(one.ok()) << one.status();
    alone += one->loss / 3;
  }
  EXPECT_NEAR(together->loss, alone, 1e-6);
  std::fill(ids.begin() + 12, ids.begin() + 24, 0.0f);
  absl::StatusOr<nn::BatchResult> empty = (*model)->TrainStep(ids.data(), labels.data(), 3);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(empty.status().message(),
                                "sample 1 of the batch has sequence length 0, not a whole number "
                                "in [1, 12] (pack_padded_sequence needs at least one step per "
                                "sample)"))
      << empty.status();
  EXPECT_EQ(nn::BatchSampleOf(empty.status()), 1);  // For the trainer to name the data's.
  // Evaluated in pieces of the largest training batch (1): the piece's sample is the batch's.
  ASSERT_TRUE((*model)->TrainStep(ids.data(), labels.data(), 1).ok());
  ASSERT_TRUE((*model)->TrainStep(ids.data() + 24, labels.data() + 2, 1).ok());
  std::vector<float> six(6 * 12, 3.0f);
  std::fill(six.begin() + 4 * 12, six.begin() + 5 * 12, 0.0f);
  const std::vector<nn::Label> six_labels(6, 1);
  absl::StatusOr<nn::BatchResult> pieces = (*model)->Evaluate(six.data(), six_labels.data(), 6);
  EXPECT_TRUE(absl::StrContains(pieces.status().message(), "sample 4 of the batch has sequence"))
      << pieces.status();
  EXPECT_EQ(nn::BatchSampleOf(pieces.status()), 4);
}

// nn.EmbeddingBag's Loop read back as a lookup and a reduction: a dynamic-batch export runs at
// other batch sizes, each sample as alone (the export's offsets were for its batch); a Loop
// whose body is anything else is refused in one line.
TEST(OnnxModelTest, EmbeddingBagsAtAnyBatchSizeOtherLoopsRefused) {
  absl::StatusOr<std::unique_ptr<nn::Model>> model =
      LoadOnnxModel(OnnxPath("text_bag_dynamic"), {});
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<float> ids(5 * 12);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<float>((i * 7) % 50);
  const std::vector<nn::Label> labels = {4, 0, 2, 1, 3};
  absl::StatusOr<nn::BatchResult> together = (*model)->Evaluate(ids.data(), labels.data(), 5);
  ASSERT_TRUE(together.ok()) << together.status();
  double alone = 0;
  for (int n = 0; n < 5; ++n) {
    absl::StatusOr<nn::BatchResult> one = (*model)->Evaluate(&ids[n * 12], &labels[n], 1);
    ASSERT_TRUE(one.ok()) << one.status();
    alone += one->loss / 5;
  }
  EXPECT_NEAR(together->loss, alone, 1e-6);

  onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(ReadBytes(OnnxPath("text_bag"))));
  for (onnx::NodeProto& node : *proto.mutable_graph()->mutable_node()) {
    if (node.op_type() != "Loop") continue;
    for (onnx::NodeProto& inner : *node.mutable_attribute(0)->mutable_g()->mutable_node()) {
      if (inner.op_type() == "ReduceMean") inner.set_op_type("ReduceProd");
    }
    break;
  }
  const std::string path = WriteTemp("prod_bag.onnx", proto.SerializeAsString());
  absl::StatusOr<std::unique_ptr<nn::Model>> prod = LoadOnnxModel(path, {});
  ASSERT_FALSE(prod.ok());
  EXPECT_EQ(prod.status().message(),
            absl::StrCat(path,
                         ": node '/mean/Loop' (Loop): control flow is unsupported (a Loop other "
                         "than nn.EmbeddingBag's of a 2-D input)"));
}

// nn.Embedding's padding_idx, which the export drops, is found as the table's one row of zeros;
// a table with two such rows (or none) has no padding row.
TEST(OnnxImportTest, PaddingRowIsTheTablesOneRowOfZeros) {
  Graph g;
  g.input = "ids";
  Tensor table;
  table.shape = {4, 2};
  table.floats = {0.5f, 1, 0, -0.0f, 2, 3, 4, 5};
  g.constants.push_back({"e.weight", table, /*state=*/true});
  table.floats[4] = table.floats[5] = 0;
  g.constants.push_back({"f.weight", table, /*state=*/true});
  g.nodes = {MakeNode("Gather", "e", {"e.weight", "ids"}, {"a"}),
             MakeNode("Gather", "f", {"f.weight", "ids"}, {"b"})};
  EXPECT_EQ(MarkPaddingRows(g), (std::vector<std::string>{"e.weight (row 1)"}));
  EXPECT_EQ(std::get<int64_t>(g.nodes[0].attributes.at("padding_idx")), 1);
  EXPECT_EQ(g.nodes[1].attributes.count("padding_idx"), 0u);
  ClearPaddingRows(g);  // --onnx_padding_rows=false.
  EXPECT_TRUE(PaddingRows(g).empty());
}

// `op` of the first node that has it in vgg.onnx replaced by `replacement`, written to a file.
std::string VggWithOp(const std::string& op, const std::string& replacement,
                      const std::string& file) {
  onnx::ModelProto model;
  EXPECT_TRUE(model.ParseFromString(ReadBytes(OnnxPath("vgg"))));
  for (onnx::NodeProto& node : *model.mutable_graph()->mutable_node()) {
    if (node.op_type() == op) {
      node.set_op_type(replacement);
      break;
    }
  }
  return WriteTemp(file, model.SerializeAsString());
}

TEST(OnnxImportTest, UnsupportedOpNamesOpAndNode) {
  const std::string path = VggWithOp("Relu", "CumSum", "cumsum.onnx");
  absl::StatusOr<std::unique_ptr<nn::Model>> model = LoadOnnxModel(path, {});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model.status().message(),
            absl::StrCat(path, ": unsupported op 'CumSum' (node '/features/features.2/Relu')"));
}

// A model of several [batch, n] inputs takes one input of their columns side by side; other
// shapes among several inputs are refused in one line.
TEST(OnnxImportTest, SeveralInputsAreColumnsOfOneInput) {
  absl::StatusOr<Graph> text = ReadOnnxGraph(OnnxPath("text_two_inputs"), BuiltinOps());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->input, kMultiInput);
  EXPECT_TRUE(text->input_ids);  // Both int64.
  EXPECT_EQ(text->input_dims, (nn::Dims{24, 1, 1}));
  const std::vector<InputColumns> parts = ConcatenatedInputs(*text);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].name, "input_ids");
  EXPECT_EQ(parts[0].begin, 0);
  EXPECT_EQ(parts[0].end, 12);
  EXPECT_EQ(parts[1].name, "attention_mask");
  EXPECT_EQ(parts[1].begin, 12);
  EXPECT_EQ(parts[1].end, 24);
  absl::StatusOr<Graph> mixed = ReadOnnxGraph(OnnxPath("tabular_two_inputs"), BuiltinOps());
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_FALSE(mixed->input_ids);  // Floats beside int64 codes: floats.
  EXPECT_EQ(mixed->input_dims, (nn::Dims{6, 1, 1}));
  EXPECT_TRUE(ConcatenatedInputs(ReadOnnxGraph(OnnxPath("vgg"), BuiltinOps()).value()).empty());

  onnx::ModelProto model;
  ASSERT_TRUE(model.ParseFromString(ReadBytes(OnnxPath("text_two_inputs"))));
  onnx::TensorShapeProto* shape = model.mutable_graph()
                                      ->mutable_input(1)
                                      ->mutable_type()
                                      ->mutable_tensor_type()
                                      ->mutable_shape();
  shape->add_dim()->set_dim_value(2);
  std::string path = WriteTemp("three_d_mask.onnx", model.SerializeAsString());
  EXPECT_EQ(LoadOnnxModel(path, {}).status().message(),
            absl::StrCat(path,
                         ": graph input 'attention_mask' is [batch, 12, 2]: a model of "
                         "several inputs takes [batch, n] ones (ids, masks, features), read "
                         "side by side from one array"));
  // A name of the importer's own is refused, not confused with its inputs' slices.
  model.mutable_graph()->mutable_input(1)->set_name("dptrain_inputs");
  path = WriteTemp("reserved.onnx", model.SerializeAsString());
  EXPECT_EQ(LoadOnnxModel(path, {}).status().message(),
            absl::StrCat(path,
                         ": the name 'dptrain_inputs' is reserved (names beginning with "
                         "'dptrain_input' are the importer's); rename it"));
  model.mutable_graph()->clear_input();
  path = WriteTemp("no_input.onnx", model.SerializeAsString());
  EXPECT_EQ(LoadOnnxModel(path, {}).status().message(),
            absl::StrCat(path, ": no graph input (besides initializers)"));
}

TEST(OnnxImportTest, UnsupportedAttributeNamesNode) {
  onnx::ModelProto model;
  ASSERT_TRUE(model.ParseFromString(ReadBytes(OnnxPath("vgg"))));
  for (onnx::AttributeProto& a : *model.mutable_graph()->mutable_node(0)->mutable_attribute()) {
    if (a.name() == "group") a.set_i(2);
  }
  const std::string path = WriteTemp("group.onnx", model.SerializeAsString());
  absl::StatusOr<std::unique_ptr<nn::Model>> made = LoadOnnxModel(path, {});
  ASSERT_FALSE(made.ok());
  EXPECT_TRUE(absl::StrContains(made.status().message(),
                                "node '/features/features.0/Conv' (Conv): group 2 does not divide "
                                "the 3 input"))
      << made.status();
  EXPECT_FALSE(absl::StrContains(made.status().message(), "\n"));
}

TEST(OnnxImportTest, TruncatedAndGarbageFilesAreRefused) {
  const std::string bytes = ReadBytes(OnnxPath("vgg"));
  for (size_t size : {bytes.size() / 2, bytes.size() - 1, size_t{10}}) {
    const std::string path = WriteTemp("truncated.onnx", bytes.substr(0, size));
    absl::StatusOr<std::unique_ptr<nn::Model>> model = LoadOnnxModel(path, {});
    ASSERT_FALSE(model.ok()) << size;
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
    EXPECT_TRUE(absl::StartsWith(model.status().message(), path)) << model.status();
  }
  const std::string garbage = WriteTemp("garbage.onnx", "this is not an ONNX model\n");
  absl::StatusOr<std::unique_ptr<nn::Model>> model = LoadOnnxModel(garbage, {});
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();

  EXPECT_EQ(LoadOnnxModel("/nonexistent/model.onnx", {}).status().code(),
            absl::StatusCode::kNotFound);
}

// Names from the file go into error messages: one with a control character (found by
// onnx_import_fuzzer: a graph output named with a newline made a two-line error) is refused
// at once, escaped.
TEST(OnnxImportTest, NamesWithControlCharactersAreRefusedEscaped) {
  const std::string bytes = ReadBytes(OnnxPath("vgg"));
  for (int where = 0; where < 3; ++where) {
    onnx::ModelProto model;
    ASSERT_TRUE(model.ParseFromString(bytes));
    onnx::GraphProto& g = *model.mutable_graph();
    if (where == 0) g.mutable_output(0)->set_name("logits\nnext line");
    if (where == 1) g.mutable_node(1)->set_name("bn\x01");
    if (where == 2) g.mutable_initializer(0)->set_name("w\teight");
    const std::string path = WriteTemp("control.onnx", model.SerializeAsString());
    absl::StatusOr<std::unique_ptr<nn::Model>> made = LoadOnnxModel(path, {});
    ASSERT_FALSE(made.ok()) << where;
    EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(made.status().message());
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_TRUE(absl::StrContains(message, "holds a control character")) << message;
  }
  // A node without outputs (also found by the fuzzer: the import's rewrites read a node's
  // first output).
  {
    onnx::ModelProto model;
    ASSERT_TRUE(model.ParseFromString(bytes));
    model.mutable_graph()->mutable_node(2)->clear_output();
    const std::string message(
        LoadOnnxModel(WriteTemp("no_output.onnx", model.SerializeAsString()), {})
            .status()
            .message());
    EXPECT_TRUE(absl::StrContains(message, "): no output")) << message;
  }
  onnx::ModelProto model;
  ASSERT_TRUE(model.ParseFromString(bytes));
  model.mutable_graph()->mutable_output(0)->set_name("logits\nnext");
  EXPECT_TRUE(absl::StrContains(
      LoadOnnxModel(WriteTemp("c.onnx", model.SerializeAsString()), {}).status().message(),
      "value name 'logits\\nnext' holds a control character"));
}

TEST(OnnxImportTest, ReadingAsecondaryOutputIsRefused) {
  // The first Relu reads the batch norm's running-mean output instead of its result.
  onnx::ModelProto model;
  ASSERT_TRUE(model.ParseFromString(ReadBytes(OnnxPath("vgg"))));
  onnx::GraphProto& g = *model.mutable_graph();
  ASSERT_EQ(g.node(1).op_type(), "BatchNormalization");
  ASSERT_GE(g.node(1).output_size(), 2);
  ASSERT_EQ(g.node(2).op_type(), "Relu");
  g.mutable_node(2)->set_input(0, g.node(1).output(1));
  const std::string path = WriteTemp("secondary.onnx", model.SerializeAsString());
  absl::StatusOr<std::unique_ptr<nn::Model>> made = LoadOnnxModel(path, {});
  ASSERT_FALSE(made.ok());
  EXPECT_TRUE(absl::StrContains(made.status().message(), "which is not computed")) << made.status();
}

// torch.onnx.export's defaults write the model for evaluation: refused with how to export.
TEST(OnnxImportTest, AFileExportedForEvaluationIsRefusedWithHowToExport) {
  const std::string how =
      "export it with torch.onnx.export(model, x, FILE, "
      "training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)";
  {
    // Eval mode without folding: BatchNormalization without training_mode=1 and its outputs.
    onnx::ModelProto model;
    ASSERT_TRUE(model.ParseFromString(ReadBytes(OnnxPath("vgg"))));
    onnx::NodeProto& bn = *model.mutable_graph()->mutable_node(1);
    ASSERT_EQ(bn.op_type(), "BatchNormalization");
    bn.mutable_output()->DeleteSubrange(1, bn.output_size() - 1);
    for (onnx::AttributeProto& a : *bn.mutable_attribute()) {
      if (a.name() == "training_mode") a.set_i(0);
    }
    const std::string path = WriteTemp("eval.onnx", model.SerializeAsString());
    absl::StatusOr<std::unique_ptr<nn::Model>> made = LoadOnnxModel(path, {});
    ASSERT_FALSE(made.ok());
    EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(made.status().message(), "was exported for evaluation"))
        << made.status();
    EXPECT_TRUE(absl::StrContains(made.status().message(), how)) << made.status();
  }
  {
    // Constant folding: the first convolution's weight is a folded constant "onnx::Conv_9".
    onnx::ModelProto model;
    ASSERT_TRUE(model.ParseFromString(ReadBytes(OnnxPath("vgg"))));
    onnx::GraphProto& g = *model.mutable_graph();
    ASSERT_EQ(g.node(0).op_type(), "Conv");
    const std::string old = g.node(0).input(1);
    for (onnx::TensorProto& t : *g.mutable_initializer()) {
      if (t.name() == old) t.set_name("onnx::Conv_9");
    }
    for (onnx::ValueInfoProto& v : *g.mutable_input()) {
      if (v.name() == old) v.set_name("onnx::Conv_9");
    }
    g.mutable_node(0)->set_input(1, "onnx::Conv_9");
    const std::string path = WriteTemp("folded.onnx", model.SerializeAsString());
    absl::StatusOr<std::unique_ptr<nn::Model>> made = LoadOnnxModel(path, {});
    ASSERT_FALSE(made.ok());
    EXPECT_TRUE(absl::StrContains(made.status().message(),
                                  "is 'onnx::Conv_9', not a state_dict "
                                  "name"))
        << made.status();
    EXPECT_TRUE(absl::StrContains(made.status().message(), how)) << made.status();
    EXPECT_EQ(std::string(made.status().message()).find('\n'), std::string::npos);
  }
}

}  // namespace
}  // namespace graph
}  // namespace dptrain
