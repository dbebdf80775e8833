// Our models against PyTorch: fixtures written by tools/make_fixtures.py hold the d2l networks'
// weights (state_dict names), an input batch, and PyTorch's logits, mean cross-entropy loss and
// parameter gradients (computed in float64). We load the weights by name, run a step on the same
// batch and compare. PyTorch is not needed to run this test.
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/nn/model.h"
#include "worker/nn/safetensors.h"

namespace dptrain {
namespace nn {
namespace {

std::string FixturePath(const std::string& model) {
  return absl::StrCat("worker/nn/testdata/", model, "_fixture.safetensors");
}

// ||a - b|| / ||b||.
double RelativeL2Error(const float* a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

class PyTorchParityTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PyTorchParityTest, LossAndGradientsMatchPyTorch) {
  const std::string name = GetParam();
  auto contents = LoadSafetensors(FixturePath(name));
  ASSERT_TRUE(contents.ok()) << contents.status();
  auto created = CreateModel({name, /*seed=*/0, /*threads=*/1});
  ASSERT_TRUE(created.ok()) << created.status();
  Model& model = **created;
  absl::Status loaded = LoadModel(FixturePath(name), model);
  ASSERT_TRUE(loaded.ok()) << loaded;

  const LoadedTensor* input = contents->Find("input");
  const LoadedTensor* label_values = contents->Find("labels");
  const LoadedTensor* logits = contents->Find("logits");
  const LoadedTensor* loss = contents->Find("loss");
  ASSERT_TRUE(input != nullptr && label_values != nullptr && logits != nullptr && loss != nullptr);
  const int batch = static_cast<int>(input->shape[0]);
  ASSERT_EQ(input->shape, (std::vector<int64_t>{batch, 1, 28, 28}));
  ASSERT_EQ(label_values->data.size(), static_cast<size_t>(batch));
  ASSERT_EQ(logits->shape, (std::vector<int64_t>{batch, 10}));
  std::vector<uint8_t> labels;
  int64_t expected_correct = 0;
  for (int i = 0; i < batch; ++i) {
    labels.push_back(static_cast<uint8_t>(label_values->data[i]));
    const float* row = logits->data.data() + 10 * i;
    int argmax = 0;
    for (int c = 1; c < 10; ++c) argmax = row[c] > row[argmax] ? c : argmax;
    expected_correct += argmax == labels[i];
  }

  auto result = model.TrainStep(input->data.data(), labels.data(), batch);
  ASSERT_TRUE(result.ok()) << result.status();
  const double expected_loss = loss->data[0];
  EXPECT_NEAR(result->loss, expected_loss, 1e-5 * std::abs(expected_loss)) << name;
  EXPECT_EQ(result->correct, expected_correct) << name;

  const std::vector<float>& grads = model.grads();
  for (const ParamInfo& p : model.params()) {
    const LoadedTensor* expected = contents->Find("grad." + p.name);
    ASSERT_NE(expected, nullptr) << p.name;
    ASSERT_EQ(expected->shape, p.shape) << p.name;
    const double error = RelativeL2Error(grads.data() + p.offset, expected->data);
    EXPECT_LE(error, 1e-4) << name << " gradient of " << p.name;
    std::cout << name << " " << p.name << ": relative L2 error of the gradient " << error
              << std::endl;
  }

  // Evaluation mode gives the same loss for these networks (no dropout or batch norm).
  auto eval = model.Evaluate(input->data.data(), labels.data(), batch);
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_NEAR(eval->loss, expected_loss, 1e-5 * std::abs(expected_loss)) << name;
  EXPECT_EQ(eval->correct, expected_correct) << name;
}

INSTANTIATE_TEST_SUITE_P(Models, PyTorchParityTest, ::testing::Values("mlp", "lenet"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace nn
}  // namespace dptrain
