// Max pooling as PyTorch's nn.MaxPool2d(kernel_size, stride, padding) with the defaults
// dilation=1 and ceil_mode=False. Padding counts as -infinity (it is never the maximum), and
// PyTorch's limit padding <= kernel / 2 applies. Ties go to the first maximum in the window (row
// by row), which receives the whole gradient; NaN wins over everything, as in PyTorch.
// No parameters.
#ifndef DPTRAIN_WORKER_NN_MAX_POOL2D_H_
#define DPTRAIN_WORKER_NN_MAX_POOL2D_H_

#include <cstdint>
#include <string>
#include <vector>

#include "worker/nn/layer.h"

namespace dptrain {
namespace nn {

struct MaxPool2dOptions {
  int kernel_h = 2;
  int kernel_w = 2;
  int stride_h = 2;
  int stride_w = 2;
  int pad_h = 0;
  int pad_w = 0;

  // As nn.MaxPool2d(kernel_size=k, stride=s, padding=p); stride 0 means stride = kernel.
  static MaxPool2dOptions Square(int kernel, int stride = 0, int padding = 0) {
    const int s = stride == 0 ? kernel : stride;
    return {kernel, kernel, s, s, padding, padding};
  }
};

template <typename T>
class MaxPool2d final : public Layer<T> {
 public:
  explicit MaxPool2d(const MaxPool2dOptions& options) : o_(options) {}

  std::string ToString() const override;
  absl::StatusOr<Dims> OutputDims(const Dims& input) const override;
  TensorRef<T> Forward(TensorRef<T> input, bool training) override;
  TensorRef<T> Backward(TensorRef<T> grad_output, bool need_input_grad) override;

 private:
  const MaxPool2dOptions o_;
  Dims in_dims_;
  Dims out_dims_;
  std::vector<int32_t> argmax_;  // Per output element: the index of its maximum in its plane.
  std::vector<T> output_;
  std::vector<T> grad_input_;
};

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_MAX_POOL2D_H_
