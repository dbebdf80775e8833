// Average pooling as PyTorch's nn.AvgPool2d(kernel_size, stride, padding, ceil_mode,
// count_include_pad): each window's sum divided by AvgPoolDivisor (kh * kw, padded zeros
// included, by default). No parameters.
#ifndef DPTRAIN_WORKER_NN_AVG_POOL2D_H_
#define DPTRAIN_WORKER_NN_AVG_POOL2D_H_

#include <string>
#include <vector>

#include "worker/nn/layer.h"
#include "worker/nn/pool2d_options.h"
#include "worker/nn/thread_pool.h"

namespace dptrain {
namespace nn {

using AvgPool2dOptions = Pool2dOptions;

// The divisor of output (oy, ox) of an h x w plane, as PyTorch's avg_pool2d: the window's
// extent up to the end of the padded input (a ceil_mode window may end past it), then, without
// count_include_pad, only the part inside the input.
int AvgPoolDivisor(const Pool2dOptions& o, int h, int w, int oy, int ox);

template <typename T>
class AvgPool2d final : public Layer<T> {
 public:
  explicit AvgPool2d(const AvgPool2dOptions& options) : o_(options) {}

  const AvgPool2dOptions& options() const { return o_; }

  std::string ToString() const override;
  absl::StatusOr<Dims> OutputDims(const Dims& input) const override;
  TensorRef<T> Forward(const LayerContext<T>& ctx, TensorRef<T> input, bool training) override;
  TensorRef<T> Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                        bool need_input_grad) override;

  // Splits the planes (sample x channel) over the pool's threads.

 private:
  bool is_2x2() const;  // Kernel 2x2, stride 2, no padding: a fast path.

  const AvgPool2dOptions o_;
  Dims in_dims_;
  Dims out_dims_;
  std::vector<T> output_;
};

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_AVG_POOL2D_H_
