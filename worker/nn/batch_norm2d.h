// Batch normalisation over the channels of NCHW input, as PyTorch's nn.BatchNorm2d(C, eps,
// momentum) with affine=True, track_running_stats=True (eps and momentum default to PyTorch's
// 1e-5 and 0.1; torchvision's MobileNetV3, EfficientNet, GoogLeNet and MnasNet set others).
//
// Parameters: weight (gamma) [C] and bias (beta) [C]. Buffers (see Layer::BufferSpecs), named as
// in PyTorch's state_dict: running_mean [C] (initially 0), running_var [C] (initially 1) and
// num_batches_tracked [] (a scalar, initially 0; an int64 in PyTorch, stored here as T, exact up
// to 2^24 steps in float).
//
// Training mode normalises with the batch statistics over (N, H, W), the variance biased (divided
// by N*H*W), and updates running = (1 - momentum) * running + momentum * batch statistic, with the
// unbiased variance (divided by N*H*W - 1; by 1 when N*H*W == 1, where PyTorch refuses to train),
// and increments num_batches_tracked. Evaluation mode normalises with the running statistics and
// leaves the buffers alone. Backward differentiates whichever mode the last Forward ran in.
#ifndef DPTRAIN_WORKER_NN_BATCH_NORM2D_H_
#define DPTRAIN_WORKER_NN_BATCH_NORM2D_H_

#include <string>
#include <vector>

#include "worker/nn/layer.h"
#include "worker/nn/thread_pool.h"

namespace dptrain {
namespace nn {

template <typename T>
class BatchNorm2d final : public Layer<T> {
 public:
  static constexpr double kEps = 1e-5;
  static constexpr double kMomentum = 0.1;

  explicit BatchNorm2d(int num_features, double eps = kEps, double momentum = kMomentum)
      : c_(num_features), eps_(eps), momentum_(momentum) {}

  int num_features() const { return c_; }
  double eps() const { return eps_; }
  double momentum() const { return momentum_; }

  std::string ToString() const override;
  absl::StatusOr<Dims> OutputDims(const Dims& input) const override;
  std::vector<TensorSpec> ParamSpecs() const override;
  void BindParams(const T* params, T* grads) override;
  std::vector<TensorSpec> BufferSpecs() const override;
  void BindBuffers(T* buffers) override;
  void InitBuffers(T* buffers) const override;
  // In training, more than one value per channel (batch x height x width > 1): the batch's
  // variance of one value is none (PyTorch refuses it alike).
  absl::Status CheckInput(TensorRef<T> input, bool training) const override;
  TensorRef<T> Forward(const LayerContext<T>& ctx, TensorRef<T> input, bool training) override;
  TensorRef<T> Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                        bool need_input_grad) override;

  // Forward and Backward writing to caller-owned buffers instead of the layer's own (input-sized,
  // not aliasing the argument; a null grad_input computes parameter gradients only). Backward
  // reads the input and the statistics, never the output, so a caller may modify the output
  // in place (Residual applies its ReLU there).
  void ForwardInto(const LayerContext<T>& ctx, TensorRef<T> input, bool training, T* output);
  // Both split the channels over ctx.pool's threads (each channel's sums as on one thread).
  void BackwardInto(const LayerContext<T>& ctx, TensorRef<T> grad_output, T* grad_input);

 private:
  template <typename Fn>
  void ForEachChannelBlock(ThreadPool* pool, int64_t count, Fn&& fn);

  const int c_;
  const double eps_;
  const double momentum_;
  const T* weight_ = nullptr;
  const T* bias_ = nullptr;
  T* grad_weight_ = nullptr;
  T* grad_bias_ = nullptr;
  T* running_mean_ = nullptr;
  T* running_var_ = nullptr;
  T* num_batches_tracked_ = nullptr;
  TensorRef<T> input_;
  bool training_ = false;        // Mode of the last Forward.
  std::vector<double> mean_;     // Per channel: the mean and 1 / sqrt(var + eps) used by the last
  std::vector<double> inv_std_;  // Forward (batch statistics in training, running ones if not).
  std::vector<T> output_;
};

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_BATCH_NORM2D_H_
