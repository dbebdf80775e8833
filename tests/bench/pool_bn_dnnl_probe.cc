// Probe: our pooling and batch-norm layers (float, split over the pool) against oneDNN's pooling
// and batch_normalization primitives (forward training + backward), on the shapes of lenet and
// resnet18, batch 256. oneDNN runs twice: on the layer's own NCHW layout (no reorder), and on its
// blocked layout (nChw8c / nChw16c) with the reorders in and out counted, as a layer behind our
// NCHW interface would pay them. Issue 17's item 3: keep whichever is faster per layer.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dnnl.hpp"
#include "worker/nn/avg_pool2d.h"
#include "worker/nn/batch_norm2d.h"
#include "worker/nn/global_avg_pool2d.h"
#include "worker/nn/max_pool2d.h"
#include "worker/nn/thread_pool.h"

using namespace dptrain::nn;
using Clock = std::chrono::steady_clock;

enum class Kind { kAvg, kMax, kGlobalAvg, kBatchNorm };

struct Shape {
  const char* name;
  Kind kind;
  int n, c, h, k, s, p;  // k, s, p: the pooling window (unused for batch norm).
};

double BestMs(int reps, const std::function<void()>& step) {
  double best = 1e9;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    step();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best * 1e3;
}

double Ours(const Shape& sh, int threads, int reps) {
  std::unique_ptr<Layer<float>> layer;
  switch (sh.kind) {
    case Kind::kAvg:
      layer = std::make_unique<AvgPool2d<float>>(Pool2dOptions::Square(sh.k, sh.s, sh.p));
      break;
    case Kind::kMax:
      layer = std::make_unique<MaxPool2d<float>>(Pool2dOptions::Square(sh.k, sh.s, sh.p));
      break;
    case Kind::kGlobalAvg:
      layer = std::make_unique<GlobalAvgPool2d<float>>();
      break;
    case Kind::kBatchNorm:
      layer = std::make_unique<BatchNorm2d<float>>(sh.c);
      break;
  }
  std::unique_ptr<ThreadPool> pool;
  if (threads > 1) pool = std::make_unique<ThreadPool>(threads);
  const LayerContext<float> ctx{pool.get(), ConvAlgorithm::kAuto, nullptr};
  std::vector<float> params(2 * sh.c, 1.0f), grads(params.size()), buffers(2 * sh.c + 1);
  if (sh.kind == Kind::kBatchNorm) {
    layer->BindParams(params.data(), grads.data());
    layer->InitBuffers(buffers.data());
    layer->BindBuffers(buffers.data());
  }
  Dims in{sh.c, sh.h, sh.h};
  Dims out = *layer->OutputDims(in);
  std::vector<float> x(int64_t{sh.n} * in.size()), dy(int64_t{sh.n} * out.size(), 0.1f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 97) * 0.01f;
  return BestMs(reps, [&] {
    layer->Forward(ctx, {x.data(), sh.n, in}, true);
    layer->Backward(ctx, {dy.data(), sh.n, out}, true);
  });
}

// oneDNN's forward training + backward on `tag` (nchw: the user's memory itself; a blocked tag:
// reorders of x in, y out, dy in and dx out each time).
double Dnnl(const Shape& sh, int threads, int reps, dnnl::memory::format_tag tag) {
  using namespace dnnl;
  omp_set_num_threads(threads);
  engine eng(engine::kind::cpu, 0);
  stream st(eng);
  const auto f32 = memory::data_type::f32;
  const auto nchw = memory::format_tag::nchw;
  const bool global = sh.kind == Kind::kGlobalAvg;
  const int k = global ? sh.h : sh.k, s = global ? 1 : sh.s, p = global ? 0 : sh.p;
  const int oh = sh.kind == Kind::kBatchNorm ? sh.h : (sh.h + 2 * p - k) / s + 1;
  memory::dims src{sh.n, sh.c, sh.h, sh.h}, dst{sh.n, sh.c, oh, oh};
  memory usrc({src, f32, nchw}, eng), udsrc({src, f32, nchw}, eng), udst({dst, f32, nchw}, eng),
      uddst({dst, f32, nchw}, eng);
  float* xs = static_cast<float*>(usrc.get_data_handle());
  for (int64_t i = 0; i < int64_t{sh.n} * sh.c * sh.h * sh.h; ++i) xs[i] = (i % 97) * 0.01f;
  std::fill_n(static_cast<float*>(uddst.get_data_handle()), int64_t{sh.n} * sh.c * oh * oh, 0.1f);
  memory bsrc({src, f32, tag}, eng), bdsrc({src, f32, tag}, eng), bdst({dst, f32, tag}, eng),
      bddst({dst, f32, tag}, eng);
  const bool blocked = tag != nchw;
  memory& x = blocked ? bsrc : usrc;
  memory& y = blocked ? bdst : udst;
  memory& dy = blocked ? bddst : uddst;
  memory& dx = blocked ? bdsrc : udsrc;
  std::function<void()> forward, backward;
  if (sh.kind == Kind::kBatchNorm) {
    const auto flags = normalization_flags::use_scale | normalization_flags::use_shift;
    batch_normalization_forward::primitive_desc fpd(
        {prop_kind::forward_training, x.get_desc(), 1e-5f, flags}, eng);
    batch_normalization_backward::primitive_desc bpd(
        {prop_kind::backward, dy.get_desc(), x.get_desc(), 1e-5f, flags}, eng, fpd);
    memory::desc cdesc({sh.c}, f32, memory::format_tag::x);
    auto scale = std::make_shared<memory>(cdesc, eng), shift = std::make_shared<memory>(cdesc, eng),
         mean = std::make_shared<memory>(cdesc, eng), var = std::make_shared<memory>(cdesc, eng),
         dscale = std::make_shared<memory>(cdesc, eng),
         dshift = std::make_shared<memory>(cdesc, eng);
    std::fill_n(static_cast<float*>(scale->get_data_handle()), sh.c, 1.0f);
    std::fill_n(static_cast<float*>(shift->get_data_handle()), sh.c, 0.0f);
    auto fwd = std::make_shared<batch_normalization_forward>(fpd);
    auto bwd = std::make_shared<batch_normalization_backward>(bpd);
    forward = [=, &st, &x, &y] {
      fwd->execute(st, {{DNNL_ARG_SRC, x},
                        {DNNL_ARG_DST, y},
                        {DNNL_ARG_SCALE, *scale},
                        {DNNL_ARG_SHIFT, *shift},
                        {DNNL_ARG_MEAN, *mean},
                        {DNNL_ARG_VARIANCE, *var}});
    };
    backward = [=, &st, &x, &dy, &dx] {
      bwd->execute(st, {{DNNL_ARG_SRC, x},
                        {DNNL_ARG_DIFF_DST, dy},
                        {DNNL_ARG_SCALE, *scale},
                        {DNNL_ARG_SHIFT, *shift},
                        {DNNL_ARG_MEAN, *mean},
                        {DNNL_ARG_VARIANCE, *var},
                        {DNNL_ARG_DIFF_SRC, dx},
                        {DNNL_ARG_DIFF_SCALE, *dscale},
                        {DNNL_ARG_DIFF_SHIFT, *dshift}});
    };
  } else {
    const algorithm alg =
        sh.kind == Kind::kMax ? algorithm::pooling_max : algorithm::pooling_avg_include_padding;
    memory::dims kd{k, k}, sd{s, s}, pd{p, p};
    pooling_forward::primitive_desc fpd(
        {prop_kind::forward_training, alg, x.get_desc(), y.get_desc(), sd, kd, pd, pd}, eng);
    pooling_backward::primitive_desc bpd({alg, dx.get_desc(), dy.get_desc(), sd, kd, pd, pd}, eng,
                                         fpd);
    auto ws = std::make_shared<memory>(fpd.workspace_desc(), eng);
    auto fwd = std::make_shared<pooling_forward>(fpd);
    auto bwd = std::make_shared<pooling_backward>(bpd);
    forward = [=, &st, &x, &y] {
      fwd->execute(st, {{DNNL_ARG_SRC, x}, {DNNL_ARG_DST, y}, {DNNL_ARG_WORKSPACE, *ws}});
    };
    backward = [=, &st, &dy, &dx] {
      bwd->execute(st, {{DNNL_ARG_DIFF_DST, dy}, {DNNL_ARG_DIFF_SRC, dx}, {DNNL_ARG_WORKSPACE, *ws}});
    };
  }
  return BestMs(reps, [&] {
    if (blocked) reorder(usrc, bsrc).execute(st, usrc, bsrc);
    forward();
    if (blocked) {
      reorder(bdst, udst).execute(st, bdst, udst);
      reorder(uddst, bddst).execute(st, uddst, bddst);
    }
    backward();
    if (blocked) reorder(bdsrc, udsrc).execute(st, bdsrc, udsrc);
    st.wait();
  });
}

int main(int argc, char** argv) {
  const std::string only = argc > 1 ? argv[1] : "";
  const Shape shapes[] = {
      {"lenet avgpool 2x2 6@28", Kind::kAvg, 256, 6, 28, 2, 2, 0},
      {"lenet avgpool 2x2 16@10", Kind::kAvg, 256, 16, 10, 2, 2, 0},
      {"resnet bn 64@28", Kind::kBatchNorm, 256, 64, 28, 0, 0, 0},
      {"resnet bn 128@14", Kind::kBatchNorm, 256, 128, 14, 0, 0, 0},
      {"resnet bn 256@7", Kind::kBatchNorm, 256, 256, 7, 0, 0, 0},
      {"resnet bn 512@4", Kind::kBatchNorm, 256, 512, 4, 0, 0, 0},
      {"resnet globalavg 512@4", Kind::kGlobalAvg, 256, 512, 4, 0, 0, 0},
      {"(no model) maxpool 3x3 s2 p1 64@28", Kind::kMax, 256, 64, 28, 3, 2, 1},
  };
  using tag = dnnl::memory::format_tag;
  for (const Shape& s : shapes) {
    if (std::string(s.name).find(only) == std::string::npos) continue;
    const int reps = 7;
    for (int t : {1, 2}) {
      const double a = Ours(s, t, reps), b = Dnnl(s, t, reps, tag::nchw),
                   c = Dnnl(s, t, reps, tag::nChw8c), d = Dnnl(s, t, reps, tag::nChw16c);
      std::printf(
          "%-36s threads %d  ours %7.2f ms  oneDNN nchw %7.2f  nChw8c+reorders %7.2f  "
          "nChw16c+reorders %7.2f  ours/best-oneDNN %.2f\n",
          s.name, t, a, b, c, d, a / std::min(b, std::min(c, d)));
      std::fflush(stdout);
    }
  }
}
