// One row of nn.CrossEntropyLoss(weight=w, label_smoothing=e) (softmax_cross_entropy.h's class-
// weighted loss), written once for the CPU loss (softmax_cross_entropy.cc) and the CUDA
// backend's kernel (worker/cuda/kernels.cu), in double: the row's weighted terms and its
// gradient, given the batch's 1 / sum of the rows' label weights.
#ifndef DPTRAIN_WORKER_NN_WEIGHTED_CROSS_ENTROPY_H_
#define DPTRAIN_WORKER_NN_WEIGHTED_CROSS_ENTROPY_H_

#include <cmath>

#include "common/host_device.h"

namespace dptrain {
namespace nn {

// A row's first maximum and the sum of exp(z_j - max) (the softmax's denominator, scaled).
template <typename T>
struct RowSoftmax {
  DPTRAIN_HOST_DEVICE RowSoftmax(const T* row, int classes) {
    for (int j = 1; j < classes; ++j) {
      if (row[j] > row[argmax]) argmax = j;
    }
    max = row[argmax];
    for (int j = 0; j < classes; ++j) sum += std::exp(static_cast<double>(row[j]) - max);
  }
  int argmax = 0;
  double max = 0;
  double sum = 0;
};

// The row's weighted loss terms, (1 - e) w[y] (-log p[y]) + e/classes sum_k w[k] (-log p[k]),
// not yet divided by the label weights' sum; writes the row's gradient g[j] =
// ((1 - e) w[y] (p_j - [j = y]) + e/classes (p_j all_weights - w[j])) * inv (if g is not null),
// `all_weights` the sum of w, `inv` 1 / the batch's sum of label weights (0 for a zero sum).
// Sets *argmax to the row's first maximum.
template <typename T>
DPTRAIN_HOST_DEVICE inline double WeightedCrossEntropyRow(const T* row, int classes, int label,
                                                          double smoothing, const double* w,
                                                          double all_weights, double inv, T* g,
                                                          int* argmax) {
  const RowSoftmax<T> r(row, classes);
  *argmax = r.argmax;
  const double max = r.max, sum = r.sum;
  // -log p[j] = log(sum) - (z_j - max): exact even when |max| dwarfs log(sum).
  const double log_sum = std::log(sum);
  const double wy = w[label];
  const double spread = smoothing / classes;
  double total = (1 - smoothing) * wy * (log_sum - (static_cast<double>(row[label]) - max));
  if (smoothing != 0) {
    double all = 0;
    for (int j = 0; j < classes; ++j) all += w[j] * (log_sum - (static_cast<double>(row[j]) - max));
    total += spread * all;
  }
  if (g != nullptr) {
    for (int j = 0; j < classes; ++j) {
      const double p = std::exp(static_cast<double>(row[j]) - max) / sum;
      const double own = (1 - smoothing) * wy * (p - (j == label ? 1.0 : 0.0));
      g[j] = static_cast<T>((own + spread * (p * all_weights - w[j])) * inv);
    }
  }
  return total;
}

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_WEIGHTED_CROSS_ENTROPY_H_
