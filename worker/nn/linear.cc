#include "worker/nn/linear.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/nn/gemm.h"
#include "worker/nn/thread_pool.h"

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

namespace {

// Below this many multiply-adds per GEMM a parallel region costs more than it saves.
constexpr int64_t kMinParallelFlops = int64_t{1} << 17;
// Pieces per pool thread of a split GEMM: each piece packs the shared operand again.
constexpr int kGemmChunksPerThread = 1;

}  // namespace

template <typename T>
TensorRef<T> Linear<T>::Forward(const LayerContext<T>& ctx, TensorRef<T> input, bool /*training*/) {
  input_ = input;
  const int n = input.batch;
  T* y = EnsureSize(output_, int64_t{n} * out_);
  const int64_t min_rows = int64_t{n} * in_ * out_ >= kMinParallelFlops ? 2 : int64_t{n} + 1;
  ParallelFor(
      ctx.pool, n,
      [&](int64_t r0, int64_t r1, int) {
        for (int64_t i = r0; i < r1; ++i) std::copy(bias_, bias_ + out_, y + i * out_);
        Gemm(false, true, static_cast<int>(r1 - r0), out_, in_, T(1), input.data + r0 * in_, in_,
             weight_, in_, T(1), y + r0 * out_, out_);
      },
      min_rows, kGemmChunksPerThread);
  return {y, n, Dims{out_, 1, 1}};
}

template <typename T>
TensorRef<T> Linear<T>::Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                                 bool need_input_grad) {
  const int n = grad_output.batch;
  const T* dy = grad_output.data;
  const bool parallel = int64_t{n} * in_ * out_ >= kMinParallelFlops;
  // dW = dY^T X, db = column sums of dY; split over output rows.
  ParallelFor(
      ctx.pool, out_,
      [&](int64_t o0, int64_t o1, int) {
        Gemm(true, false, static_cast<int>(o1 - o0), in_, n, T(1), dy + o0, out_, input_.data, in_,
             T(0), grad_weight_ + o0 * in_, in_);
        std::fill(grad_bias_ + o0, grad_bias_ + o1, T(0));
        for (int i = 0; i < n; ++i) {
          const T* row = dy + int64_t{i} * out_;
          for (int64_t o = o0; o < o1; ++o) grad_bias_[o] += row[o];
        }
      },
      parallel ? 2 : int64_t{out_} + 1, kGemmChunksPerThread);
  if (!need_input_grad) return {};
  // dX = dY W; split over rows.
  T* dx = this->GradInputBuffer(ctx, grad_output.data, int64_t{n} * in_);
  ParallelFor(
      ctx.pool, n,
      [&](int64_t r0, int64_t r1, int) {
        Gemm(false, false, static_cast<int>(r1 - r0), in_, out_, T(1), dy + r0 * out_, out_,
             weight_, in_, T(0), dx + r0 * in_, in_);
      },
      parallel ? 2 : int64_t{n} + 1, kGemmChunksPerThread);
  return {dx, n, input_.dims};
}

template class Linear<float>;
template class Linear<double>;

}  // namespace nn
}  // namespace dptrain
