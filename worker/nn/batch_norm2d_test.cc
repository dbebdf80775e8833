#include "worker/nn/batch_norm2d.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "worker/nn/layer_check.h"

namespace dptrain {
namespace nn {
namespace {

// gamma * (x - mean) / sqrt(var + eps) + beta per channel, with the batch's statistics (biased
// variance) if `running` is null, else with running = {mean[0..c), var[0..c)}.
ReferenceForward DirectBatchNorm(const Dims& in, const std::vector<double>* running,
                                 double eps = 1e-5) {
  return [in, running, eps](const std::vector<double>& x, const std::vector<double>& p, int batch) {
    const int64_t plane = int64_t{in.h} * in.w;
    std::vector<double> y(x.size());
    for (int c = 0; c < in.c; ++c) {
      double mean = 0, var = 0;
      if (running != nullptr) {
        mean = (*running)[c];
        var = (*running)[in.c + c];
      } else {
        for (int n = 0; n < batch; ++n) {
          for (int64_t i = 0; i < plane; ++i) mean += x[(n * in.c + c) * plane + i];
        }
        mean /= batch * plane;
        for (int n = 0; n < batch; ++n) {
          for (int64_t i = 0; i < plane; ++i) {
            const double d = x[(n * in.c + c) * plane + i] - mean;
            var += d * d;
          }
        }
        var /= batch * plane;
      }
      for (int n = 0; n < batch; ++n) {
        for (int64_t i = 0; i < plane; ++i) {
          const int64_t at = (n * in.c + c) * plane + i;
          y[at] = p[c] * (x[at] - mean) / std::sqrt(var + eps) + p[in.c + c];
        }
      }
    }
    return y;
  };
}

void CheckTraining(const Dims& in, int batch, double eps = 1e-5) {
  BatchNorm2d<double> d(in.c, eps);
  BatchNorm2d<float> f(in.c, eps);
  LayerCheckOptions options;
  options.batch = batch;
  options.input = in;
  SCOPED_TRACE(d.ToString() + " on " + in.ToString());
  CheckLayer(d, f, options, DirectBatchNorm(in, nullptr, eps));
}

TEST(BatchNorm2dTest, TrainingOddSizes) { CheckTraining({3, 5, 7}, 2); }

TEST(BatchNorm2dTest, TrainingBatchOne) { CheckTraining({2, 3, 3}, 1); }

TEST(BatchNorm2dTest, TrainingOneByOnePlanes) { CheckTraining({4, 1, 1}, 5); }

// torchvision's MobileNetV3 and EfficientNet: eps=1e-3 (a large eps changes the gradient too).
TEST(BatchNorm2dTest, TrainingOtherEps) { CheckTraining({3, 4, 3}, 2, 1e-3); }
TEST(BatchNorm2dTest, TrainingLargeEps) { CheckTraining({2, 2, 2}, 3, 0.5); }

TEST(BatchNorm2dTest, EvaluationUsesRunningStatistics) {
  const Dims in{3, 4, 5};
  static const std::vector<double> running = {0.3, -0.2, 0.1, 0.5, 2.0, 1.3};
  BatchNorm2d<double> d(in.c);
  BatchNorm2d<float> f(in.c);
  LayerCheckOptions options;
  options.batch = 2;
  options.input = in;
  options.training = false;
  options.init_buffers = [](std::vector<double>& b) {
    std::copy(running.begin(), running.end(), b.begin());
    b[6] = 4;
  };
  CheckLayer(d, f, options, DirectBatchNorm(in, &running));
}

TEST(BatchNorm2dTest, RunningStatisticsAsPyTorch) {
  // Channel 0 of a batch of 2 x [1, 1, 3]: values 1, 2, 3, 4, 5, 9: mean 4, biased var 20/3,
  // unbiased var 8.
  BatchNorm2d<double> bn(1);
  std::vector<double> params = {1.5, 0.25}, grads(2), buffers(3);
  bn.BindParams(params.data(), grads.data());
  bn.InitBuffers(buffers.data());
  EXPECT_EQ(buffers, (std::vector<double>{0, 1, 0}));
  bn.BindBuffers(buffers.data());
  const std::vector<double> x = {1, 2, 3, 4, 5, 9};
  TensorRef<double> y = bn.Forward({}, {x.data(), 2, {1, 1, 3}}, true);
  EXPECT_NEAR(y.data[0], 1.5 * (1 - 4) / std::sqrt(20.0 / 3 + 1e-5) + 0.25, 1e-12);
  EXPECT_NEAR(buffers[0], 0.1 * 4, 1e-12);
  EXPECT_NEAR(buffers[1], 0.9 * 1 + 0.1 * 8, 1e-12);
  EXPECT_EQ(buffers[2], 1);
  bn.Forward({}, {x.data(), 2, {1, 1, 3}}, true);
  EXPECT_NEAR(buffers[0], 0.9 * 0.4 + 0.1 * 4, 1e-12);
  EXPECT_NEAR(buffers[1], 0.9 * 1.7 + 0.1 * 8, 1e-12);
  EXPECT_EQ(buffers[2], 2);

  // Evaluation leaves the buffers alone; with running statistics equal to the batch's (biased)
  // ones it gives the training output.
  buffers = {4, 20.0 / 3, 2};
  const std::vector<double> train(y.data, y.data + 6);
  TensorRef<double> e = bn.Forward({}, {x.data(), 2, {1, 1, 3}}, false);
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(e.data[i], train[i], 1e-12);
  EXPECT_EQ(buffers, (std::vector<double>{4, 20.0 / 3, 2}));
}

TEST(BatchNorm2dTest, RunningStatisticsWithOtherEpsAndMomentum) {
  // The batch of RunningStatisticsAsPyTorch with nn.BatchNorm2d(1, eps=1e-3, momentum=0.01).
  BatchNorm2d<double> bn(1, 1e-3, 0.01);
  EXPECT_EQ(bn.ToString(),
            "BatchNorm2d(1, eps=0.001, momentum=0.01, affine=True, track_running_stats=True)");
  std::vector<double> params = {1.5, 0.25}, grads(2), buffers(3);
  bn.BindParams(params.data(), grads.data());
  bn.InitBuffers(buffers.data());
  bn.BindBuffers(buffers.data());
  const std::vector<double> x = {1, 2, 3, 4, 5, 9};
  TensorRef<double> y = bn.Forward({}, {x.data(), 2, {1, 1, 3}}, true);
  EXPECT_NEAR(y.data[5], 1.5 * (9 - 4) / std::sqrt(20.0 / 3 + 1e-3) + 0.25, 1e-12);
  EXPECT_NEAR(buffers[0], 0.01 * 4, 1e-12);
  EXPECT_NEAR(buffers[1], 0.99 * 1 + 0.01 * 8, 1e-12);
  buffers = {0.5, 2.0, 1};
  TensorRef<double> e = bn.Forward({}, {x.data(), 2, {1, 1, 3}}, false);
  EXPECT_NEAR(e.data[0], 1.5 * (1 - 0.5) / std::sqrt(2.0 + 1e-3) + 0.25, 1e-12);
}

TEST(BatchNorm2dTest, SpecsMatchPyTorch) {
  BatchNorm2d<float> bn(64);
  const std::vector<TensorSpec> params = bn.ParamSpecs();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[0].name, "weight");
  EXPECT_EQ(params[0].shape, (std::vector<int64_t>{64}));
  EXPECT_EQ(params[1].name, "bias");
  const std::vector<TensorSpec> buffers = bn.BufferSpecs();
  ASSERT_EQ(buffers.size(), 3u);
  EXPECT_EQ(buffers[0].name, "running_mean");
  EXPECT_EQ(buffers[1].name, "running_var");
  EXPECT_EQ(buffers[1].shape, (std::vector<int64_t>{64}));
  EXPECT_EQ(buffers[2].name, "num_batches_tracked");
  EXPECT_EQ(buffers[2].shape, (std::vector<int64_t>{}));
  EXPECT_EQ(buffers[2].size(), 1);
  EXPECT_TRUE(bn.OutputDims({64, 4, 4}).ok());
  EXPECT_FALSE(bn.OutputDims({63, 4, 4}).ok());
}

}  // namespace
}  // namespace nn
}  // namespace dptrain
