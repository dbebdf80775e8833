#include "worker/nn/softmax_cross_entropy.h"

#include <cmath>
#include <vector>

namespace dptrain {
namespace nn {

template <typename T>
LossOutput SoftmaxCrossEntropy(const T* logits, const nn::Label* labels, int batch, int classes,
                               T* grad_logits, double label_smoothing) {
  LossOutput out;
  double total = 0;
  const double inv_batch = 1.0 / batch;
  const double spread = label_smoothing / classes;  // Every class's share of the target.
  for (int i = 0; i < batch; ++i) {
    const T* row = logits + int64_t{i} * classes;
    int argmax = 0;
    for (int j = 1; j < classes; ++j) {
      if (row[j] > row[argmax]) argmax = j;
    }
    const double max = row[argmax];
    double sum = 0;
    for (int j = 0; j < classes; ++j) sum += std::exp(static_cast<double>(row[j]) - max);
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
                                               double);
template LossOutput SoftmaxCrossEntropy<double>(const double*, const nn::Label*, int, int, double*,
                                                double);

}  // namespace nn
}  // namespace dptrain
