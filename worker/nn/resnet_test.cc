// ResNet: the state_dict names of resnet18 against PyTorch's (a checked-in fixture), gradients of
// a small ResNet against double-precision finite differences, and resnet18 through the Model API:
// training steps, learning and batch-norm buffers.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "worker/graph/builtin_models.h"
#include "worker/nn/architectures.h"
#include "worker/nn/init.h"
#include "worker/nn/layer_check.h"
#include "worker/nn/model.h"
#include "worker/nn/safetensors.h"
#include "worker/nn/softmax_cross_entropy.h"

namespace dptrain {
namespace nn {
namespace {

constexpr int kImage = 28 * 28;

std::string Line(const std::string& kind, const ParamInfo& p) {
  std::vector<std::string> dims;
  for (int64_t d : p.shape) dims.push_back(std::to_string(d));
  return kind + " " + p.name + " " + (dims.empty() ? "scalar" : absl::StrJoin(dims, "x"));
}

// testdata/resnet18_state_dict.txt, printed by testdata/resnet18_names.py from d2l's PyTorch code.
TEST(ResNetTest, StateDictAsPyTorch) {
  std::ifstream file("worker/nn/testdata/resnet18_state_dict.txt");
  ASSERT_TRUE(file.good());
  std::vector<std::string> expected_params, expected_buffers;
  int64_t expected_total = -1;
  std::string line;
  while (std::getline(file, line)) {
    if (line.rfind("param ", 0) == 0) expected_params.push_back(line);
    if (line.rfind("buffer ", 0) == 0) expected_buffers.push_back(line);
    if (line.rfind("total_params ", 0) == 0) expected_total = std::stoll(line.substr(13));
  }
  absl::StatusOr<std::unique_ptr<Model>> model = graph::CreateBuiltinModel({"resnet18"});
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<std::string> params, buffers;
  int64_t offset = 0;
  for (const ParamInfo& p : (*model)->params()) {
    params.push_back(Line("param", p));
    EXPECT_EQ(p.offset, offset) << p.name;
    offset += p.size;
  }
  EXPECT_EQ(offset, 11175818);
  EXPECT_EQ(offset, expected_total);
  EXPECT_EQ(static_cast<int64_t>((*model)->weights().size()), offset);
  offset = 0;
  for (const ParamInfo& p : (*model)->buffers()) {
    buffers.push_back(Line("buffer", p));
    EXPECT_EQ(p.offset, offset) << p.name;
    offset += p.size;
  }
  EXPECT_EQ(static_cast<int64_t>((*model)->buffer_values().size()), offset);
  EXPECT_EQ(params, expected_params);
  EXPECT_EQ(buffers, expected_buffers);
  EXPECT_EQ(params.size(), 76u);
  EXPECT_EQ(buffers.size(), 51u);
}

// A small ResNet (two stages of one Residual, 7x7 input: odd sizes and a stride-2 projection) in
// double: gradients of the mean cross-entropy against central differences, and the float network
// against the double one.
TEST(ResNetTest, SmallResNetGradientsMatchFiniteDifferences) {
  const ResNetConfig config{{2, 7, 7}, {3, 4}, 1, kNumClasses};
  absl::StatusOr<Sequential<double>> net = BuildResNet<double>(config);
  ASSERT_TRUE(net.ok()) << net.status();
  absl::StatusOr<Sequential<float>> netf = BuildResNet<float>(config);
  ASSERT_TRUE(netf.ok()) << netf.status();
  ASSERT_EQ(net->output_dims(), (Dims{kNumClasses, 1, 1}));
  const int batch = 3;
  std::vector<double> params = RandomVector(net->num_params(), 0.5, 3);
  std::vector<double> grads(params.size()), buffers(net->num_buffers());
  const std::vector<double> images = RandomVector(batch * config.input.size(), 1.0, 4);
  const std::vector<nn::Label> labels = {1, 7, 3};
  net->BindParams(params.data(), grads.data());
  net->InitBuffers(buffers.data());
  net->BindBuffers(buffers.data());
  auto loss = [&](double* grad_logits) {
    TensorRef<double> logits = net->Forward(images.data(), batch, true);
    return SoftmaxCrossEntropy(logits.data, labels.data(), batch, kNumClasses, grad_logits).loss;
  };
  std::vector<double> grad_logits(batch * kNumClasses);
  loss(grad_logits.data());
  net->Backward({grad_logits.data(), batch, {kNumClasses, 1, 1}});

  std::vector<double> numeric, analytic;
  std::mt19937_64 rng(5);
  for (int k = 0; k < 300; ++k) {
    const int64_t i = static_cast<int64_t>(rng() % params.size());
    const double saved = params[i];
    params[i] = saved + 1e-6;
    const double plus = loss(nullptr);
    params[i] = saved - 1e-6;
    const double minus = loss(nullptr);
    params[i] = saved;
    numeric.push_back((plus - minus) / 2e-6);
    analytic.push_back(grads[i]);
  }
  ExpectAllClose("double gradient vs finite differences", analytic, numeric, 1e-6);

  std::vector<float> paramsf(params.begin(), params.end()), gradsf(params.size());
  std::vector<float> buffersf(net->num_buffers());
  const std::vector<float> imagesf(images.begin(), images.end());
  netf->BindParams(paramsf.data(), gradsf.data());
  netf->InitBuffers(buffersf.data());
  netf->BindBuffers(buffersf.data());
  TensorRef<float> logits = netf->Forward(imagesf.data(), batch, true);
  std::vector<float> grad_logitsf(batch * kNumClasses);
  SoftmaxCrossEntropy(logits.data, labels.data(), batch, kNumClasses, grad_logitsf.data());
  netf->Backward({grad_logitsf.data(), batch, {kNumClasses, 1, 1}});
  ExpectAllClose("float gradient", std::vector<double>(gradsf.begin(), gradsf.end()), grads, 1e-4);
  // Each training forward counts in num_batches_tracked (after the stem's 3-channel running
  // mean and variance): 1 + 2 * 300 of the double net, 1 of the float one.
  EXPECT_EQ(buffers[2 * 3], 601);
  EXPECT_EQ(buffersf[2 * 3], 1);
}

// ||a - b|| / max(||b||, floor).
double RelativeError(const float* a, const std::vector<float>& b, double floor) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    norm += double{b[i]} * b[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), floor);
}

// testdata/small_resnet_fixture.safetensors (made by small_resnet_fixture.py with PyTorch): the
// same small ResNet with randomised batch-norm state, one training step and one evaluation.
TEST(ResNetTest, SmallResNetMatchesPyTorch) {
  absl::StatusOr<SafetensorsContents> fixture =
      LoadSafetensors("worker/nn/testdata/small_resnet_fixture.safetensors");
  ASSERT_TRUE(fixture.ok()) << fixture.status();
  absl::StatusOr<Sequential<float>> net = BuildResNet<float>({{2, 9, 9}, {4, 8}, 2, kNumClasses});
  ASSERT_TRUE(net.ok()) << net.status();
  std::vector<float> params(net->num_params()), grads(net->num_params());
  std::vector<float> buffers(net->num_buffers());
  struct Named {
    std::string name;
    float* data;
    int64_t size;
  };
  std::vector<Named> named_params, named_buffers;
  for (int i = 0; i < net->num_layers(); ++i) {
    int64_t offset = net->param_offset(i);
    for (const TensorSpec& spec : net->layer(i).ParamSpecs()) {
      named_params.push_back({absl::StrCat(i, ".", spec.name), &params[offset], spec.size()});
      offset += spec.size();
    }
    offset = net->buffer_offset(i);
    for (const TensorSpec& spec : net->layer(i).BufferSpecs()) {
      named_buffers.push_back({absl::StrCat(i, ".", spec.name), &buffers[offset], spec.size()});
      offset += spec.size();
    }
  }
  for (const std::vector<Named>* list : {&named_params, &named_buffers}) {
    for (const Named& t : *list) {
      const LoadedTensor* value = fixture->Find(t.name);
      ASSERT_NE(value, nullptr) << t.name;
      ASSERT_EQ(static_cast<int64_t>(value->data.size()), t.size) << t.name;
      std::copy(value->data.begin(), value->data.end(), t.data);
    }
  }
  net->BindParams(params.data(), grads.data());
  net->BindBuffers(buffers.data());

  const LoadedTensor* input = fixture->Find("input");
  const LoadedTensor* label_values = fixture->Find("labels");
  ASSERT_TRUE(input != nullptr && label_values != nullptr);
  const int batch = static_cast<int>(input->shape[0]);
  std::vector<nn::Label> labels;
  for (float v : label_values->data) labels.push_back(static_cast<nn::Label>(v));
  TensorRef<float> logits = net->Forward(input->data.data(), batch, /*training=*/true);
  EXPECT_LE(RelativeError(logits.data, fixture->Find("logits")->data, 0), 1e-5);
  std::vector<float> grad_logits(batch * kNumClasses);
  const LossOutput loss =
      SoftmaxCrossEntropy(logits.data, labels.data(), batch, kNumClasses, grad_logits.data());
  EXPECT_NEAR(loss.loss, fixture->Find("loss")->data[0], 1e-5);
  net->Backward({grad_logits.data(), batch, {kNumClasses, 1, 1}});

  // Convolution biases feeding a batch norm have a zero gradient in exact arithmetic; their
  // float noise is measured against the typical gradient size instead.
  double grad_scale = 0;
  for (const Named& t : named_params) {
    grad_scale = std::max(grad_scale, RelativeError(t.data, std::vector<float>(t.size), 1.0));
  }
  for (const Named& t : named_params) {
    const LoadedTensor* expected = fixture->Find("grad." + t.name);
    ASSERT_NE(expected, nullptr) << t.name;
    EXPECT_LE(
        RelativeError(grads.data() + (t.data - params.data()), expected->data, 1e-3 * grad_scale),
        1e-4)
        << "gradient of " << t.name;
  }
  for (const Named& t : named_buffers) {
    const LoadedTensor* expected = fixture->Find("after." + t.name);
    ASSERT_NE(expected, nullptr) << t.name;
    EXPECT_LE(RelativeError(t.data, expected->data, 0), 1e-5) << t.name;
  }
  TensorRef<float> eval = net->Forward(input->data.data(), batch, /*training=*/false);
  EXPECT_LE(RelativeError(eval.data, fixture->Find("eval_logits")->data, 0), 1e-5);
}

std::unique_ptr<Model> MustCreate(const ModelOptions& options) {
  absl::StatusOr<std::unique_ptr<Model>> model = graph::CreateBuiltinModel(options);
  EXPECT_TRUE(model.ok()) << model.status();
  return *std::move(model);
}

// Smooth random images (7x7 blocks of 4x4 pixels) for labels 0..n-1.
void MakeBatch(int n, std::vector<float>* images, std::vector<nn::Label>* labels) {
  std::mt19937_64 rng(11);
  images->assign(n * kImage, 0.0f);
  labels->clear();
  for (int i = 0; i < n; ++i) {
    labels->push_back(static_cast<nn::Label>(i % kNumClasses));
    float blocks[7][7];
    for (auto& row : blocks) {
      for (float& b : row) b = (rng() & 1) ? 1.0f : -1.0f;
    }
    for (int p = 0; p < kImage; ++p) (*images)[i * kImage + p] = blocks[p / 28 / 4][p % 28 / 4];
  }
}

TEST(ResNetTest, Resnet18TrainsAndKeepsBuffersLocal) {
  auto model = MustCreate({"resnet18", 3, 0});
  EXPECT_EQ(model->name(), "resnet18");
  std::vector<float> images;
  std::vector<nn::Label> labels;
  MakeBatch(4, &images, &labels);

  // Fresh buffers: running_mean 0, running_var 1, num_batches_tracked 0.
  const std::vector<ParamInfo>& buffers = model->buffers();
  ASSERT_EQ(buffers[0].name, "0.1.running_mean");
  const std::vector<float> initial = model->buffer_values();
  for (const ParamInfo& b : buffers) {
    const float want = b.name.find("running_var") != std::string::npos ? 1.0f : 0.0f;
    for (int64_t i = 0; i < b.size; ++i) ASSERT_EQ(initial[b.offset + i], want) << b.name;
  }

  // Evaluation reads but does not change the buffers, nor the gradients.
  absl::StatusOr<BatchResult> eval0 = model->Evaluate(images.data(), labels.data(), 2);
  ASSERT_TRUE(eval0.ok()) << eval0.status();
  EXPECT_EQ(model->buffer_values(), initial);
  for (float g : model->grads()) ASSERT_EQ(g, 0.0f);

  // Batch 2 training steps with plain SGD: the loss on the batch goes down, and every batch norm
  // counts the steps in its num_batches_tracked.
  const float lr = 0.05f;
  std::vector<double> losses;
  for (int step = 0; step < 6; ++step) {
    absl::StatusOr<BatchResult> r = model->TrainStep(images.data(), labels.data(), 2);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(std::isfinite(r->loss));
    losses.push_back(r->loss);
    std::vector<float>& w = model->weights();
    for (size_t i = 0; i < w.size(); ++i) w[i] -= lr * model->grads()[i];
  }
  EXPECT_LT(losses.back(), 0.5 * losses.front()) << absl::StrJoin(losses, ", ");
  for (const ParamInfo& b : buffers) {
    if (b.name.find("num_batches_tracked") != std::string::npos) {
      EXPECT_EQ(model->buffer_values()[b.offset], 6.0f) << b.name;
    }
  }
  EXPECT_NE(model->buffer_values(), initial);

  // Evaluate uses the running statistics: changing them changes its result (but not TrainStep's),
  // and restoring them restores it exactly.
  const std::vector<float> trained = model->buffer_values();
  absl::StatusOr<BatchResult> eval1 = model->Evaluate(images.data(), labels.data(), 2);
  ASSERT_TRUE(eval1.ok());
  EXPECT_EQ(model->buffer_values(), trained);
  model->buffer_values() = initial;  // New storage, as a checkpoint loader might assign.
  absl::StatusOr<BatchResult> eval2 = model->Evaluate(images.data(), labels.data(), 2);
  ASSERT_TRUE(eval2.ok());
  EXPECT_NE(eval2->loss, eval1->loss);
  model->buffer_values() = trained;
  absl::StatusOr<BatchResult> eval3 = model->Evaluate(images.data(), labels.data(), 2);
  ASSERT_TRUE(eval3.ok());
  EXPECT_EQ(eval3->loss, eval1->loss);

  model->buffer_values().pop_back();
  EXPECT_EQ(model->Evaluate(images.data(), labels.data(), 2).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ResNetTest, Resnet18BatchOneAndFourMatchShapes) {
  auto model = MustCreate({"resnet18", 1, 0});
  std::vector<float> images;
  std::vector<nn::Label> labels;
  MakeBatch(4, &images, &labels);
  absl::StatusOr<BatchResult> r = model->TrainStep(images.data(), labels.data(), 4);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->loss, std::log(10.0), 1.5);
  r = model->TrainStep(images.data(), labels.data(), 1);
  ASSERT_TRUE(r.ok()) << r.status();
  r = model->Evaluate(images.data(), labels.data(), 1);
  ASSERT_TRUE(r.ok()) << r.status();
}

TEST(ResNetTest, Initialisation) {
  auto a = MustCreate({"resnet18", 5, 0}), b = MustCreate({"resnet18", 5, 0});
  EXPECT_EQ(a->weights(), b->weights());
  for (const ParamInfo& p : a->params()) {
    const float* v = a->weights().data() + p.offset;
    const bool is_bias = p.name.size() >= 4 && p.name.substr(p.name.size() - 4) == "bias";
    if (is_bias || p.shape.size() == 1) {
      const float want = is_bias ? 0.0f : 1.0f;  // Batch-norm weights are 1.
      for (int64_t i = 0; i < p.size; ++i) ASSERT_EQ(v[i], want) << p.name;
      continue;
    }
    const double bound = XavierUniformBound(p.shape);
    double max_abs = 0;
    for (int64_t i = 0; i < p.size; ++i) max_abs = std::max(max_abs, std::abs(double{v[i]}));
    EXPECT_LE(max_abs, bound) << p.name;
    EXPECT_GT(max_abs, 0.9 * bound) << p.name;
  }

  ModelOptions kaiming{"resnet18", 5, 0, "kaiming"};
  auto k = MustCreate(kaiming);
  const ParamInfo& conv = k->params()[6];  // 1.0.conv2.weight [64, 64, 3, 3]: fan_out 576.
  ASSERT_EQ(conv.name, "1.0.conv2.weight");
  double sq = 0;
  for (int64_t i = 0; i < conv.size; ++i) sq += std::pow(k->weights()[conv.offset + i], 2);
  EXPECT_NEAR(std::sqrt(sq / conv.size), std::sqrt(2.0 / 576), 0.002);

  auto n = MustCreate({"lenet", 5, 0, "normal"});
  EXPECT_LT(std::abs(n->weights()[0]), 0.06);
  absl::StatusOr<std::unique_ptr<Model>> bad = graph::CreateBuiltinModel({"mlp", 0, 0, "uniform"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "unknown init 'uniform' (expected default, normal, xavier or kaiming)");
}

}  // namespace
}  // namespace nn
}  // namespace dptrain
