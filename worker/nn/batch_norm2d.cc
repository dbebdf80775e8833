#include "worker/nn/batch_norm2d.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dptrain {
namespace nn {
namespace {

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

// Sum of (x[i] - mean)^2 and, if dy is not null, of dy[i] * (x[i] - mean), as Sum.
template <typename T>
void CenteredSums(const T* x, const T* dy, int64_t n, T mean, T* sq, T* dot) {
  T psq[8] = {}, pdot[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) {
      const T d = x[i + l] - mean;
      psq[l] += d * d;
      if (dy != nullptr) pdot[l] += dy[i + l] * d;
    }
  }
  T s = 0, t = 0;
  for (; i < n; ++i) {
    const T d = x[i] - mean;
    s += d * d;
    if (dy != nullptr) t += dy[i] * d;
  }
  for (int l = 0; l < 8; ++l) {
    s += psq[l];
    t += pdot[l];
  }
  *sq = s;
  *dot = t;
}

}  // namespace

// Runs fn(c0, c1) over blocks of channels that cover [0, c_), split over the pool. A block holds
// as many channels as fit kBlockBytes of input (`count` = N*H*W elements per channel; at least
// one): each pass then reads one contiguous run per sample instead of one short plane per
// channel (ResNet-18's 512@4x4 stage: 64-byte planes 32 KiB apart), and the block stays in cache
// between the passes.
template <typename T>
template <typename Fn>
void BatchNorm2d<T>::ForEachChannelBlock(ThreadPool* pool, int64_t count, Fn&& fn) {
  constexpr int64_t kBlockBytes = int64_t{256} << 10;
  const int64_t per_block =
      std::max<int64_t>(1, kBlockBytes / std::max<int64_t>(1, count * int64_t{sizeof(T)}));
  ParallelFor(
      pool, c_,
      [&](int64_t c0, int64_t c1, int) {
        for (int64_t b = c0; b < c1; b += per_block) {
          fn(static_cast<int>(b), static_cast<int>(std::min(c1, b + per_block)));
        }
      },
      count * c_ >= kMinParallelElements ? 2 : c_ + 1);
}

template <typename T>
std::string BatchNorm2d<T>::ToString() const {
  return absl::StrCat("BatchNorm2d(", c_, ", eps=", eps_, ", momentum=", momentum_,
                      ", affine=True, track_running_stats=True)");
}

template <typename T>
absl::StatusOr<Dims> BatchNorm2d<T>::OutputDims(const Dims& input) const {
  if (c_ < 1) return absl::InvalidArgumentError(absl::StrCat(ToString(), ": invalid"));
  if (input.c != c_ || input.h < 1 || input.w < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(ToString(), ": does not fit input ", input.ToString()));
  }
  return input;
}

template <typename T>
std::vector<TensorSpec> BatchNorm2d<T>::ParamSpecs() const {
  return {{"weight", {c_}}, {"bias", {c_}}};
}

template <typename T>
void BatchNorm2d<T>::BindParams(const T* params, T* grads) {
  weight_ = params;
  bias_ = params + c_;
  grad_weight_ = grads;
  grad_bias_ = grads + c_;
}

template <typename T>
std::vector<TensorSpec> BatchNorm2d<T>::BufferSpecs() const {
  return {{"running_mean", {c_}}, {"running_var", {c_}}, {"num_batches_tracked", {}}};
}

template <typename T>
void BatchNorm2d<T>::BindBuffers(T* buffers) {
  running_mean_ = buffers;
  running_var_ = buffers + c_;
  num_batches_tracked_ = buffers + 2 * c_;
}

template <typename T>
void BatchNorm2d<T>::InitBuffers(T* buffers) const {
  std::fill(buffers, buffers + c_, T(0));
  std::fill(buffers + c_, buffers + 2 * c_, T(1));
  buffers[2 * c_] = T(0);
}

template <typename T>
absl::Status BatchNorm2d<T>::CheckInput(TensorRef<T> input, bool training) const {
  if (!training || int64_t{input.batch} * input.dims.h * input.dims.w > 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("BatchNorm2d: expected more than 1 value per channel when training, got input [",
                   input.batch, ", ", input.dims.c, ", ", input.dims.h, ", ", input.dims.w,
                   "] (one sample, one pixel: a batch of 2 or more trains)"));
}

template <typename T>
TensorRef<T> BatchNorm2d<T>::Forward(const LayerContext<T>& ctx, TensorRef<T> input,
                                     bool training) {
  T* y = EnsureSize(output_, input.size());
  ForwardInto(ctx, input, training, y);
  return {y, input.batch, input.dims};
}

template <typename T>
void BatchNorm2d<T>::ForwardInto(const LayerContext<T>& ctx, TensorRef<T> input, bool training,
                                 T* y) {
  input_ = input;
  training_ = training;
  const int batch = input.batch;
  const int64_t plane = int64_t{input.dims.h} * input.dims.w;
  const int64_t count = batch * plane;
  mean_.resize(c_);
  inv_std_.resize(c_);
  // One block of channels [c0, c1): the statistics, then the output, sample by sample (each
  // channel's sums in the order of one channel at a time: results do not depend on the block).
  auto block = [&](int c0, int c1) {
    const int nc = c1 - c0;
    auto at = [&](int n, int c) { return (int64_t{n} * c_ + c) * plane; };
    if (training) {
      std::vector<double> sum(nc, 0.0), sq(nc, 0.0);
      for (int n = 0; n < batch; ++n) {
        for (int c = c0; c < c1; ++c) sum[c - c0] += Sum(input.data + at(n, c), plane);
      }
      for (int c = c0; c < c1; ++c) mean_[c] = sum[c - c0] / count;
      for (int n = 0; n < batch; ++n) {
        for (int c = c0; c < c1; ++c) {
          T s, unused;
          CenteredSums<T>(input.data + at(n, c), nullptr, plane, T(mean_[c]), &s, &unused);
          sq[c - c0] += s;
        }
      }
      for (int c = c0; c < c1; ++c) {
        const double var = sq[c - c0] / count;
        const double unbiased = count > 1 ? sq[c - c0] / (count - 1) : var;
        running_mean_[c] = T((1 - momentum_) * running_mean_[c] + momentum_ * mean_[c]);
        running_var_[c] = T((1 - momentum_) * running_var_[c] + momentum_ * unbiased);
        inv_std_[c] = 1.0 / std::sqrt(var + eps_);
      }
    } else {
      for (int c = c0; c < c1; ++c) {
        mean_[c] = running_mean_[c];
        inv_std_[c] = 1.0 / std::sqrt(double{running_var_[c]} + eps_);
      }
    }
    std::vector<T> scale(nc), shift(nc);
    for (int c = c0; c < c1; ++c) {
      scale[c - c0] = T(weight_[c] * inv_std_[c]);
      shift[c - c0] = T(bias_[c] - mean_[c] * weight_[c] * inv_std_[c]);
    }
    for (int n = 0; n < batch; ++n) {
      for (int c = c0; c < c1; ++c) {
        const T* __restrict x = input.data + at(n, c);
        T* __restrict out = y + at(n, c);
        const T a = scale[c - c0], b = shift[c - c0];
        for (int64_t i = 0; i < plane; ++i) out[i] = x[i] * a + b;
      }
    }
  };
  ForEachChannelBlock(ctx.pool, count, [&](int c0, int c1) { block(c0, c1); });
  if (training) *num_batches_tracked_ += T(1);
}

template <typename T>
TensorRef<T> BatchNorm2d<T>::Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
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
void BatchNorm2d<T>::BackwardInto(const LayerContext<T>& ctx, TensorRef<T> grad_output, T* dx) {
  const int batch = grad_output.batch;
  const int64_t plane = int64_t{input_.dims.h} * input_.dims.w;
  const int64_t count = batch * plane;
  // One block of channels [c0, c1), as in ForwardInto.
  auto block = [&](int c0, int c1) {
    const int nc = c1 - c0;
    auto at = [&](int n, int c) { return (int64_t{n} * c_ + c) * plane; };
    // d(bias) = sum(dy); d(weight) = sum(dy * xhat) with xhat = (x - mean) * inv_std.
    std::vector<double> sum_dy(nc, 0.0), sum_dy_xc(nc, 0.0);
    for (int n = 0; n < batch; ++n) {
      for (int c = c0; c < c1; ++c) {
        sum_dy[c - c0] += Sum(grad_output.data + at(n, c), plane);
        T unused, dot;
        CenteredSums<T>(input_.data + at(n, c), grad_output.data + at(n, c), plane, T(mean_[c]),
                        &unused, &dot);
        sum_dy_xc[c - c0] += dot;
      }
    }
    // Training: dx = gamma * inv_std * (dy - mean(dy) - xhat * mean(dy * xhat)); the batch
    // statistics depend on x. Evaluation: dx = gamma * inv_std * dy.
    std::vector<T> a(nc), b(nc), shift(nc);
    for (int c = c0; c < c1; ++c) {
      const double inv_std = inv_std_[c];
      grad_bias_[c] = T(sum_dy[c - c0]);
      grad_weight_[c] = T(sum_dy_xc[c - c0] * inv_std);
      const double k = weight_[c] * inv_std;
      a[c - c0] = T(k);
      b[c - c0] = training_ ? T(-k * inv_std * inv_std * sum_dy_xc[c - c0] / count) : T(0);
      shift[c - c0] = training_ ? T(-k * sum_dy[c - c0] / count) : T(0);
    }
    if (dx == nullptr) return;
    for (int n = 0; n < batch; ++n) {
      for (int c = c0; c < c1; ++c) {
        const T* __restrict dy = grad_output.data + at(n, c);
        const T* __restrict x = input_.data + at(n, c);
        T* __restrict out = dx + at(n, c);
        const T ac = a[c - c0], bc = b[c - c0], sc = shift[c - c0], mean = T(mean_[c]);
        for (int64_t i = 0; i < plane; ++i) out[i] = ac * dy[i] + bc * (x[i] - mean) + sc;
      }
    }
  };
  ForEachChannelBlock(ctx.pool, count, [&](int c0, int c1) { block(c0, c1); });
}

template class BatchNorm2d<float>;
template class BatchNorm2d<double>;

}  // namespace nn
}  // namespace dptrain
