// d2l's Residual block (the basic block of ResNet-18):
//
//   y = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))
//
// conv1 = Conv2d(in, out, 3, stride=s, padding=1), conv2 = Conv2d(out, out, 3, padding=1),
// bn1 = bn2 = BatchNorm2d(out), and shortcut = conv3 = Conv2d(in, out, 1, stride=s) if
// use_1x1conv, else the identity (which needs in == out and s == 1). All convolutions have biases.
//
// Parameters and buffers are named and ordered as PyTorch's state_dict of d2l's module, whose
// attributes are registered as conv1, conv2, conv3, bn1, bn2: "conv1.weight", "conv1.bias",
// "conv2.weight", ..., "conv3.bias", "bn1.weight", "bn1.bias", "bn2.weight", "bn2.bias"; buffers
// "bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked", then bn2's.
//
// Memory: the block keeps what its backward needs (conv1's and conv2's outputs, relu(bn1), its
// own output, and conv3's output) and its input gradient; its sub-layers share three more
// gradient buffers (ResidualScratch), which blocks may share in turn.
#ifndef DPTRAIN_WORKER_NN_RESIDUAL_H_
#define DPTRAIN_WORKER_NN_RESIDUAL_H_

#include <memory>
#include <string>
#include <vector>

#include "worker/nn/batch_norm2d.h"
#include "worker/nn/conv2d.h"
#include "worker/nn/layer.h"

namespace dptrain {
namespace nn {

// Gradient buffers that a Residual uses only inside its Backward, so that the blocks of one
// network (driven by one thread at a time) can share them.
template <typename T>
struct ResidualScratch {
  std::vector<T> grad_sum;  // d(loss)/d(bn2(...) + shortcut(x)).
  std::vector<T> a;         // Two buffers the sub-layers take turns writing their input
  std::vector<T> b;         // gradients to (a also holds conv3's).
};

struct ResidualOptions {
  int in_channels = 1;
  int out_channels = 1;
  bool use_1x1conv = false;
  int stride = 1;
};

template <typename T>
class Residual final : public Layer<T> {
 public:
  // `scratch` may be shared with other blocks that are never run concurrently with this one;
  // null: a private one.
  explicit Residual(const ResidualOptions& options,
                    std::shared_ptr<ResidualScratch<T>> scratch = nullptr);

  const ResidualOptions& options() const { return o_; }

  std::string ToString() const override;
  absl::StatusOr<Dims> OutputDims(const Dims& input) const override;
  std::vector<TensorSpec> ParamSpecs() const override;
  void BindParams(const T* params, T* grads) override;
  std::vector<TensorSpec> BufferSpecs() const override;
  void BindBuffers(T* buffers) override;
  void InitBuffers(T* buffers) const override;
  // Its batch norms' (on the block's output dims).
  absl::Status CheckInput(TensorRef<T> input, bool training) const override;
  TensorRef<T> Forward(const LayerContext<T>& ctx, TensorRef<T> input, bool training) override;
  TensorRef<T> Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                        bool need_input_grad) override;

 private:
  // The sub-layers with parameters in state_dict order (conv3 only if use_1x1conv).
  std::vector<Layer<T>*> ParamLayers() const;

  const ResidualOptions o_;
  Conv2d<T> conv1_;
  Conv2d<T> conv2_;
  std::unique_ptr<Conv2d<T>> conv3_;
  BatchNorm2d<T> bn1_;
  BatchNorm2d<T> bn2_;
  TensorRef<T> input_;
  Dims dims_;              // Per-sample output dims (also those of conv1's output).
  std::vector<T> act1_;    // relu(bn1(conv1(x))), the input of conv2.
  std::vector<T> output_;  // relu(bn2(...) + shortcut(x)), built in place.
  std::shared_ptr<ResidualScratch<T>> scratch_;
};

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_RESIDUAL_H_
