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

template <typename T>
std::string BatchNorm2d<T>::ToString() const {
  return absl::StrCat("BatchNorm2d(", c_, ", eps=1e-05, momentum=0.1, affine=True, ",
                      "track_running_stats=True)");
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
TensorRef<T> BatchNorm2d<T>::Forward(TensorRef<T> input, bool training) {
  T* y = EnsureSize(output_, input.size());
  ForwardInto(input, training, y);
  return {y, input.batch, input.dims};
}

template <typename T>
void BatchNorm2d<T>::ForwardInto(TensorRef<T> input, bool training, T* y) {
  input_ = input;
  training_ = training;
  const int batch = input.batch;
  const int64_t plane = int64_t{input.dims.h} * input.dims.w;
  const int64_t count = batch * plane;
  mean_.resize(c_);
  inv_std_.resize(c_);
  auto channel = [&](int c) {
    double mean, var;
    if (training) {
      double sum = 0;
      for (int n = 0; n < batch; ++n) sum += Sum(input.data + (int64_t{n} * c_ + c) * plane, plane);
      mean = sum / count;
      double sq = 0;
      for (int n = 0; n < batch; ++n) {
        T s, unused;
        CenteredSums<T>(input.data + (int64_t{n} * c_ + c) * plane, nullptr, plane, T(mean), &s,
                        &unused);
        sq += s;
      }
      var = sq / count;
      const double unbiased = count > 1 ? sq / (count - 1) : var;
      running_mean_[c] = T((1 - kMomentum) * running_mean_[c] + kMomentum * mean);
      running_var_[c] = T((1 - kMomentum) * running_var_[c] + kMomentum * unbiased);
    } else {
      mean = running_mean_[c];
      var = running_var_[c];
    }
    mean_[c] = mean;
    inv_std_[c] = 1.0 / std::sqrt(var + kEps);
    const T scale = T(weight_[c] * inv_std_[c]);
    const T shift = T(bias_[c] - mean * weight_[c] * inv_std_[c]);
    for (int n = 0; n < batch; ++n) {
      const T* __restrict x = input.data + (int64_t{n} * c_ + c) * plane;
      T* __restrict out = y + (int64_t{n} * c_ + c) * plane;
      for (int64_t i = 0; i < plane; ++i) out[i] = x[i] * scale + shift;
    }
  };
  ParallelFor(
      pool_, c_,
      [&](int64_t c0, int64_t c1, int) {
        for (int64_t c = c0; c < c1; ++c) channel(static_cast<int>(c));
      },
      count * c_ >= kMinParallelElements ? 2 : c_ + 1);
  if (training) *num_batches_tracked_ += T(1);
}

template <typename T>
TensorRef<T> BatchNorm2d<T>::Backward(TensorRef<T> grad_output, bool need_input_grad) {
  if (!need_input_grad) {
    BackwardInto(grad_output, nullptr);
    return {};
  }
  T* dx = this->GradInputBuffer(grad_output.data, input_.size());
  BackwardInto(grad_output, dx);
  return {dx, grad_output.batch, input_.dims};
}

template <typename T>
void BatchNorm2d<T>::BackwardInto(TensorRef<T> grad_output, T* dx) {
  const int batch = grad_output.batch;
  const int64_t plane = int64_t{input_.dims.h} * input_.dims.w;
  const int64_t count = batch * plane;
  auto channel = [&](int c) {
    // d(bias) = sum(dy); d(weight) = sum(dy * xhat) with xhat = (x - mean) * inv_std.
    double sum_dy = 0, sum_dy_xc = 0;
    for (int n = 0; n < batch; ++n) {
      const int64_t at = (int64_t{n} * c_ + c) * plane;
      sum_dy += Sum(grad_output.data + at, plane);
      T unused, dot;
      CenteredSums<T>(input_.data + at, grad_output.data + at, plane, T(mean_[c]), &unused, &dot);
      sum_dy_xc += dot;
    }
    const double inv_std = inv_std_[c];
    grad_bias_[c] = T(sum_dy);
    grad_weight_[c] = T(sum_dy_xc * inv_std);
    if (dx == nullptr) return;
    // Training: dx = gamma * inv_std * (dy - mean(dy) - xhat * mean(dy * xhat)); the batch
    // statistics depend on x. Evaluation: dx = gamma * inv_std * dy.
    const double k = weight_[c] * inv_std;
    const T a = T(k);
    const T b = training_ ? T(-k * inv_std * inv_std * sum_dy_xc / count) : T(0);
    const T mean = T(mean_[c]);
    const T shift = training_ ? T(-k * sum_dy / count) : T(0);
    for (int n = 0; n < batch; ++n) {
      const int64_t at = (int64_t{n} * c_ + c) * plane;
      const T* __restrict dy = grad_output.data + at;
      const T* __restrict x = input_.data + at;
      T* __restrict out = dx + at;
      for (int64_t i = 0; i < plane; ++i) out[i] = a * dy[i] + b * (x[i] - mean) + shift;
    }
  };
  ParallelFor(
      pool_, c_,
      [&](int64_t c0, int64_t c1, int) {
        for (int64_t c = c0; c < c1; ++c) channel(static_cast<int>(c));
      },
      count * c_ >= kMinParallelElements ? 2 : c_ + 1);
}

template class BatchNorm2d<float>;
template class BatchNorm2d<double>;

}  // namespace nn
}  // namespace dptrain
