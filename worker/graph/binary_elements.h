// Add, Sub, Mul, Div, Max and Min of a value and an operand broadcast into it, element by
// element (any_shape_ops.h's NumPy broadcasting): the arithmetic and its derivatives written
// once, for the CPU node (any_shape_math_ops.cc) and the CUDA kernels (any_shape_kernels.cu):
// the same formulas (nvcc may fuse a multiply and an add into one rounding, so the device's last
// bits may differ; the GPU tests compare within fp32 rounding). x is the full (computed) value's
// element, c the operand's; `swapped`: the full value is the right operand (c op x). The operand's
// gradient at one of its elements is the sum of its readers' (element_sources.h's Readers), in
// increasing order from zero, as the CPU node adds.
#ifndef DPTRAIN_WORKER_GRAPH_BINARY_ELEMENTS_H_
#define DPTRAIN_WORKER_GRAPH_BINARY_ELEMENTS_H_

#include <cstdint>

#include "worker/graph/element_sources.h"

namespace dptrain {
namespace graph {

// graph::BinaryOp's numbering (node.h checks it).
inline constexpr int kBinaryAdd = 0, kBinarySub = 1, kBinaryMul = 2, kBinaryDiv = 3, kBinaryMax = 5,
                     kBinaryMin = 6;

template <typename T>
DPTRAIN_HOST_DEVICE inline bool IsNan(T v) {
  return v != v;
}

template <typename T>
DPTRAIN_HOST_DEVICE inline T BinaryValue(int op, bool swapped, T x, T c) {
  const T a = swapped ? c : x;
  const T b = swapped ? x : c;
  switch (op) {
    case kBinaryMax:  // NaN wins, as in torch.maximum.
      return a > b || IsNan(a) ? a : b;
    case kBinaryMin:
      return a < b || IsNan(a) ? a : b;
    case kBinaryAdd:
      return a + b;
    case kBinarySub:
      return a - b;
    case kBinaryMul:
      return a * b;
    default:
      return a / b;
  }
}

// d(out)/dx * g and d(out)/dc * g.
template <typename T>
DPTRAIN_HOST_DEVICE inline void BinaryGrads(int op, bool swapped, T x, T c, T g, T& gx, T& gc) {
  switch (op) {
    case kBinaryMax:  // To the larger; a tie halves it, as torch.maximum's gradient.
    case kBinaryMin:
      if (x == c) {
        gx = gc = g / T(2);
      } else {
        // The operand the forward took (a NaN is taken, as it wins there).
        const bool x_taken = IsNan(x) || (!IsNan(c) && (op == kBinaryMax) == (x > c));
        gx = x_taken ? g : T(0);
        gc = x_taken ? T(0) : g;
      }
      return;
    case kBinaryAdd:
      gx = g;
      gc = g;
      return;
    case kBinarySub:
      gx = swapped ? -g : g;
      gc = swapped ? g : -g;
      return;
    case kBinaryMul:
      gx = g * c;
      gc = g * x;
      return;
    default:
      if (swapped) {  // c / x
        gx = -g * c / (x * x);
        gc = g / x;
      } else {  // x / c
        gx = g / c;
        gc = -g * x / (c * c);
      }
      return;
  }
}

// The operand's gradient at its element o: over o's readers k (offsets, readers: Readers of the
// operand indices), the sum of d(out_k)/dc * dy[k].
template <typename T>
DPTRAIN_HOST_DEVICE inline T OperandGradSum(int op, bool swapped, const int64_t* offsets,
                                            const int64_t* readers, const T* x, T c, const T* dy,
                                            int64_t o) {
  T sum = T(0);
  for (int64_t r = offsets[o]; r < offsets[o + 1]; ++r) {
    const int64_t k = readers[r];
    T gx, gc;
    BinaryGrads(op, swapped, x[k], c, dy[k], gx, gc);
    sum += gc;
  }
  return sum;
}

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_BINARY_ELEMENTS_H_
