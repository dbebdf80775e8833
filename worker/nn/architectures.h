// The networks of the d2l chapters the project grew out of, for 1x28x28 Fashion-MNIST images
// and 10 classes, built as a Sequential whose layer indices match PyTorch's nn.Sequential (so
// parameter "i.weight" belongs to layer i).
//
//   mlp:   Flatten, Linear(784, 256), ReLU, Linear(256, 10)
//   lenet: Conv2d(1, 6, 5, padding=2), Sigmoid, AvgPool2d(2, 2), Conv2d(6, 16, 5), Sigmoid,
//          AvgPool2d(2, 2), Flatten, Linear(400, 120), Sigmoid, Linear(120, 84), Sigmoid,
//          Linear(84, 10)
#ifndef DPTRAIN_WORKER_NN_ARCHITECTURES_H_
#define DPTRAIN_WORKER_NN_ARCHITECTURES_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/nn/sequential.h"

namespace dptrain {
namespace nn {

inline constexpr int kNumClasses = 10;
inline constexpr Dims kImageDims{1, 28, 28};

// "mlp" or "lenet"; InvalidArgument "unknown model 'x' (expected mlp or lenet)" otherwise.
template <typename T>
absl::StatusOr<Sequential<T>> BuildNetwork(absl::string_view name);

// Overwrites `params` (net.num_params() values) with d2l's initialisation for network `name`,
// drawn deterministically from `seed`: mlp weights N(0, 0.01^2); lenet weights Xavier-uniform;
// all biases 0. Parameters are drawn in layout order. InvalidArgument for an unknown name.
absl::Status InitializeParams(absl::string_view name, const Sequential<float>& net, uint64_t seed,
                              float* params);

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_ARCHITECTURES_H_
