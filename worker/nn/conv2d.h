// 2-D convolution (cross-correlation, as PyTorch's nn.Conv2d with groups=1, dilation=1) over
// NCHW input: weight [out_c, in_c, kh, kw], bias [out_c]. Any kernel size, stride and zero
// padding. Computed per sample as im2col (from a zero-padded copy, so the copies are branch-free)
// followed by one GEMM; the im2col matrix stays in cache and is rebuilt in Backward rather than
// stored for the whole batch. Small outputs (ResNet's 7x7 and 4x4 stages) would make GEMMs with a
// handful of columns that re-read the whole weight matrix per sample, so samples are grouped side
// by side until a GEMM has at least kMinGemmColumns columns (28x28 outputs: one sample; LeNet's
// 10x10: three, measured neither faster nor slower than one; ResNet-18 at batch 32: about 10%
// less CPU time than one sample per GEMM). The group's im2col matrix is what is kept, never
// the whole batch's.
//
// A float layer may instead run oneDNN's convolution on the whole batch (onednn_conv.h), where
// the measured rule says it is faster (ConvAlgorithm::kAuto, with a pool) or when told to
// (kOneDnn). Its batch-sized scratch then comes from the pool's thread 0 (shared by the layers),
// or from the layer without a pool.
#ifndef DPTRAIN_WORKER_NN_CONV2D_H_
#define DPTRAIN_WORKER_NN_CONV2D_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/nn/layer.h"
#include "worker/nn/onednn_conv.h"
#include "worker/nn/thread_pool.h"

namespace dptrain {
namespace nn {

struct Conv2dOptions {
  int in_channels = 1;
  int out_channels = 1;
  int kernel_h = 1;
  int kernel_w = 1;
  int stride_h = 1;
  int stride_w = 1;
  int pad_h = 0;
  int pad_w = 0;

  // Square kernel, stride and padding, as nn.Conv2d(in, out, kernel_size=k, stride=s, padding=p).
  static Conv2dOptions Square(int in_channels, int out_channels, int kernel, int stride = 1,
                              int padding = 0) {
    return {in_channels, out_channels, kernel, kernel, stride, stride, padding, padding};
  }
};

template <typename T>
class Conv2d final : public Layer<T> {
 public:
  explicit Conv2d(const Conv2dOptions& options) : o_(options) {}

  const Conv2dOptions& options() const { return o_; }

  std::string ToString() const override;
  absl::StatusOr<Dims> OutputDims(const Dims& input) const override;
  std::vector<TensorSpec> ParamSpecs() const override;
  void BindParams(const T* params, T* grads) override;
  // With a pool (ctx.pool), Forward and Backward split the batch's sample groups over its
  // threads (each builds its own groups' im2col matrices and runs their GEMMs, which should then
  // be single-threaded BLAS). Backward cuts the groups into one contiguous part per thread, sums
  // each part's weight gradient on its own and then the parts in order, so the result depends
  // on the number of threads but not on scheduling. Scratch comes from the pool then.
  // ctx.conv_algorithm picks im2col or oneDNN (float only).
  // Whether the last Forward ran on oneDNN.
  bool last_used_onednn() const { return use_onednn_; }
  TensorRef<T> Forward(const LayerContext<T>& ctx, TensorRef<T> input, bool training) override;
  TensorRef<T> Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                        bool need_input_grad) override;
  // Backward that writes d(loss)/d(input) to `grad_input` (input-sized, caller-owned, not aliasing
  // grad_output), or computes parameter gradients only if it is null. Lets a block (Residual)
  // share its gradient buffers between its layers.
  void BackwardInto(const LayerContext<T>& ctx, TensorRef<T> grad_output, T* grad_input);

 private:
  // Rows of the im2col matrix (in_c * kh * kw) = columns of the weight matrix.
  int patch_size() const { return o_.in_channels * o_.kernel_h * o_.kernel_w; }
  // True for a 1x1, stride 1, unpadded kernel, whose im2col matrix is the input itself.
  bool is_pointwise() const;
  static constexpr int kMinGemmColumns = 256;

  // Samples per GEMM for the current output dims.
  int GroupSize(int batch) const;
  // Scratch buffers, per thread: from the pool if there is one, else the layer's own.
  enum Slot { kPadded, kColumns, kGroup, kGradColumns, kGradPadded, kGradWeight };
  T* Scratch(int thread, Slot slot, int64_t n);

  // The im2col matrix of samples [n0, n0 + count) of the current input, side by side:
  // patch_size() x (count * oh * ow), built in `thread`'s scratch. May point into the input.
  const T* Columns(int n0, int count, int thread);
  // Forward of samples [n0, n0 + count) into the output y, and the backward of the same samples:
  // dW (+)= their weight gradient (overwritten if `first`), their input gradient into dx if not
  // null.
  void ForwardGroup(int n0, int count, int thread, T* y);
  void BackwardGroup(const T* grad_output, int n0, int count, int thread, T* dw, bool first, T* dx);

  // The oneDNN convolution for this batch of `input` if the algorithm and the rule choose
  // oneDNN (made on first use, one per batch size), else null (always for double, and after
  // oneDNN refused the shape, which is said once on stderr).
  OneDnnConv* OneDnnFor(const TensorRef<T>& input);
  OneDnnConv::Scratch OneDnnScratch();

  const Conv2dOptions o_;
  const T* weight_ = nullptr;
  const T* bias_ = nullptr;
  T* grad_weight_ = nullptr;
  T* grad_bias_ = nullptr;
  TensorRef<T> input_;
  Dims out_dims_;
  std::vector<T> padded_;        // One zero-padded input sample (if there is padding).
  std::vector<T> columns_;       // One group's im2col matrix.
  std::vector<T> group_buffer_;  // One group's output (gradient), oc x (count * oh * ow).
  std::vector<T> grad_columns_;  // Its gradient, same shape.
  std::vector<T> grad_padded_;   // The gradient of padded_.
  std::vector<T> output_;
  // The current call's pool and algorithm (its LayerContext's), for the helpers above.
  void BeginCall(const LayerContext<T>& ctx);
  ThreadPool* pool_ = nullptr;
  ConvAlgorithm algorithm_ = ConvAlgorithm::kAuto;
  // By batch size, for onednn_dims_ and onednn_threads_ (the pool's threads they were made for).
  std::map<int, std::unique_ptr<OneDnnConv>> onednn_;
  int onednn_threads_ = 0;
  Dims onednn_dims_;
  bool onednn_refused_ = false;
  bool use_onednn_ = false;  // The last Forward ran on onednn_[input_.batch].
  std::vector<float> onednn_scratch_[OneDnnConv::kScratchSlots];  // Without a pool.
};

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_CONV2D_H_
