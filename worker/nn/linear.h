// Fully connected layer, y = x W^T + b, as PyTorch's nn.Linear: weight [out, in], bias [out].
// The input is flattened per sample, so its dims must hold exactly `in_features` elements.
#ifndef DPTRAIN_WORKER_NN_LINEAR_H_
#define DPTRAIN_WORKER_NN_LINEAR_H_

#include <string>
#include <vector>

#include "worker/nn/layer.h"

namespace dptrain {
namespace nn {

template <typename T>
class Linear final : public Layer<T> {
 public:
  Linear(int in_features, int out_features) : in_(in_features), out_(out_features) {}

  int in_features() const { return in_; }
  int out_features() const { return out_; }

  std::string ToString() const override;
  absl::StatusOr<Dims> OutputDims(const Dims& input) const override;
  std::vector<TensorSpec> ParamSpecs() const override;
  void BindParams(const T* params, T* grads) override;
  // With a pool: the forward and the input gradient split the batch's rows over its threads, the
  // weight and bias gradients their output rows (no cross-thread sums, so the same results as
  // without). Small layers stay on one thread. Without a pool each GEMM runs whole, on as many
  // threads as BLAS is set to.
  TensorRef<T> Forward(const LayerContext<T>& ctx, TensorRef<T> input, bool training) override;
  TensorRef<T> Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                        bool need_input_grad) override;

 private:
  const int in_;
  const int out_;
  const T* weight_ = nullptr;
  const T* bias_ = nullptr;
  T* grad_weight_ = nullptr;
  T* grad_bias_ = nullptr;
  TensorRef<T> input_;
  std::vector<T> output_;
};

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_LINEAR_H_
