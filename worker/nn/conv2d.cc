#include "worker/nn/conv2d.h"

#include <algorithm>
#include <iostream>
#include <type_traits>

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
// padded input xp, rows `ld` apart: every read is in bounds, so the rows are plain (vectorisable)
// copies.
template <typename T>
void Im2Col(const Geometry& g, const T* xp, T* cols, int64_t ld) {
  for (int ci = 0; ci < g.c; ++ci) {
    for (int ki = 0; ki < g.kh; ++ki) {
      for (int kj = 0; kj < g.kw; ++kj) {
        T* row = cols + ((int64_t{ci} * g.kh + ki) * g.kw + kj) * ld;
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
void Col2Im(const Geometry& g, const T* cols, int64_t ld, T* dxp) {
  for (int ci = 0; ci < g.c; ++ci) {
    for (int ki = 0; ki < g.kh; ++ki) {
      for (int kj = 0; kj < g.kw; ++kj) {
        const T* row = cols + ((int64_t{ci} * g.kh + ki) * g.kw + kj) * ld;
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
int Conv2d<T>::GroupSize(int batch) const {
  const int p = out_dims_.h * out_dims_.w;
  return std::max(1, std::min(batch, (kMinGemmColumns + p - 1) / p));
}

template <typename T>
T* Conv2d<T>::Scratch(int thread, Slot slot, int64_t n) {
  if (pool_ != nullptr) return pool_->Scratch<T>(thread, slot, n);
  switch (slot) {
    case kPadded:
      return EnsureSize(padded_, n);
    case kColumns:
      return EnsureSize(columns_, n);
    case kGroup:
      return EnsureSize(group_buffer_, n);
    case kGradColumns:
      return EnsureSize(grad_columns_, n);
    case kGradPadded:
      return EnsureSize(grad_padded_, n);
    case kGradWeight:
      break;  // Thread 0 (the only one without a pool) accumulates into grad_weight_.
  }
  return nullptr;
}

template <typename T>
const T* Conv2d<T>::Columns(int n0, int count, int thread) {
  const Geometry g = MakeGeometry(o_, input_.dims, out_dims_);
  const int64_t p = int64_t{out_dims_.h} * out_dims_.w, ld = count * p;
  if (count == 1 && is_pointwise()) return input_.data + n0 * input_.dims.size();
  T* cols = Scratch(thread, kColumns, patch_size() * ld);
  for (int s = 0; s < count; ++s) {
    const T* x = input_.data + (n0 + s) * input_.dims.size();
    if (is_pointwise()) {
      for (int c = 0; c < g.c; ++c) std::copy(x + c * p, x + (c + 1) * p, cols + c * ld + s * p);
      continue;
    }
    if (g.padded()) {
      T* xp = Scratch(thread, kPadded, g.padded_size());
      Pad(g, x, xp);
      x = xp;
    }
    Im2Col(g, x, cols + s * p, ld);
  }
  return cols;
}

template <typename T>
OneDnnConv* Conv2d<T>::OneDnnFor(const TensorRef<T>& input) {
  if constexpr (!std::is_same_v<T, float>) {
    return nullptr;
  } else {
    if (onednn_refused_ || algorithm_ == ConvAlgorithm::kIm2col) return nullptr;
    if (algorithm_ == ConvAlgorithm::kAuto &&
        (pool_ == nullptr || !PreferOneDnn(o_, input.dims, pool_->num_threads()))) {
      return nullptr;
    }
    if (input.dims != onednn_dims_ || NumThreads(pool_) != onednn_threads_) {
      onednn_.clear();
      onednn_dims_ = input.dims;
      onednn_threads_ = NumThreads(pool_);
    }
    std::unique_ptr<OneDnnConv>& conv = onednn_[input.batch];
    if (conv == nullptr) {
      auto made = OneDnnConv::Create(o_, input.dims, input.batch, NumThreads(pool_));
      if (!made.ok()) {
        std::cerr << ToString() << ": " << made.status().message() << "; im2col from now on"
                  << std::endl;
        onednn_refused_ = true;
        onednn_.clear();
        return nullptr;
      }
      conv = *std::move(made);
    }
    return conv.get();
  }
}

template <typename T>
OneDnnConv::Scratch Conv2d<T>::OneDnnScratch() {
  return [this](int slot, int64_t floats) {
    if (pool_ != nullptr) return pool_->Scratch<float>(0, slot, floats);
    return EnsureSize(onednn_scratch_[slot], floats);
  };
}

template <typename T>
void Conv2d<T>::BeginCall(const LayerContext<T>& ctx) {
  pool_ = ctx.pool;
  algorithm_ = ctx.conv_algorithm;
}

template <typename T>
TensorRef<T> Conv2d<T>::Forward(const LayerContext<T>& ctx, TensorRef<T> input, bool /*training*/) {
  BeginCall(ctx);
  input_ = input;
  out_dims_ = Dims{o_.out_channels, (input.dims.h + 2 * o_.pad_h - o_.kernel_h) / o_.stride_h + 1,
                   (input.dims.w + 2 * o_.pad_w - o_.kernel_w) / o_.stride_w + 1};
  if constexpr (std::is_same_v<T, float>) {
    OneDnnConv* onednn = OneDnnFor(input);
    use_onednn_ = onednn != nullptr;
    if (use_onednn_) {
      float* y = EnsureSize(output_, input.batch * out_dims_.size());
      onednn->Forward(input.data, weight_, bias_, y, OneDnnScratch());
      return {y, input.batch, out_dims_};
    }
  }
  const int group = GroupSize(input.batch);
  const int groups = (input.batch + group - 1) / group;
  T* y = EnsureSize(output_, input.batch * out_dims_.size());
  ParallelFor(pool_, groups, [&](int64_t g0, int64_t g1, int thread) {
    for (int64_t gi = g0; gi < g1; ++gi) {
      const int n0 = static_cast<int>(gi) * group;
      ForwardGroup(n0, std::min(group, input.batch - n0), thread, y);
    }
  });
  return {y, input.batch, out_dims_};
}

template <typename T>
void Conv2d<T>::ForwardGroup(int n0, int count, int thread, T* y) {
  const int oc = o_.out_channels, k = patch_size(), p = out_dims_.h * out_dims_.w;
  const T* cols = Columns(n0, count, thread);
  if (count == 1) {
    T* yn = y + n0 * out_dims_.size();
    for (int c = 0; c < oc; ++c) std::fill(yn + int64_t{c} * p, yn + int64_t{c + 1} * p, bias_[c]);
    // Y_n [oc, p] = W [oc, k] * cols [k, p] + bias.
    Gemm(false, false, oc, p, k, T(1), weight_, k, cols, p, T(1), yn, p);
    return;
  }
  // Y [oc, count * p] = W [oc, k] * cols [k, count * p], then scattered to NCHW with the bias.
  const int64_t ld = int64_t{count} * p;
  T* yg = Scratch(thread, kGroup, oc * ld);
  Gemm(false, false, oc, count * p, k, T(1), weight_, k, cols, count * p, T(0), yg, count * p);
  for (int s = 0; s < count; ++s) {
    T* yn = y + (n0 + s) * out_dims_.size();
    for (int c = 0; c < oc; ++c) {
      const T* __restrict src = yg + c * ld + s * p;
      T* __restrict dst = yn + int64_t{c} * p;
      const T b = bias_[c];
      for (int i = 0; i < p; ++i) dst[i] = src[i] + b;
    }
  }
}

template <typename T>
TensorRef<T> Conv2d<T>::Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                                 bool need_input_grad) {
  if (!need_input_grad) {
    BackwardInto(ctx, grad_output, nullptr);
    return {};
  }
  T* dx = this->GradInputBuffer(ctx, grad_output.data, input_.size());
  BackwardInto(ctx, grad_output, dx);
  return {dx, grad_output.batch, input_.dims};
}

template <typename T>
void Conv2d<T>::BackwardInto(const LayerContext<T>& ctx, TensorRef<T> grad_output, T* dx) {
  BeginCall(ctx);
  if constexpr (std::is_same_v<T, float>) {
    if (use_onednn_) {
      onednn_[input_.batch]->Backward(input_.data, weight_, grad_output.data, grad_weight_,
                                      grad_bias_, dx, OneDnnScratch());
      return;
    }
  }
  const int oc = o_.out_channels, k = patch_size(), p = out_dims_.h * out_dims_.w;
  const int batch = grad_output.batch;
  const int group = GroupSize(batch);
  const int groups = (batch + group - 1) / group;
  const int64_t out_size = out_dims_.size();
  // Bias gradient: per channel, the samples in order (the same sums on any number of threads).
  ParallelFor(
      pool_, oc,
      [&](int64_t c0, int64_t c1, int) {
        for (int64_t c = c0; c < c1; ++c) {
          T sum = 0;
          for (int n = 0; n < batch; ++n) sum += Sum(grad_output.data + n * out_size + c * p, p);
          grad_bias_[c] = sum;
        }
      },
      int64_t{batch} * out_size >= kMinParallelElements ? 2 : oc + 1);
  // The groups are cut into `parts` contiguous runs (one per thread), each summing its weight
  // gradient on its own (part 0 into grad_weight_, the others into scratch); the partial sums
  // are then added in part order, whichever thread ran which part.
  const int parts = groups >= 2 ? std::min(NumThreads(pool_), groups) : 1;
  const int64_t wsize = int64_t{oc} * k;
  auto run_part = [&](int64_t part, int thread) {
    const int64_t g0 = ChunkBegin(groups, parts, part), g1 = ChunkBegin(groups, parts, part + 1);
    T* dw =
        part == 0 ? grad_weight_ : pool_->Scratch<T>(static_cast<int>(part), kGradWeight, wsize);
    for (int64_t gi = g0; gi < g1; ++gi) {
      const int n0 = static_cast<int>(gi) * group;
      BackwardGroup(grad_output.data, n0, std::min(group, batch - n0), thread, dw, gi == g0, dx);
    }
  };
  if (parts == 1) {
    run_part(0, 0);
    return;
  }
  pool_->Run(parts, run_part);
  std::vector<const T*> partial;  // Parts 1.. in order.
  for (int part = 1; part < parts; ++part) {
    partial.push_back(pool_->Scratch<T>(part, kGradWeight, wsize));
  }
  ParallelFor(
      pool_, wsize,
      [&](int64_t i0, int64_t i1, int) {
        T* __restrict dw = grad_weight_;
        for (const T* src : partial) {
          for (int64_t i = i0; i < i1; ++i) dw[i] += src[i];
        }
      },
      kMinParallelElements);
}

template <typename T>
void Conv2d<T>::BackwardGroup(const T* grad_output, int n0, int count, int thread, T* dw,
                              bool first, T* dx) {
  const int oc = o_.out_channels, k = patch_size(), p = out_dims_.h * out_dims_.w;
  const Geometry g = MakeGeometry(o_, input_.dims, out_dims_);
  const int64_t ld = int64_t{count} * p;
  // dY [oc, count * p]: the samples' output gradients side by side (as is for one sample).
  const T* dy = grad_output + n0 * out_dims_.size();
  if (count > 1) {
    T* gathered = Scratch(thread, kGroup, oc * ld);
    for (int s = 0; s < count; ++s) {
      for (int c = 0; c < oc; ++c) {
        const T* src = dy + s * out_dims_.size() + int64_t{c} * p;
        std::copy(src, src + p, gathered + c * ld + s * p);
      }
    }
    dy = gathered;
  }
  // dW [oc, k] (+)= dY [oc, count * p] * cols^T [count * p, k].
  Gemm(false, true, oc, k, count * p, T(1), dy, count * p, Columns(n0, count, thread), count * p,
       first ? T(0) : T(1), dw, k);
  if (dx == nullptr) return;
  if (count == 1 && is_pointwise()) {
    Gemm(true, false, k, p, oc, T(1), weight_, k, dy, p, T(0), dx + n0 * input_.dims.size(), p);
    return;
  }
  // dcols [k, count * p] = W^T [k, oc] * dY [oc, count * p], then added back onto the inputs.
  T* dcols = Scratch(thread, kGradColumns, int64_t{k} * ld);
  Gemm(true, false, k, count * p, oc, T(1), weight_, k, dy, count * p, T(0), dcols, count * p);
  T* dxp = g.padded() ? Scratch(thread, kGradPadded, g.padded_size()) : nullptr;
  for (int s = 0; s < count; ++s) {
    T* dxn = dx + (n0 + s) * input_.dims.size();
    if (is_pointwise()) {
      for (int c = 0; c < k; ++c)
        std::copy(dcols + c * ld + s * p, dcols + c * ld + (s + 1) * p, dxn + c * p);
      continue;
    }
    T* target = g.padded() ? dxp : dxn;
    std::fill(target, target + (g.padded() ? g.padded_size() : input_.dims.size()), T(0));
    Col2Im(g, dcols + s * p, ld, target);
    if (g.padded()) Crop(g, dxp, dxn);
  }
}

template class Conv2d<float>;
template class Conv2d<double>;

}  // namespace nn
}  // namespace dptrain
