// Softmax cross-entropy loss over a batch of logits, as PyTorch's nn.CrossEntropyLoss with the
// default reduction='mean', and its label_smoothing and weight (class weights).
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
  // What `loss` is a mean over: the batch, or with class weights the sum of the rows' label
  // weights (so that pieces of a batch combine: sum(loss * weight) / sum(weight)).
  double weight = 0;
};

// `logits` holds `batch` rows of `classes` values; every label must be < classes (the caller
// checks). If `grad_logits` is not null it is overwritten with d(mean loss)/d(logits) =
// (softmax(logits) - target) / batch, target = (1 - e) onehot(label) + e / classes for
// `label_smoothing` e in [0, 1) (PyTorch's). Computed in double internally, with the row maximum
// subtracted before exponentiating, so large logits neither overflow nor lose the loss.
// `class_weights` (if not null: `classes` values >= 0) weigh each row's terms as
// nn.CrossEntropyLoss(weight=w, label_smoothing=e): the row's loss is
// (1 - e) w[label] (-log p[label]) + e/classes sum_k w[k] (-log p[k]), and the mean divides by
// the sum of the rows' w[label] (a batch whose labels all weigh 0: loss and gradient 0, where
// PyTorch gives NaN).
template <typename T>
LossOutput SoftmaxCrossEntropy(const T* logits, const nn::Label* labels, int batch, int classes,
                               T* grad_logits, double label_smoothing = 0,
                               const double* class_weights = nullptr);

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_SOFTMAX_CROSS_ENTROPY_H_
