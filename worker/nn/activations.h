// Parameter-free element-wise and shape layers: ReLU, Sigmoid and Flatten, as PyTorch's
// nn.ReLU, nn.Sigmoid and nn.Flatten (which keeps the batch dimension).
#ifndef DPTRAIN_WORKER_NN_ACTIVATIONS_H_
#define DPTRAIN_WORKER_NN_ACTIVATIONS_H_

#include <string>
#include <vector>

#include "worker/nn/layer.h"
#include "worker/nn/thread_pool.h"

namespace dptrain {
namespace nn {

// max(x, 0); NaN stays NaN. The gradient at exactly 0 is 0, as in PyTorch.
template <typename T>
class ReLU final : public Layer<T> {
 public:
  std::string ToString() const override { return "ReLU()"; }
  absl::StatusOr<Dims> OutputDims(const Dims& input) const override { return input; }
  TensorRef<T> Forward(const LayerContext<T>& ctx, TensorRef<T> input, bool training) override;
  TensorRef<T> Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                        bool need_input_grad) override;

 private:
  std::vector<T> output_;
  TensorRef<T> output_ref_;
};

// 1 / (1 + exp(-x)); saturates to exactly 0 or 1 for large |x| without overflow trouble. The
// float version uses a vectorisable exp accurate to about 1 ulp; the double one uses std::exp.
template <typename T>
class Sigmoid final : public Layer<T> {
 public:
  std::string ToString() const override { return "Sigmoid()"; }
  absl::StatusOr<Dims> OutputDims(const Dims& input) const override { return input; }
  TensorRef<T> Forward(const LayerContext<T>& ctx, TensorRef<T> input, bool training) override;
  TensorRef<T> Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                        bool need_input_grad) override;

 private:
  std::vector<T> output_;
  TensorRef<T> output_ref_;
};

// [c, h, w] -> [c * h * w, 1, 1]. No copies: the output aliases the input and the input gradient
// aliases the output gradient.
template <typename T>
class Flatten final : public Layer<T> {
 public:
  std::string ToString() const override { return "Flatten()"; }
  absl::StatusOr<Dims> OutputDims(const Dims& input) const override;
  TensorRef<T> Forward(const LayerContext<T>& ctx, TensorRef<T> input, bool training) override;
  TensorRef<T> Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                        bool need_input_grad) override;

 private:
  Dims in_dims_;
};

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_ACTIVATIONS_H_
