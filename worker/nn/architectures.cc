#include "worker/nn/architectures.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/nn/activations.h"
#include "worker/nn/avg_pool2d.h"
#include "worker/nn/conv2d.h"
#include "worker/nn/init.h"
#include "worker/nn/linear.h"

namespace dptrain {
namespace nn {
namespace {

absl::Status UnknownModel(absl::string_view name) {
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model '", name, "' (expected mlp or lenet)"));
}

template <typename T>
absl::StatusOr<Sequential<T>> BuildMlp() {
  std::vector<std::unique_ptr<Layer<T>>> layers;
  layers.push_back(std::make_unique<Flatten<T>>());
  layers.push_back(std::make_unique<Linear<T>>(784, 256));
  layers.push_back(std::make_unique<ReLU<T>>());
  layers.push_back(std::make_unique<Linear<T>>(256, kNumClasses));
  return Sequential<T>::Create(kImageDims, std::move(layers));
}

template <typename T>
absl::StatusOr<Sequential<T>> BuildLeNet() {
  std::vector<std::unique_ptr<Layer<T>>> layers;
  layers.push_back(std::make_unique<Conv2d<T>>(Conv2dOptions::Square(1, 6, 5, 1, 2)));
  layers.push_back(std::make_unique<Sigmoid<T>>());
  layers.push_back(std::make_unique<AvgPool2d<T>>(AvgPool2dOptions::Square(2, 2)));
  layers.push_back(std::make_unique<Conv2d<T>>(Conv2dOptions::Square(6, 16, 5)));
  layers.push_back(std::make_unique<Sigmoid<T>>());
  layers.push_back(std::make_unique<AvgPool2d<T>>(AvgPool2dOptions::Square(2, 2)));
  layers.push_back(std::make_unique<Flatten<T>>());
  layers.push_back(std::make_unique<Linear<T>>(16 * 5 * 5, 120));
  layers.push_back(std::make_unique<Sigmoid<T>>());
  layers.push_back(std::make_unique<Linear<T>>(120, 84));
  layers.push_back(std::make_unique<Sigmoid<T>>());
  layers.push_back(std::make_unique<Linear<T>>(84, kNumClasses));
  return Sequential<T>::Create(kImageDims, std::move(layers));
}

}  // namespace

template <typename T>
absl::StatusOr<Sequential<T>> BuildNetwork(absl::string_view name) {
  if (name == "mlp") return BuildMlp<T>();
  if (name == "lenet") return BuildLeNet<T>();
  return UnknownModel(name);
}

template absl::StatusOr<Sequential<float>> BuildNetwork<float>(absl::string_view);
template absl::StatusOr<Sequential<double>> BuildNetwork<double>(absl::string_view);

absl::Status InitializeParams(absl::string_view name, const Sequential<float>& net, uint64_t seed,
                              float* params) {
  if (name != "mlp" && name != "lenet") return UnknownModel(name);
  InitRng rng(seed);
  for (int i = 0; i < net.num_layers(); ++i) {
    float* p = params + net.param_offset(i);
    for (const TensorSpec& spec : net.layer(i).ParamSpecs()) {
      if (spec.name == "bias") {
        std::fill(p, p + spec.size(), 0.0f);
      } else if (name == "mlp") {
        FillNormal(rng, 0.0, 0.01, p, spec.size());
      } else {
        const double bound = XavierUniformBound(spec.shape);
        FillUniform(rng, -bound, bound, p, spec.size());
      }
      p += spec.size();
    }
  }
  return absl::OkStatus();
}

}  // namespace nn
}  // namespace dptrain
