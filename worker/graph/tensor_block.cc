#include "worker/graph/tensor_block.h"

#include <algorithm>
#include <utility>

namespace dptrain {
namespace graph {
namespace {

// dst[r][c] = src[c][r] for the layer's [rows, cols] from the graph's [cols, rows], or back.
template <typename T>
void Transpose(const T* src, int64_t src_rows, int64_t src_cols, T* dst) {
  for (int64_t r = 0; r < src_rows; ++r) {
    for (int64_t c = 0; c < src_cols; ++c) dst[c * src_rows + r] = src[r * src_cols + c];
  }
}

}  // namespace

template <typename T>
TensorBlock<T>::TensorBlock(std::vector<Part> parts) : parts_(std::move(parts)) {}

template <typename T>
void TensorBlock<T>::Bind(absl::Span<const T* const> values, absl::Span<T* const> grads,
                          bool writable) {
  values_.assign(parts_.size(), nullptr);
  writable_.assign(parts_.size(), nullptr);
  grads_.assign(parts_.size(), nullptr);
  size_t next = 0;
  bool contiguous = true;
  const T* expected_value = nullptr;
  const T* expected_grad = nullptr;
  for (size_t i = 0; i < parts_.size(); ++i) {
    const Part& p = parts_[i];
    if (!p.provided || p.transposed_rows > 0) contiguous = false;
    if (!p.provided) continue;
    values_[i] = values[next];
    if (writable) writable_[i] = const_cast<T*>(values[next]);  // The caller's, and mutable.
    if (!grads.empty()) grads_[i] = grads[next];
    if (expected_value != nullptr &&
        (values_[i] != expected_value || (!grads.empty() && grads_[i] != expected_grad))) {
      contiguous = false;
    }
    expected_value = values_[i] + p.size;
    if (!grads.empty()) expected_grad = grads_[i] + p.size;
    ++next;
  }
  direct_ = contiguous && !parts_.empty();
  if (direct_) {
    direct_values_ = values_[0];
    direct_writable_ = writable_[0];
    direct_grads_ = grads_.empty() ? nullptr : grads_[0];
    // No stage (a model's worth of parameters would otherwise be held twice more).
    std::vector<T>().swap(stage_);
    std::vector<T>().swap(grad_stage_);
    return;
  }
  if (!stage_.empty()) return;
  int64_t total = 0;
  for (const Part& p : parts_) total += p.size;
  stage_.assign(total, T(0));
  grad_stage_.assign(total, T(0));
  int64_t at = 0;
  for (const Part& p : parts_) {
    if (!p.provided) std::fill(stage_.begin() + at, stage_.begin() + at + p.size, p.fill);
    at += p.size;
  }
}

template <typename T>
void TensorBlock<T>::CopyIn() {
  if (direct_) return;
  int64_t at = 0;
  for (size_t i = 0; i < parts_.size(); ++i) {
    const Part& p = parts_[i];
    if (p.provided) {
      if (p.transposed_rows > 0) {
        // The graph's [cols, rows] into the layer's [rows, cols].
        Transpose(values_[i], p.size / p.transposed_rows, p.transposed_rows, stage_.data() + at);
      } else {
        std::copy(values_[i], values_[i] + p.size, stage_.begin() + at);
      }
    }
    at += p.size;
  }
}

template <typename T>
void TensorBlock<T>::CopyValuesOut() {
  if (direct_) return;
  int64_t at = 0;
  for (size_t i = 0; i < parts_.size(); ++i) {
    const Part& p = parts_[i];
    if (p.provided && writable_[i] != nullptr) {
      if (p.transposed_rows > 0) {
        Transpose(stage_.data() + at, p.transposed_rows, p.size / p.transposed_rows, writable_[i]);
      } else {
        std::copy(stage_.begin() + at, stage_.begin() + at + p.size, writable_[i]);
      }
    }
    at += p.size;
  }
}

template <typename T>
void TensorBlock<T>::CopyGradsOut() {
  if (direct_) return;
  int64_t at = 0;
  for (size_t i = 0; i < parts_.size(); ++i) {
    const Part& p = parts_[i];
    if (p.provided && grads_[i] != nullptr) {
      if (p.transposed_rows > 0) {
        // The layer's [rows, cols] gradient into the graph's [cols, rows].
        Transpose(grad_stage_.data() + at, p.transposed_rows, p.size / p.transposed_rows,
                  grads_[i]);
      } else {
        std::copy(grad_stage_.begin() + at, grad_stage_.begin() + at + p.size, grads_[i]);
      }
    }
    at += p.size;
  }
}

template class TensorBlock<float>;
template class TensorBlock<double>;

}  // namespace graph
}  // namespace dptrain
