// Probe: our Conv2d<float> (im2col + OpenBLAS, split over the pool) against oneDNN's convolution
// (forward, backward data, backward weights) on the shapes of lenet and resnet18, batch 256.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dnnl.hpp"
#include "worker/nn/conv2d.h"
#include "worker/nn/gemm.h"
#include "worker/nn/thread_pool.h"

using namespace dptrain::nn;
using Clock = std::chrono::steady_clock;

struct Shape {
  const char* name;
  int n, c, h, oc, k, s, p;
};

double Ours(const Shape& sh, int threads, int reps) {
  Conv2dOptions o = Conv2dOptions::Square(sh.c, sh.oc, sh.k, sh.s, sh.p);
  Conv2d<float> conv(o);
  std::unique_ptr<ThreadPool> pool;
  SetBlasThreads(1);
  if (threads > 1) pool = std::make_unique<ThreadPool>(threads);
  const LayerContext<float> ctx{pool.get(), ConvAlgorithm::kAuto, nullptr};
  Dims in{sh.c, sh.h, sh.h};
  Dims out = *conv.OutputDims(in);
  std::vector<float> params(int64_t{sh.oc} * sh.c * sh.k * sh.k + sh.oc, 0.01f),
      grads(params.size());
  conv.BindParams(params.data(), grads.data());
  std::vector<float> x(int64_t{sh.n} * in.size(), 0.5f), dy(int64_t{sh.n} * out.size(), 0.1f);
  double best = 1e9;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    conv.Forward(ctx, {x.data(), sh.n, in}, true);
    conv.Backward(ctx, {dy.data(), sh.n, out}, true);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best * 1e3;
}

double Dnnl(const Shape& sh, int threads, int reps) {
  using namespace dnnl;
  omp_set_num_threads(threads);
  engine eng(engine::kind::cpu, 0);
  stream st(eng);
  const int oh = (sh.h + 2 * sh.p - sh.k) / sh.s + 1;
  memory::dims src{sh.n, sh.c, sh.h, sh.h}, wei{sh.oc, sh.c, sh.k, sh.k}, bia{sh.oc},
      dst{sh.n, sh.oc, oh, oh}, strides{sh.s, sh.s}, pad{sh.p, sh.p};
  auto f32 = memory::data_type::f32;
  auto md = [&](const memory::dims& d, memory::format_tag t) { return memory::desc(d, f32, t); };
  auto any = memory::format_tag::any;
  convolution_forward::desc fd(prop_kind::forward_training, algorithm::convolution_direct,
                               md(src, any), md(wei, any), md(bia, memory::format_tag::x),
                               md(dst, any), strides, pad, pad);
  convolution_forward::primitive_desc fpd(fd, eng);
  convolution_backward_data::desc bdd(algorithm::convolution_direct, md(src, any), md(wei, any),
                                      md(dst, any), strides, pad, pad);
  convolution_backward_data::primitive_desc bdpd(bdd, eng, fpd);
  convolution_backward_weights::desc bwd(algorithm::convolution_direct, md(src, any), md(wei, any),
                                         md(bia, memory::format_tag::x), md(dst, any), strides, pad,
                                         pad);
  convolution_backward_weights::primitive_desc bwpd(bwd, eng, fpd);
  // User memory in NCHW / OIHW; reorders in and out counted in the time, as a layer would pay.
  memory usrc(md(src, memory::format_tag::nchw), eng), uwei(md(wei, memory::format_tag::oihw), eng),
      ubia(md(bia, memory::format_tag::x), eng), udst(md(dst, memory::format_tag::nchw), eng),
      uddst(md(dst, memory::format_tag::nchw), eng), udsrc(md(src, memory::format_tag::nchw), eng),
      udwei(md(wei, memory::format_tag::oihw), eng), udbia(md(bia, memory::format_tag::x), eng);
  memory psrc(fpd.src_desc(), eng), pwei(fpd.weights_desc(), eng), pdst(fpd.dst_desc(), eng),
      pddst(bdpd.diff_dst_desc(), eng), pdsrc(bdpd.diff_src_desc(), eng),
      pwsrc(bwpd.src_desc(), eng), pwddst(bwpd.diff_dst_desc(), eng),
      pdwei(bwpd.diff_weights_desc(), eng), pbwei(bdpd.weights_desc(), eng);
  std::fill_n(static_cast<float*>(usrc.get_data_handle()), sh.n * sh.c * sh.h * sh.h, 0.5f);
  std::fill_n(static_cast<float*>(uwei.get_data_handle()), sh.oc * sh.c * sh.k * sh.k, 0.01f);
  std::fill_n(static_cast<float*>(uddst.get_data_handle()), sh.n * sh.oc * oh * oh, 0.1f);
  convolution_forward fwd(fpd);
  convolution_backward_data bwdd(bdpd);
  convolution_backward_weights bwdw(bwpd);
  auto reorder_if = [&](memory& a, memory& b) {
    if (a.get_desc() != b.get_desc()) reorder(a, b).execute(st, a, b);
    return a.get_desc() != b.get_desc();
  };
  double best = 1e9;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    memory fs = psrc, fw = pwei;
    if (!reorder_if(usrc, psrc)) fs = usrc;
    if (!reorder_if(uwei, pwei)) fw = uwei;
    memory fdst = fpd.dst_desc() == udst.get_desc() ? udst : pdst;
    fwd.execute(
        st,
        {{DNNL_ARG_SRC, fs}, {DNNL_ARG_WEIGHTS, fw}, {DNNL_ARG_BIAS, ubia}, {DNNL_ARG_DST, fdst}});
    if (fdst != udst) reorder(fdst, udst).execute(st, fdst, udst);
    memory dd = pddst;
    if (!reorder_if(uddst, pddst)) dd = uddst;
    memory bw = pbwei;
    if (!reorder_if(uwei, pbwei)) bw = uwei;
    memory ds = bdpd.diff_src_desc() == udsrc.get_desc() ? udsrc : pdsrc;
    bwdd.execute(st, {{DNNL_ARG_DIFF_DST, dd}, {DNNL_ARG_WEIGHTS, bw}, {DNNL_ARG_DIFF_SRC, ds}});
    if (ds != udsrc) reorder(ds, udsrc).execute(st, ds, udsrc);
    memory ws = pwsrc, wd = pwddst;
    if (!reorder_if(usrc, pwsrc)) ws = usrc;
    if (!reorder_if(uddst, pwddst)) wd = uddst;
    memory dw = bwpd.diff_weights_desc() == udwei.get_desc() ? udwei : pdwei;
    bwdw.execute(st, {{DNNL_ARG_SRC, ws},
                      {DNNL_ARG_DIFF_DST, wd},
                      {DNNL_ARG_DIFF_WEIGHTS, dw},
                      {DNNL_ARG_DIFF_BIAS, udbia}});
    if (dw != udwei) reorder(dw, udwei).execute(st, dw, udwei);
    st.wait();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best * 1e3;
}

int main(int argc, char** argv) {
  // Optional argument: only the shapes whose name contains it.
  const std::string only = argc > 1 ? argv[1] : "";
  const Shape shapes[] = {{"lenet conv1 1->6 5x5 p2 @28", 256, 1, 28, 6, 5, 1, 2},
                          {"lenet conv2 6->16 5x5 @14", 256, 6, 14, 16, 5, 1, 0},
                          {"resnet 1->64 3x3 @28", 256, 1, 28, 64, 3, 1, 1},
                          {"resnet 64->64 3x3 @28", 256, 64, 28, 64, 3, 1, 1},
                          {"resnet 64->128 3x3 s2 @28", 256, 64, 28, 128, 3, 2, 1},
                          {"resnet 64->128 1x1 s2 @28", 256, 64, 28, 128, 1, 2, 0},
                          {"resnet 128->128 3x3 @14", 256, 128, 14, 128, 3, 1, 1},
                          {"resnet 256->256 3x3 @7", 256, 256, 7, 256, 3, 1, 1},
                          {"resnet 512->512 3x3 @4", 256, 512, 4, 512, 3, 1, 1}};
  for (const Shape& s : shapes) {
    if (std::string(s.name).find(only) == std::string::npos) continue;
    const int reps = s.c >= 64 ? 2 : 5;
    for (int t : {1, 2}) {
      const double a = Ours(s, t, reps), b = Dnnl(s, t, reps);
      std::printf("%-32s threads %d  ours %8.2f ms  oneDNN %8.2f ms  ours/oneDNN %.2f\n", s.name, t,
                  a, b, a / b);
      std::fflush(stdout);
    }
  }
}
