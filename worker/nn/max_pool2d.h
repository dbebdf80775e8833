// Max pooling as PyTorch's nn.MaxPool2d(kernel_size, stride, padding, ceil_mode) with
// dilation=1 (ceil_mode: Pool2dOptions). Padding counts as -infinity (it is never the maximum), and
// PyTorch's limit padding <= kernel / 2 applies. Ties go to the first maximum in the window (row
// by row), which receives the whole gradient; NaN wins over everything, as in PyTorch.
// No parameters.
#ifndef DPTRAIN_WORKER_NN_MAX_POOL2D_H_
#define DPTRAIN_WORKER_NN_MAX_POOL2D_H_

#include <cstdint>
#include <string>
#include <vector>

#include "worker/nn/layer.h"
#include "worker/nn/pool2d_options.h"

namespace dptrain {
namespace nn {

using MaxPool2dOptions = Pool2dOptions;

template <typename T>
class MaxPool2d final : public Layer<T> {
 public:
  explicit MaxPool2d(const MaxPool2dOptions& options) : o_(options) {}

  const MaxPool2dOptions& options() const { return o_; }

  std::string ToString() const override;
  absl::StatusOr<Dims> OutputDims(const Dims& input) const override;
  TensorRef<T> Forward(const LayerContext<T>& ctx, TensorRef<T> input, bool training) override;
  TensorRef<T> Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                        bool need_input_grad) override;

 private:
  const MaxPool2dOptions o_;
  Dims in_dims_;
  Dims out_dims_;
  std::vector<int32_t> argmax_;  // Per output element: the index of its maximum in its plane.
  std::vector<T> output_;
};

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_MAX_POOL2D_H_
