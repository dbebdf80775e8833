// Softmax cross-entropy loss over a batch of logits, as PyTorch's nn.CrossEntropyLoss with the
// default reduction='mean'.
#ifndef DPTRAIN_WORKER_NN_SOFTMAX_CROSS_ENTROPY_H_
#define DPTRAIN_WORKER_NN_SOFTMAX_CROSS_ENTROPY_H_

#include <cstdint>

namespace dptrain {
namespace nn {

struct LossOutput {
  double loss = 0;      // Mean over the batch of -log softmax(logits)[label].
  int64_t correct = 0;  // Rows whose argmax (the first maximum) equals the label.
};

// `logits` holds `batch` rows of `classes` values; every label must be < classes (the caller
// checks). If `grad_logits` is not null it is overwritten with d(mean loss)/d(logits) =
// (softmax(logits) - onehot(label)) / batch. Computed in double internally, with the row maximum
// subtracted before exponentiating, so large logits neither overflow nor lose the loss.
template <typename T>
LossOutput SoftmaxCrossEntropy(const T* logits, const uint8_t* labels, int batch, int classes,
                               T* grad_logits);

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_SOFTMAX_CROSS_ENTROPY_H_
