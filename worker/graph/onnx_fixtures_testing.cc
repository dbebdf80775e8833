#include "worker/graph/onnx_fixtures_testing.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/graph/executor.h"
#include "worker/graph/graph_check.h"
#include "worker/graph/graph_model.h"
#include "worker/graph/op_registry.h"
#include "worker/nn/layer_check.h"
#include "worker/nn/softmax_cross_entropy.h"

namespace dptrain {
namespace graph {
namespace testing_fixtures {

std::string OnnxPath(const std::string& model, const std::string& dir) {
  return absl::StrCat(dir, "/", model, ".onnx");
}

std::string ReferencePath(const std::string& model, const std::string& dir) {
  return absl::StrCat(dir, "/", model, "_reference.safetensors");
}

std::vector<double> ToDouble(const float* data, int64_t n) {
  return std::vector<double>(data, data + n);
}

Batch ReferenceBatch(const SafetensorsContents& ref) {
  Batch b;
  b.images = ref.Find("input")->data;
  b.size = static_cast<int>(ref.Find("input")->shape[0]);
  if (const LoadedTensor* targets = ref.Find("targets"); targets != nullptr) {
    b.targets = targets->data;
    return b;
  }
  for (float l : ref.Find("labels")->data) b.labels.push_back(static_cast<nn::Label>(l));
  return b;
}

// Expects the model's gradients equal `prefix` + name of `ref` for every parameter, and that
// the model has exactly PyTorch's parameters.
void ExpectGradientsMatch(nn::Model& model, const SafetensorsContents& ref,
                          const std::string& prefix) {
  std::set<std::string> torch_params;
  for (const LoadedTensor& t : ref.tensors) {
    if (absl::StartsWith(t.name, prefix)) torch_params.insert(t.name.substr(prefix.size()));
  }
  std::set<std::string> ours;
  for (const nn::ParamInfo& p : model.params()) {
    ours.insert(p.name);
    const LoadedTensor* expected = ref.Find(prefix + p.name);
    ASSERT_NE(expected, nullptr) << p.name;
    EXPECT_EQ(p.shape, expected->shape) << p.name;
    // Per tensor: the relative L2 error (the measure of worker/nn/pytorch_parity_test) at most
    // 1e-4, and every element within 1e-3 of the tensor's largest gradient, with an absolute
    // floor for gradients that are zero up to rounding (a convolution's bias before a batch
    // norm: its sum over the batch cancels).
    double scale = 1e-2, diff = 0, norm = 0, worst = 0;
    for (float e : expected->data) scale = std::max(scale, std::abs(static_cast<double>(e)));
    for (int64_t i = 0; i < p.size; ++i) {
      const double e = expected->data[i];
      const double d = model.grads()[p.offset + i] - e;
      diff += d * d;
      norm += e * e;
      worst = std::max(worst, std::abs(d) / scale);
    }
    // (Skipped for a gradient that is zero up to rounding: no relative error to speak of.)
    if (std::sqrt(norm / p.size) > 1e-6) {
      EXPECT_LE(std::sqrt(diff / norm), 1e-4) << p.name << ": relative L2 error of the gradient";
    }
    EXPECT_LE(worst, 1e-3) << p.name << ": largest error relative to the largest gradient";
  }
  EXPECT_EQ(ours, torch_params);
}

double FloatLossTolerance(const SafetensorsContents& ref) {
  const double loss = ref.Find("loss")->data[0];
  const double tolerance = 1e-5 * std::max(1.0, std::abs(loss));
  const LoadedTensor* float32 = ref.Find("float32_loss");
  if (float32 == nullptr) return tolerance;
  return std::max(tolerance, 2 * std::abs(float32->data[0] - loss));
}

void ExpectTrainStepMatches(nn::Model& model, const SafetensorsContents& ref) {
  const Batch batch = ReferenceBatch(ref);
  absl::StatusOr<nn::BatchResult> step =
      model.TrainStep(batch.images.data(), batch.scored(), batch.size);
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_NEAR(step->loss, ref.Find("loss")->data[0], FloatLossTolerance(ref));
  ExpectGradientsMatch(model, ref, "grad.");
  for (const nn::ParamInfo& b : model.buffers()) {
    const LoadedTensor* after = ref.Find("after." + b.name);
    ASSERT_NE(after, nullptr) << b.name;
    nn::ExpectAllClose("after " + b.name, ToDouble(model.buffer_values().data() + b.offset, b.size),
                       ToDouble(after->data.data(), static_cast<int64_t>(after->data.size())),
                       1e-5);
  }
}

void ExpectDoubleStepMatches(const Graph& graph, const SafetensorsContents& ref) {
  const OpRegistry registry = BuiltinOps();
  absl::StatusOr<std::unique_ptr<Executor<double>>> made =
      Executor<double>::Create(WithoutDropout(graph), registry);
  ASSERT_TRUE(made.ok()) << made.status();
  Executor<double>& e = **made;
  std::vector<double> params = e.initial_params();
  std::vector<double> grads(params.size());
  std::vector<double> buffers = e.initial_buffers();
  e.Bind(params.data(), grads.data(), buffers.data());
  const Batch batch = ReferenceBatch(ref);
  const int n = batch.size;
  const std::vector<double> input(batch.images.begin(), batch.images.end());
  const nn::TensorRef<double> logits = ForwardOk(e, input.data(), n, /*training=*/true);
  ASSERT_NE(logits.data, nullptr);
  const int classes = static_cast<int>(logits.dims.size());
  std::vector<double> grad_logits(logits.size());
  nn::LossOutput loss;
  if (batch.regression()) {  // nn.MSELoss: the mean of (y - t)^2 over batch x outputs.
    ASSERT_EQ(static_cast<int64_t>(batch.targets.size()), logits.size());
    for (int64_t k = 0; k < logits.size(); ++k) {
      const double d = logits.data[k] - double{batch.targets[k]};
      loss.loss += d * d / static_cast<double>(logits.size());
      grad_logits[k] = 2 * d / static_cast<double>(logits.size());
    }
  } else {
    loss =
        nn::SoftmaxCrossEntropy(logits.data, batch.labels.data(), n, classes, grad_logits.data());
  }
  const double expected_loss = ref.Find("loss")->data[0];
  // The reference holds float32s: the loss rounded to 6e-8 of itself.
  EXPECT_NEAR(loss.loss, expected_loss, 1e-7 * std::max(1.0, std::abs(expected_loss)));
  e.Backward({grad_logits.data(), n, logits.dims}, /*need_input_grad=*/false);
  for (const nn::ParamInfo& p : e.params()) {
    const LoadedTensor* expected = ref.Find("grad." + p.name);
    ASSERT_NE(expected, nullptr) << p.name;
    double diff = 0, norm = 0;
    for (int64_t i = 0; i < p.size; ++i) {
      const double d = grads[p.offset + i] - expected->data[i];
      diff += d * d;
      norm += double{expected->data[i]} * expected->data[i];
    }
    if (std::sqrt(norm / p.size) <= 1e-9) continue;
    // The reference is float64 rounded to float32: 6e-8 relative at best.
    EXPECT_LE(std::sqrt(diff / norm), 1e-7) << p.name << ": relative L2 error (double)";
  }
  for (const nn::ParamInfo& b : e.buffers()) {
    const LoadedTensor* after = ref.Find("after." + b.name);
    ASSERT_NE(after, nullptr) << b.name;
    nn::ExpectAllClose(
        "after " + b.name + " (double)",
        std::vector<double>(buffers.begin() + b.offset, buffers.begin() + b.offset + b.size),
        ToDouble(after->data.data(), static_cast<int64_t>(after->data.size())), 1e-7);
  }
}

}  // namespace testing_fixtures
}  // namespace graph
}  // namespace dptrain
