// Softmax cross-entropy loss over a batch of logits, as PyTorch's nn.CrossEntropyLoss with the
// default reduction='mean', and its label_smoothing.
#ifndef DPTRAIN_WORKER_NN_SOFTMAX_CROSS_ENTROPY_H_
#define DPTRAIN_WORKER_NN_SOFTMAX_CROSS_ENTROPY_H_

#include <cstdint>

#include "worker/nn/tensor.h"

namespace dptrain {
namespace nn {

struct LossOutput {
  // Mean over the batch of -log softmax(logits)[label] (with label smoothing e: of
  // -(1 - e) log p[label] - e/classes sum_k log p[k]).
  double loss = 0;
  int64_t correct = 0;  // Rows whose argmax (the first maximum) equals the label.
};

// `logits` holds `batch` rows of `classes` values; every label must be < classes (the caller
// checks). If `grad_logits` is not null it is overwritten with d(mean loss)/d(logits) =
// (softmax(logits) - target) / batch, target = (1 - e) onehot(label) + e / classes for
// `label_smoothing` e in [0, 1) (PyTorch's). Computed in double internally, with the row maximum
// subtracted before exponentiating, so large logits neither overflow nor lose the loss.
template <typename T>
LossOutput SoftmaxCrossEntropy(const T* logits, const nn::Label* labels, int batch, int classes,
                               T* grad_logits, double label_smoothing = 0);

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_SOFTMAX_CROSS_ENTROPY_H_
