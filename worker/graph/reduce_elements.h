// ReduceMean, ReduceSum, ReduceMax, ReduceMin and ReduceL2 over axes other than the batch's, and
// TopK's selection (any_shape_ops.h), element by element, for the CUDA kernels
// (any_shape_kernels.cu) and element_sources_test, which checks them on the host against the CPU
// node bit for bit: the CPU node visits the input in increasing order, adding each element into its
// output element; here each output element reads its inputs (`offsets`, `readers`:
// element_sources.h's Readers of the input-to-output indices, NodeImpl::ReducedIndices) in the same
// order.
#ifndef DPTRAIN_WORKER_GRAPH_REDUCE_ELEMENTS_H_
#define DPTRAIN_WORKER_GRAPH_REDUCE_ELEMENTS_H_

#include <cmath>
#include <cstdint>

#include "worker/graph/binary_elements.h"
#include "worker/graph/element_sources.h"

namespace dptrain {
namespace graph {

// Reductions, numbered as the CPU node's (any_shape_math_ops.cc checks it).
inline constexpr int kReduceMean = 0, kReduceSum = 1, kReduceMax = 2, kReduceMin = 3, kReduceL2 = 4;

// Output element o; for a max or min, *arg is set to the input element taken (the first best,
// NaN winning, as PyTorch's max and min).
template <typename T>
DPTRAIN_HOST_DEVICE inline T ReducedValue(int reduction, const int64_t* offsets,
                                          const int64_t* readers, const T* x, T scale, int64_t o,
                                          int64_t* arg) {
  const int64_t begin = offsets[o], end = offsets[o + 1];
  if (reduction == kReduceMax || reduction == kReduceMin) {
    T y = T(0);
    int64_t taken = -1;
    for (int64_t r = begin; r < end; ++r) {
      const T v = x[readers[r]];
      const bool better = reduction == kReduceMax ? v > y : v < y;
      if (taken < 0 || better || (IsNan(v) && !IsNan(y))) {
        y = v;
        taken = readers[r];
      }
    }
    *arg = taken;
    return y;
  }
  T sum = T(0);
  for (int64_t r = begin; r < end; ++r) {
    const T v = x[readers[r]];
    sum += reduction == kReduceL2 ? v * v : v;
  }
  if (reduction == kReduceL2) return std::sqrt(sum);
  return scale != T(1) ? sum * scale : sum;
}

// d(loss)/d(input element k), which adds into output element out_of[k]; y the outputs, arg the
// elements a max or min took.
template <typename T>
DPTRAIN_HOST_DEVICE inline T ReducedGrad(int reduction, const int64_t* out_of, const T* x,
                                         const T* y, const int64_t* arg, const T* dy, T scale,
                                         int64_t k) {
  const int64_t o = out_of[k];
  switch (reduction) {
    case kReduceMax:
    case kReduceMin:
      return arg[o] == k ? dy[o] : T(0);
    case kReduceL2:
      return y[o] > T(0) ? dy[o] * x[k] / y[o] : T(0);
    default:
      return dy[o] * scale;
  }
}

// TopK's order along a row (x[0], x[stride], ... of n elements): a before b when larger (smaller
// unless `largest`), NaN counting as the largest (first among the largest, last among the
// smallest), then by the lower index, as PyTorch's topk: a total order.
template <typename T>
DPTRAIN_HOST_DEVICE inline bool TopKBefore(T a, int64_t ia, T b, int64_t ib, bool largest) {
  if (IsNan(a) != IsNan(b)) return largest ? IsNan(a) : IsNan(b);
  if (a != b && !IsNan(a)) return largest ? a > b : a < b;
  return ia < ib;
}

// The index of the element that follows element `prev` in TopK's order (the first one where
// prev < 0): k calls give the k elements TopK takes, in its output's order.
template <typename T>
DPTRAIN_HOST_DEVICE inline int64_t TopKNext(const T* row, int64_t n, int64_t stride, bool largest,
                                            int64_t prev) {
  int64_t best = -1;
  for (int64_t a = 0; a < n; ++a) {
    const T v = row[a * stride];
    if (prev >= 0 && !TopKBefore(row[prev * stride], prev, v, a, largest)) continue;
    if (best < 0 || TopKBefore(v, a, row[best * stride], best, largest)) best = a;
  }
  return best;
}

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_REDUCE_ELEMENTS_H_
