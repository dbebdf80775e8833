#include "worker/nn/activations.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace dptrain {
namespace nn {
namespace {

// exp(x) for x in [-87, 88], Cephes' expf: x = n ln2 + r with |r| <= ln2 / 2, a degree-7
// polynomial for exp(r), and 2^n built in the exponent bits. About 1 ulp; branch-free, so the
// loops using it vectorise (std::exp is a scalar library call).
inline float ExpInRange(float x) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer.
  const float shifted = x * 1.44269504088896341f + kRound;
  const float n = shifted - kRound;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 in two parts.
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n from the integer n in shifted's low mantissa bits (0x4B400000 is kRound's pattern),
  // in unsigned arithmetic: a NaN x (whose n converted to int would be undefined behaviour)
  // gives some scale, and NaN * scale stays NaN.
  uint32_t shifted_bits;
  std::memcpy(&shifted_bits, &shifted, sizeof(shifted_bits));
  const uint32_t bits = (shifted_bits - 0x4B400000u + 127u) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

void SigmoidKernel(const float* x, float* y, int64_t n) {
  // Clamping -x to [-87, 88] keeps ExpInRange in range; it changes results only below 1e-38 (to
  // 1 / (1 + e^88) instead of a denormal or 0). The clamp is a separate pass over a block so that
  // the compiler does not turn it into branches. NaN stays NaN.
  constexpr int kBlock = 256;
  float t[kBlock];
  for (int64_t i = 0; i < n; i += kBlock) {
    const int m = static_cast<int>(std::min<int64_t>(kBlock, n - i));
    for (int j = 0; j < m; ++j) {
      const float v = -x[i + j];
      const float lo = v < -87.0f ? -87.0f : v;
      t[j] = lo > 88.0f ? 88.0f : lo;
    }
    for (int j = 0; j < m; ++j) y[i + j] = 1.0f / (1.0f + ExpInRange(t[j]));
  }
}

// Double is for reference computations: exact library exp. exp(-x) overflows to +inf for very
// negative x, giving exactly 0, never NaN.
void SigmoidKernel(const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = 1.0 / (1.0 + std::exp(-x[i]));
}

}  // namespace

template <typename T>
TensorRef<T> ReLU<T>::Forward(const LayerContext<T>& ctx, TensorRef<T> input, bool /*training*/) {
  const int64_t n = input.size();
  T* y = EnsureSize(output_, n);
  const T* x = input.data;
  ParallelFor(
      ctx.pool, n,
      [x, y](int64_t begin, int64_t end, int) {
        for (int64_t i = begin; i < end; ++i) y[i] = x[i] < T(0) ? T(0) : x[i];  // NaN stays NaN.
      },
      kMinParallelElements);
  output_ref_ = {y, input.batch, input.dims};
  return output_ref_;
}

template <typename T>
TensorRef<T> ReLU<T>::Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                               bool need_input_grad) {
  if (!need_input_grad) return {};
  const int64_t n = grad_output.size();
  T* dx = this->GradInputBuffer(ctx, grad_output.data, n);
  const T* y = output_ref_.data;
  const T* dy = grad_output.data;
  ParallelFor(
      ctx.pool, n,
      [dx, y, dy](int64_t begin, int64_t end, int) {
        // Both operands loaded unconditionally, so the select vectorises.
        for (int64_t i = begin; i < end; ++i) {
          const T g = dy[i];
          dx[i] = y[i] > T(0) ? g : T(0);
        }
      },
      kMinParallelElements);
  return {dx, grad_output.batch, grad_output.dims};
}

template <typename T>
TensorRef<T> Sigmoid<T>::Forward(const LayerContext<T>& ctx, TensorRef<T> input,
                                 bool /*training*/) {
  const int64_t n = input.size();
  T* y = EnsureSize(output_, n);
  const T* x = input.data;
  ParallelFor(
      ctx.pool, n,
      [x, y](int64_t begin, int64_t end, int) { SigmoidKernel(x + begin, y + begin, end - begin); },
      kMinParallelElements);
  output_ref_ = {y, input.batch, input.dims};
  return output_ref_;
}

template <typename T>
TensorRef<T> Sigmoid<T>::Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                                  bool need_input_grad) {
  if (!need_input_grad) return {};
  const int64_t n = grad_output.size();
  T* dx = this->GradInputBuffer(ctx, grad_output.data, n);
  const T* y = output_ref_.data;
  const T* dy = grad_output.data;
  ParallelFor(
      ctx.pool, n,
      [dx, y, dy](int64_t begin, int64_t end, int) {
        for (int64_t i = begin; i < end; ++i) dx[i] = dy[i] * y[i] * (T(1) - y[i]);
      },
      kMinParallelElements);
  return {dx, grad_output.batch, grad_output.dims};
}

template <typename T>
absl::StatusOr<Dims> Flatten<T>::OutputDims(const Dims& input) const {
  return Dims{static_cast<int>(input.size()), 1, 1};
}

template <typename T>
TensorRef<T> Flatten<T>::Forward(const LayerContext<T>& ctx, TensorRef<T> input,
                                 bool /*training*/) {
  in_dims_ = input.dims;
  return {input.data, input.batch, Dims{static_cast<int>(input.dims.size()), 1, 1}};
}

template <typename T>
TensorRef<T> Flatten<T>::Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                                  bool need_input_grad) {
  if (!need_input_grad) return {};
  return {grad_output.data, grad_output.batch, in_dims_};
}

template class ReLU<float>;
template class ReLU<double>;
template class Sigmoid<float>;
template class Sigmoid<double>;
template class Flatten<float>;
template class Flatten<double>;

}  // namespace nn
}  // namespace dptrain
