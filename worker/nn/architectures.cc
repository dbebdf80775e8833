#include "worker/nn/architectures.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/nn/activations.h"
#include "worker/nn/avg_pool2d.h"
#include "worker/nn/batch_norm2d.h"
#include "worker/nn/conv2d.h"
#include "worker/nn/global_avg_pool2d.h"
#include "worker/nn/init.h"
#include "worker/nn/linear.h"
#include "worker/nn/residual.h"
#include "worker/nn/sequential_block.h"

namespace dptrain {
namespace nn {
namespace {

absl::Status UnknownModel(absl::string_view name) {
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model '", name, "' (expected mlp, lenet or resnet18)"));
}

template <typename T>
absl::StatusOr<Sequential<T>> BuildMlp(const NetworkShape& shape) {
  std::vector<std::unique_ptr<Layer<T>>> layers;
  layers.push_back(std::make_unique<Flatten<T>>());
  layers.push_back(std::make_unique<Linear<T>>(shape.input.size(), 256));
  layers.push_back(std::make_unique<ReLU<T>>());
  layers.push_back(std::make_unique<Linear<T>>(256, shape.classes));
  return Sequential<T>::Create(shape.input, std::move(layers));
}

template <typename T>
absl::StatusOr<Sequential<T>> BuildLeNet(const NetworkShape& shape) {
  const int h = (shape.input.h / 2 - 4) / 2, w = (shape.input.w / 2 - 4) / 2;
  std::vector<std::unique_ptr<Layer<T>>> layers;
  layers.push_back(std::make_unique<Conv2d<T>>(Conv2dOptions::Square(shape.input.c, 6, 5, 1, 2)));
  layers.push_back(std::make_unique<Sigmoid<T>>());
  layers.push_back(std::make_unique<AvgPool2d<T>>(AvgPool2dOptions::Square(2, 2)));
  layers.push_back(std::make_unique<Conv2d<T>>(Conv2dOptions::Square(6, 16, 5)));
  layers.push_back(std::make_unique<Sigmoid<T>>());
  layers.push_back(std::make_unique<AvgPool2d<T>>(AvgPool2dOptions::Square(2, 2)));
  layers.push_back(std::make_unique<Flatten<T>>());
  layers.push_back(std::make_unique<Linear<T>>(16 * h * w, 120));
  layers.push_back(std::make_unique<Sigmoid<T>>());
  layers.push_back(std::make_unique<Linear<T>>(120, 84));
  layers.push_back(std::make_unique<Sigmoid<T>>());
  layers.push_back(std::make_unique<Linear<T>>(84, shape.classes));
  return Sequential<T>::Create(shape.input, std::move(layers));
}

ResNetConfig ResNet18Config(const NetworkShape& shape) {
  return ResNetConfig{shape.input, {64, 128, 256, 512}, 2, shape.classes};
}

}  // namespace

template <typename T>
absl::StatusOr<Sequential<T>> BuildResNet(const ResNetConfig& config) {
  if (config.channels.empty() || config.residuals < 1 || config.classes < 1) {
    return absl::InvalidArgumentError("ResNet: needs channels, residuals >= 1 and classes >= 1");
  }
  std::vector<std::unique_ptr<Layer<T>>> layers;
  {
    std::vector<std::unique_ptr<Layer<T>>> b1;
    b1.push_back(std::make_unique<Conv2d<T>>(
        Conv2dOptions::Square(config.input.c, config.channels[0], 3, 1, 1)));
    b1.push_back(std::make_unique<BatchNorm2d<T>>(config.channels[0]));
    b1.push_back(std::make_unique<ReLU<T>>());
    layers.push_back(std::make_unique<SequentialBlock<T>>(std::move(b1)));
  }
  // The blocks run one after the other, so they can share their backward scratch buffers.
  auto scratch = std::make_shared<ResidualScratch<T>>();
  for (size_t s = 0; s < config.channels.size(); ++s) {
    std::vector<std::unique_ptr<Layer<T>>> stage;
    const int out = config.channels[s];
    for (int r = 0; r < config.residuals; ++r) {
      if (r == 0 && s > 0) {
        stage.push_back(std::make_unique<Residual<T>>(
            ResidualOptions{config.channels[s - 1], out, /*use_1x1conv=*/true, /*stride=*/2},
            scratch));
      } else {
        stage.push_back(
            std::make_unique<Residual<T>>(ResidualOptions{out, out, false, 1}, scratch));
      }
    }
    layers.push_back(std::make_unique<SequentialBlock<T>>(std::move(stage)));
  }
  layers.push_back(std::make_unique<GlobalAvgPool2d<T>>());
  layers.push_back(std::make_unique<Flatten<T>>());
  layers.push_back(std::make_unique<Linear<T>>(config.channels.back(), config.classes));
  return Sequential<T>::Create(config.input, std::move(layers));
}

template absl::StatusOr<Sequential<float>> BuildResNet<float>(const ResNetConfig&);
template absl::StatusOr<Sequential<double>> BuildResNet<double>(const ResNetConfig&);

absl::Status CheckNetworkShape(absl::string_view name, const NetworkShape& shape) {
  if (name != "mlp" && name != "lenet" && name != "resnet18") return UnknownModel(name);
  if (shape.input.c < 1 || shape.input.h < 1 || shape.input.w < 1 || shape.classes < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": needs an input of at least 1x1x1 and 2 or more classes, got ",
                     shape.input.ToString(), " and ", shape.classes, " classes"));
  }
  if (name == "lenet" && (shape.input.h < 12 || shape.input.w < 12)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lenet needs images of at least 12x12, got ", shape.input.ToString()));
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<Sequential<T>> BuildNetwork(absl::string_view name, const NetworkShape& shape) {
  if (absl::Status s = CheckNetworkShape(name, shape); !s.ok()) return s;
  if (name == "mlp") return BuildMlp<T>(shape);
  if (name == "lenet") return BuildLeNet<T>(shape);
  return BuildResNet<T>(ResNet18Config(shape));
}

template absl::StatusOr<Sequential<float>> BuildNetwork<float>(absl::string_view,
                                                               const NetworkShape&);
template absl::StatusOr<Sequential<double>> BuildNetwork<double>(absl::string_view,
                                                                 const NetworkShape&);

absl::Status InitializeParams(absl::string_view name, absl::Span<const TensorSpec> specs,
                              uint64_t seed, float* params, absl::string_view init) {
  if (name != "mlp" && name != "lenet" && name != "resnet18") return UnknownModel(name);
  if (init == "default") init = name == "mlp" ? "normal" : "xavier";
  if (init != "normal" && init != "xavier" && init != "kaiming") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown init '", init, "' (expected default, normal, xavier or kaiming)"));
  }
  InitRng rng(seed);
  float* p = params;
  for (const TensorSpec& spec : specs) {
    if (absl::EndsWith(spec.name, "bias")) {
      std::fill(p, p + spec.size(), 0.0f);
    } else if (spec.shape.size() == 1) {  // Batch norm's weight (gamma).
      std::fill(p, p + spec.size(), 1.0f);
    } else if (init == "normal") {
      FillNormal(rng, 0.0, 0.01, p, spec.size());
    } else if (init == "xavier") {
      const double bound = XavierUniformBound(spec.shape);
      FillUniform(rng, -bound, bound, p, spec.size());
    } else {
      int64_t fan_in, fan_out;
      ComputeFans(spec.shape, &fan_in, &fan_out);
      FillNormal(rng, 0.0, std::sqrt(2.0 / static_cast<double>(fan_out)), p, spec.size());
    }
    p += spec.size();
  }
  return absl::OkStatus();
}

absl::Status InitializeParams(absl::string_view name, const Sequential<float>& net, uint64_t seed,
                              float* params, absl::string_view init) {
  std::vector<TensorSpec> specs;  // Layer by layer: the layout order (params are back to back).
  for (int i = 0; i < net.num_layers(); ++i) {
    for (TensorSpec& spec : net.layer(i).ParamSpecs()) specs.push_back(std::move(spec));
  }
  return InitializeParams(name, specs, seed, params, init);
}

}  // namespace nn
}  // namespace dptrain
