// The CUDA backend's own kernels, for what cuBLAS and cuDNN do not cover: activations,
// softmax cross-entropy with accuracy counting, the SGD update, fp16/bf16 casts and the
// overflow check of mixed precision. Pointers are device memory; every function enqueues
// on `stream` and returns a Status naming the launch that failed (checked with
// cudaGetLastError). Each has a CPU reference in kernels_test.cc.
#ifndef DPTRAIN_WORKER_CUDA_KERNELS_H_
#define DPTRAIN_WORKER_CUDA_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "common/optimizer.h"
#include "worker/nn/held_data.h"
#include "worker/nn/tensor.h"

namespace dptrain {
namespace cuda {

// y = max(x, 0) (NaN stays NaN); dx = y > 0 ? dy : 0.
absl::Status ReluForward(const float* x, float* y, int64_t n, cudaStream_t stream);
absl::Status ReluBackward(const float* y, const float* dy, float* dx, int64_t n,
                          cudaStream_t stream);

// For `batch` rows of `classes` logits and labels in [0, classes): adds the rows' summed
// cross-entropy to *loss_sum and the rows whose argmax is the label to *correct (both
// device scalars the caller zeroes), and writes d(mean loss)/d(logits) to dlogits. With
// `label_smoothing` e the target is (1 - e) onehot(label) + e / classes, as
// nn.CrossEntropyLoss(label_smoothing=e) (worker/nn/softmax_cross_entropy.h).
absl::Status SoftmaxCrossEntropy(const float* logits, const nn::Label* labels, int batch,
                                 int classes, float label_smoothing, float* loss_sum, int* correct,
                                 float* dlogits, cudaStream_t stream);

// nn.CrossEntropyLoss(weight=class_weights, label_smoothing=e) over `batch` rows: writes the
// batch's sum of label weights and its inverse to weight_sum[0] and [1] (device doubles), adds
// the mean loss (the rows' weighted terms over that sum) to *loss_sum and the rows whose argmax
// is the label to *correct, and writes the gradient to dlogits; per row
// nn::WeightedCrossEntropyRow, the CPU's. `class_weights`: `classes` device doubles, summing to
// all_weights.
absl::Status WeightedSoftmaxCrossEntropy(const float* logits, const nn::Label* labels, int batch,
                                         int classes, double label_smoothing,
                                         const double* class_weights, double all_weights,
                                         double* weight_sum, float* loss_sum, int* correct,
                                         float* dlogits, cudaStream_t stream);

// nn.MSELoss, nn.L1Loss or nn.BCEWithLogitsLoss (`loss`: nn::kLossMse, kLossL1, kLossBce) of
// `batch` rows of `outputs` values against `targets` (batch x outputs) or, where targets is
// null, onehot(labels): adds the rows' losses over `outputs` to *loss_sum (so *loss_sum / batch
// is the mean over batch x outputs) and, with labels, the rows whose argmax is the label to
// *correct; writes d(mean loss)/d(y) to grad. Per element nn::ElementLossOf, the CPU model's.
absl::Status ElementwiseLoss(int loss, const float* y, const float* targets,
                             const nn::Label* labels, int batch, int outputs, float* loss_sum,
                             int* correct, float* grad, cudaStream_t stream);

// torch.optim.SGD (dampening 0): d = g + wd w; buf = mu buf + d (buf = d when `first`);
// w -= lr buf, lr (d + mu buf) with `nesterov` (lr d when mu = 0; buf may then be null).
absl::Status SgdUpdate(float* w, const float* g, float* buf, int64_t n, float lr, float mu,
                       float wd, bool first, bool nesterov, cudaStream_t stream);

// torch.optim.Adam / AdamW (amsgrad off), one step with the scalars of AdamScalarsAt
// (common/optimizer.h), the same rounded numbers as the CPU optimizer: `m` and `v` are the
// moments (zero before the first step).
absl::Status AdamUpdate(float* w, const float* g, float* m, float* v, int64_t n,
                        const AdamScalars& s, cudaStream_t stream);

// Round to nearest even, as __float2half / __float2bfloat16 and torch's .half() /
// .bfloat16(); values are raw 16-bit patterns.
absl::Status FloatToHalf(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);
absl::Status FloatToBf16(const float* x, uint16_t* y, int64_t n, cudaStream_t stream);
absl::Status HalfToFloat(const uint16_t* x, float* y, int64_t n, cudaStream_t stream);
absl::Status Bf16ToFloat(const uint16_t* x, float* y, int64_t n, cudaStream_t stream);

// x *= scale, and adds the number of inf/NaN results to *non_finite (a device counter the
// caller zeroes): the unscale-and-check of a mixed-precision step in one pass.
absl::Status UnscaleAndCheck(float* x, int64_t n, float scale, int* non_finite,
                             cudaStream_t stream);

// The graph executor's element-wise work (gpu_graph.h): y = a + b; y += x; x[i] = value.
absl::Status AddTensors(const float* a, const float* b, float* y, int64_t n, cudaStream_t stream);
absl::Status AddInto(const float* x, float* y, int64_t n, cudaStream_t stream);
absl::Status Fill(float* x, int64_t n, float value, cudaStream_t stream);

// A batch of held samples (worker/nn/held_data.h): for each of the `batch` samples, its image's
// values HeldValue(...) into `images` (batch x channels x rows x cols) and its label into
// `labels`. `bytes` and `held_labels`: the held set; `mean`, `inv_std`, `fill`: per channel or
// null. Indices must be inside the held set (the caller checks them).
absl::Status GatherHeldBatch(const uint8_t* bytes, const nn::Label* held_labels,
                             const nn::HeldSample* samples, int batch, int channels, int rows,
                             int cols, const float* mean, const float* inv_std, const float* fill,
                             float* images, nn::Label* labels, cudaStream_t stream);

// Dropout with the CPU node's masks (worker/graph/shape_ops.cc), bit for bit: element i is
// kept when (SplitMix64(mask_key + i) >> 11) * 2^-53 >= ratio; y = kept ? x * scale : 0 and
// keep[i] records it; backward dx = keep[i] ? dy * scale : 0.
absl::Status DropoutForward(const float* x, float* y, uint8_t* keep, int64_t n, uint64_t mask_key,
                            double ratio, float scale, cudaStream_t stream);
absl::Status DropoutBackward(const float* dy, const uint8_t* keep, float* dx, int64_t n,
                             float scale, cudaStream_t stream);

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_KERNELS_H_
