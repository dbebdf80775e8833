#include "worker/nn/onednn_conv.h"

#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "dnnl.hpp"
#include "worker/nn/conv2d.h"

namespace dptrain {
namespace nn {

bool PreferOneDnn(const Conv2dOptions& o, const Dims& in, int threads) {
  const int oh = (in.h + 2 * o.pad_h - o.kernel_h) / o.stride_h + 1;
  const int ow = (in.w + 2 * o.pad_w - o.kernel_w) / o.stride_w + 1;
  // On more than one thread the whole step was not ahead (see the header).
  if (threads > 1) return false;
  // One input channel (LeNet's and ResNet-18's first layers: 0.3-0.5x), 1x1 kernels
  // (ResNet-18's strided shortcuts: 0.75x) and the 4x4 stage (0.90x) stay on im2col.
  return o.in_channels >= 6 && o.kernel_h * o.kernel_w > 1 && int64_t{oh} * ow >= 7 * 7;
}

namespace {

using dnnl::memory;
using Tag = memory::format_tag;

constexpr memory::data_type kF32 = memory::data_type::f32;

[[noreturn]] void Die(const dnnl::error& e) {
  // Execution of primitives that were created successfully fails only when memory runs out.
  std::fprintf(stderr, "oneDNN convolution failed: %s (status %d)\n", e.what(),
               static_cast<int>(e.status));
  std::abort();
}

}  // namespace

struct OneDnnConv::Impl {
  int batch = 0;
  int threads = 1;
  dnnl::engine engine;
  dnnl::stream stream;
  // The layer's plain layouts.
  memory::desc src, weights, bias, dst;
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_backward_weights::primitive_desc bwd_weights_pd;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd;
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_weights bwd_weights;
  dnnl::convolution_backward_data bwd_data;

  // The plain tensor at `data` as the primitive wants it: itself if the layouts agree, else
  // reordered into scratch `slot`.
  memory In(const memory::desc& plain, const memory::desc& want, const float* data, int slot,
            const Scratch& scratch) {
    memory user(plain, engine, const_cast<float*>(data));
    if (want == plain) return user;
    memory blocked(want, engine, scratch(slot, static_cast<int64_t>(want.get_size() / 4)));
    dnnl::reorder(user, blocked).execute(stream, user, blocked);
    return blocked;
  }
  // Where the primitive should write a tensor that ends up plain at `data`: `data` itself if the
  // layouts agree, else scratch `slot` (then Out copies it back).
  memory Target(const memory::desc& plain, const memory::desc& want, float* data, int slot,
                const Scratch& scratch) {
    if (want == plain) return memory(plain, engine, data);
    return memory(want, engine, scratch(slot, static_cast<int64_t>(want.get_size() / 4)));
  }
  void Out(const memory& produced, const memory::desc& plain, float* data) {
    if (produced.get_desc() == plain) return;
    memory user(plain, engine, data);
    dnnl::reorder(produced, user).execute(stream, const_cast<memory&>(produced), user);
  }
};

// Scratch slots: the source and the input gradient take turns in 0, the output in 1, the output
// gradient in 2 (and 1 when backward data wants it laid out otherwise), the weights in 3, the
// weight gradient in 4.
absl::StatusOr<std::unique_ptr<OneDnnConv>> OneDnnConv::Create(const Conv2dOptions& o,
                                                               const Dims& in, int batch,
                                                               int threads) {
  auto impl = std::make_unique<Impl>();
  impl->batch = batch;
  impl->threads = threads < 1 ? 1 : threads;
  const int oh = (in.h + 2 * o.pad_h - o.kernel_h) / o.stride_h + 1;
  const int ow = (in.w + 2 * o.pad_w - o.kernel_w) / o.stride_w + 1;
  try {
    omp_set_num_threads(impl->threads);
    impl->engine = dnnl::engine(dnnl::engine::kind::cpu, 0);
    impl->stream = dnnl::stream(impl->engine);
    const memory::dims src{batch, in.c, in.h, in.w},
        weights{o.out_channels, o.in_channels, o.kernel_h, o.kernel_w}, bias{o.out_channels},
        dst{batch, o.out_channels, oh, ow}, strides{o.stride_h, o.stride_w},
        padding{o.pad_h, o.pad_w};
    impl->src = memory::desc(src, kF32, Tag::nchw);
    impl->weights = memory::desc(weights, kF32, Tag::oihw);
    impl->bias = memory::desc(bias, kF32, Tag::x);
    impl->dst = memory::desc(dst, kF32, Tag::nchw);
    const memory::desc any_src(src, kF32, Tag::any), any_weights(weights, kF32, Tag::any),
        any_dst(dst, kF32, Tag::any);
    const auto direct = dnnl::algorithm::convolution_direct;
    impl->fwd_pd = dnnl::convolution_forward::primitive_desc(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, direct, any_src,
                                        any_weights, impl->bias, any_dst, strides, padding,
                                        padding),
        impl->engine);
    impl->bwd_weights_pd = dnnl::convolution_backward_weights::primitive_desc(
        dnnl::convolution_backward_weights::desc(direct, any_src, any_weights, impl->bias,
                                                 any_dst, strides, padding, padding),
        impl->engine, impl->fwd_pd);
    impl->bwd_data_pd = dnnl::convolution_backward_data::primitive_desc(
        dnnl::convolution_backward_data::desc(direct, any_src, any_weights, any_dst, strides,
                                              padding, padding),
        impl->engine, impl->fwd_pd);
    impl->fwd = dnnl::convolution_forward(impl->fwd_pd);
    impl->bwd_weights = dnnl::convolution_backward_weights(impl->bwd_weights_pd);
    impl->bwd_data = dnnl::convolution_backward_data(impl->bwd_data_pd);
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN has no convolution for batch ", batch, " of ",
                                            in.ToString(), ": ", e.what()));
  }
  return std::unique_ptr<OneDnnConv>(new OneDnnConv(std::move(impl)));
}

OneDnnConv::OneDnnConv(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
OneDnnConv::~OneDnnConv() = default;

int OneDnnConv::batch() const { return impl_->batch; }

void OneDnnConv::Forward(const float* x, const float* w, const float* b, float* y,
                         const Scratch& scratch) {
  Impl& m = *impl_;
  try {
    omp_set_num_threads(m.threads);
    memory src = m.In(m.src, m.fwd_pd.src_desc(), x, 0, scratch);
    memory weights = m.In(m.weights, m.fwd_pd.weights_desc(), w, 3, scratch);
    memory bias(m.bias, m.engine, const_cast<float*>(b));
    memory dst = m.Target(m.dst, m.fwd_pd.dst_desc(), y, 1, scratch);
    m.fwd.execute(m.stream, {{DNNL_ARG_SRC, src},
                             {DNNL_ARG_WEIGHTS, weights},
                             {DNNL_ARG_BIAS, bias},
                             {DNNL_ARG_DST, dst}});
    m.Out(dst, m.dst, y);
    m.stream.wait();
  } catch (const dnnl::error& e) {
    Die(e);
  }
}

void OneDnnConv::Backward(const float* x, const float* w, const float* dy, float* dw, float* db,
                          float* dx, const Scratch& scratch) {
  Impl& m = *impl_;
  try {
    omp_set_num_threads(m.threads);
    const memory::desc& dy_for_weights = m.bwd_weights_pd.diff_dst_desc();
    memory src = m.In(m.src, m.bwd_weights_pd.src_desc(), x, 0, scratch);
    memory diff_dst = m.In(m.dst, dy_for_weights, dy, 2, scratch);
    memory diff_weights = m.Target(m.weights, m.bwd_weights_pd.diff_weights_desc(), dw, 4, scratch);
    memory diff_bias(m.bias, m.engine, db);
    m.bwd_weights.execute(m.stream, {{DNNL_ARG_SRC, src},
                                     {DNNL_ARG_DIFF_DST, diff_dst},
                                     {DNNL_ARG_DIFF_WEIGHTS, diff_weights},
                                     {DNNL_ARG_DIFF_BIAS, diff_bias}});
    m.Out(diff_weights, m.weights, dw);
    if (dx != nullptr) {
      memory dy_for_data = m.bwd_data_pd.diff_dst_desc() == dy_for_weights
                               ? diff_dst
                               : m.In(m.dst, m.bwd_data_pd.diff_dst_desc(), dy, 1, scratch);
      memory weights = m.In(m.weights, m.bwd_data_pd.weights_desc(), w, 3, scratch);
      memory diff_src = m.Target(m.src, m.bwd_data_pd.diff_src_desc(), dx, 0, scratch);
      m.bwd_data.execute(m.stream, {{DNNL_ARG_DIFF_DST, dy_for_data},
                                    {DNNL_ARG_WEIGHTS, weights},
                                    {DNNL_ARG_DIFF_SRC, diff_src}});
      m.Out(diff_src, m.src, dx);
    }
    m.stream.wait();
  } catch (const dnnl::error& e) {
    Die(e);
  }
}

}  // namespace nn
}  // namespace dptrain
