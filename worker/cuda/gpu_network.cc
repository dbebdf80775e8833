#include "worker/cuda/gpu_network.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/nn/activations.h"
#include "worker/nn/avg_pool2d.h"
#include "worker/nn/batch_norm2d.h"
#include "worker/nn/conv2d.h"
#include "worker/nn/global_avg_pool2d.h"
#include "worker/nn/linear.h"
#include "worker/nn/max_pool2d.h"
#include "worker/nn/residual.h"
#include "worker/nn/sequential_block.h"

namespace dptrain {
namespace cuda {

absl::StatusOr<std::unique_ptr<GpuLayer>> ToGpu(const nn::Layer<float>& layer,
                                                const nn::Dims& input) {
  absl::StatusOr<nn::Dims> output = layer.OutputDims(input);
  if (!output.ok()) return output.status();
  if (auto* l = dynamic_cast<const nn::Linear<float>*>(&layer)) {
    return std::make_unique<GpuLinear>(l->in_features(), l->out_features());
  }
  if (auto* c = dynamic_cast<const nn::Conv2d<float>*>(&layer)) {
    return std::make_unique<GpuConv2d>(c->options(), input, *output);
  }
  if (auto* b = dynamic_cast<const nn::BatchNorm2d<float>*>(&layer)) {
    return std::make_unique<GpuBatchNorm2d>(b->num_features(), b->eps(), b->momentum());
  }
  if (dynamic_cast<const nn::ReLU<float>*>(&layer) != nullptr) {
    return std::make_unique<GpuActivation>(GpuActivation::Kind::kRelu);
  }
  if (dynamic_cast<const nn::Sigmoid<float>*>(&layer) != nullptr) {
    return std::make_unique<GpuActivation>(GpuActivation::Kind::kSigmoid);
  }
  if (dynamic_cast<const nn::Flatten<float>*>(&layer) != nullptr) {
    return std::make_unique<GpuFlatten>();
  }
  if (auto* p = dynamic_cast<const nn::MaxPool2d<float>*>(&layer)) {
    if (p->options().ceil_mode) {  // cuDNN's pooling rounds its output size down: ours.
      return std::make_unique<GpuDirectPool2d>(GpuDirectPool2d::Kind::kMax, p->options(), input,
                                               *output);
    }
    return std::make_unique<GpuPool2d>(GpuPool2d::Kind::kMax, p->options(), input, *output);
  }
  if (auto* p = dynamic_cast<const nn::AvgPool2d<float>*>(&layer)) {
    if (p->options().ceil_mode || !p->options().count_include_pad) {  // Ours, as for MaxPool.
      return std::make_unique<GpuDirectPool2d>(GpuDirectPool2d::Kind::kAvg, p->options(), input,
                                               *output);
    }
    return std::make_unique<GpuPool2d>(GpuPool2d::Kind::kAvg, p->options(), input, *output);
  }
  if (dynamic_cast<const nn::GlobalAvgPool2d<float>*>(&layer) != nullptr) {
    return std::make_unique<GpuPool2d>(GpuPool2d::Kind::kGlobalAvg, nn::Pool2dOptions{}, input,
                                       *output);
  }
  if (auto* r = dynamic_cast<const nn::Residual<float>*>(&layer)) {
    return std::make_unique<GpuResidual>(r->options(), input, *output);
  }
  if (auto* s = dynamic_cast<const nn::SequentialBlock<float>*>(&layer)) {
    std::vector<std::unique_ptr<GpuLayer>> layers;
    nn::Dims dims = input;
    for (int i = 0; i < s->num_layers(); ++i) {
      absl::StatusOr<std::unique_ptr<GpuLayer>> g = ToGpu(s->layer(i), dims);
      if (!g.ok()) return g.status();
      layers.push_back(*std::move(g));
      dims = *s->layer(i).OutputDims(dims);
    }
    return std::make_unique<GpuSequentialBlock>(std::move(layers));
  }
  return absl::UnimplementedError(
      absl::StrCat("the CUDA backend has no ", layer.ToString(), " layer"));
}

absl::StatusOr<std::unique_ptr<GpuSequentialBlock>> ToGpu(const nn::Sequential<float>& net) {
  std::vector<std::unique_ptr<GpuLayer>> layers;
  for (int i = 0; i < net.num_layers(); ++i) {
    absl::StatusOr<std::unique_ptr<GpuLayer>> g = ToGpu(net.layer(i), net.dims(i));
    if (!g.ok()) return g.status();
    layers.push_back(*std::move(g));
  }
  return std::make_unique<GpuSequentialBlock>(std::move(layers));
}

}  // namespace cuda
}  // namespace dptrain
