// oneDNN's convolution (Debian's libdnnl 2.6, the library behind PyTorch's CPU convolutions) for
// a float Conv2d layer, the whole batch at once: forward, backward weights (with the bias
// gradient) and backward data. oneDNN runs on its preferred (blocked) layouts on its own OpenMP
// threads; the layer's plain NCHW / OIHW tensors are reordered in and out on every call into
// scratch the caller lends, so the layer keeps no batch-sized state of its own and layers can
// share that scratch (the pool's, see Conv2d).
//
// Where it is used is a measured rule (PreferOneDnn): oneDNN wins on some shapes and loses
// on others (tests/bench:conv_dnnl_probe, docs/benchmarks/onednn_conv.md).
#ifndef DPTRAIN_WORKER_NN_ONEDNN_CONV_H_
#define DPTRAIN_WORKER_NN_ONEDNN_CONV_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "worker/nn/layer.h"
#include "worker/nn/tensor.h"

namespace dptrain {
namespace nn {

struct Conv2dOptions;  // conv2d.h

// The measured rule for kAuto, for a layer with a pool of `threads` threads
// (tests/bench:conv_dnnl_probe per layer, batch 256, forward + both backward passes, reorders
// counted; compute_head_to_head.py's auto-vs-im2col step for the whole model; docs/benchmarks/compute.md): on one
// thread, oneDNN for kernels larger than 1x1 with 6 or more input channels and outputs of 7x7
// or more (LeNet's second layer 1.4x, ResNet-18's 3x3 layers 1.05-1.10x; the models' steps
// 1.05-1.25x); im2col + OpenBLAS for a single input channel (0.3-0.5x), 1x1 kernels (0.75x),
// the 4x4 stage (0.90x), and for every layer on more than one thread (per layer oneDNN was
// level or ahead, but the whole step was not ahead, within the machine's noise: ResNet-18
// 0.89-1.12x, LeNet 0.77-1.00x; not OpenMP's spin-wait: OMP_WAIT_POLICY=passive made it no
// faster, tools/omp_wait_probe.sh).
bool PreferOneDnn(const Conv2dOptions& o, const Dims& in, int threads);

class OneDnnConv {
 public:
  // Scratch lent by the caller: slot (0..kScratchSlots-1) -> at least `floats` floats, valid
  // until the call that asked returns; the slots must not overlap.
  static constexpr int kScratchSlots = 5;
  using Scratch = std::function<float*(int slot, int64_t floats)>;

  // Primitives for batches of `batch` samples of per-sample dims `in`, run on `threads`
  // OpenMP threads. Internal if oneDNN has no implementation for it.
  static absl::StatusOr<std::unique_ptr<OneDnnConv>> Create(const Conv2dOptions& o,
                                                            const Dims& in, int batch,
                                                            int threads);
  ~OneDnnConv();
  OneDnnConv(const OneDnnConv&) = delete;
  OneDnnConv& operator=(const OneDnnConv&) = delete;

  int batch() const;

  // y [batch, oc, oh, ow] = conv(x, w) + b.
  void Forward(const float* x, const float* w, const float* b, float* y, const Scratch& scratch);
  // dw, db = the weight and bias gradients of the batch (overwritten); dx = the input gradient,
  // unless dx is null.
  void Backward(const float* x, const float* w, const float* dy, float* dw, float* db, float* dx,
                const Scratch& scratch);

 private:
  struct Impl;
  explicit OneDnnConv(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_ONEDNN_CONV_H_
