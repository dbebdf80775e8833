// The layer interface of the CPU network: a layer maps a batch of samples to a batch of samples
// and back-propagates through the last batch it saw. Layers are templated on the scalar type so
// that the same code runs in float (training) and in double (gradient checks).
//
// Buffers: a layer owns its output buffer and reuses it from step to step; it grows to the
// largest batch seen and never shrinks, so steady-state steps do not allocate. Input gradients
// go to a GradBufferPair shared by the whole network (or, for a layer on its own, to a buffer
// of its own), so a deep network holds two gradient tensors rather than one per layer.
// Parameters and parameter gradients live in flat buffers owned by the caller (see BindParams).
//
// What a layer computes with (the thread pool, the convolution algorithm, the shared gradient
// buffers) comes with each call, in a LayerContext, as the GPU layers get their DeviceContext:
// a composite hands its sub-layers the context it was given, and nothing has to be set on a
// layer before it runs.
//
// A layer is not thread-safe; one thread drives it at a time.
#ifndef DPTRAIN_WORKER_NN_LAYER_H_
#define DPTRAIN_WORKER_NN_LAYER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/nn/tensor.h"

namespace dptrain {
namespace nn {

class ThreadPool;  // thread_pool.h

// How a float Conv2d computes: kIm2col (im2col + OpenBLAS, split over the pool), kOneDnn
// (oneDNN's convolution, onednn_conv.h), or kAuto (onednn_conv.h's measured PreferOneDnn).
// Double layers (gradient checks) always use im2col.
enum class ConvAlgorithm { kAuto, kIm2col, kOneDnn };

// Two buffers that the layers of one network take turns writing their input gradients to:
// each Backward writes to the one that does not hold its grad_output, which is all a
// back-propagation step needs alive at once.
template <typename T>
class GradBufferPair {
 public:
  // A buffer of at least `n` elements that does not hold `in_use`. Growing it moves it, so
  // earlier views into it die; they belong to layers already done with them.
  T* Other(const T* in_use, int64_t n) { return EnsureSize(buffers_[Holds(0, in_use) ? 1 : 0], n); }
  // Whether `p` points into one of the two buffers.
  bool Contains(const T* p) const { return Holds(0, p) || Holds(1, p); }

 private:
  bool Holds(int i, const T* p) const {
    const std::vector<T>& b = buffers_[i];
    std::less<const T*> less;
    return !b.empty() && !less(p, b.data()) && less(p, b.data() + b.size());
  }
  std::vector<T> buffers_[2];
};

// The per-call context of Forward and Backward. The default: the calling thread only, kAuto,
// each layer's own input-gradient buffer.
template <typename T>
struct LayerContext {
  // The intra-op thread pool to split the work over (not owned), or null: the calling thread.
  ThreadPool* pool = nullptr;
  // How convolutions compute (ConvAlgorithm).
  ConvAlgorithm conv_algorithm = ConvAlgorithm::kAuto;
  // The network's shared input-gradient buffers (not owned; must outlive the views Backward
  // returns), or null: a buffer of the layer's own.
  GradBufferPair<T>* grad_buffers = nullptr;
};

template <typename T>
class Layer {
 public:
  virtual ~Layer() = default;

  // Short description in PyTorch's spelling, e.g. "Linear(784, 256)".
  virtual std::string ToString() const = 0;

  // Per-sample output dims for per-sample input dims `input`. InvalidArgument if the layer's
  // configuration is invalid or `input` does not fit it. Forward may assume that OutputDims
  // succeeded for the dims it is given.
  virtual absl::StatusOr<Dims> OutputDims(const Dims& input) const = 0;

  // The learnable tensors in the order they are laid out in the flat buffers (PyTorch's order:
  // "weight" then "bias"); empty for parameter-free layers.
  virtual std::vector<TensorSpec> ParamSpecs() const { return {}; }

  // Points the layer at its parameters and their gradients: each buffer holds the tensors of
  // ParamSpecs() back to back. Not owned; both must outlive every later Forward/Backward. Must be
  // called before Forward by layers with parameters; the parameters may change between steps.
  virtual void BindParams(const T* params, T* grads) {}

  // Buffers: state that is not learnt by gradient descent (batch norm's running statistics),
  // updated by Forward in training mode and read in evaluation mode. Laid out like the parameters
  // but in a separate flat buffer, in PyTorch's state_dict order; empty for most layers.
  virtual std::vector<TensorSpec> BufferSpecs() const { return {}; }
  // Points the layer at its buffers (BufferSpecs() back to back). Not owned; must outlive every
  // later Forward. Must be called before Forward by layers with buffers.
  virtual void BindBuffers(T* buffers) {}
  // Writes PyTorch's initial buffer values (BufferSpecs() layout) to `buffers`.
  virtual void InitBuffers(T* buffers) const {}

  // Refuses an input Forward cannot compute with (a batch norm's single value per channel in
  // training, as PyTorch does): InvalidArgument saying why; OK by default. The graph's layer
  // nodes call it before Forward.
  virtual absl::Status CheckInput(TensorRef<T> input, bool training) const {
    return absl::OkStatus();
  }

  // Computes the output for `input`. The returned view is owned by the layer and valid until its
  // next Forward. `input` must stay valid and unchanged until Backward (if any) returns.
  virtual TensorRef<T> Forward(const LayerContext<T>& ctx, TensorRef<T> input, bool training) = 0;

  // Given d(loss)/d(output) for the last Forward (same batch and dims as that output), overwrites
  // the bound parameter gradients with d(loss)/d(params) and returns d(loss)/d(input), owned by
  // the layer and valid until its next Backward; or, with ctx.grad_buffers, in that pair and
  // valid only until the next Backward of any layer writes the pair (the caller consumes it
  // first or copies it). Returns an empty view
  // (data == nullptr) when `need_input_grad` is false, which saves the work for the first layer
  // of a network.
  virtual TensorRef<T> Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                                bool need_input_grad) = 0;

 protected:
  // Where Backward writes d(loss)/d(input) (`n` elements), given where grad_output lives.
  T* GradInputBuffer(const LayerContext<T>& ctx, const T* grad_output, int64_t n) {
    if (ctx.grad_buffers != nullptr) return ctx.grad_buffers->Other(grad_output, n);
    return EnsureSize(own_grad_input_, n);
  }

 private:
  std::vector<T> own_grad_input_;
};

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_LAYER_H_
