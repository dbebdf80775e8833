#include "worker/nn/sequential.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dptrain {
namespace nn {

template <typename T>
absl::StatusOr<Sequential<T>> Sequential<T>::Create(const Dims& input,
                                                    std::vector<std::unique_ptr<Layer<T>>> layers) {
  if (layers.empty()) return absl::InvalidArgumentError("Sequential: no layers");
  if (input.size() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Sequential: empty input dims ", input.ToString()));
  }
  Sequential seq;
  seq.dims_.push_back(input);
  seq.offsets_.push_back(0);
  seq.buffer_offsets_.push_back(0);
  seq.first_with_params_ = static_cast<int>(layers.size());
  for (int i = 0; i < static_cast<int>(layers.size()); ++i) {
    absl::StatusOr<Dims> out = layers[i]->OutputDims(seq.dims_.back());
    if (!out.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Sequential layer ", i, ": ", out.status().message()));
    }
    int64_t size = 0;
    for (const TensorSpec& spec : layers[i]->ParamSpecs()) size += spec.size();
    if (size > 0 && seq.first_with_params_ == static_cast<int>(layers.size())) {
      seq.first_with_params_ = i;
    }
    seq.dims_.push_back(*out);
    seq.offsets_.push_back(seq.offsets_.back() + size);
    int64_t buffers = 0;
    for (const TensorSpec& spec : layers[i]->BufferSpecs()) buffers += spec.size();
    seq.buffer_offsets_.push_back(seq.buffer_offsets_.back() + buffers);
  }
  seq.layers_ = std::move(layers);
  return seq;
}

template <typename T>
void Sequential<T>::BindParams(const T* params, T* grads) {
  for (int i = 0; i < num_layers(); ++i) {
    layers_[i]->BindParams(params + offsets_[i], grads + offsets_[i]);
  }
}

template <typename T>
void Sequential<T>::BindBuffers(T* buffers) {
  for (int i = 0; i < num_layers(); ++i) layers_[i]->BindBuffers(buffers + buffer_offsets_[i]);
}

template <typename T>
void Sequential<T>::InitBuffers(T* buffers) const {
  for (int i = 0; i < num_layers(); ++i) layers_[i]->InitBuffers(buffers + buffer_offsets_[i]);
}

template <typename T>
TensorRef<T> Sequential<T>::Forward(const T* input, int batch, bool training) {
  TensorRef<T> x{input, batch, input_dims()};
  for (auto& layer : layers_) x = layer->Forward(ctx_, x, training);
  return x;
}

template <typename T>
void Sequential<T>::Backward(TensorRef<T> grad_output) {
  TensorRef<T> g = grad_output;
  for (int i = num_layers() - 1; i >= first_with_params_; --i) {
    g = layers_[i]->Backward(ctx_, g, /*need_input_grad=*/i > first_with_params_);
  }
}

template class Sequential<float>;
template class Sequential<double>;

}  // namespace nn
}  // namespace dptrain
