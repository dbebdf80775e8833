// A chain of layers that is itself a layer, as an nn.Sequential nested inside another module
// (d2l's ResNet stages). Its parameters and buffers are those of its layers, back to back in
// layer order, named "<index>.<name>" as PyTorch's state_dict names a child of a Sequential
// ("0.weight", "1.conv1.weight", ...).
#ifndef DPTRAIN_WORKER_NN_SEQUENTIAL_BLOCK_H_
#define DPTRAIN_WORKER_NN_SEQUENTIAL_BLOCK_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/nn/layer.h"

namespace dptrain {
namespace nn {

template <typename T>
class SequentialBlock final : public Layer<T> {
 public:
  explicit SequentialBlock(std::vector<std::unique_ptr<Layer<T>>> layers);

  int num_layers() const { return static_cast<int>(layers_.size()); }
  const Layer<T>& layer(int i) const { return *layers_[i]; }

  std::string ToString() const override;
  // InvalidArgument naming the failing layer's index, or for no layers.
  absl::StatusOr<Dims> OutputDims(const Dims& input) const override;
  std::vector<TensorSpec> ParamSpecs() const override;
  void BindParams(const T* params, T* grads) override;
  std::vector<TensorSpec> BufferSpecs() const override;
  void BindBuffers(T* buffers) override;
  void InitBuffers(T* buffers) const override;
  // Each layer's, on the dims it gets.
  absl::Status CheckInput(TensorRef<T> input, bool training) const override;
  TensorRef<T> Forward(const LayerContext<T>& ctx, TensorRef<T> input, bool training) override;
  TensorRef<T> Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                        bool need_input_grad) override;

 private:
  std::vector<std::unique_ptr<Layer<T>>> layers_;
  std::vector<int64_t> param_sizes_;   // Per layer: elements of its parameters.
  std::vector<int64_t> buffer_sizes_;  // Per layer: elements of its buffers.
};

// Prefixes each spec's name with "<prefix>.".
std::vector<TensorSpec> PrefixSpecs(const std::string& prefix, std::vector<TensorSpec> specs);
// Total elements of `specs`.
int64_t SpecsSize(const std::vector<TensorSpec>& specs);

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_SEQUENTIAL_BLOCK_H_
