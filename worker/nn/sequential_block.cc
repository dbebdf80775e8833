#include "worker/nn/sequential_block.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dptrain {
namespace nn {

std::vector<TensorSpec> PrefixSpecs(const std::string& prefix, std::vector<TensorSpec> specs) {
  for (TensorSpec& spec : specs) spec.name = absl::StrCat(prefix, ".", spec.name);
  return specs;
}

int64_t SpecsSize(const std::vector<TensorSpec>& specs) {
  int64_t size = 0;
  for (const TensorSpec& spec : specs) size += spec.size();
  return size;
}

template <typename T>
SequentialBlock<T>::SequentialBlock(std::vector<std::unique_ptr<Layer<T>>> layers)
    : layers_(std::move(layers)) {
  for (const auto& layer : layers_) {
    param_sizes_.push_back(SpecsSize(layer->ParamSpecs()));
    buffer_sizes_.push_back(SpecsSize(layer->BufferSpecs()));
  }
}

template <typename T>
std::string SequentialBlock<T>::ToString() const {
  std::string s = "Sequential(";
  for (size_t i = 0; i < layers_.size(); ++i) {
    absl::StrAppend(&s, i == 0 ? "" : ", ", layers_[i]->ToString());
  }
  return s + ")";
}

template <typename T>
absl::StatusOr<Dims> SequentialBlock<T>::OutputDims(const Dims& input) const {
  if (layers_.empty()) return absl::InvalidArgumentError("Sequential: no layers");
  Dims dims = input;
  for (size_t i = 0; i < layers_.size(); ++i) {
    absl::StatusOr<Dims> out = layers_[i]->OutputDims(dims);
    if (!out.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Sequential layer ", i, ": ", out.status().message()));
    }
    dims = *out;
  }
  return dims;
}

template <typename T>
std::vector<TensorSpec> SequentialBlock<T>::ParamSpecs() const {
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i < layers_.size(); ++i) {
    for (TensorSpec& spec : PrefixSpecs(absl::StrCat(i), layers_[i]->ParamSpecs())) {
      specs.push_back(std::move(spec));
    }
  }
  return specs;
}

template <typename T>
void SequentialBlock<T>::BindParams(const T* params, T* grads) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->BindParams(params, grads);
    params += param_sizes_[i];
    grads += param_sizes_[i];
  }
}

template <typename T>
std::vector<TensorSpec> SequentialBlock<T>::BufferSpecs() const {
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i < layers_.size(); ++i) {
    for (TensorSpec& spec : PrefixSpecs(absl::StrCat(i), layers_[i]->BufferSpecs())) {
      specs.push_back(std::move(spec));
    }
  }
  return specs;
}

template <typename T>
void SequentialBlock<T>::BindBuffers(T* buffers) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->BindBuffers(buffers);
    buffers += buffer_sizes_[i];
  }
}

template <typename T>
void SequentialBlock<T>::InitBuffers(T* buffers) const {
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->InitBuffers(buffers);
    buffers += buffer_sizes_[i];
  }
}

template <typename T>
absl::Status SequentialBlock<T>::CheckInput(TensorRef<T> input, bool training) const {
  TensorRef<T> at{nullptr, input.batch, input.dims};
  for (const auto& layer : layers_) {
    if (absl::Status s = layer->CheckInput(at, training); !s.ok()) return s;
    absl::StatusOr<Dims> out = layer->OutputDims(at.dims);
    if (!out.ok()) return out.status();
    at.dims = *out;
  }
  return absl::OkStatus();
}

template <typename T>
TensorRef<T> SequentialBlock<T>::Forward(const LayerContext<T>& ctx, TensorRef<T> input,
                                         bool training) {
  for (auto& layer : layers_) input = layer->Forward(ctx, input, training);
  return input;
}

template <typename T>
TensorRef<T> SequentialBlock<T>::Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                                          bool need_input_grad) {
  for (size_t i = layers_.size(); i-- > 0;) {
    grad_output = layers_[i]->Backward(ctx, grad_output, i > 0 || need_input_grad);
  }
  return grad_output;
}

template class SequentialBlock<float>;
template class SequentialBlock<double>;

}  // namespace nn
}  // namespace dptrain
