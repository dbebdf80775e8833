// What the GPU graph tests share: whether a GPU is there, and GpuTwinTest, which runs a small
// graph on the GPU (its twins) and on the CPU executor from the same weights, input and output
// gradient, and compares outputs, d(input), every parameter's gradient and the buffers within
// fp32 rounding. Test-only.
#ifndef DPTRAIN_WORKER_CUDA_GPU_TWIN_TESTING_H_
#define DPTRAIN_WORKER_CUDA_GPU_TWIN_TESTING_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/cuda/device_context.h"
#include "worker/cuda/gpu_graph.h"
#include "worker/graph/executor.h"
#include "worker/graph/graph_check.h"
#include "worker/graph/op_registry.h"
#include "worker/nn/layer_check.h"

namespace dptrain {
namespace cuda {

inline bool HaveGpu(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaSuccess && count > 0) return true;
  *why = e == cudaSuccess ? "no CUDA device" : cudaGetErrorString(e);
  return false;
}

// Each twin against its CPU node: a small graph run forward (training) and backward on the
// GPU and by the CPU executor from the same weights, input and output gradient: output,
// d(input) and every parameter's gradient within fp32 rounding.
class GpuTwinTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!HaveGpu(&why)) GTEST_SKIP() << "no usable GPU here (" << why << ")";
    // Deterministic cuDNN (heuristic, not timed, algorithm choice): a timed search may take an
    // FFT or Winograd convolution, whose fp32 error can exceed this test's tolerance.
    DeviceOptions options;
    options.deterministic = true;
    absl::StatusOr<std::unique_ptr<DeviceContext>> ctx = DeviceContext::Create(options);
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    ctx_ = *std::move(ctx);
  }

  static std::vector<float> Random(int64_t n, uint64_t seed, float scale = 1.5f) {
    std::vector<float> v(n);
    uint64_t x = seed;
    for (float& f : v) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      f = scale * (static_cast<float>(x >> 40) / static_cast<float>(1 << 24) * 2 - 1);
    }
    return v;
  }

  float* Upload(const std::vector<float>& host) {
    float* d = nullptr;
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), std::max<size_t>(host.size(), 1) * 4),
              cudaSuccess);
    if (!host.empty()) {
      EXPECT_EQ(cudaMemcpy(d, host.data(), host.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    }
    device_.push_back(d);
    return d;
  }
  static std::vector<double> Download(const float* d, int64_t n) {
    std::vector<float> host(n);
    if (n > 0) {
      EXPECT_EQ(cudaMemcpy(host.data(), d, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return std::vector<double>(host.begin(), host.end());
  }
  void TearDown() override {
    for (float* d : device_) cudaFree(d);
  }

  // `input`: the graph's input values (ids), else random ones.
  void Check(const graph::Graph& g, int batch = 3, const std::vector<float>* input = nullptr) {
    CheckSteps(g, {batch}, input);
  }

  // One step per entry of `batches` on the same executor and the same twins (their buffers
  // reused, their plans made again where the batch size changed), each compared as Check does.
  void CheckSteps(const graph::Graph& g, const std::vector<int>& batches,
                  const std::vector<float>* input = nullptr) {
    const graph::OpRegistry ops = graph::BuiltinOps();
    absl::StatusOr<std::unique_ptr<graph::Executor<float>>> cpu =
        graph::Executor<float>::Create(g, ops);
    absl::StatusOr<std::unique_ptr<graph::Executor<float>>> plan =
        graph::Executor<float>::Create(g, ops);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    ASSERT_TRUE(plan.ok()) << plan.status();
    absl::StatusOr<std::unique_ptr<GpuGraph>> gpu = GpuGraph::Create(**plan, GpuOps());
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    graph::Executor<float>& c = **cpu;
    std::vector<float> params = c.initial_params(), buffers = c.initial_buffers();
    std::vector<float> grads(params.size(), 0.0f);
    c.Bind(params.data(), grads.data(), buffers.data());
    float* d_params = Upload(c.initial_params());
    float* d_grads = Upload(std::vector<float>(params.size(), 0.0f));
    float* d_buffers = Upload(c.initial_buffers());
    (*gpu)->BindParams(d_params, d_grads);
    (*gpu)->BindBuffers(d_buffers);
    for (size_t k = 0; k < batches.size(); ++k) {
      SCOPED_TRACE(::testing::Message() << "step " << k << ", batch " << batches[k]);
      Step(c, **gpu, batches[k], input, 1 + 2 * k, d_grads, d_buffers, grads, buffers);
      if (HasFatalFailure()) return;
    }
  }

  // One step of CheckSteps; x and the output gradient drawn from `seed` and seed + 1.
  void Step(graph::Executor<float>& c, GpuGraph& gpu, int batch, const std::vector<float>* input,
            uint64_t seed, float* d_grads, float* d_buffers, const std::vector<float>& grads,
            const std::vector<float>& buffers) {
    const std::vector<float> x =
        input != nullptr ? *input : Random(batch * c.input_dims().size(), seed);
    const std::vector<float> gy = Random(batch * c.output_dims().size(), seed + 1, 1.0f);
    const nn::TensorRef<float> y = graph::ForwardOk(c, x.data(), batch, /*training=*/true);
    const std::vector<double> y_cpu(y.data, y.data + y.size());
    const nn::TensorRef<float> dx =
        c.Backward({gy.data(), batch, c.output_dims()}, /*need_input_grad=*/true);
    const std::vector<double> dx_cpu(dx.data, dx.data + dx.size());

    float* d_x = Upload(x);
    float* d_gy = Upload(gy);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // The uploads, before the stream's work.
    absl::StatusOr<DeviceTensor> y_gpu =
        gpu.Forward(*ctx_, DeviceTensor{d_x, batch, c.input_dims()}, /*training=*/true);
    ASSERT_TRUE(y_gpu.ok()) << y_gpu.status();
    ASSERT_TRUE(ctx_->Synchronize().ok());  // The context's stream does not wait for cudaMemcpy.
    const std::vector<double> y_dev = Download(y_gpu->data, y_gpu->size());
    absl::StatusOr<DeviceTensor> dx_gpu =
        gpu.Backward(*ctx_, DeviceTensor{d_gy, batch, c.output_dims()}, true);
    ASSERT_TRUE(dx_gpu.ok()) << dx_gpu.status();
    ASSERT_TRUE(ctx_->Synchronize().ok());
    nn::ExpectAllClose("output", y_dev, y_cpu, 1e-5);
    nn::ExpectAllClose("d(input)", Download(dx_gpu->data, dx_gpu->size()), dx_cpu, 1e-5);
    nn::ExpectAllClose("parameter gradients", Download(d_grads, static_cast<int64_t>(grads.size())),
                       std::vector<double>(grads.begin(), grads.end()), 1e-5);
    nn::ExpectAllClose("buffers", Download(d_buffers, static_cast<int64_t>(buffers.size())),
                       std::vector<double>(buffers.begin(), buffers.end()), 1e-5);
  }

  std::unique_ptr<DeviceContext> ctx_;
  std::vector<float*> device_;
};

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_GPU_TWIN_TESTING_H_
