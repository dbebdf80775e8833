#include "worker/nn/linear.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/nn/gemm.h"

namespace dptrain {
namespace nn {

template <typename T>
std::string Linear<T>::ToString() const {
  return absl::StrCat("Linear(", in_, ", ", out_, ")");
}

template <typename T>
absl::StatusOr<Dims> Linear<T>::OutputDims(const Dims& input) const {
  if (in_ < 1 || out_ < 1) {
    return absl::InvalidArgumentError(absl::StrCat(ToString(), ": features must be >= 1"));
  }
  if (input.size() != in_) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToString(), ": input ", input.ToString(), " has ", input.size(), " features"));
  }
  return Dims{out_, 1, 1};
}

template <typename T>
std::vector<TensorSpec> Linear<T>::ParamSpecs() const {
  return {{"weight", {out_, in_}}, {"bias", {out_}}};
}

template <typename T>
void Linear<T>::BindParams(const T* params, T* grads) {
  weight_ = params;
  bias_ = params + int64_t{out_} * in_;
  grad_weight_ = grads;
  grad_bias_ = grads + int64_t{out_} * in_;
}

template <typename T>
TensorRef<T> Linear<T>::Forward(TensorRef<T> input, bool /*training*/) {
  input_ = input;
  const int n = input.batch;
  T* y = EnsureSize(output_, int64_t{n} * out_);
  for (int i = 0; i < n; ++i) std::copy(bias_, bias_ + out_, y + int64_t{i} * out_);
  Gemm(false, true, n, out_, in_, T(1), input.data, in_, weight_, in_, T(1), y, out_);
  return {y, n, Dims{out_, 1, 1}};
}

template <typename T>
TensorRef<T> Linear<T>::Backward(TensorRef<T> grad_output, bool need_input_grad) {
  const int n = grad_output.batch;
  const T* dy = grad_output.data;
  // dW = dY^T X, db = column sums of dY.
  Gemm(true, false, out_, in_, n, T(1), dy, out_, input_.data, in_, T(0), grad_weight_, in_);
  std::fill(grad_bias_, grad_bias_ + out_, T(0));
  for (int i = 0; i < n; ++i) {
    const T* row = dy + int64_t{i} * out_;
    for (int o = 0; o < out_; ++o) grad_bias_[o] += row[o];
  }
  if (!need_input_grad) return {};
  // dX = dY W.
  T* dx = EnsureSize(grad_input_, int64_t{n} * in_);
  Gemm(false, false, n, in_, out_, T(1), dy, out_, weight_, in_, T(0), dx, in_);
  return {dx, n, input_.dims};
}

template class Linear<float>;
template class Linear<double>;

}  // namespace nn
}  // namespace dptrain
