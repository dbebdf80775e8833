#include "worker/nn/max_pool2d.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dptrain {
namespace nn {

template <typename T>
std::string MaxPool2d<T>::ToString() const {
  return PoolToString("MaxPool2d", o_);
}

template <typename T>
absl::StatusOr<Dims> MaxPool2d<T>::OutputDims(const Dims& input) const {
  return PoolOutputDims("MaxPool2d", o_, input);
}

template <typename T>
TensorRef<T> MaxPool2d<T>::Forward(const LayerContext<T>& ctx, TensorRef<T> input,
                                   bool /*training*/) {
  in_dims_ = input.dims;
  out_dims_ = Dims{input.dims.c,
                   PooledLength(input.dims.h, o_.kernel_h, o_.stride_h, o_.pad_h, o_.ceil_mode),
                   PooledLength(input.dims.w, o_.kernel_w, o_.stride_w, o_.pad_w, o_.ceil_mode)};
  const int h = in_dims_.h, w = in_dims_.w, oh = out_dims_.h, ow = out_dims_.w;
  const int64_t planes = int64_t{input.batch} * in_dims_.c;
  T* y = EnsureSize(output_, planes * oh * ow);
  int32_t* arg = EnsureSize(argmax_, planes * oh * ow);
  for (int64_t pl = 0; pl < planes; ++pl) {
    const T* x = input.data + pl * h * w;
    for (int oy = 0; oy < oh; ++oy) {
      // Every window holds at least one input element: padding <= kernel / 2, and a ceil-mode
      // window starts inside the input or its left padding.
      const int y0 = std::max(0, oy * o_.stride_h - o_.pad_h);
      const int y1 = std::min(h, oy * o_.stride_h - o_.pad_h + o_.kernel_h);
      for (int ox = 0; ox < ow; ++ox) {
        const int x0 = std::max(0, ox * o_.stride_w - o_.pad_w);
        const int x1 = std::min(w, ox * o_.stride_w - o_.pad_w + o_.kernel_w);
        int best = y0 * w + x0;
        T best_value = x[best];
        for (int iy = y0; iy < y1; ++iy) {
          for (int ix = x0; ix < x1; ++ix) {
            const T v = x[iy * w + ix];
            if (v > best_value || (std::isnan(v) && !std::isnan(best_value))) {
              best_value = v;
              best = iy * w + ix;
            }
          }
        }
        const int64_t at = (pl * oh + oy) * ow + ox;
        y[at] = best_value;
        arg[at] = best;
      }
    }
  }
  return {y, input.batch, out_dims_};
}

template <typename T>
TensorRef<T> MaxPool2d<T>::Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                                    bool need_input_grad) {
  if (!need_input_grad) return {};
  const int64_t in_plane = int64_t{in_dims_.h} * in_dims_.w;
  const int64_t out_plane = int64_t{out_dims_.h} * out_dims_.w;
  const int64_t planes = int64_t{grad_output.batch} * in_dims_.c;
  T* dx = this->GradInputBuffer(ctx, grad_output.data, planes * in_plane);
  std::fill(dx, dx + planes * in_plane, T(0));
  for (int64_t pl = 0; pl < planes; ++pl) {
    const T* dy = grad_output.data + pl * out_plane;
    const int32_t* arg = argmax_.data() + pl * out_plane;
    T* d = dx + pl * in_plane;
    for (int64_t i = 0; i < out_plane; ++i) d[arg[i]] += dy[i];
  }
  return {dx, grad_output.batch, in_dims_};
}

template class MaxPool2d<float>;
template class MaxPool2d<double>;

}  // namespace nn
}  // namespace dptrain
