// Every kernel against a CPU reference on random inputs. Skips (visibly) without a GPU.
#include "worker/cuda/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/optimizer.h"
#include "gtest/gtest.h"
#include "worker/cuda/cuda_status.h"
#include "worker/nn/softmax_cross_entropy.h"

namespace dptrain {
namespace cuda {
namespace {

// Device buffer of T, filled from / read back to host vectors.
template <typename T>
class Device {
 public:
  explicit Device(size_t n) : n_(n) {
    ok_ = cudaMalloc(reinterpret_cast<void**>(&p_), std::max<size_t>(n, 1) * sizeof(T)) ==
          cudaSuccess;
  }
  explicit Device(const std::vector<T>& v) : Device(v.size()) {
    if (ok_ && !v.empty()) {
      ok_ = cudaMemcpy(p_, v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess;
    }
  }
  ~Device() { cudaFree(p_); }
  T* get() { return p_; }
  bool ok() const { return ok_; }
  std::vector<T> Read() const {
    std::vector<T> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  size_t n_;
  T* p_ = nullptr;
  bool ok_ = false;
};

class KernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no usable GPU here (" << cudaGetErrorString(e)
                   << "); the kernels were not exercised";
    }
  }
  std::vector<float> Random(size_t n, float lo = -3, float hi = 3) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = u(gen_);
    return v;
  }
  std::mt19937 gen_{12345};
};

TEST_F(KernelsTest, Relu) {
  const int64_t n = 100003;  // Not a multiple of the block size.
  std::vector<float> x = Random(n), dy = Random(n);
  x[7] = std::numeric_limits<float>::quiet_NaN();
  Device<float> dx_in(x), dy_in(dy), y(n), dx(n);
  ASSERT_TRUE(ReluForward(dx_in.get(), y.get(), n, nullptr).ok());
  ASSERT_TRUE(ReluBackward(y.get(), dy_in.get(), dx.get(), n, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> yh = y.Read(), dxh = dx.Read();
  EXPECT_TRUE(std::isnan(yh[7]));
  for (int64_t i = 0; i < n; ++i) {
    if (i == 7) continue;
    ASSERT_EQ(yh[i], x[i] < 0 ? 0.0f : x[i]) << i;
    ASSERT_EQ(dxh[i], yh[i] > 0 ? dy[i] : 0.0f) << i;
  }
}

// Against the CPU's loss in double (worker/nn/softmax_cross_entropy.h, itself checked against
// the definition and PyTorch's label smoothing), without and with label smoothing.
TEST_F(KernelsTest, SoftmaxCrossEntropyMatchesFloat64) {
  for (const int classes : {10, 1000}) {  // 1000: labels past a byte (ImageNet's classes).
    SCOPED_TRACE(classes);
    const int batch = 257;
    std::vector<float> z = Random(batch * classes, -20, 20);
    std::vector<nn::Label> labels(batch);
    for (int r = 0; r < batch; ++r) labels[r] = static_cast<nn::Label>(gen_() % classes);
    const std::vector<double> z64(z.begin(), z.end());
    for (const float smoothing : {0.0f, 0.1f}) {
      SCOPED_TRACE(smoothing);
      Device<float> dz_in(z), loss(std::vector<float>{0.0f}), dz(z.size());
      Device<nn::Label> dlabels(labels);
      Device<int> correct(std::vector<int>{0});
      ASSERT_TRUE(SoftmaxCrossEntropy(dz_in.get(), dlabels.get(), batch, classes, smoothing,
                                      loss.get(), correct.get(), dz.get(), nullptr)
                      .ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      std::vector<double> dz_ref(z.size());
      const nn::LossOutput ref = nn::SoftmaxCrossEntropy(z64.data(), labels.data(), batch, classes,
                                                         dz_ref.data(), smoothing);
      const double loss_ref = ref.loss * batch;  // The kernel sums the rows.
      EXPECT_NEAR(loss.Read()[0], loss_ref, 1e-5 * loss_ref);
      EXPECT_EQ(correct.Read()[0], ref.correct);
      const std::vector<float> got = dz.Read();
      for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], dz_ref[i], 1e-7) << i;
    }
  }
}

TEST_F(KernelsTest, SgdMatchesTheCpuOptimizer) {
  const int64_t n = 5000;
  for (const bool nesterov : {false, true}) {
    SCOPED_TRACE(nesterov ? "nesterov" : "momentum");
    OptimizerOptions o;
    o.learning_rate = 0.1f;
    o.momentum = 0.9f;
    o.weight_decay = 1e-3f;
    o.nesterov = nesterov;
    auto cpu = CreateOptimizer(o);
    ASSERT_TRUE(cpu.ok());
    std::vector<float> w = Random(n), w_cpu = w;
    Device<float> dw(w), buf(n);
    OptimizerState state;
    for (int step = 0; step < 3; ++step) {
      std::vector<float> g = Random(n);
      Device<float> dg(g);
      ASSERT_TRUE(SgdUpdate(dw.get(), dg.get(), buf.get(), n, o.learning_rate, o.momentum,
                            o.weight_decay, step == 0, nesterov, nullptr)
                      .ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      (*cpu)->Apply(absl::MakeSpan(w_cpu), g, state);
    }
    const std::vector<float> got = dw.Read();
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(got[i], w_cpu[i], 1e-6f * (1 + std::fabs(w_cpu[i]))) << i;
    }
  }
  Device<float> dw(Random(n));
  EXPECT_FALSE(SgdUpdate(dw.get(), dw.get(), nullptr, n, 0.1f, 0.9f, 0, true, false, nullptr).ok());
}

// Adam and AdamW with weight decay, 5 steps, against the CPU optimizer (the same rounded
// scalars; nvcc fuses multiply-adds, so a few ulps apart).
TEST_F(KernelsTest, AdamMatchesTheCpuOptimizer) {
  for (const char* name : {"adam", "adamw"}) {
    SCOPED_TRACE(name);
    const int64_t n = 5000;
    OptimizerOptions o;
    o.name = name;
    o.learning_rate = 0.01f;
    o.weight_decay = 0.05f;
    o.beta1 = 0.8;
    o.beta2 = 0.99;
    auto cpu = CreateOptimizer(o);
    ASSERT_TRUE(cpu.ok());
    std::vector<float> w = Random(n), w_cpu = w;
    Device<float> dw(w), m(std::vector<float>(n, 0.0f)), v(std::vector<float>(n, 0.0f));
    OptimizerState state;
    for (int step = 0; step < 5; ++step) {
      std::vector<float> g = Random(n);
      Device<float> dg(g);
      const float lr = o.learning_rate * (step + 1);  // As a schedule changes it.
      ASSERT_TRUE(AdamUpdate(dw.get(), dg.get(), m.get(), v.get(), n,
                             AdamScalarsAt(o, step + 1, lr), nullptr)
                      .ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      (*cpu)->Apply(absl::MakeSpan(w_cpu), g, state, lr);
    }
    const std::vector<float> got = dw.Read(), m_got = m.Read(), v_got = v.Read();
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(got[i], w_cpu[i], 1e-5f * (1 + std::fabs(w_cpu[i]))) << i;
      // m sums terms of either sign (|g| up to 3): absolute error at the scale of the terms.
      ASSERT_NEAR(m_got[i], state.exp_avg[i], 1e-6f * (1 + std::fabs(state.exp_avg[i]))) << i;
      ASSERT_NEAR(v_got[i], state.exp_avg_sq[i], 1e-5f * (1e-3f + state.exp_avg_sq[i])) << i;
    }
  }
  EXPECT_FALSE(AdamUpdate(nullptr, nullptr, nullptr, nullptr, 10, AdamScalars{}, nullptr).ok());
}

TEST_F(KernelsTest, CastsRoundToNearestEven) {
  std::vector<float> x = Random(4099, -70000, 70000);
  x[0] = 1.0f + 1.0f / 2048;  // A tie for fp16.
  x[1] = std::numeric_limits<float>::infinity();
  x[2] = 1e-8f;  // Underflows fp16.
  const int64_t n = x.size();
  Device<float> dx(x), back(n);
  Device<uint16_t> h(n), b(n);
  ASSERT_TRUE(FloatToHalf(dx.get(), h.get(), n, nullptr).ok());
  ASSERT_TRUE(FloatToBf16(dx.get(), b.get(), n, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> hh = h.Read(), bh = b.Read();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(hh[i], __half_as_ushort(__float2half_rn(x[i]))) << i;
    ASSERT_EQ(bh[i], __bfloat16_as_ushort(__float2bfloat16_rn(x[i]))) << i;
  }
  ASSERT_TRUE(Bf16ToFloat(b.get(), back.get(), n, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> bf = back.Read();
  for (int64_t i = 3; i < n; ++i) ASSERT_NEAR(bf[i], x[i], std::fabs(x[i]) / 128) << i;
  ASSERT_TRUE(HalfToFloat(h.get(), back.get(), n, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(back.Read()[0], 1.0f);  // The tie went to the even neighbour.
}

TEST_F(KernelsTest, UnscaleCountsNonFinite) {
  std::vector<float> x = Random(10000);
  x[10] = std::numeric_limits<float>::infinity();
  x[20] = std::numeric_limits<float>::quiet_NaN();
  x[30] = 3e38f;  // Finite, but not after scaling by 2.
  Device<float> dx(x);
  Device<int> count(std::vector<int>{0});
  ASSERT_TRUE(UnscaleAndCheck(dx.get(), x.size(), 2.0f, count.get(), nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(count.Read()[0], 3);
  EXPECT_EQ(dx.Read()[0], 2.0f * x[0]);
}

TEST_F(KernelsTest, AddFillAndAddInto) {
  const int64_t n = 70001;
  const std::vector<float> a = Random(n), b = Random(n);
  Device<float> da(a), db(b), y(n), filled(n);
  ASSERT_TRUE(AddTensors(da.get(), db.get(), y.get(), n, nullptr).ok());
  ASSERT_TRUE(AddInto(da.get(), db.get(), n, nullptr).ok());  // b += a
  ASSERT_TRUE(Fill(filled.get(), n, 0.25f, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> yh = y.Read(), bh = db.Read(), fh = filled.Read();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(yh[i], a[i] + b[i]) << i;
    ASSERT_EQ(bh[i], a[i] + b[i]) << i;
    ASSERT_EQ(fh[i], 0.25f) << i;
  }
}

// The CPU graph's Dropout (worker/graph/shape_ops.cc), written out: the kernel must keep the
// same elements, bit for bit.
uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

TEST_F(KernelsTest, DropoutKeepsTheCpuGraphsElements) {
  const int64_t n = 50021;
  const double ratio = 0.3;
  const float scale = static_cast<float>(1.0 / (1.0 - ratio));
  const uint64_t key = SplitMix64(99 ^ SplitMix64(4));
  const std::vector<float> x = Random(n), dy = Random(n);
  Device<float> dx_in(x), ddy(dy), y(n), dx(n);
  Device<uint8_t> keep(n);
  ASSERT_TRUE(DropoutForward(dx_in.get(), y.get(), keep.get(), n, key, ratio, scale, nullptr).ok());
  ASSERT_TRUE(DropoutBackward(ddy.get(), keep.get(), dx.get(), n, scale, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> yh = y.Read(), dxh = dx.Read();
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double u =
        static_cast<double>(SplitMix64(key + static_cast<uint64_t>(i)) >> 11) * 0x1.0p-53;
    const bool k = u >= ratio;
    kept += k;
    ASSERT_EQ(yh[i], k ? x[i] * scale : 0.0f) << i;
    ASSERT_EQ(dxh[i], k ? dy[i] * scale : 0.0f) << i;
  }
  EXPECT_NEAR(static_cast<double>(kept) / n, 1 - ratio, 0.01);
}

}  // namespace
}  // namespace cuda
}  // namespace dptrain
