// The networks of the d2l chapters the project grew out of, for 1x28x28 Fashion-MNIST images
// and 10 classes by default, or any C x H x W input and class count (NetworkShape: the sizes
// below follow from it), built as a Sequential whose layer indices match PyTorch's
// nn.Sequential (so parameter "i.weight" belongs to layer i).
//
//   mlp:      Flatten, Linear(784, 256), ReLU, Linear(256, 10)
//   lenet:    Conv2d(1, 6, 5, padding=2), Sigmoid, AvgPool2d(2, 2), Conv2d(6, 16, 5), Sigmoid,
//             AvgPool2d(2, 2), Flatten, Linear(400, 120), Sigmoid, Linear(120, 84), Sigmoid,
//             Linear(84, 10)
//   resnet18: d2l's ResNet-18 as modified for 28x28 input (3x3 stem, stride 1, no max-pool):
//             Sequential(Conv2d(1, 64, 3, padding=1), BatchNorm2d(64), ReLU), then four stages
//             of two Residuals each (64, 128, 256, 512 channels; stages 2-4 start with a
//             use_1x1conv, stride-2 Residual), AdaptiveAvgPool2d((1, 1)), Flatten,
//             Linear(512, 10). 11,175,818 parameters; names as worker/nn/testdata/
//             resnet18_state_dict.txt (made by PyTorch from d2l's code).
#ifndef DPTRAIN_WORKER_NN_ARCHITECTURES_H_
#define DPTRAIN_WORKER_NN_ARCHITECTURES_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "worker/nn/sequential.h"

namespace dptrain {
namespace nn {

inline constexpr int kNumClasses = 10;
inline constexpr Dims kImageDims{1, 28, 28};

// What a built-in network is built for: one sample's dims and the number of classes (the
// data's: 3x32x32 and 10 for CIFAR-10). mlp's first Linear takes input.size() values; lenet's
// convolutions take input.c channels and its first Linear 16 x (H/2 - 4)/2 x (W/2 - 4)/2
// (LeNet needs H, W >= 12); resnet18's stem takes input.c channels (any H, W >= 1).
struct NetworkShape {
  Dims input = kImageDims;
  int classes = kNumClasses;
};

// "mlp", "lenet" or "resnet18"; InvalidArgument
// "unknown model 'x' (expected mlp, lenet or resnet18)" otherwise, or naming the shape a
// network cannot take.
absl::Status CheckNetworkShape(absl::string_view name, const NetworkShape& shape);
template <typename T>
absl::StatusOr<Sequential<T>> BuildNetwork(absl::string_view name,
                                           const NetworkShape& shape = NetworkShape());

// A d2l-style ResNet: layer 0 = Sequential(Conv2d(input.c, channels[0], 3, padding=1),
// BatchNorm2d, ReLU); layer 1 + s = Sequential of `residuals` Residuals for each stage s (stage 0:
// channels[0] -> channels[0], stride 1; later stages: the first Residual goes from
// channels[s - 1] to channels[s] with use_1x1conv and stride 2); then AdaptiveAvgPool2d((1, 1)),
// Flatten, Linear(channels.back(), classes). resnet18 is {kImageDims, {64, 128, 256, 512}, 2, 10};
// tests use small ones.
struct ResNetConfig {
  Dims input;
  std::vector<int> channels;
  int residuals = 2;
  int classes = kNumClasses;
};
template <typename T>
absl::StatusOr<Sequential<T>> BuildResNet(const ResNetConfig& config);

// Overwrites `params` (net.num_params() values) drawn deterministically from `seed`, in layout
// order. Biases (names ending in "bias") are 0 and batch-norm weights (1-D "weight"s) are 1. The
// other weights depend on `init`:
//   "normal":  N(0, 0.01^2), d2l's for the MLP;
//   "xavier":  Xavier-uniform (gain 1), d2l's train_ch6 for LeNet and ResNet;
//   "kaiming": Kaiming-normal, fan_out mode, ReLU gain: N(0, 2 / fan_out) (torchvision's ResNet);
//   "default": the model's d2l choice: normal for mlp, xavier for lenet and resnet18.
// InvalidArgument for an unknown model or init name.
absl::Status InitializeParams(absl::string_view name, const Sequential<float>& net, uint64_t seed,
                              float* params, absl::string_view init = "default");
// The same for any layout of those parameters: `specs` (names and shapes, in layout order,
// back to back from `params`) drawn in that order, so that the same specs give the same values
// whatever holds them (the Sequential above, or the built-in graphs of builtin_models.h).
absl::Status InitializeParams(absl::string_view name, absl::Span<const TensorSpec> specs,
                              uint64_t seed, float* params, absl::string_view init = "default");

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_ARCHITECTURES_H_
