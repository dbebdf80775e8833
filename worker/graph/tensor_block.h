// How a node that wraps an nn::Layer hands it its parameters (or buffers): the layer wants its
// tensors back to back in one block (its ParamSpecs / BufferSpecs order), the executor hands
// one pointer per tensor wherever the model's flat buffers keep it. Where the tensors already
// lie back to back (PyTorch exports a module's weight and bias next to each other) the layer is
// bound to them directly; otherwise (a tensor the graph lacks, such as a bias-free
// convolution's bias; a tensor the graph holds transposed, such as MatMul's [in, out] weight;
// tensors apart) the layer gets a staging copy: values copied in before each Forward,
// gradients (or updated buffers) copied out after Backward (or a training Forward).
//
// Not thread-safe; the node's thread drives it.
#ifndef DPTRAIN_WORKER_GRAPH_TENSOR_BLOCK_H_
#define DPTRAIN_WORKER_GRAPH_TENSOR_BLOCK_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "worker/graph/node.h"

namespace dptrain {
namespace graph {

template <typename T>
class TensorBlock {
 public:
  // The layer's tensors in its order (node.h): size, whether the graph provides it (else
  // the layer sees `fill` and its gradient is dropped), whether the graph holds it transposed.
  using Part = typename TwinSpec<T>::Part;

  explicit TensorBlock(std::vector<Part> parts);

  // One pointer per provided part, in order: values and (for parameters) gradients; `grads` is
  // empty for buffers. `writable` (buffers) says CopyValuesOut may write the values back.
  void Bind(absl::Span<const T* const> values, absl::Span<T* const> grads, bool writable);

  // The block the layer binds to: stable between Binds (the stage, made by the first Bind that
  // needs one, or the caller's buffers).
  const T* values() const { return direct_ ? direct_values_ : stage_.data(); }
  T* mutable_values() { return direct_ ? direct_writable_ : stage_.data(); }
  T* grads() { return direct_ ? direct_grads_ : grad_stage_.data(); }
  // True when the layer is bound to the caller's tensors themselves.
  bool direct() const { return direct_; }

  // Staged only (no-ops when direct): the values into the stage (before each Forward); the
  // stage's values back (buffers, after a training Forward); the stage's gradients back (after
  // each Backward).
  void CopyIn();
  void CopyValuesOut();
  void CopyGradsOut();

  const std::vector<Part>& parts() const { return parts_; }

 private:
  std::vector<Part> parts_;
  std::vector<const T*> values_;  // Per part; null where not provided.
  std::vector<T*> writable_;
  std::vector<T*> grads_;
  bool direct_ = false;
  const T* direct_values_ = nullptr;
  T* direct_writable_ = nullptr;
  T* direct_grads_ = nullptr;
  std::vector<T> stage_;
  std::vector<T> grad_stage_;
};

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_TENSOR_BLOCK_H_
