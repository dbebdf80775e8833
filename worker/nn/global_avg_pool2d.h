// Global average pooling, as PyTorch's nn.AdaptiveAvgPool2d((1, 1)): [c, h, w] -> [c, 1, 1], each
// channel's mean over its plane. No parameters.
#ifndef DPTRAIN_WORKER_NN_GLOBAL_AVG_POOL2D_H_
#define DPTRAIN_WORKER_NN_GLOBAL_AVG_POOL2D_H_

#include <string>
#include <vector>

#include "worker/nn/layer.h"

namespace dptrain {
namespace nn {

template <typename T>
class GlobalAvgPool2d final : public Layer<T> {
 public:
  std::string ToString() const override { return "AdaptiveAvgPool2d(output_size=(1, 1))"; }
  absl::StatusOr<Dims> OutputDims(const Dims& input) const override;
  TensorRef<T> Forward(const LayerContext<T>& ctx, TensorRef<T> input, bool training) override;
  TensorRef<T> Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                        bool need_input_grad) override;

 private:
  Dims in_dims_;
  std::vector<T> output_;
};

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_GLOBAL_AVG_POOL2D_H_
