// One element of an nn.LSTM or nn.GRU step (recurrent_ops.h), forward and backward, written once
// for the CPU node (recurrent_ops.cc) and the CUDA twin's kernels (recurrent_kernels.cu); the
// products of the input and of the previous h with the weights are the caller's (a GEMM each).
// Gate order as PyTorch's: LSTM input, forget, cell, output; GRU reset, update, new (the new
// gate's hidden product scaled by the reset gate: linear_before_reset=1). `h` is the hidden size
// and j the element of the state, so gate k of a sample's row is at k h + j.
#ifndef DPTRAIN_WORKER_GRAPH_RECURRENT_CELLS_H_
#define DPTRAIN_WORKER_GRAPH_RECURRENT_CELLS_H_

#include <cmath>
#include <cstdint>

#include "worker/graph/element_sources.h"

namespace dptrain {
namespace graph {

template <typename T>
DPTRAIN_HOST_DEVICE inline T RecurrentSigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// The time that step `step` of direction `direction` (0 forward, 1 reverse) reads for a sample of
// `length` steps (the sequence's T where samples have no lengths), or -1 past its length (its
// state then stays as it was): the reverse direction starts at the sample's own last step.
DPTRAIN_HOST_DEVICE inline int64_t RecurrentTime(int direction, int64_t step, int64_t length) {
  if (step >= length) return -1;
  return direction == 0 ? step : length - 1 - step;
}

// LSTM forward, element j of one sample: `x_row` its gates' input product [4h] and `h_row` the
// previous h's product (null where x_row holds both sums), the biases (both or neither null),
// c_prev the previous c. Writes the gates after their activations into `gates` [4h] and returns
// the new c; sets tanh(c) and the new h.
template <typename T>
DPTRAIN_HOST_DEVICE inline T LstmForward(const T* x_row, const T* h_row, const T* b_ih,
                                         const T* b_hh, int64_t h, int64_t j, T c_prev, T* gates,
                                         T* tanh_c, T* h_next) {
  T act[4];
  for (int k = 0; k < 4; ++k) {
    const int64_t e = k * h + j;
    const T product = h_row != nullptr ? x_row[e] + h_row[e] : x_row[e];
    const T pre = product + (b_ih != nullptr ? b_ih[e] + b_hh[e] : T(0));
    act[k] = k == 2 ? std::tanh(pre) : RecurrentSigmoid(pre);
    gates[e] = act[k];
  }
  const T c = act[1] * c_prev + act[0] * act[2];
  *tanh_c = std::tanh(c);
  *h_next = act[3] * *tanh_c;
  return c;
}

// LSTM backward, element j: `gates` the step's activations [4h], tanh_c and c_prev the step's,
// dh the gradient of its h (the later steps' and its output's), *dc that of its c (updated to the
// previous c's). Writes the gradients of the gates' pre-activations into `dgates` [4h] (both
// products' and both biases').
template <typename T>
DPTRAIN_HOST_DEVICE inline void LstmBackward(const T* gates, T tanh_c, T c_prev, T dh, T* dc,
                                             T* dgates, int64_t h, int64_t j) {
  const T i = gates[j], f = gates[h + j], cell = gates[2 * h + j], o = gates[3 * h + j];
  const T dc_j = *dc + dh * o * (T(1) - tanh_c * tanh_c);
  dgates[j] = dc_j * cell * i * (T(1) - i);
  dgates[h + j] = dc_j * c_prev * f * (T(1) - f);
  dgates[2 * h + j] = dc_j * i * (T(1) - cell * cell);
  dgates[3 * h + j] = dh * tanh_c * o * (T(1) - o);
  *dc = dc_j * f;
}

// GRU forward, element j: `x_row` the input product [3h], `h_row` the previous h's [3h], the
// biases (each may be null), hp the previous h. Writes r, z and the new gate's activation into
// `gates` [3h]; sets *hidden_new to W_hn h + b_hn (what backward needs of the reset product);
// returns the new h.
template <typename T>
DPTRAIN_HOST_DEVICE inline T GruForward(const T* x_row, const T* h_row, const T* b_ih,
                                        const T* b_hh, int64_t h, int64_t j, T hp, T* gates,
                                        T* hidden_new) {
  const T r = RecurrentSigmoid(x_row[j] + (b_ih != nullptr ? b_ih[j] : T(0)) + h_row[j] +
                               (b_hh != nullptr ? b_hh[j] : T(0)));
  const T z = RecurrentSigmoid(x_row[h + j] + (b_ih != nullptr ? b_ih[h + j] : T(0)) +
                               h_row[h + j] + (b_hh != nullptr ? b_hh[h + j] : T(0)));
  *hidden_new = h_row[2 * h + j] + (b_hh != nullptr ? b_hh[2 * h + j] : T(0));
  const T cand =
      std::tanh(x_row[2 * h + j] + (b_ih != nullptr ? b_ih[2 * h + j] : T(0)) + r * *hidden_new);
  gates[j] = r;
  gates[h + j] = z;
  gates[2 * h + j] = cand;
  return (T(1) - z) * cand + z * hp;
}

// GRU backward, element j: `gates` the step's [3h], hidden_new its W_hn h + b_hn, hp the previous
// h, dh the gradient of its h. Writes the gradients of the input product's pre-activations into
// `dx_gates` [3h] and of the hidden product's into `dh_gates` [3h]; returns the previous h's
// gradient along the direct path (z h_prev; the product's is added by the caller).
template <typename T>
DPTRAIN_HOST_DEVICE inline T GruBackward(const T* gates, T hidden_new, T hp, T dh, T* dx_gates,
                                         T* dh_gates, int64_t h, int64_t j) {
  const T r = gates[j], z = gates[h + j], cand = gates[2 * h + j];
  const T dn = dh * (T(1) - z) * (T(1) - cand * cand);
  const T dr = dn * hidden_new * r * (T(1) - r);
  const T dz = dh * (hp - cand) * z * (T(1) - z);
  dx_gates[j] = dr;
  dx_gates[h + j] = dz;
  dx_gates[2 * h + j] = dn;
  dh_gates[j] = dr;
  dh_gates[h + j] = dz;
  dh_gates[2 * h + j] = dn * r;
  return dh * z;
}

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_RECURRENT_CELLS_H_
