#include "worker/nn/softmax_cross_entropy.h"

#include <cmath>
#include <vector>

namespace dptrain {
namespace nn {

template <typename T>
LossOutput SoftmaxCrossEntropy(const T* logits, const uint8_t* labels, int batch, int classes,
                               T* grad_logits) {
  LossOutput out;
  double total = 0;
  const double inv_batch = 1.0 / batch;
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
    // log(sum) - (z_label - max): exact even when |max| dwarfs log(sum).
    total += std::log(sum) - (static_cast<double>(row[label]) - max);
    if (argmax == label) ++out.correct;
    if (grad_logits != nullptr) {
      T* g = grad_logits + int64_t{i} * classes;
      const double scale = inv_batch / sum;
      for (int j = 0; j < classes; ++j) {
        const double p = std::exp(static_cast<double>(row[j]) - max) * scale;
        g[j] = static_cast<T>(j == label ? p - inv_batch : p);
      }
    }
  }
  out.loss = total * inv_batch;
  return out;
}

template LossOutput SoftmaxCrossEntropy<float>(const float*, const uint8_t*, int, int, float*);
template LossOutput SoftmaxCrossEntropy<double>(const double*, const uint8_t*, int, int, double*);

}  // namespace nn
}  // namespace dptrain
