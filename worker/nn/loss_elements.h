// The element-wise losses of a model's outputs against targets (nn.MSELoss, nn.L1Loss,
// nn.BCEWithLogitsLoss): one output's loss and its derivative, written once for the CPU graph
// model (worker/graph/graph_model.cc) and the CUDA backend's loss kernel (worker/cuda/kernels.cu),
// in double.
#ifndef DPTRAIN_WORKER_NN_LOSS_ELEMENTS_H_
#define DPTRAIN_WORKER_NN_LOSS_ELEMENTS_H_

#include <cmath>

#include "common/host_device.h"

namespace dptrain {
namespace nn {

// graph::Loss's numbering of the element-wise losses (graph_model.cc checks it).
inline constexpr int kLossMse = 1, kLossL1 = 2, kLossBce = 3;

struct ElementLoss {
  double value, derivative;
};

// (y - t)^2 (kLossMse), |y - t| (kLossL1: derivative sign(y - t), 0 at 0, as PyTorch) or the
// binary cross-entropy of sigmoid(y) against t (kLossBce: max(y, 0) - y t + log(1 + exp(-|y|)),
// stable for any y, as PyTorch's).
DPTRAIN_HOST_DEVICE inline ElementLoss ElementLossOf(int loss, double y, double t) {
  const double d = y - t;
  switch (loss) {
    case kLossMse:
      return {d * d, 2 * d};
    case kLossL1:
      return {d < 0 ? -d : d, static_cast<double>((d > 0) - (d < 0))};
    default:  // kLossBce.
      return {(y > 0 ? y : 0.0) - y * t + std::log1p(std::exp(y < 0 ? y : -y)),
              1 / (1 + std::exp(-y)) - t};
  }
}

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_LOSS_ELEMENTS_H_
