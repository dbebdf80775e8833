#include "worker/nn/conv2d.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/nn/gemm.h"

namespace dptrain {
namespace nn {
namespace {

// Geometry of one convolution: input [c, h, w] -> output [oc, oh, ow].
struct Geometry {
  int c, h, w, kh, kw, sh, sw, ph, pw, oh, ow;

  bool padded() const { return ph > 0 || pw > 0; }
  int hp() const { return h + 2 * ph; }  // Height of the zero-padded input.
  int wp() const { return w + 2 * pw; }  // Width of the zero-padded input.
  int64_t padded_size() const { return int64_t{c} * hp() * wp(); }
};

Geometry MakeGeometry(const Conv2dOptions& o, const Dims& in, const Dims& out) {
  return {in.c,       in.h,    in.w,    o.kernel_h, o.kernel_w, o.stride_h,
          o.stride_w, o.pad_h, o.pad_w, out.h,      out.w};
}

// xp [c, hp, wp] = x [c, h, w] surrounded by zeros.
template <typename T>
void Pad(const Geometry& g, const T* x, T* xp) {
  std::fill(xp, xp + g.padded_size(), T(0));
  for (int ci = 0; ci < g.c; ++ci) {
    for (int iy = 0; iy < g.h; ++iy) {
      const T* src = x + (int64_t{ci} * g.h + iy) * g.w;
      T* dst = xp + (int64_t{ci} * g.hp() + iy + g.ph) * g.wp() + g.pw;
      for (int ix = 0; ix < g.w; ++ix) dst[ix] = src[ix];
    }
  }
}

// x [c, h, w] = the interior of xp [c, hp, wp]; the adjoint of Pad.
template <typename T>
void Crop(const Geometry& g, const T* xp, T* x) {
  for (int ci = 0; ci < g.c; ++ci) {
    for (int iy = 0; iy < g.h; ++iy) {
      const T* src = xp + (int64_t{ci} * g.hp() + iy + g.ph) * g.wp() + g.pw;
      T* dst = x + (int64_t{ci} * g.h + iy) * g.w;
      for (int ix = 0; ix < g.w; ++ix) dst[ix] = src[ix];
    }
  }
}

// cols[(ci * kh + ki) * kw + kj][oy * ow + ox] = xp[ci][oy * sh + ki][ox * sw + kj] for the
// padded input xp: every read is in bounds, so the rows are plain (vectorisable) copies.
template <typename T>
void Im2Col(const Geometry& g, const T* xp, T* cols) {
  const int64_t plane = int64_t{g.oh} * g.ow;
  for (int ci = 0; ci < g.c; ++ci) {
    for (int ki = 0; ki < g.kh; ++ki) {
      for (int kj = 0; kj < g.kw; ++kj) {
        T* row = cols + ((int64_t{ci} * g.kh + ki) * g.kw + kj) * plane;
        for (int oy = 0; oy < g.oh; ++oy) {
          const T* __restrict src = xp + (int64_t{ci} * g.hp() + oy * g.sh + ki) * g.wp() + kj;
          T* __restrict dst = row + int64_t{oy} * g.ow;
          if (g.sw == 1) {
            for (int ox = 0; ox < g.ow; ++ox) dst[ox] = src[ox];
          } else {
            for (int ox = 0; ox < g.ow; ++ox) dst[ox] = src[int64_t{ox} * g.sw];
          }
        }
      }
    }
  }
}

// The adjoint of Im2Col: adds every column entry onto the padded-input position it came from.
// dxp must be zeroed by the caller.
template <typename T>
void Col2Im(const Geometry& g, const T* cols, T* dxp) {
  const int64_t plane = int64_t{g.oh} * g.ow;
  for (int ci = 0; ci < g.c; ++ci) {
    for (int ki = 0; ki < g.kh; ++ki) {
      for (int kj = 0; kj < g.kw; ++kj) {
        const T* row = cols + ((int64_t{ci} * g.kh + ki) * g.kw + kj) * plane;
        for (int oy = 0; oy < g.oh; ++oy) {
          const T* __restrict src = row + int64_t{oy} * g.ow;
          T* __restrict dst = dxp + (int64_t{ci} * g.hp() + oy * g.sh + ki) * g.wp() + kj;
          if (g.sw == 1) {
            for (int ox = 0; ox < g.ow; ++ox) dst[ox] += src[ox];
          } else {
            for (int ox = 0; ox < g.ow; ++ox) dst[int64_t{ox} * g.sw] += src[ox];
          }
        }
      }
    }
  }
}

// Sum of x[0..n) with eight independent partial sums (vectorisable, and more accurate than one).
template <typename T>
T Sum(const T* x, int64_t n) {
  T partial[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) partial[l] += x[i + l];
  }
  T sum = 0;
  for (; i < n; ++i) sum += x[i];
  for (int l = 0; l < 8; ++l) sum += partial[l];
  return sum;
}

}  // namespace

template <typename T>
std::string Conv2d<T>::ToString() const {
  return absl::StrCat("Conv2d(", o_.in_channels, ", ", o_.out_channels, ", kernel_size=(",
                      o_.kernel_h, ", ", o_.kernel_w, "), stride=(", o_.stride_h, ", ", o_.stride_w,
                      "), padding=(", o_.pad_h, ", ", o_.pad_w, "))");
}

template <typename T>
absl::StatusOr<Dims> Conv2d<T>::OutputDims(const Dims& input) const {
  if (o_.in_channels < 1 || o_.out_channels < 1 || o_.kernel_h < 1 || o_.kernel_w < 1 ||
      o_.stride_h < 1 || o_.stride_w < 1 || o_.pad_h < 0 || o_.pad_w < 0) {
    return absl::InvalidArgumentError(absl::StrCat(ToString(), ": invalid configuration"));
  }
  const int ph = input.h + 2 * o_.pad_h, pw = input.w + 2 * o_.pad_w;
  if (input.c != o_.in_channels || ph < o_.kernel_h || pw < o_.kernel_w) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToString(), ": does not fit input ", input.ToString()));
  }
  return Dims{o_.out_channels, (ph - o_.kernel_h) / o_.stride_h + 1,
              (pw - o_.kernel_w) / o_.stride_w + 1};
}

template <typename T>
std::vector<TensorSpec> Conv2d<T>::ParamSpecs() const {
  return {{"weight", {o_.out_channels, o_.in_channels, o_.kernel_h, o_.kernel_w}},
          {"bias", {o_.out_channels}}};
}

template <typename T>
void Conv2d<T>::BindParams(const T* params, T* grads) {
  const int64_t weights = int64_t{o_.out_channels} * patch_size();
  weight_ = params;
  bias_ = params + weights;
  grad_weight_ = grads;
  grad_bias_ = grads + weights;
}

template <typename T>
bool Conv2d<T>::is_pointwise() const {
  return o_.kernel_h == 1 && o_.kernel_w == 1 && o_.stride_h == 1 && o_.stride_w == 1 &&
         o_.pad_h == 0 && o_.pad_w == 0;
}

template <typename T>
const T* Conv2d<T>::Columns(int n) {
  const T* x = input_.data + n * input_.dims.size();
  if (is_pointwise()) return x;
  const Geometry g = MakeGeometry(o_, input_.dims, out_dims_);
  if (g.padded()) {
    T* xp = EnsureSize(padded_, g.padded_size());
    Pad(g, x, xp);
    x = xp;
  }
  T* cols = EnsureSize(columns_, int64_t{patch_size()} * out_dims_.h * out_dims_.w);
  Im2Col(g, x, cols);
  return cols;
}

template <typename T>
TensorRef<T> Conv2d<T>::Forward(TensorRef<T> input, bool /*training*/) {
  input_ = input;
  out_dims_ = Dims{o_.out_channels, (input.dims.h + 2 * o_.pad_h - o_.kernel_h) / o_.stride_h + 1,
                   (input.dims.w + 2 * o_.pad_w - o_.kernel_w) / o_.stride_w + 1};
  const int oc = o_.out_channels, k = patch_size(), p = out_dims_.h * out_dims_.w;
  T* y = EnsureSize(output_, input.batch * out_dims_.size());
  for (int n = 0; n < input.batch; ++n) {
    T* yn = y + n * out_dims_.size();
    for (int c = 0; c < oc; ++c) std::fill(yn + int64_t{c} * p, yn + int64_t{c + 1} * p, bias_[c]);
    // Y_n [oc, p] = W [oc, k] * cols [k, p] + bias.
    Gemm(false, false, oc, p, k, T(1), weight_, k, Columns(n), p, T(1), yn, p);
  }
  return {y, input.batch, out_dims_};
}

template <typename T>
TensorRef<T> Conv2d<T>::Backward(TensorRef<T> grad_output, bool need_input_grad) {
  const int oc = o_.out_channels, k = patch_size(), p = out_dims_.h * out_dims_.w;
  const int batch = grad_output.batch;
  const Geometry g = MakeGeometry(o_, input_.dims, out_dims_);
  T* dx = need_input_grad ? EnsureSize(grad_input_, input_.size()) : nullptr;
  T* dcols = need_input_grad ? EnsureSize(grad_columns_, int64_t{k} * p) : nullptr;
  T* dxp = need_input_grad && g.padded() ? EnsureSize(grad_padded_, g.padded_size()) : nullptr;
  std::fill(grad_bias_, grad_bias_ + oc, T(0));
  for (int n = 0; n < batch; ++n) {
    const T* dyn = grad_output.data + n * out_dims_.size();
    for (int c = 0; c < oc; ++c) grad_bias_[c] += Sum(dyn + int64_t{c} * p, p);
    // dW [oc, k] (+)= dY_n [oc, p] * cols^T [p, k].
    Gemm(false, true, oc, k, p, T(1), dyn, p, Columns(n), p, n == 0 ? T(0) : T(1), grad_weight_, k);
    if (!need_input_grad) continue;
    T* dxn = dx + n * input_.dims.size();
    if (is_pointwise()) {
      Gemm(true, false, k, p, oc, T(1), weight_, k, dyn, p, T(0), dxn, p);
      continue;
    }
    // dcols [k, p] = W^T [k, oc] * dY_n [oc, p], then added back onto the (padded) input.
    Gemm(true, false, k, p, oc, T(1), weight_, k, dyn, p, T(0), dcols, p);
    T* target = g.padded() ? dxp : dxn;
    std::fill(target, target + (g.padded() ? g.padded_size() : input_.dims.size()), T(0));
    Col2Im(g, dcols, target);
    if (g.padded()) Crop(g, dxp, dxn);
  }
  if (!need_input_grad) return {};
  return {dx, batch, input_.dims};
}

template class Conv2d<float>;
template class Conv2d<double>;

}  // namespace nn
}  // namespace dptrain
