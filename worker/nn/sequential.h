// A chain of layers run in order, as PyTorch's nn.Sequential. Owns the layers; lays their
// parameters out back to back in one flat buffer (layer order, then each layer's ParamSpecs()
// order), which is the layout that crosses the wire. Buffers (batch norm's running statistics,
// Layer::BufferSpecs) are laid out the same way in a second flat buffer that never crosses it.
//
// Not thread-safe; one thread drives a Sequential at a time.
#ifndef DPTRAIN_WORKER_NN_SEQUENTIAL_H_
#define DPTRAIN_WORKER_NN_SEQUENTIAL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/nn/layer.h"
#include "worker/nn/tensor.h"

namespace dptrain {
namespace nn {

template <typename T>
class Sequential {
 public:
  // Checks that every layer accepts the previous layer's output dims (the first: `input`).
  // InvalidArgument naming the layer index otherwise, or for no layers.
  static absl::StatusOr<Sequential> Create(const Dims& input,
                                           std::vector<std::unique_ptr<Layer<T>>> layers);

  Sequential(Sequential&&) = default;
  Sequential& operator=(Sequential&&) = default;

  const Dims& input_dims() const { return dims_.front(); }
  const Dims& output_dims() const { return dims_.back(); }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  const Layer<T>& layer(int i) const { return *layers_[i]; }
  // Per-sample input dims of layer i (i == num_layers() gives the output dims).
  const Dims& dims(int i) const { return dims_[i]; }
  // First element of layer i's parameters in the flat buffers.
  int64_t param_offset(int i) const { return offsets_[i]; }
  int64_t num_params() const { return offsets_.back(); }
  // First element of layer i's buffers (Layer::BufferSpecs) in the flat buffer of buffers.
  int64_t buffer_offset(int i) const { return buffer_offsets_[i]; }
  int64_t num_buffers() const { return buffer_offsets_.back(); }

  // Binds every layer to its slice of `params` and `grads`, each num_params() elements, not
  // owned, which must outlive every later Forward/Backward. Call again if the buffers move.
  void BindParams(const T* params, T* grads);

  // Binds every layer to its slice of `buffers` (num_buffers() elements, not owned), and writes
  // the layers' initial buffer values to `buffers`.
  void BindBuffers(T* buffers);
  void InitBuffers(T* buffers) const;

  // The intra-op thread pool every layer's Forward and Backward get (LayerContext::pool; not
  // owned, must outlive every later call); null (the default): single-threaded.
  void SetThreadPool(ThreadPool* pool) { ctx_.pool = pool; }
  // The convolution algorithm they get (LayerContext::conv_algorithm).
  void SetConvAlgorithm(ConvAlgorithm algorithm) { ctx_.conv_algorithm = algorithm; }

  // Runs `batch` >= 1 samples of input_dims() each. The result (batch x output_dims()) is owned by
  // the last layer and valid until the next Forward. `input` must stay valid until Backward.
  TensorRef<T> Forward(const T* input, int batch, bool training);

  // Back-propagates d(loss)/d(output) of the last Forward and overwrites the bound gradients
  // with d(loss)/d(params). Stops at the first layer with parameters: no input gradient is made.
  void Backward(TensorRef<T> grad_output);

 private:
  Sequential() = default;

  std::vector<std::unique_ptr<Layer<T>>> layers_;
  // The input gradients of every layer (a stable address: ctx_ points to it, and moves along).
  std::unique_ptr<GradBufferPair<T>> grad_buffers_ = std::make_unique<GradBufferPair<T>>();
  LayerContext<T> ctx_{nullptr, ConvAlgorithm::kAuto, grad_buffers_.get()};
  std::vector<Dims> dims_;               // num_layers() + 1 entries.
  std::vector<int64_t> offsets_;         // num_layers() + 1 entries; the last is the total.
  std::vector<int64_t> buffer_offsets_;  // Likewise for the buffers.
  int first_with_params_ = 0;            // num_layers() when no layer has parameters.
};

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_SEQUENTIAL_H_
