// The LSTM / GRU twin's kernels (recurrent_kernels.h): each thread one (sample n, element j)
// of one step, running graph/recurrent_cells.h's per-element function.
#include <cuda_runtime_api.h>

#include "worker/cuda/kernel_launch.h"
#include "worker/cuda/recurrent_kernels.h"
#include "worker/graph/recurrent_cells.h"

namespace dptrain {
namespace cuda {
namespace {

__device__ int64_t LengthOf(const RecurrentStep& s, int64_t n) {
  return s.lengths != nullptr ? static_cast<int64_t>(s.lengths[n]) : s.steps;
}

__global__ void StepForwardKernel(RecurrentStep s, const float* x_products, const float* h_products,
                                  const float* b_ih, const float* b_hh, float* h, float* c,
                                  float* gates, float* extra) {
  const int64_t hidden = s.hidden, state = s.batch * hidden, g = (s.gru ? 3 : 4) * hidden;
  DPTRAIN_GRID_STRIDE(e, state) {
    const int64_t n = e / hidden, j = e % hidden;
    const int64_t t = graph::RecurrentTime(s.direction, s.step, LengthOf(s, n));
    const int64_t now = s.step * state + e, next = now + state;
    if (t < 0) {  // Past its length: the state stays.
      h[next] = h[now];
      if (c != nullptr) c[next] = c[now];
      continue;
    }
    const float* x_row = x_products + (t * s.batch + n) * g;
    const float* h_row = h_products + n * g;
    float* gates_row = gates + (s.step * s.batch + n) * g;
    if (s.gru) {
      h[next] =
          graph::GruForward(x_row, h_row, b_ih, b_hh, hidden, j, h[now], gates_row, &extra[now]);
    } else {
      c[next] = graph::LstmForward(x_row, h_row, b_ih, b_hh, hidden, j, c[now], gates_row,
                                   &extra[now], &h[next]);
    }
  }
}

__global__ void StepBackwardKernel(RecurrentStep s, const float* dy, const float* gates,
                                   const float* extra, const float* h, const float* c, float* dh,
                                   float* dc, float* dx_gates, float* dh_gates) {
  const int64_t hidden = s.hidden, state = s.batch * hidden;
  const int gate_count = s.gru ? 3 : 4;
  const int64_t g = gate_count * hidden;
  DPTRAIN_GRID_STRIDE(e, state) {
    const int64_t n = e / hidden, j = e % hidden;
    const int64_t t = graph::RecurrentTime(s.direction, s.step, LengthOf(s, n));
    float* dh_row = dh_gates + n * g;
    if (t < 0) {  // Past its length: the state's gradients pass through, the gates get none.
      for (int k = 0; k < gate_count; ++k) dh_row[k * hidden + j] = 0.0f;
      continue;
    }
    const int64_t now = s.step * state + e;
    const float dh_j =
        dh[e] + (dy != nullptr ? dy[(t * s.directions + s.direction) * state + e] : 0.0f);
    const float* gates_row = gates + (s.step * s.batch + n) * g;
    float* dx_row = dx_gates + (t * s.batch + n) * g;
    if (s.gru) {
      dh[e] = graph::GruBackward(gates_row, extra[now], h[now], dh_j, dx_row, dh_row, hidden, j);
    } else {
      graph::LstmBackward(gates_row, extra[now], c[now], dh_j, &dc[e], dx_row, hidden, j);
      for (int k = 0; k < 4; ++k) dh_row[k * hidden + j] = dx_row[k * hidden + j];
      dh[e] = 0.0f;  // The product with W_hh is all of the previous h's gradient.
    }
  }
}

__global__ void OutputKernel(RecurrentStep s, const float* h, float* y) {
  const int64_t state = s.batch * s.hidden, n_all = s.steps * state;
  DPTRAIN_GRID_STRIDE(k, n_all) {
    const int64_t t = k / state, e = k % state, n = e / s.hidden;
    // The step at which the sample reads time t (RecurrentTime is its own inverse).
    const int64_t step = graph::RecurrentTime(s.direction, t, LengthOf(s, n));
    y[(t * s.directions + s.direction) * state + e] = step < 0 ? 0.0f : h[(step + 1) * state + e];
  }
}

}  // namespace

absl::Status RecurrentStepForward(const RecurrentStep& s, const float* x_products,
                                  const float* h_products, const float* b_ih, const float* b_hh,
                                  float* h, float* c, float* gates, float* extra,
                                  cudaStream_t stream) {
  const int64_t state = s.batch * s.hidden;
  if (state == 0) return absl::OkStatus();
  StepForwardKernel<<<Blocks(state), kThreads, 0, stream>>>(s, x_products, h_products, b_ih, b_hh,
                                                            h, c, gates, extra);
  return Launched("StepForwardKernel<<<>>>");
}

absl::Status RecurrentStepBackward(const RecurrentStep& s, const float* dy, const float* gates,
                                   const float* extra, const float* h, const float* c, float* dh,
                                   float* dc, float* dx_gates, float* dh_gates,
                                   cudaStream_t stream) {
  const int64_t state = s.batch * s.hidden;
  if (state == 0) return absl::OkStatus();
  StepBackwardKernel<<<Blocks(state), kThreads, 0, stream>>>(s, dy, gates, extra, h, c, dh, dc,
                                                             dx_gates, dh_gates);
  return Launched("StepBackwardKernel<<<>>>");
}

absl::Status RecurrentOutput(const RecurrentStep& s, const float* h, float* y,
                             cudaStream_t stream) {
  const int64_t n = s.steps * s.batch * s.hidden;
  if (n == 0) return absl::OkStatus();
  OutputKernel<<<Blocks(n), kThreads, 0, stream>>>(s, h, y);
  return Launched("OutputKernel<<<>>>");
}

}  // namespace cuda
}  // namespace dptrain
