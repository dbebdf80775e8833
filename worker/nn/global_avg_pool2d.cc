#include "worker/nn/global_avg_pool2d.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dptrain {
namespace nn {

template <typename T>
absl::StatusOr<Dims> GlobalAvgPool2d<T>::OutputDims(const Dims& input) const {
  if (input.size() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToString(), ": does not fit input ", input.ToString()));
  }
  return Dims{input.c, 1, 1};
}

template <typename T>
TensorRef<T> GlobalAvgPool2d<T>::Forward(const LayerContext<T>& ctx, TensorRef<T> input,
                                         bool /*training*/) {
  in_dims_ = input.dims;
  const int64_t plane = int64_t{in_dims_.h} * in_dims_.w;
  const int64_t planes = int64_t{input.batch} * in_dims_.c;
  T* y = EnsureSize(output_, planes);
  const T scale = T(1) / T(plane);
  for (int64_t pl = 0; pl < planes; ++pl) {
    const T* x = input.data + pl * plane;
    T sum = 0;
    for (int64_t i = 0; i < plane; ++i) sum += x[i];
    y[pl] = sum * scale;
  }
  return {y, input.batch, Dims{in_dims_.c, 1, 1}};
}

template <typename T>
TensorRef<T> GlobalAvgPool2d<T>::Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                                          bool need_input_grad) {
  if (!need_input_grad) return {};
  const int64_t plane = int64_t{in_dims_.h} * in_dims_.w;
  const int64_t planes = int64_t{grad_output.batch} * in_dims_.c;
  T* dx = this->GradInputBuffer(ctx, grad_output.data, planes * plane);
  const T scale = T(1) / T(plane);
  for (int64_t pl = 0; pl < planes; ++pl) {
    const T g = grad_output.data[pl] * scale;
    T* d = dx + pl * plane;
    for (int64_t i = 0; i < plane; ++i) d[i] = g;
  }
  return {dx, grad_output.batch, in_dims_};
}

template class GlobalAvgPool2d<float>;
template class GlobalAvgPool2d<double>;

}  // namespace nn
}  // namespace dptrain
