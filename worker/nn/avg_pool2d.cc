#include "worker/nn/avg_pool2d.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dptrain {
namespace nn {
namespace {

// The common 2x2, stride 2, unpadded case (LeNet's), as straight vectorisable loops.
template <typename T>
void Pool2x2Forward(const T* x, int64_t planes, int h, int w, T* y) {
  const int oh = h / 2, ow = w / 2;
  for (int64_t pl = 0; pl < planes; ++pl) {
    for (int oy = 0; oy < oh; ++oy) {
      const T* __restrict r0 = x + (pl * h + 2 * oy) * w;
      const T* __restrict r1 = r0 + w;
      T* __restrict out = y + (pl * oh + oy) * ow;
      for (int ox = 0; ox < ow; ++ox) {
        out[ox] = ((r0[2 * ox] + r0[2 * ox + 1]) + (r1[2 * ox] + r1[2 * ox + 1])) * T(0.25);
      }
    }
  }
}

template <typename T>
void Pool2x2Backward(const T* dy, int64_t planes, int h, int w, T* dx) {
  const int oh = h / 2, ow = w / 2;
  for (int64_t pl = 0; pl < planes; ++pl) {
    for (int oy = 0; oy < oh; ++oy) {
      const T* __restrict g = dy + (pl * oh + oy) * ow;
      T* __restrict d0 = dx + (pl * h + 2 * oy) * w;
      T* __restrict d1 = d0 + w;
      for (int ox = 0; ox < ow; ++ox) {
        const T v = g[ox] * T(0.25);
        d0[2 * ox] = v;
        d0[2 * ox + 1] = v;
        d1[2 * ox] = v;
        d1[2 * ox + 1] = v;
      }
      for (int ix = 2 * ow; ix < w; ++ix) d0[ix] = d1[ix] = T(0);  // Odd width: last column.
    }
    if (h % 2 != 0) std::fill(dx + (pl * h + h - 1) * w, dx + (pl + 1) * h * w, T(0));
  }
}

}  // namespace

template <typename T>
std::string AvgPool2d<T>::ToString() const {
  return PoolToString("AvgPool2d", o_);
}

template <typename T>
absl::StatusOr<Dims> AvgPool2d<T>::OutputDims(const Dims& input) const {
  return PoolOutputDims("AvgPool2d", o_, input);
}

template <typename T>
bool AvgPool2d<T>::is_2x2() const {
  return o_.kernel_h == 2 && o_.kernel_w == 2 && o_.stride_h == 2 && o_.stride_w == 2 &&
         o_.pad_h == 0 && o_.pad_w == 0 && !o_.ceil_mode;
}

int AvgPoolDivisor(const Pool2dOptions& o, int h, int w, int oy, int ox) {
  // PyTorch's avg_pool2d: the window's extent up to the padded input's end, then (without
  // count_include_pad) only the part inside the input.
  const int hs = oy * o.stride_h - o.pad_h, ws = ox * o.stride_w - o.pad_w;
  const int he = std::min(hs + o.kernel_h, h + o.pad_h),
            we = std::min(ws + o.kernel_w, w + o.pad_w);
  if (o.count_include_pad) return (he - hs) * (we - ws);
  return (std::min(he, h) - std::max(hs, 0)) * (std::min(we, w) - std::max(ws, 0));
}

template <typename T>
TensorRef<T> AvgPool2d<T>::Forward(const LayerContext<T>& ctx, TensorRef<T> input,
                                   bool /*training*/) {
  in_dims_ = input.dims;
  out_dims_ = Dims{input.dims.c,
                   PooledLength(input.dims.h, o_.kernel_h, o_.stride_h, o_.pad_h, o_.ceil_mode),
                   PooledLength(input.dims.w, o_.kernel_w, o_.stride_w, o_.pad_w, o_.ceil_mode)};
  const int h = in_dims_.h, w = in_dims_.w, oh = out_dims_.h, ow = out_dims_.w;
  const int64_t planes = int64_t{input.batch} * in_dims_.c;
  T* y = EnsureSize(output_, planes * oh * ow);
  const int64_t min_planes =
      planes * h * w >= kMinParallelElements ? 2 : planes + 1;  // Else one thread.
  if (is_2x2()) {
    ParallelFor(
        ctx.pool, planes,
        [&](int64_t p0, int64_t p1, int) {
          Pool2x2Forward(input.data + p0 * h * w, p1 - p0, h, w, y + p0 * oh * ow);
        },
        min_planes);
    return {y, input.batch, out_dims_};
  }
  ParallelFor(
      ctx.pool, planes,
      [&](int64_t p0, int64_t p1, int) {
        for (int64_t pl = p0; pl < p1; ++pl) {
          const T* x = input.data + pl * h * w;
          T* yp = y + pl * oh * ow;
          for (int oy = 0; oy < oh; ++oy) {
            const int y0 = std::max(0, oy * o_.stride_h - o_.pad_h);
            const int y1 = std::min(h, oy * o_.stride_h - o_.pad_h + o_.kernel_h);
            for (int ox = 0; ox < ow; ++ox) {
              const int x0 = std::max(0, ox * o_.stride_w - o_.pad_w);
              const int x1 = std::min(w, ox * o_.stride_w - o_.pad_w + o_.kernel_w);
              T sum = 0;
              for (int iy = y0; iy < y1; ++iy) {
                for (int ix = x0; ix < x1; ++ix) sum += x[iy * w + ix];
              }
              yp[oy * ow + ox] = sum * (T(1) / T(AvgPoolDivisor(o_, h, w, oy, ox)));
            }
          }
        }
      },
      min_planes);
  return {y, input.batch, out_dims_};
}

template <typename T>
TensorRef<T> AvgPool2d<T>::Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                                    bool need_input_grad) {
  if (!need_input_grad) return {};
  const int h = in_dims_.h, w = in_dims_.w, oh = out_dims_.h, ow = out_dims_.w;
  const int64_t planes = int64_t{grad_output.batch} * in_dims_.c;
  T* dx = this->GradInputBuffer(ctx, grad_output.data, planes * h * w);
  const int64_t min_planes = planes * h * w >= kMinParallelElements ? 2 : planes + 1;
  if (is_2x2()) {
    ParallelFor(
        ctx.pool, planes,
        [&](int64_t p0, int64_t p1, int) {
          Pool2x2Backward(grad_output.data + p0 * oh * ow, p1 - p0, h, w, dx + p0 * h * w);
        },
        min_planes);
    return {dx, grad_output.batch, in_dims_};
  }
  ParallelFor(
      ctx.pool, planes,
      [&](int64_t p0, int64_t p1, int) {
        std::fill(dx + p0 * h * w, dx + p1 * h * w, T(0));
        for (int64_t pl = p0; pl < p1; ++pl) {
          const T* dy = grad_output.data + pl * oh * ow;
          T* dxp = dx + pl * h * w;
          for (int oy = 0; oy < oh; ++oy) {
            const int y0 = std::max(0, oy * o_.stride_h - o_.pad_h);
            const int y1 = std::min(h, oy * o_.stride_h - o_.pad_h + o_.kernel_h);
            for (int ox = 0; ox < ow; ++ox) {
              const int x0 = std::max(0, ox * o_.stride_w - o_.pad_w);
              const int x1 = std::min(w, ox * o_.stride_w - o_.pad_w + o_.kernel_w);
              const T g = dy[oy * ow + ox] * (T(1) / T(AvgPoolDivisor(o_, h, w, oy, ox)));
              for (int iy = y0; iy < y1; ++iy) {
                for (int ix = x0; ix < x1; ++ix) dxp[iy * w + ix] += g;
              }
            }
          }
        }
      },
      min_planes);
  return {dx, grad_output.batch, in_dims_};
}

template class AvgPool2d<float>;
template class AvgPool2d<double>;

}  // namespace nn
}  // namespace dptrain
