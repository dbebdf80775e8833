#include "worker/nn/softmax_cross_entropy.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "worker/nn/layer_check.h"

namespace dptrain {
namespace nn {
namespace {

// Mean of -log(exp(z_label) / sum_j exp(z_j)), straight from the definition (small logits only).
double DirectLoss(const std::vector<double>& z, const std::vector<nn::Label>& labels, int classes) {
  const int batch = static_cast<int>(labels.size());
  double total = 0;
  for (int i = 0; i < batch; ++i) {
    double sum = 0;
    for (int j = 0; j < classes; ++j) sum += std::exp(z[i * classes + j]);
    total += -std::log(std::exp(z[i * classes + labels[i]]) / sum);
  }
  return total / batch;
}

TEST(SoftmaxCrossEntropyTest, LossAndGradientMatchDefinition) {
  const int batch = 5, classes = 7;
  std::vector<double> z = RandomVector(batch * classes, 3.0, 11);
  const std::vector<nn::Label> labels = {0, 6, 3, 3, 1};
  std::vector<double> grad(z.size());
  const LossOutput out = SoftmaxCrossEntropy(z.data(), labels.data(), batch, classes, grad.data());
  EXPECT_NEAR(out.loss, DirectLoss(z, labels, classes), 1e-12);

  std::vector<double> numeric;
  const double h = 1e-6;
  for (size_t i = 0; i < z.size(); ++i) {
    const double saved = z[i];
    z[i] = saved + h;
    const double plus = DirectLoss(z, labels, classes);
    z[i] = saved - h;
    const double minus = DirectLoss(z, labels, classes);
    z[i] = saved;
    numeric.push_back((plus - minus) / (2 * h));
  }
  ExpectAllClose("gradient", grad, numeric, 1e-7);

  std::vector<float> zf(z.begin(), z.end()), gradf(z.size());
  const LossOutput outf =
      SoftmaxCrossEntropy(zf.data(), labels.data(), batch, classes, gradf.data());
  EXPECT_NEAR(outf.loss, out.loss, 1e-6);
  EXPECT_EQ(outf.correct, out.correct);
  ExpectAllClose("float gradient", std::vector<double>(gradf.begin(), gradf.end()), grad, 1e-6);
}

// Labels past a byte (ImageNet's 1,000 classes): each row's own class is the one that counts.
TEST(SoftmaxCrossEntropyTest, ThousandClasses) {
  const int batch = 3, classes = 1000;
  std::vector<double> z = RandomVector(batch * classes, 3.0, 5);
  const std::vector<Label> labels = {999, 300, 256};
  z[2 * classes + 256] = 40.0;  // Row 2 predicts its class; rows 0 and 1 (almost surely) not.
  std::vector<double> grad(z.size());
  const LossOutput out = SoftmaxCrossEntropy(z.data(), labels.data(), batch, classes, grad.data());
  EXPECT_NEAR(out.loss, DirectLoss(z, labels, classes), 1e-12);
  EXPECT_EQ(out.correct, 1);
  for (int r = 0; r < batch; ++r) {  // p - onehot: negative only at the label.
    EXPECT_LT(grad[r * classes + labels[r]], 0.0) << r;
    EXPECT_GT(grad[r * classes + (labels[r] + 1) % classes], 0.0) << r;
  }
}

// nn.CrossEntropyLoss(label_smoothing=0.1) in float64, from Debian's torch 1.13:
//   z = torch.tensor([[1.5, -0.25, 0.75, 2.0], [0.1, 0.2, -3.0, 0.4], [-1.0, 0.5, 0.5, 0.0]],
//                    dtype=torch.float64, requires_grad=True)
//   loss = F.cross_entropy(z, torch.tensor([3, 0, 2]), label_smoothing=0.1); loss.backward()
TEST(SoftmaxCrossEntropyTest, LabelSmoothingMatchesPyTorch) {
  const std::vector<double> z = {1.5, -0.25, 0.75, 2.0, 0.1, 0.2, -3.0, 0.4, -1.0, 0.5, 0.5, 0.0};
  const std::vector<nn::Label> labels = {3, 0, 2};
  std::vector<double> grad(z.size());
  const LossOutput out = SoftmaxCrossEntropy(z.data(), labels.data(), 3, 4, grad.data(), 0.1);
  EXPECT_NEAR(out.loss, 1.0676021955446064, 1e-14);
  const std::vector<double> torch_grad = {
      0.09283428974658847,  0.009246963478772944, 0.03945486802993165,  -0.14153612125529305,
      -0.21309738574871706, 0.09691866629256131,  -0.00404302985545169, 0.12022174931160753,
      0.01795134344751438,  0.10946641531276062,  -0.1905335846872394,  0.06311582592696442};
  ExpectAllClose("gradient", grad, torch_grad, 1e-14);
  EXPECT_EQ(out.correct, 1);  // Row 0 (row 2's first maximum is class 1, not its label 2).
  // Smoothing 0 is the plain loss.
  const LossOutput plain = SoftmaxCrossEntropy(z.data(), labels.data(), 3, 4, grad.data(), 0.0);
  EXPECT_EQ(plain.loss, SoftmaxCrossEntropy(z.data(), labels.data(), 3, 4, grad.data()).loss);
}

// nn.CrossEntropyLoss(weight=w) with and without label_smoothing=0.1, float64, from Debian's
// torch 1.13 (z and labels as above):
//   w = torch.tensor([0.5, 2.0, 1.0, 0.25], dtype=torch.float64)
//   loss = F.cross_entropy(z, torch.tensor([3, 0, 2]), weight=w, label_smoothing=eps)
TEST(SoftmaxCrossEntropyTest, ClassWeightsMatchPyTorch) {
  const std::vector<double> z = {1.5, -0.25, 0.75, 2.0, 0.1, 0.2, -3.0, 0.4, -1.0, 0.5, 0.5, 0.0};
  const std::vector<nn::Label> labels = {3, 0, 2};
  const double w[4] = {0.5, 2.0, 1.0, 0.25};
  std::vector<double> grad(z.size());
  LossOutput out = SoftmaxCrossEntropy(z.data(), labels.data(), 3, 4, grad.data(), 0.0, w);
  EXPECT_NEAR(out.loss, 1.0512232377492103, 1e-14);
  EXPECT_DOUBLE_EQ(out.weight, 0.25 + 0.5 + 1.0);
  ExpectAllClose(
      "gradient", grad,
      {0.04335755274853791, 0.007534412919474117, 0.02048065772711356, -0.07137262339512558,
       -0.20408347349890035, 0.09021599967933824, 0.0036774029810414076, 0.1101900708385207,
       0.04505944591002465, 0.20194242625044673, -0.36948614517812467, 0.12248427301765327},
      1e-14);
  out = SoftmaxCrossEntropy(z.data(), labels.data(), 3, 4, grad.data(), 0.1, w);
  EXPECT_NEAR(out.loss, 1.2445994811153867, 1e-14);
  ExpectAllClose(
      "smoothed gradient", grad,
      {0.0481380226115287, -0.018965052099099072, 0.011827124316355506, -0.041000094828785125,
       -0.1755122060014827, 0.06953847107985177, -0.010286538543831757, 0.11626027346546271,
       0.037634967230229854, 0.1721088575149529, -0.32789114248504714, 0.11814731773986438},
      1e-14);
  EXPECT_EQ(out.correct, 1);
  // Weights of one throughout are the unweighted loss; labels that all weigh 0: loss and
  // gradient 0 (PyTorch: NaN).
  const double ones[4] = {1, 1, 1, 1};
  std::vector<double> plain_grad(z.size());
  const LossOutput plain = SoftmaxCrossEntropy(z.data(), labels.data(), 3, 4, plain_grad.data());
  EXPECT_NEAR(SoftmaxCrossEntropy(z.data(), labels.data(), 3, 4, grad.data(), 0.0, ones).loss,
              plain.loss, 1e-15);
  ExpectAllClose("ones", grad, plain_grad, 1e-15);
  const double zero_for_labels[4] = {0, 1, 0, 0};
  out = SoftmaxCrossEntropy(z.data(), labels.data(), 3, 4, grad.data(), 0.1, zero_for_labels);
  EXPECT_EQ(out.loss, 0);
  for (double g : grad) EXPECT_EQ(g, 0);
}

TEST(SoftmaxCrossEntropyTest, CountsCorrectWithFirstMaximumOnTies) {
  const std::vector<float> z = {0, 5, 1,   // argmax 1
                                2, 2, 1,   // tie: argmax 0
                                1, 1, 9};  // argmax 2
  const std::vector<nn::Label> labels = {1, 1, 0};
  EXPECT_EQ(
      SoftmaxCrossEntropy(z.data(), labels.data(), 3, 3, static_cast<float*>(nullptr)).correct, 1);
  const std::vector<nn::Label> labels2 = {1, 0, 2};
  EXPECT_EQ(
      SoftmaxCrossEntropy(z.data(), labels2.data(), 3, 3, static_cast<float*>(nullptr)).correct, 3);
}

TEST(SoftmaxCrossEntropyTest, LargeLogitsAreStable) {
  const std::vector<float> z = {1000, 0, -1000, 1e30f, 1e30f, -1e30f};
  const std::vector<nn::Label> labels = {1, 0};
  std::vector<float> grad(6);
  const LossOutput out = SoftmaxCrossEntropy(z.data(), labels.data(), 2, 3, grad.data());
  // Row 0: loss 1000; row 1: log 2.
  EXPECT_NEAR(out.loss, (1000 + std::log(2.0)) / 2, 1e-9);
  for (float g : grad) EXPECT_TRUE(std::isfinite(g));
  EXPECT_FLOAT_EQ(grad[0], 0.5f);
  EXPECT_FLOAT_EQ(grad[1], -0.5f);
  EXPECT_FLOAT_EQ(grad[3], -0.25f);
  EXPECT_FLOAT_EQ(grad[4], 0.25f);
  EXPECT_EQ(grad[5], 0.0f);
}

TEST(SoftmaxCrossEntropyTest, UniformLogitsGiveLogClasses) {
  const std::vector<float> z(20, 0.0f);
  const std::vector<nn::Label> labels = {3, 9};
  std::vector<float> grad(20);
  const LossOutput out = SoftmaxCrossEntropy(z.data(), labels.data(), 2, 10, grad.data());
  EXPECT_NEAR(out.loss, std::log(10.0), 1e-12);
  EXPECT_FLOAT_EQ(grad[0], 0.05f);
  EXPECT_FLOAT_EQ(grad[3], -0.45f);
  EXPECT_FLOAT_EQ(grad[19], -0.45f);
}

}  // namespace
}  // namespace nn
}  // namespace dptrain
