// CPU vs GPU on random inputs, every layer and every model: forward output, input gradient,
// parameter gradients and batch-norm statistics, as ||gpu - cpu|| / ||cpu||. Bounds from the
// issue: 1e-5 in strict fp32, 5e-3 with TF32, 2e-2 in bf16/fp16 mixed precision. Skips
// (visibly) without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/cuda/cuda_model.h"
#include "worker/cuda/gpu_network.h"
#include "worker/graph/builtin_models.h"
#include "worker/nn/activations.h"
#include "worker/nn/architectures.h"
#include "worker/nn/avg_pool2d.h"
#include "worker/nn/batch_norm2d.h"
#include "worker/nn/conv2d.h"
#include "worker/nn/global_avg_pool2d.h"
#include "worker/nn/linear.h"
#include "worker/nn/max_pool2d.h"
#include "worker/nn/residual.h"
#include "worker/nn/safetensors.h"
#include "worker/nn/sequential_block.h"
#include "worker/nn/softmax_cross_entropy.h"

namespace dptrain {
namespace cuda {
namespace {

double RelativeError(absl::Span<const float> gpu, absl::Span<const float> cpu) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    diff += (double{gpu[i]} - cpu[i]) * (double{gpu[i]} - cpu[i]);
    ref += double{cpu[i]} * cpu[i];
  }
  return ref == 0 ? std::sqrt(diff) : std::sqrt(diff / ref);
}

// For a failure message: the parameter tensors whose gradients differ most (relative
// error, and each tensor's share of the whole vector's difference).
std::string WorstTensors(const std::vector<nn::ParamInfo>& params, absl::Span<const float> gpu,
                         absl::Span<const float> cpu) {
  std::vector<std::tuple<double, double, std::string>> errors;
  double total = 0;
  for (const nn::ParamInfo& p : params) {
    double diff = 0, ref = 0;
    for (int64_t i = p.offset; i < p.offset + p.size; ++i) {
      diff += (double{gpu[i]} - cpu[i]) * (double{gpu[i]} - cpu[i]);
      ref += double{cpu[i]} * cpu[i];
    }
    total += diff;
    errors.emplace_back(diff, ref == 0 ? std::sqrt(diff) : std::sqrt(diff / ref), p.name);
  }
  std::sort(errors.rbegin(), errors.rend());
  std::string out;
  for (size_t i = 0; i < errors.size() && i < 4; ++i) {
    const auto& [diff, rel, name] = errors[i];
    out += absl::StrCat(name, ": ", rel, " (", total > 0 ? 100 * diff / total : 0, "%); ");
  }
  return out;
}

std::vector<float> Random(size_t n, std::mt19937& gen, float scale = 1) {
  std::normal_distribution<float> d(0, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

bool HaveGpu(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaSuccess && count > 0) return true;
  *why = e == cudaSuccess ? "no CUDA device" : cudaGetErrorString(e);
  return false;
}

std::vector<float> Read(const float* device, int64_t n) {
  std::vector<float> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// How the GPU computes, and the bound on its relative error.
enum class Math { kFp32, kTf32, kBf16, kFp16 };

double BoundFor(Math m) { return m == Math::kFp32 ? 1e-5 : m == Math::kTf32 ? 5e-3 : 2e-2; }

// Gradients through ReLUs in reduced precision: a ReLU input within rounding of zero takes
// the other branch on the GPU, passing (or zeroing) its whole gradient path, so the
// relative error of a gradient behind many ReLUs is ~sqrt(2 x the flipped fraction), not
// the rounding error (a review estimated ~3.5 % for mlp at batch 16 in bf16). Those
// comparisons get 10x the bound; forward outputs, losses and every ReLU-free path
// keep it. Strict fp32 has no such slack.
double ThroughReluBound(Math m) { return m == Math::kFp32 ? BoundFor(m) : 10 * BoundFor(m); }

// ResNet-18's whole-model gradient at batch 4 in reduced precision is further from float64
// than the per-layer bounds: PyTorch 2.11 (cuDNN, deterministic) on an H100 at this test's
// first point (seed 3, batch 4; tools/gpu/torch_parity_reference.py,
// docs/measured/gpu_h100_precision_2026-11-27.md) has 9.33e-2 in TF32, 3.18e-1 with bf16
// autocast and 1.18e-1 with fp16 autocast, ours 9.33e-2, 3.11e-1 and 1.17e-1. The bound is
// 1.5x PyTorch's error there: what the framework a user would compare with gets.
double WholeModelBound(const std::string& model, Math m) {
  if (model != "resnet18") return 0;
  return m == Math::kTf32   ? 1.5 * 9.33e-2
         : m == Math::kBf16 ? 1.5 * 3.18e-1
         : m == Math::kFp16 ? 1.5 * 1.18e-1
                            : 0;
}

DeviceOptions OptionsFor(Math m) {
  DeviceOptions o;
  o.tf32 = m == Math::kTf32;
  o.precision = m == Math::kBf16   ? Precision::kBf16
                : m == Math::kFp16 ? Precision::kFp16
                                   : Precision::kFp32;
  o.initial_loss_scale = 1024;  // Small models: no overflow at the first step.
  return o;
}

std::string MathName(const ::testing::TestParamInfo<Math>& info) {
  static const char* const kNames[] = {"fp32", "tf32", "bf16", "fp16"};
  return kNames[static_cast<int>(info.param)];
}

class ParityTest : public ::testing::TestWithParam<Math> {
 protected:
  void SetUp() override {
    std::string why;
    if (!HaveGpu(&why)) {
      GTEST_SKIP() << "no usable GPU here (" << why << "); CPU-GPU parity was not checked";
    }
    absl::StatusOr<std::unique_ptr<DeviceContext>> ctx =
        DeviceContext::Create(OptionsFor(GetParam()));
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    ctx_ = *std::move(ctx);
  }
  double Bound() const { return BoundFor(GetParam()); }

  // Runs `cpu` and its GPU twin on the same random input, parameters, buffers and output
  // gradient, in training (then evaluation) mode, and compares everything they produce.
  // `grad_bound`: for the gradients (input and parameters); 0 = Bound().
  void CheckLayer(nn::Layer<float>& cpu, const nn::Dims& in, int batch, double grad_bound = 0) {
    if (grad_bound == 0) grad_bound = Bound();
    SCOPED_TRACE(cpu.ToString());
    absl::StatusOr<nn::Dims> out = cpu.OutputDims(in);
    ASSERT_TRUE(out.ok()) << out.status();
    absl::StatusOr<std::unique_ptr<GpuLayer>> made = ToGpu(cpu, in);
    ASSERT_TRUE(made.ok()) << made.status();
    GpuLayer& gpu = **made;
    const int64_t np = nn::SpecsSize(cpu.ParamSpecs());
    const int64_t nb = nn::SpecsSize(cpu.BufferSpecs());
    std::vector<float> params = Random(np, gen_, 0.3f), grads(np);
    std::vector<float> buffers(nb);
    cpu.InitBuffers(buffers.data());
    for (int64_t i = 0; i < nb; ++i) buffers[i] += 0.1f * (i % 3);  // Off the initial values.
    std::vector<float> x = Random(batch * in.size(), gen_);
    std::vector<float> dy = Random(batch * out->size(), gen_);
    cpu.BindParams(params.data(), grads.data());
    std::vector<float> cpu_buffers = buffers;
    cpu.BindBuffers(cpu_buffers.data());

    DeviceBuffer<float> d_params, d_grads, d_buffers, d_x, d_dy;
    float* p = *d_params.Ensure(*ctx_, std::max<int64_t>(np, 1));
    float* g = *d_grads.Ensure(*ctx_, std::max<int64_t>(np, 1));
    float* b = *d_buffers.Ensure(*ctx_, std::max<int64_t>(nb, 1));
    float* dx_in = *d_x.Ensure(*ctx_, x.size());
    float* ddy = *d_dy.Ensure(*ctx_, dy.size());
    // On the context's stream (non-blocking: it does not wait for the legacy stream).
    for (auto [to, from] : {std::pair{p, &params}, std::pair{b, &buffers}, std::pair{dx_in, &x},
                            std::pair{ddy, &dy}}) {
      ASSERT_EQ(cudaMemcpyAsync(to, from->data(), from->size() * sizeof(float),
                                cudaMemcpyHostToDevice, ctx_->stream()),
                cudaSuccess);
    }
    ASSERT_TRUE(ctx_->Synchronize().ok());
    gpu.BindParams(p, g);
    gpu.BindBuffers(b);

    for (bool training : {true, false}) {
      SCOPED_TRACE(training ? "training" : "evaluation");
      const nn::TensorRef<float> y = cpu.Forward({}, {x.data(), batch, in}, training);
      const std::vector<float> cpu_y(y.data, y.data + y.size());
      absl::StatusOr<DeviceTensor> gy = gpu.Forward(*ctx_, {dx_in, batch, in}, training);
      ASSERT_TRUE(gy.ok()) << gy.status();
      ASSERT_EQ(gy->dims, *out);
      ASSERT_TRUE(ctx_->Synchronize().ok());
      EXPECT_LE(RelativeError(Read(gy->data, gy->size()), cpu_y), Bound()) << "output";
      if (nb > 0) {
        // Running statistics; num_batches_tracked is counted by the model on the GPU side.
        std::vector<float> gb = Read(b, nb), cb = cpu_buffers;
        int64_t at = 0;
        for (const nn::TensorSpec& s : cpu.BufferSpecs()) {
          if (s.name.find("num_batches_tracked") != std::string::npos) gb[at] = cb[at];
          at += s.size();
        }
        EXPECT_LE(RelativeError(gb, cb), Bound()) << "running statistics";
      }
      if (!training) continue;
      const nn::TensorRef<float> dx = cpu.Backward({}, {dy.data(), batch, *out}, true);
      const std::vector<float> cpu_dx(dx.data, dx.data + dx.size());
      absl::StatusOr<DeviceTensor> gdx = gpu.Backward(*ctx_, {ddy, batch, *out}, true);
      ASSERT_TRUE(gdx.ok()) << gdx.status();
      ASSERT_TRUE(ctx_->Synchronize().ok());
      EXPECT_LE(RelativeError(Read(gdx->data, gdx->size()), cpu_dx), grad_bound) << "input grad";
      if (np > 0) {
        EXPECT_LE(RelativeError(Read(g, np), grads), grad_bound) << "parameter grads";
      }
    }
  }

  std::unique_ptr<DeviceContext> ctx_;
  std::mt19937 gen_{7};
};

TEST_P(ParityTest, Linear) {
  nn::Linear<float> layer(37, 11);
  CheckLayer(layer, {37, 1, 1}, 5);
}

TEST_P(ParityTest, Conv2dStridedPadded) {
  nn::Conv2d<float> layer(nn::Conv2dOptions{3, 4, 3, 2, 2, 1, 1, 0});
  CheckLayer(layer, {3, 9, 8}, 3);
}

TEST_P(ParityTest, Conv2dPointwiseStride2) {
  nn::Conv2d<float> layer(nn::Conv2dOptions::Square(5, 6, 1, 2));
  CheckLayer(layer, {5, 7, 7}, 2);
}

TEST_P(ParityTest, Conv2dBatchOne) {
  nn::Conv2d<float> layer(nn::Conv2dOptions::Square(1, 6, 5, 1, 2));
  CheckLayer(layer, {1, 28, 28}, 1);
}

TEST_P(ParityTest, BatchNorm2d) {
  nn::BatchNorm2d<float> layer(4);
  CheckLayer(layer, {4, 5, 3}, 6);
}

// One value per channel in training: cuDNN's unbiased update would divide by zero, so the GPU
// layer refuses, as PyTorch and the CPU layer (nn::BatchNorm2d::CheckInput) do, alike.
TEST_P(ParityTest, BatchNorm2dRefusesOneValuePerChannel) {
  nn::BatchNorm2d<float> cpu(3);
  absl::StatusOr<std::unique_ptr<GpuLayer>> gpu = ToGpu(cpu, {3, 1, 1});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  DeviceBuffer<float> params, grads, buffers, x;
  (*gpu)->BindParams(*params.Ensure(*ctx_, 6), *grads.Ensure(*ctx_, 6));
  (*gpu)->BindBuffers(*buffers.Ensure(*ctx_, 7));
  absl::StatusOr<DeviceTensor> y =
      (*gpu)->Forward(*ctx_, {*x.Ensure(*ctx_, 3), 1, {3, 1, 1}}, true);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kInvalidArgument) << y.status();
  EXPECT_EQ(y.status().message(),
            cpu.CheckInput({nullptr, 1, {3, 1, 1}}, /*training=*/true).message());
}

TEST_P(ParityTest, Activations) {
  nn::ReLU<float> relu;
  CheckLayer(relu, {3, 4, 5}, 2);
  nn::Sigmoid<float> sigmoid;
  CheckLayer(sigmoid, {3, 4, 5}, 2);
}

TEST_P(ParityTest, Pooling) {
  nn::MaxPool2d<float> max(nn::Pool2dOptions::Square(3, 2, 1));
  CheckLayer(max, {2, 9, 9}, 2);
  nn::AvgPool2d<float> avg(nn::Pool2dOptions::Square(3, 2, 1));
  CheckLayer(avg, {2, 9, 9}, 2);
  nn::AvgPool2d<float> avg2(nn::Pool2dOptions::Square(2));
  CheckLayer(avg2, {6, 10, 10}, 3);
  nn::GlobalAvgPool2d<float> global;
  CheckLayer(global, {5, 4, 6}, 3);
}

TEST_P(ParityTest, Residuals) {
  nn::Residual<float> same(nn::ResidualOptions{4, 4, false, 1});
  CheckLayer(same, {4, 6, 6}, 3, ThroughReluBound(GetParam()));
  nn::Residual<float> down(nn::ResidualOptions{3, 5, true, 2});
  CheckLayer(down, {3, 7, 7}, 2, ThroughReluBound(GetParam()));
}

// Whole models through the Model API: a training step (loss, accuracy, gradients, batch
// norm's statistics), an SGD update on the device, then evaluation.
class ModelParityTest : public ::testing::TestWithParam<std::tuple<std::string, Math>> {};

TEST_P(ModelParityTest, TrainStepSgdAndEvaluate) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no usable GPU here (" << why << ")";
  const auto& [name, math] = GetParam();
  const double bound = BoundFor(math);
  // lenet has no ReLU, but sigmoids: the same bound keeps it simple.
  const double grad_bound = std::max(ThroughReluBound(math), WholeModelBound(name, math));
  const bool exact_math = math == Math::kFp32;
  nn::ModelOptions options;
  options.name = name;
  options.seed = 3;
  options.threads = 1;
  absl::StatusOr<std::unique_ptr<nn::Model>> cpu = graph::CreateBuiltinModel(options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  // Deterministic algorithms: the same trajectory every run. With timed ones it differs from
  // run to run, and ResNet-18 at batch 4 can reach a point where one float32
  // implementation's rounding flips a gradient path: seen on both sides (issue 28's
  // diagnosis on an H100: the GPU 2.8e-3 from float64 with the CPU at 1.3e-6, and in another
  // run the CPU 9.4e-4 with the GPU at 3.2e-6), failing this test in ~2 runs of 3.
  DeviceOptions device = OptionsFor(math);
  device.deterministic = true;
  absl::StatusOr<std::unique_ptr<CudaModel>> gpu = CudaModel::Create(options, device);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  // Both ways of bringing the gradients to the host: copied during backward (fp32, bf16)
  // and copied on demand (TF32, fp16).
  (*gpu)->set_copy_grads_during_backward(math == Math::kFp32 || math == Math::kBf16);
  EXPECT_EQ((*gpu)->weights(), (*cpu)->weights()) << "same seed, same initial weights";

  const int batch = name == "resnet18" ? 4 : 16;
  std::mt19937 gen(11);
  std::vector<float> images = Random(batch * 784, gen);
  std::vector<nn::Label> labels(batch);
  for (int i = 0; i < batch; ++i) labels[i] = static_cast<nn::Label>(gen() % 10);

  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(step);
    auto c = (*cpu)->TrainStep(images.data(), labels.data(), batch);
    auto g = (*gpu)->TrainStep(images.data(), labels.data(), batch);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_NEAR(g->loss, c->loss, bound * std::abs(c->loss) + 1e-6);
    ASSERT_FALSE(g->overflow) << "loss scale " << (*gpu)->loss_scale();
    if (exact_math) {
      EXPECT_EQ(g->correct, c->correct);  // Else a near tie may flip.
    }
    EXPECT_LE(RelativeError((*gpu)->grads(), (*cpu)->grads()), grad_bound)
        << "grads; worst: " << WorstTensors((*cpu)->params(), (*gpu)->grads(), (*cpu)->grads());
    EXPECT_LE(RelativeError((*gpu)->buffer_values(), (*cpu)->buffer_values()), bound)
        << "batch-norm statistics";
    // SGD: on the device for the GPU model, on the host for the CPU one.
    ASSERT_TRUE((*gpu)->ApplySgd(0.1f).ok());
    std::vector<float>& w = (*cpu)->weights();
    for (size_t i = 0; i < w.size(); ++i) w[i] -= 0.1f * (*cpu)->grads()[i];
    EXPECT_LE(RelativeError((*gpu)->weights(), w), grad_bound) << "weights after SGD";
    // The next step starts both from the GPU's weights and statistics: ResNet-18 at batch 4
    // is chaotic (a 1e-6 relative change of the weights changes the next step's gradients
    // by 3e-3 on the CPU alone), so comparing two diverging trajectories would measure the
    // chaos, not the GPU.
    w = (*gpu)->weights();
    (*cpu)->buffer_values() = (*gpu)->buffer_values();
  }
  auto c = (*cpu)->Evaluate(images.data(), labels.data(), batch);
  auto g = (*gpu)->Evaluate(images.data(), labels.data(), batch);
  ASSERT_TRUE(c.ok() && g.ok());
  EXPECT_NEAR(g->loss, c->loss, bound * std::abs(c->loss) + 1e-6);

  // Bad input: the CPU model's errors.
  labels[0] = 10;
  auto bad = (*gpu)->TrainStep(images.data(), labels.data(), batch);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  (*gpu)->weights().pop_back();
  labels[0] = 1;
  bad = (*gpu)->TrainStep(images.data(), labels.data(), batch);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kFailedPrecondition);
}

// Issue 28's experiment on the strict-fp32 ResNet-18 failure, run by tools/gpu/check.sh
// (stage parity): per step, from the same weights and statistics,
//   copy:    grads() (copied during backward) against the device's gradient copied whole
//            after a full synchronisation: a mismatch is a stream-ordering race (hard failure);
//   stale:   elements of grads() equal to the previous step's (a copy that read too early);
//   replay:  the same step run again on the same model: bitwise equal with deterministic
//            algorithms (hard failure otherwise), reported without;
//   ref64:   the network in float64 from the same weights: the GPU's and the CPU fp32 model's
//            relative errors against it (which of the two is off, when they differ).
// The trajectory is ModelParityTest's (SGD with the first run's gradient); the replay runs
// at the last step only.
// One line per step ("diagnosis ...") goes to stdout for the check's log.
class ResNetDiagnosis : public ::testing::TestWithParam<bool> {};

double RelativeError64(absl::Span<const float> x, const std::vector<double>& ref) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    diff += (x[i] - ref[i]) * (x[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

TEST_P(ResNetDiagnosis, CopyPathDeterminismAndFloat64Reference) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no usable GPU here (" << why << ")";
  const bool deterministic = GetParam();
  nn::ModelOptions options;
  options.name = "resnet18";
  options.seed = 3;
  options.threads = 1;
  DeviceOptions device = OptionsFor(Math::kFp32);
  device.deterministic = deterministic;
  absl::StatusOr<std::unique_ptr<nn::Model>> cpu = graph::CreateBuiltinModel(options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  absl::StatusOr<std::unique_ptr<CudaModel>> gpu = CudaModel::Create(options, device);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  (*gpu)->set_copy_grads_during_backward(true);
  absl::StatusOr<nn::Sequential<double>> ref_net = nn::BuildNetwork<double>("resnet18");
  ASSERT_TRUE(ref_net.ok()) << ref_net.status();

  const int batch = 4;
  std::mt19937 gen(11);
  const std::vector<float> images = Random(batch * 784, gen);
  std::vector<nn::Label> labels(batch);
  for (int i = 0; i < batch; ++i) labels[i] = static_cast<nn::Label>(gen() % 10);
  const std::vector<double> images64(images.begin(), images.end());
  std::vector<float> previous;
  constexpr int kSteps = 3;
  for (int step = 0; step < kSteps; ++step) {
    SCOPED_TRACE(step);
    const std::vector<float> w = (*gpu)->weights();
    const std::vector<float> b = (*gpu)->buffer_values();
    auto g = (*gpu)->TrainStep(images.data(), labels.data(), batch);
    ASSERT_TRUE(g.ok()) << g.status();
    const std::vector<float> copied((*gpu)->grads().begin(), (*gpu)->grads().end());
    absl::StatusOr<std::vector<float>> whole = (*gpu)->DeviceGradsForTest();
    ASSERT_TRUE(whole.ok()) << whole.status();
    int64_t copy_mismatches = 0, stale = 0;
    for (size_t i = 0; i < copied.size(); ++i) {
      copy_mismatches += std::memcmp(&copied[i], &(*whole)[i], sizeof(float)) != 0;
      if (!previous.empty()) stale += copied[i] == previous[i] && copied[i] != 0;
    }
    // float64 and the CPU's float32 from the same state.
    std::vector<double> w64(w.begin(), w.end()), g64(w.size()), b64(b.begin(), b.end());
    ref_net->BindParams(w64.data(), g64.data());
    ref_net->BindBuffers(b64.data());
    nn::TensorRef<double> logits = ref_net->Forward(images64.data(), batch, true);
    std::vector<double> dlogits(batch * nn::kNumClasses);
    nn::SoftmaxCrossEntropy(logits.data, labels.data(), batch, nn::kNumClasses, dlogits.data());
    ref_net->Backward({dlogits.data(), batch, {nn::kNumClasses, 1, 1}});
    (*cpu)->weights() = w;
    (*cpu)->buffer_values() = b;
    ASSERT_TRUE((*cpu)->TrainStep(images.data(), labels.data(), batch).ok());
    // The last step again, from the same weights and statistics.
    int64_t replay_differs = -1;
    double replay_rel = -1;
    if (step == kSteps - 1) {
      (*gpu)->weights() = w;
      (*gpu)->buffer_values() = b;
      auto again = (*gpu)->TrainStep(images.data(), labels.data(), batch);
      ASSERT_TRUE(again.ok()) << again.status();
      const std::vector<float> replayed((*gpu)->grads().begin(), (*gpu)->grads().end());
      replay_differs = 0;
      for (size_t i = 0; i < copied.size(); ++i) {
        replay_differs += std::memcmp(&copied[i], &replayed[i], sizeof(float)) != 0;
      }
      replay_rel = RelativeError(replayed, copied);
    }
    const double gpu_err = RelativeError64(copied, g64);
    const double cpu_err = RelativeError64((*cpu)->grads(), g64);
    std::cout << "diagnosis deterministic=" << deterministic << " step=" << step
              << " copy_mismatches=" << copy_mismatches << " stale=" << stale
              << " replay_differs=" << replay_differs << " replay_rel=" << replay_rel
              << " gpu_vs_f64=" << gpu_err << " cpu32_vs_f64=" << cpu_err
              << " gpu_vs_cpu32=" << RelativeError(copied, (*cpu)->grads()) << " worst_gpu_vs_f64: "
              << WorstTensors((*gpu)->params(), copied, std::vector<float>(g64.begin(), g64.end()))
              << std::endl;
    EXPECT_EQ(copy_mismatches, 0) << "grads() differs from the device's gradient";
    if (deterministic && replay_differs >= 0) {
      EXPECT_EQ(replay_differs, 0) << "deterministic algorithms";
    }
    previous = copied;
    ASSERT_TRUE((*gpu)->ApplySgd(0.1f).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, ResNetDiagnosis, ::testing::Bool());

// ResNet-18's gradient at one fixed point (seed 3, batch 4) in every math against float64.
// Prints one line per math ("precision ..."); with DPTRAIN_PARITY_FIXTURE_DIR set it also
// writes that point (resnet18.safetensors, images.f32, labels.u8) and the errors
// (ours.txt) there, for tools/gpu/torch_parity_reference.py to measure PyTorch's error at the
// same point (fp32, TF32, bf16/fp16 autocast): the yardstick for the whole-model bounds.
TEST(ResNetPrecision, GradientErrorsAgainstFloat64) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no usable GPU here (" << why << ")";
  nn::ModelOptions options;
  options.name = "resnet18";
  options.seed = 3;
  options.threads = 1;
  absl::StatusOr<std::unique_ptr<nn::Model>> cpu = graph::CreateBuiltinModel(options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  const int batch = 4;
  std::mt19937 gen(11);
  const std::vector<float> images = Random(batch * 784, gen);
  std::vector<nn::Label> labels(batch);
  for (int i = 0; i < batch; ++i) labels[i] = static_cast<nn::Label>(gen() % 10);
  absl::StatusOr<nn::Sequential<double>> ref_net = nn::BuildNetwork<double>("resnet18");
  ASSERT_TRUE(ref_net.ok()) << ref_net.status();
  const std::vector<float>& w = (*cpu)->weights();
  std::vector<double> w64(w.begin(), w.end()), g64(w.size());
  std::vector<double> b64((*cpu)->buffer_values().begin(), (*cpu)->buffer_values().end());
  ref_net->BindParams(w64.data(), g64.data());
  ref_net->BindBuffers(b64.data());
  const std::vector<double> images64(images.begin(), images.end());
  nn::TensorRef<double> logits = ref_net->Forward(images64.data(), batch, true);
  std::vector<double> dlogits(batch * nn::kNumClasses);
  nn::SoftmaxCrossEntropy(logits.data, labels.data(), batch, nn::kNumClasses, dlogits.data());
  ref_net->Backward({dlogits.data(), batch, {nn::kNumClasses, 1, 1}});

  const char* dir = std::getenv("DPTRAIN_PARITY_FIXTURE_DIR");
  std::ofstream ours;
  if (dir != nullptr) {
    ASSERT_TRUE(nn::SaveModel(**cpu, absl::StrCat(dir, "/resnet18.safetensors")).ok());
    std::ofstream(absl::StrCat(dir, "/images.f32"), std::ios::binary)
        .write(reinterpret_cast<const char*>(images.data()), images.size() * sizeof(float));
    // One byte per label, as tools/gpu/torch_parity_reference.py reads them (all below 10).
    const std::vector<uint8_t> label_bytes(labels.begin(), labels.end());
    std::ofstream(absl::StrCat(dir, "/labels.u8"), std::ios::binary)
        .write(reinterpret_cast<const char*>(label_bytes.data()), label_bytes.size());
    ours.open(absl::StrCat(dir, "/ours.txt"));
  }
  ASSERT_TRUE((*cpu)->TrainStep(images.data(), labels.data(), batch).ok());
  std::cout << "precision math=cpu32 vs_f64=" << RelativeError64((*cpu)->grads(), g64) << std::endl;
  for (Math math : {Math::kFp32, Math::kTf32, Math::kBf16, Math::kFp16}) {
    for (bool deterministic : {false, true}) {
      DeviceOptions device = OptionsFor(math);
      device.deterministic = deterministic;
      absl::StatusOr<std::unique_ptr<CudaModel>> gpu = CudaModel::Create(options, device);
      ASSERT_TRUE(gpu.ok()) << gpu.status();
      auto g = (*gpu)->TrainStep(images.data(), labels.data(), batch);
      ASSERT_TRUE(g.ok()) << g.status();
      const double err = RelativeError64((*gpu)->grads(), g64);
      std::cout << "precision math=" << MathName(::testing::TestParamInfo<Math>(math, 0))
                << " deterministic=" << deterministic << " vs_f64=" << err << " worst: "
                << WorstTensors((*gpu)->params(), (*gpu)->grads(),
                                std::vector<float>(g64.begin(), g64.end()))
                << std::endl;
      if (ours.is_open()) {
        ours << MathName(::testing::TestParamInfo<Math>(math, 0)) << " " << deterministic << " "
             << err << "\n";
      }
    }
  }
}

// fp16 with an absurd loss scale: the scaled gradient overflows fp16, TrainStep says so,
// ApplySgd skips the update and halves the scale (GradScaler's rule), and once the scale is
// small enough steps apply again.
TEST(MixedPrecisionTest, OverflowSkipsTheStepAndBacksOff) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no usable GPU here (" << why << ")";
  nn::ModelOptions options;
  options.name = "mlp";
  DeviceOptions device = OptionsFor(Math::kFp16);
  device.initial_loss_scale = 1e30f;
  absl::StatusOr<std::unique_ptr<CudaModel>> model = CudaModel::Create(options, device);
  ASSERT_TRUE(model.ok()) << model.status();
  std::mt19937 gen(5);
  std::vector<float> images = Random(8 * 784, gen);
  std::vector<nn::Label> labels = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<float> before = (*model)->weights();
  auto r = (*model)->TrainStep(images.data(), labels.data(), 8);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->overflow);
  ASSERT_TRUE((*model)->ApplySgd(0.1f).ok());
  EXPECT_EQ((*model)->weights(), before) << "an overflowed step must not be applied";
  EXPECT_EQ((*model)->loss_scale(), 0.5e30f);
  int steps = 0;
  while (r->overflow && ++steps < 200) {
    r = (*model)->TrainStep(images.data(), labels.data(), 8);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE((*model)->ApplySgd(0.1f).ok());
  }
  EXPECT_FALSE(r->overflow) << "still overflowing at scale " << (*model)->loss_scale();
  EXPECT_NE((*model)->weights(), before) << "a finite step must be applied";
}

// All-reduce mode's update on the device = the host optimizer (torch.optim.SGD with
// momentum and weight decay, Adam, AdamW), step after step: with the replicas' average
// written into gradient_exchange(), and (a lone replica) with the device's own gradient.
class ApplyUpdateTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ApplyUpdateTest, SameAsTheCpuModel) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no usable GPU here (" << why << ")";
  OptimizerOptions optimizer;
  optimizer.name = GetParam();
  optimizer.learning_rate = optimizer.name == "sgd" ? 0.05f : 0.002f;
  optimizer.momentum = 0.9f;
  optimizer.weight_decay = 1e-3f;
  nn::ModelOptions options;
  options.name = "mlp";
  options.threads = 1;
  options.optimizer = optimizer;
  absl::StatusOr<std::unique_ptr<CudaModel>> gpu = CudaModel::Create(options, {});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  absl::StatusOr<std::unique_ptr<nn::Model>> cpu = graph::CreateBuiltinModel(options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  std::mt19937 gen(9);
  std::vector<float> images = Random(16 * 784, gen);
  std::vector<nn::Label> labels(16);
  for (int i = 0; i < 16; ++i) labels[i] = static_cast<nn::Label>(gen() % 10);
  for (int step = 0; step < 6; ++step) {
    SCOPED_TRACE(step);
    ASSERT_TRUE((*gpu)->TrainStep(images.data(), labels.data(), 16).ok());
    ASSERT_TRUE((*cpu)->TrainStep(images.data(), labels.data(), 16).ok());
    if (step % 2 == 0) {  // An exchanged "average": the same made-up gradient on both.
      const std::vector<float> averaged = Random((*cpu)->grads().size(), gen, 0.1f);
      absl::Span<float> g = (*gpu)->gradient_exchange();
      absl::Span<float> c = (*cpu)->gradient_exchange();
      ASSERT_EQ(g.size(), averaged.size() + 1);
      EXPECT_EQ(g.back(), 0.0f) << "fp32 never overflows";
      std::copy(averaged.begin(), averaged.end(), g.begin());
      std::copy(averaged.begin(), averaged.end(), c.begin());
    }
    const float rate = optimizer.learning_rate * (1 + 0.5f * step);  // As a schedule would.
    ASSERT_TRUE((*gpu)->ApplyUpdate(rate).ok());
    ASSERT_TRUE((*cpu)->ApplyUpdate(rate).ok());
    EXPECT_LE(RelativeError((*gpu)->weights(), (*cpu)->weights()), 1e-5);
  }

  // The state comes down in the CPU model's layout (a checkpoint of either resumes on the
  // other)...
  absl::StatusOr<OptimizerState> gpu_state = (*gpu)->ExportOptimizerState();
  ASSERT_TRUE(gpu_state.ok()) << gpu_state.status();
  absl::StatusOr<OptimizerState> cpu_state = (*cpu)->ExportOptimizerState();
  ASSERT_TRUE(cpu_state.ok()) << cpu_state.status();
  EXPECT_EQ(gpu_state->steps, 6);
  EXPECT_EQ(gpu_state->steps, cpu_state->steps);
  for (int v = 0; v < 3; ++v) {
    const std::vector<float>& g = *gpu_state->vectors()[v];
    const std::vector<float>& c = *cpu_state->vectors()[v];
    ASSERT_EQ(g.size(), c.size()) << "vector " << v;
    if (!g.empty()) {
      EXPECT_LE(RelativeError(g, c), 1e-5) << "vector " << v;
    }
  }
  // ...and a replica made afresh with the weights and the imported state continues
  // bit-identically.
  absl::StatusOr<std::unique_ptr<CudaModel>> resumed = CudaModel::Create(options, {});
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  OptimizerState bad;
  bad.steps = 6;  // But none of the vectors its update needs.
  EXPECT_EQ((*resumed)->ImportOptimizerState(bad).code(), absl::StatusCode::kInvalidArgument);
  bad.momentum_buffer = {1, 2, 3};
  EXPECT_EQ((*resumed)->ImportOptimizerState(bad).code(), absl::StatusCode::kInvalidArgument);
  (*resumed)->weights() = (*gpu)->weights();
  ASSERT_TRUE((*resumed)->ImportOptimizerState(*gpu_state).ok());
  const std::vector<float> averaged = Random((*cpu)->grads().size(), gen, 0.1f);
  for (CudaModel* m : {gpu->get(), resumed->get()}) {
    ASSERT_TRUE(m->TrainStep(images.data(), labels.data(), 16).ok());
    std::copy(averaged.begin(), averaged.end(), m->gradient_exchange().begin());
    ASSERT_TRUE(m->ApplyUpdate(optimizer.learning_rate).ok());
  }
  EXPECT_EQ((*resumed)->weights(), (*gpu)->weights());
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ApplyUpdateTest, ::testing::Values("sgd", "adam", "adamw"));

TEST(ApplyUpdateWithoutAnOptimizerTest, IsAFailedPrecondition) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no usable GPU here (" << why << ")";
  nn::ModelOptions options;
  options.name = "mlp";
  absl::StatusOr<std::unique_ptr<CudaModel>> bare = CudaModel::Create(options, {});
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ((*bare)->ApplyUpdate(0.1f).code(), absl::StatusCode::kFailedPrecondition);
  options.optimizer = OptimizerOptions{};
  options.optimizer->name = "lamb";
  EXPECT_EQ(CudaModel::Create(options, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Maths, ParityTest,
                         ::testing::Values(Math::kFp32, Math::kTf32, Math::kBf16, Math::kFp16),
                         MathName);
INSTANTIATE_TEST_SUITE_P(Models, ModelParityTest,
                         ::testing::Combine(::testing::Values("mlp", "lenet", "resnet18"),
                                            ::testing::Values(Math::kFp32, Math::kTf32, Math::kBf16,
                                                              Math::kFp16)));

}  // namespace
}  // namespace cuda
}  // namespace dptrain
