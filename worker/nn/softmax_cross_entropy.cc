#include "worker/nn/softmax_cross_entropy.h"

#include <cmath>
#include <vector>

#include "worker/nn/weighted_cross_entropy.h"

namespace dptrain {
namespace nn {

namespace {

// The class-weighted loss (SoftmaxCrossEntropy's comment): the row's terms weighed, the mean
// over the label weights' sum; d/dz_j of a row = ((1 - e) w[y] (p_j - [j = y]) +
// e/classes (p_j sum_k w[k] - w[j])) / that sum.
template <typename T>
LossOutput WeightedSoftmaxCrossEntropy(const T* logits, const nn::Label* labels, int batch,
                                       int classes, T* grad_logits, double label_smoothing,
                                       const double* w) {
  LossOutput out;
  double all_weights = 0;
  for (int j = 0; j < classes; ++j) all_weights += w[j];
  for (int i = 0; i < batch; ++i) out.weight += w[labels[i]];
  const double inv = out.weight > 0 ? 1.0 / out.weight : 0.0;
  double total = 0;
  for (int i = 0; i < batch; ++i) {
    int argmax = 0;
    total += WeightedCrossEntropyRow(
        logits + int64_t{i} * classes, classes, labels[i], label_smoothing, w, all_weights, inv,
        grad_logits != nullptr ? grad_logits + int64_t{i} * classes : nullptr, &argmax);
    if (argmax == labels[i]) ++out.correct;
  }
  out.loss = total * inv;
  return out;
}

}  // namespace

template <typename T>
LossOutput SoftmaxCrossEntropy(const T* logits, const nn::Label* labels, int batch, int classes,
                               T* grad_logits, double label_smoothing,
                               const double* class_weights) {
  if (class_weights != nullptr) {
    return WeightedSoftmaxCrossEntropy(logits, labels, batch, classes, grad_logits, label_smoothing,
                                       class_weights);
  }
  LossOutput out;
  out.weight = batch;
  double total = 0;
  const double inv_batch = 1.0 / batch;
  const double spread = label_smoothing / classes;  // Every class's share of the target.
  for (int i = 0; i < batch; ++i) {
    const T* row = logits + int64_t{i} * classes;
    const RowSoftmax<T> r(row, classes);
    const int argmax = r.argmax;
    const double max = r.max, sum = r.sum;
    const int label = labels[i];
    // -log p[j] = log(sum) - (z_j - max): exact even when |max| dwarfs log(sum).
    const double log_sum = std::log(sum);
    total += (1 - label_smoothing) * (log_sum - (static_cast<double>(row[label]) - max));
    if (label_smoothing != 0) {
      double all = 0;
      for (int j = 0; j < classes; ++j) all += log_sum - (static_cast<double>(row[j]) - max);
      total += spread * all;
    }
    if (argmax == label) ++out.correct;
    if (grad_logits != nullptr) {
      T* g = grad_logits + int64_t{i} * classes;
      const double scale = inv_batch / sum;
      for (int j = 0; j < classes; ++j) {
        const double p = std::exp(static_cast<double>(row[j]) - max) * scale;
        const double target = (j == label ? 1 - label_smoothing : 0) + spread;
        g[j] = static_cast<T>(p - target * inv_batch);
      }
    }
  }
  out.loss = total * inv_batch;
  return out;
}

template LossOutput SoftmaxCrossEntropy<float>(const float*, const nn::Label*, int, int, float*,
                                               double, const double*);
template LossOutput SoftmaxCrossEntropy<double>(const double*, const nn::Label*, int, int, double*,
                                                double, const double*);

}  // namespace nn
}  // namespace dptrain
