#include "worker/nn/residual.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/nn/sequential_block.h"
#include "worker/nn/thread_pool.h"

namespace dptrain {
namespace nn {

template <typename T>
Residual<T>::Residual(const ResidualOptions& o, std::shared_ptr<ResidualScratch<T>> scratch)
    : o_(o),
      conv1_(Conv2dOptions::Square(o.in_channels, o.out_channels, 3, o.stride, 1)),
      conv2_(Conv2dOptions::Square(o.out_channels, o.out_channels, 3, 1, 1)),
      conv3_(o.use_1x1conv ? std::make_unique<Conv2d<T>>(
                                 Conv2dOptions::Square(o.in_channels, o.out_channels, 1, o.stride))
                           : nullptr),
      bn1_(o.out_channels),
      bn2_(o.out_channels),
      scratch_(scratch ? std::move(scratch) : std::make_shared<ResidualScratch<T>>()) {}

template <typename T>
std::string Residual<T>::ToString() const {
  return absl::StrCat("Residual(", o_.in_channels, ", ", o_.out_channels,
                      ", use_1x1conv=", o_.use_1x1conv ? "True" : "False", ", strides=", o_.stride,
                      ")");
}

template <typename T>
absl::StatusOr<Dims> Residual<T>::OutputDims(const Dims& input) const {
  absl::StatusOr<Dims> d1 = conv1_.OutputDims(input);
  if (!d1.ok())
    return absl::InvalidArgumentError(absl::StrCat(ToString(), ": conv1: ", d1.status().message()));
  absl::StatusOr<Dims> d2 = conv2_.OutputDims(*d1);
  if (!d2.ok())
    return absl::InvalidArgumentError(absl::StrCat(ToString(), ": conv2: ", d2.status().message()));
  if (!bn1_.OutputDims(*d1).ok())
    return absl::InvalidArgumentError(absl::StrCat(ToString(), ": invalid"));
  absl::StatusOr<Dims> shortcut = conv3_ ? conv3_->OutputDims(input) : absl::StatusOr<Dims>(input);
  if (!shortcut.ok() || *shortcut != *d2) {
    return absl::InvalidArgumentError(absl::StrCat(
        ToString(), ": shortcut of input ", input.ToString(), " does not match ", d2->ToString()));
  }
  return *d2;
}

template <typename T>
std::vector<Layer<T>*> Residual<T>::ParamLayers() const {
  auto* self = const_cast<Residual<T>*>(this);
  std::vector<Layer<T>*> layers = {&self->conv1_, &self->conv2_};
  if (conv3_) layers.push_back(conv3_.get());
  layers.push_back(&self->bn1_);
  layers.push_back(&self->bn2_);
  return layers;
}

template <typename T>
std::vector<TensorSpec> Residual<T>::ParamSpecs() const {
  static const char* const kNames[] = {"conv1", "conv2", "conv3", "bn1", "bn2"};
  std::vector<TensorSpec> specs;
  int k = 0;
  for (Layer<T>* layer : ParamLayers()) {
    if (k == 2 && !conv3_) ++k;
    for (TensorSpec& spec : PrefixSpecs(kNames[k++], layer->ParamSpecs())) {
      specs.push_back(std::move(spec));
    }
  }
  return specs;
}

template <typename T>
void Residual<T>::BindParams(const T* params, T* grads) {
  for (Layer<T>* layer : ParamLayers()) {
    layer->BindParams(params, grads);
    const int64_t size = SpecsSize(layer->ParamSpecs());
    params += size;
    grads += size;
  }
}

template <typename T>
std::vector<TensorSpec> Residual<T>::BufferSpecs() const {
  std::vector<TensorSpec> specs = PrefixSpecs("bn1", bn1_.BufferSpecs());
  for (TensorSpec& spec : PrefixSpecs("bn2", bn2_.BufferSpecs())) specs.push_back(std::move(spec));
  return specs;
}

template <typename T>
void Residual<T>::BindBuffers(T* buffers) {
  bn1_.BindBuffers(buffers);
  bn2_.BindBuffers(buffers + SpecsSize(bn1_.BufferSpecs()));
}

template <typename T>
void Residual<T>::InitBuffers(T* buffers) const {
  bn1_.InitBuffers(buffers);
  bn2_.InitBuffers(buffers + SpecsSize(bn1_.BufferSpecs()));
}

template <typename T>
absl::Status Residual<T>::CheckInput(TensorRef<T> input, bool training) const {
  absl::StatusOr<Dims> out = OutputDims(input.dims);
  if (!out.ok()) return out.status();
  return bn1_.CheckInput({nullptr, input.batch, *out}, training);
}

template <typename T>
TensorRef<T> Residual<T>::Forward(const LayerContext<T>& ctx, TensorRef<T> input, bool training) {
  input_ = input;
  const TensorRef<T> y1 = conv1_.Forward(ctx, input, training);
  dims_ = y1.dims;
  const int64_t n = y1.size();
  T* __restrict a1 = EnsureSize(act1_, n);
  bn1_.ForwardInto(ctx, y1, training, a1);
  ParallelFor(
      ctx.pool, n,
      [a1](int64_t begin, int64_t end, int) {
        for (int64_t i = begin; i < end; ++i) a1[i] = a1[i] < T(0) ? T(0) : a1[i];  // NaN stays.
      },
      kMinParallelElements);
  const TensorRef<T> y2 = conv2_.Forward(ctx, {a1, input.batch, dims_}, training);
  T* __restrict out = EnsureSize(output_, n);
  bn2_.ForwardInto(ctx, y2, training, out);
  const TensorRef<T> shortcut = conv3_ ? conv3_->Forward(ctx, input, training) : input;
  const T* __restrict s = shortcut.data;
  ParallelFor(
      ctx.pool, n,
      [out, s](int64_t begin, int64_t end, int) {
        for (int64_t i = begin; i < end; ++i) {
          const T v = out[i] + s[i];
          out[i] = v < T(0) ? T(0) : v;
        }
      },
      kMinParallelElements);
  return {out, input.batch, dims_};
}

template <typename T>
TensorRef<T> Residual<T>::Backward(const LayerContext<T>& ctx, TensorRef<T> grad_output,
                                   bool need_input_grad) {
  const int batch = grad_output.batch;
  const int64_t n = grad_output.size(), m = input_.size();
  T* __restrict gs = EnsureSize(scratch_->grad_sum, n);
  {
    const T* __restrict out = output_.data();
    const T* __restrict g = grad_output.data;
    ParallelFor(
        ctx.pool, n,
        [gs, out, g](int64_t begin, int64_t end, int) {
          for (int64_t i = begin; i < end; ++i) {
            const T d = g[i];  // Loaded unconditionally, so the select vectorises.
            gs[i] = out[i] > T(0) ? d : T(0);
          }
        },
        kMinParallelElements);
  }
  T* __restrict a = EnsureSize(scratch_->a, std::max(n, m));
  T* __restrict b = EnsureSize(scratch_->b, n);
  bn2_.BackwardInto(ctx, {gs, batch, dims_}, a);
  conv2_.BackwardInto(ctx, {a, batch, dims_}, b);
  const T* __restrict a1 = act1_.data();
  ParallelFor(
      ctx.pool, n,
      [a1, b](int64_t begin, int64_t end, int) {
        for (int64_t i = begin; i < end; ++i) b[i] = a1[i] > T(0) ? b[i] : T(0);
      },
      kMinParallelElements);
  bn1_.BackwardInto(ctx, {b, batch, dims_}, a);
  T* __restrict dx = need_input_grad ? this->GradInputBuffer(ctx, grad_output.data, m) : nullptr;
  conv1_.BackwardInto(ctx, {a, batch, dims_}, dx);
  const T* shortcut_grad = gs;
  if (conv3_) {
    conv3_->BackwardInto(ctx, {gs, batch, dims_}, need_input_grad ? a : nullptr);
    shortcut_grad = a;
  }
  if (!need_input_grad) return {};
  ParallelFor(
      ctx.pool, m,
      [dx, shortcut_grad](int64_t begin, int64_t end, int) {
        for (int64_t i = begin; i < end; ++i) dx[i] += shortcut_grad[i];
      },
      kMinParallelElements);
  return {dx, batch, input_.dims};
}

template class Residual<float>;
template class Residual<double>;

}  // namespace nn
}  // namespace dptrain
