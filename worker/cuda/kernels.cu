#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "worker/cuda/cuda_status.h"
#include "worker/cuda/kernel_launch.h"
#include "worker/cuda/kernels.h"
#include "worker/nn/loss_elements.h"
#include "worker/nn/weighted_cross_entropy.h"

namespace dptrain {
namespace cuda {
namespace {

__global__ void ReluForwardKernel(const float* x, float* y, int64_t n) {
  DPTRAIN_GRID_STRIDE(i, n) {
    const float v = x[i];
    y[i] = v < 0.0f ? 0.0f : v;
  }
}

__global__ void ReluBackwardKernel(const float* y, const float* dy, float* dx, int64_t n) {
  DPTRAIN_GRID_STRIDE(i, n) { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; }
}

// One thread per row (a thousand classes are a thousand steps of one thread: fine beside the
// network that made the logits).
__global__ void SoftmaxCrossEntropyKernel(const float* logits, const nn::Label* labels, int batch,
                                          int classes, float smoothing, float* loss_sum,
                                          int* correct, float* dlogits) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= batch) return;
  const float* z = logits + int64_t{row} * classes;
  float* dz = dlogits + int64_t{row} * classes;
  int best = 0;
  for (int c = 1; c < classes; ++c) {
    if (z[c] > z[best]) best = c;
  }
  const float top = z[best];
  float sum = 0.0f;
  for (int c = 0; c < classes; ++c) sum += expf(z[c] - top);
  const int label = labels[row];
  const float log_sum = logf(sum);
  const float spread = smoothing / static_cast<float>(classes);
  float loss = (1.0f - smoothing) * (log_sum - (z[label] - top));
  if (smoothing != 0.0f) {
    float all = 0.0f;
    for (int c = 0; c < classes; ++c) all += log_sum - (z[c] - top);
    loss += spread * all;
  }
  atomicAdd(loss_sum, loss);
  if (best == label) atomicAdd(correct, 1);
  const float inv_batch = 1.0f / static_cast<float>(batch);
  for (int c = 0; c < classes; ++c) {
    const float p = expf(z[c] - top) / sum;
    dz[c] = (p - ((c == label ? 1.0f - smoothing : 0.0f) + spread)) * inv_batch;
  }
}

// The batch's sum of label weights and its inverse (0 for a zero sum), in one thread, in the
// CPU's order.
__global__ void LabelWeightSumKernel(const nn::Label* labels, int batch, const double* w,
                                     double* sum_inv) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double sum = 0;
  for (int i = 0; i < batch; ++i) sum += w[labels[i]];
  sum_inv[0] = sum;
  sum_inv[1] = sum > 0 ? 1.0 / sum : 0.0;
}

// One thread per row: nn::WeightedCrossEntropyRow (the CPU's), the row's share of the mean
// added to *loss_sum.
__global__ void WeightedCrossEntropyKernel(const float* logits, const nn::Label* labels, int batch,
                                           int classes, double smoothing, const double* w,
                                           double all_weights, const double* sum_inv,
                                           float* loss_sum, int* correct, float* dlogits) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= batch) return;
  int argmax = 0;
  const double terms = nn::WeightedCrossEntropyRow(
      logits + int64_t{row} * classes, classes, labels[row], smoothing, w, all_weights, sum_inv[1],
      dlogits + int64_t{row} * classes, &argmax);
  atomicAdd(loss_sum, static_cast<float>(terms * sum_inv[1]));
  if (argmax == labels[row]) atomicAdd(correct, 1);
}

// One thread per row: the row's element-wise losses (nn::ElementLossOf, in double) against its
// targets or onehot(label); the row's mean over its outputs added to *loss_sum.
__global__ void ElementwiseLossKernel(int loss, const float* y, const float* targets,
                                      const nn::Label* labels, int batch, int outputs,
                                      float* loss_sum, int* correct, float* grad) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= batch) return;
  const float* z = y + int64_t{row} * outputs;
  float* g = grad + int64_t{row} * outputs;
  const double count = static_cast<double>(batch) * outputs;
  double sum = 0;
  int best = 0;
  for (int k = 0; k < outputs; ++k) {
    const double t = targets != nullptr ? targets[int64_t{row} * outputs + k]
                     : k == labels[row] ? 1.0
                                        : 0.0;
    const nn::ElementLoss e = nn::ElementLossOf(loss, z[k], t);
    sum += e.value;
    g[k] = static_cast<float>(e.derivative / count);
    if (z[k] > z[best]) best = k;
  }
  atomicAdd(loss_sum, static_cast<float>(sum / outputs));
  if (labels != nullptr && best == labels[row]) atomicAdd(correct, 1);
}

__global__ void SgdKernel(float* w, const float* g, float* buf, int64_t n, float lr, float mu,
                          float wd, bool first, bool nesterov) {
  DPTRAIN_GRID_STRIDE(i, n) {
    const float d = g[i] + wd * w[i];
    if (mu == 0.0f) {
      w[i] -= lr * d;
    } else {
      const float b = first ? d : mu * buf[i] + d;
      buf[i] = b;
      w[i] -= lr * (nesterov ? d + mu * b : b);
    }
  }
}

__global__ void AdamKernel(float* w, const float* g, float* m, float* v, int64_t n,
                           AdamScalars s) {
  DPTRAIN_GRID_STRIDE(i, n) {
    const float weight = w[i] * s.decay;
    const float grad = g[i] + s.l2 * weight;
    const float mi = m[i] * s.beta1 + s.one_minus_beta1 * grad;
    const float vi = v[i] * s.beta2 + s.one_minus_beta2 * grad * grad;
    m[i] = mi;
    v[i] = vi;
    // IEEE sqrt and division (no --use_fast_math here), as the CPU loop computes them.
    w[i] = weight - s.step_size * mi / (sqrtf(vi) / s.bias_correction2_sqrt + s.eps);
  }
}

__global__ void ToHalfKernel(const float* x, uint16_t* y, int64_t n) {
  DPTRAIN_GRID_STRIDE(i, n) { y[i] = __half_as_ushort(__float2half_rn(x[i])); }
}

__global__ void ToBf16Kernel(const float* x, uint16_t* y, int64_t n) {
  DPTRAIN_GRID_STRIDE(i, n) { y[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i])); }
}

__global__ void FromHalfKernel(const uint16_t* x, float* y, int64_t n) {
  DPTRAIN_GRID_STRIDE(i, n) { y[i] = __half2float(__ushort_as_half(x[i])); }
}

__global__ void FromBf16Kernel(const uint16_t* x, float* y, int64_t n) {
  DPTRAIN_GRID_STRIDE(i, n) { y[i] = __bfloat162float(__ushort_as_bfloat16(x[i])); }
}

__global__ void UnscaleKernel(float* x, int64_t n, float scale, int* non_finite) {
  int local = 0;
  DPTRAIN_GRID_STRIDE(i, n) {
    const float v = x[i] * scale;
    x[i] = v;
    local += isfinite(v) ? 0 : 1;
  }
  if (local > 0) atomicAdd(non_finite, local);
}

__global__ void AddTensorsKernel(const float* a, const float* b, float* y, int64_t n) {
  DPTRAIN_GRID_STRIDE(i, n) { y[i] = a[i] + b[i]; }
}

__global__ void AddIntoKernel(const float* x, float* y, int64_t n) {
  DPTRAIN_GRID_STRIDE(i, n) { y[i] += x[i]; }
}

__global__ void FillKernel(float* x, int64_t n, float value) {
  DPTRAIN_GRID_STRIDE(i, n) { x[i] = value; }
}

// One thread per value of the batch: sample i = k / (channels * plane), then c, y, x.
__global__ void GatherHeldKernel(const uint8_t* bytes, const nn::HeldSample* samples, int channels,
                                 int rows, int cols, const float* mean, const float* inv_std,
                                 const float* fill, float* images, int64_t n) {
  const int64_t plane = static_cast<int64_t>(rows) * cols, image = channels * plane;
  DPTRAIN_GRID_STRIDE(k, n) {
    const int64_t i = k / image, r = k % image;
    const int c = static_cast<int>(r / plane);
    const int64_t p = r % plane;
    const nn::HeldSample s = samples[i];
    images[k] = nn::HeldValue(bytes + s.index * image, rows, cols, c, static_cast<int>(p / cols),
                              static_cast<int>(p % cols), s, mean, inv_std, fill);
  }
}

__global__ void GatherHeldLabelsKernel(const nn::Label* held_labels, const nn::HeldSample* samples,
                                       nn::Label* labels, int batch) {
  DPTRAIN_GRID_STRIDE(i, batch) { labels[i] = held_labels[samples[i].index]; }
}

__device__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

__global__ void DropoutForwardKernel(const float* x, float* y, uint8_t* keep, int64_t n,
                                     uint64_t mask_key, double ratio, float scale) {
  DPTRAIN_GRID_STRIDE(i, n) {
    const double u =
        static_cast<double>(SplitMix64(mask_key + static_cast<uint64_t>(i)) >> 11) * 0x1.0p-53;
    const bool kept = u >= ratio;
    keep[i] = kept ? 1 : 0;
    y[i] = kept ? x[i] * scale : 0.0f;
  }
}

__global__ void DropoutBackwardKernel(const float* dy, const uint8_t* keep, float* dx, int64_t n,
                                      float scale) {
  DPTRAIN_GRID_STRIDE(i, n) { dx[i] = keep[i] ? dy[i] * scale : 0.0f; }
}

}  // namespace

absl::Status ReluForward(const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  ReluForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, n);
  return Launched("ReluForwardKernel<<<>>>");
}

absl::Status ReluBackward(const float* y, const float* dy, float* dx, int64_t n,
                          cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  ReluBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(y, dy, dx, n);
  return Launched("ReluBackwardKernel<<<>>>");
}

absl::Status SoftmaxCrossEntropy(const float* logits, const nn::Label* labels, int batch,
                                 int classes, float label_smoothing, float* loss_sum, int* correct,
                                 float* dlogits, cudaStream_t stream) {
  if (batch <= 0) return absl::OkStatus();
  if (classes < 1) return absl::InvalidArgumentError("SoftmaxCrossEntropy: classes < 1");
  SoftmaxCrossEntropyKernel<<<(batch + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      logits, labels, batch, classes, label_smoothing, loss_sum, correct, dlogits);
  return Launched("SoftmaxCrossEntropyKernel<<<>>>");
}

absl::Status SgdUpdate(float* w, const float* g, float* buf, int64_t n, float lr, float mu,
                       float wd, bool first, bool nesterov, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  if (mu != 0.0f && buf == nullptr) {
    return absl::InvalidArgumentError("SgdUpdate: momentum needs a buffer");
  }
  SgdKernel<<<Blocks(n), kThreads, 0, stream>>>(w, g, buf, n, lr, mu, wd, first, nesterov);
  return Launched("SgdKernel<<<>>>");
}

absl::Status AdamUpdate(float* w, const float* g, float* m, float* v, int64_t n,
                        const AdamScalars& s, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  if (m == nullptr || v == nullptr) {
    return absl::InvalidArgumentError("AdamUpdate: needs both moment buffers");
  }
  AdamKernel<<<Blocks(n), kThreads, 0, stream>>>(w, g, m, v, n, s);
  return Launched("AdamKernel<<<>>>");
}

absl::Status FloatToHalf(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  ToHalfKernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, n);
  return Launched("ToHalfKernel<<<>>>");
}

absl::Status FloatToBf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  ToBf16Kernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, n);
  return Launched("ToBf16Kernel<<<>>>");
}

absl::Status HalfToFloat(const uint16_t* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  FromHalfKernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, n);
  return Launched("FromHalfKernel<<<>>>");
}

absl::Status Bf16ToFloat(const uint16_t* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  FromBf16Kernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, n);
  return Launched("FromBf16Kernel<<<>>>");
}

absl::Status UnscaleAndCheck(float* x, int64_t n, float scale, int* non_finite,
                             cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  UnscaleKernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, scale, non_finite);
  return Launched("UnscaleKernel<<<>>>");
}

absl::Status AddTensors(const float* a, const float* b, float* y, int64_t n,
                        cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  AddTensorsKernel<<<Blocks(n), kThreads, 0, stream>>>(a, b, y, n);
  return Launched("AddTensorsKernel<<<>>>");
}

absl::Status AddInto(const float* x, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  AddIntoKernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, n);
  return Launched("AddIntoKernel<<<>>>");
}

absl::Status Fill(float* x, int64_t n, float value, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  FillKernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, value);
  return Launched("FillKernel<<<>>>");
}

absl::Status WeightedSoftmaxCrossEntropy(const float* logits, const nn::Label* labels, int batch,
                                         int classes, double label_smoothing,
                                         const double* class_weights, double all_weights,
                                         double* weight_sum, float* loss_sum, int* correct,
                                         float* dlogits, cudaStream_t stream) {
  if (batch <= 0) return absl::OkStatus();
  LabelWeightSumKernel<<<1, 1, 0, stream>>>(labels, batch, class_weights, weight_sum);
  if (absl::Status s = Launched("LabelWeightSumKernel<<<>>>"); !s.ok()) return s;
  WeightedCrossEntropyKernel<<<(batch + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      logits, labels, batch, classes, label_smoothing, class_weights, all_weights, weight_sum,
      loss_sum, correct, dlogits);
  return Launched("WeightedCrossEntropyKernel<<<>>>");
}

absl::Status ElementwiseLoss(int loss, const float* y, const float* targets,
                             const nn::Label* labels, int batch, int outputs, float* loss_sum,
                             int* correct, float* grad, cudaStream_t stream) {
  if (batch <= 0) return absl::OkStatus();
  ElementwiseLossKernel<<<(batch + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      loss, y, targets, labels, batch, outputs, loss_sum, correct, grad);
  return Launched("ElementwiseLossKernel<<<>>>");
}

absl::Status GatherHeldBatch(const uint8_t* bytes, const nn::Label* held_labels,
                             const nn::HeldSample* samples, int batch, int channels, int rows,
                             int cols, const float* mean, const float* inv_std, const float* fill,
                             float* images, nn::Label* labels, cudaStream_t stream) {
  const int64_t n = int64_t{batch} * channels * rows * cols;
  if (n <= 0) return absl::OkStatus();
  GatherHeldKernel<<<Blocks(n), kThreads, 0, stream>>>(bytes, samples, channels, rows, cols, mean,
                                                       inv_std, fill, images, n);
  if (absl::Status s = Launched("GatherHeldKernel<<<>>>"); !s.ok()) return s;
  GatherHeldLabelsKernel<<<Blocks(batch), kThreads, 0, stream>>>(held_labels, samples, labels,
                                                                 batch);
  return Launched("GatherHeldLabelsKernel<<<>>>");
}

absl::Status DropoutForward(const float* x, float* y, uint8_t* keep, int64_t n, uint64_t mask_key,
                            double ratio, float scale, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  DropoutForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, keep, n, mask_key, ratio, scale);
  return Launched("DropoutForwardKernel<<<>>>");
}

absl::Status DropoutBackward(const float* dy, const uint8_t* keep, float* dx, int64_t n,
                             float scale, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  DropoutBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(dy, keep, dx, n, scale);
  return Launched("DropoutBackwardKernel<<<>>>");
}

}  // namespace cuda
}  // namespace dptrain
