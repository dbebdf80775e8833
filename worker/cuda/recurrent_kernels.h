// Kernels of the nn.LSTM / nn.GRU twin (gpu_recurrent.h): one step of one direction forward and
// backward, one thread per (sample, element of the state) running graph/recurrent_cells.h's
// function (the one the CPU node computes with), and the scatter of every step's h into Y. The
// products with the weights are cuBLAS's (the twin's). Pointers are device memory; every
// function enqueues on `stream` and returns a Status naming the launch that failed.
//
// Layouts (B samples, hidden size H, G = 4H or 3H gates, T steps): the input products
// [T * B, G] by time (row t B + n); everything else by step (step s of the reverse direction
// reads time T - 1 - s, or L_n - 1 - s with lengths): h and c [T + 1, B, H] from the zero
// state, the gates after their activations [T, B, G], tanh(c) or W_hn h + b_hn [T, B, H].
#ifndef DPTRAIN_WORKER_CUDA_RECURRENT_KERNELS_H_
#define DPTRAIN_WORKER_CUDA_RECURRENT_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace dptrain {
namespace cuda {

// Which step of which layer.
struct RecurrentStep {
  bool gru = false;
  int direction = 0, directions = 1;
  int64_t step = 0, steps = 0, batch = 0, hidden = 0;
  // Each sample's length [B] (whole numbers in [1, T], checked on the host before), or null:
  // every sample runs every step.
  const float* lengths = nullptr;
};

// Forward of step s: reads x_products' row of each sample's time, h_products [B, G] (the
// previous h's product with W_hh), the biases (both or neither null), h[s] and c[s]; writes
// h[s + 1], c[s + 1] (LSTM; c null for a GRU), the step's gates and `extra`. A sample past its
// length keeps its state (h[s + 1] = h[s]).
absl::Status RecurrentStepForward(const RecurrentStep& s, const float* x_products,
                                  const float* h_products, const float* b_ih, const float* b_hh,
                                  float* h, float* c, float* gates, float* extra,
                                  cudaStream_t stream);

// Backward of step s. dy: Y's gradient [T, D, B, H] (output 0), else null. dh [B, H]: in, the
// gradient of h[s + 1] from later steps; out, for a sample that ran the step, zero (LSTM) or the
// direct path's z dh (GRU), to which the caller adds dh_gates W_hh; a sample past its length
// keeps it. dc [B, H] likewise (LSTM). Writes each sample's gate gradients into dx_gates' row of
// its time (rows of samples past their length are not written) and into dh_gates [B, G] of this
// step (zero for a sample past its length).
absl::Status RecurrentStepBackward(const RecurrentStep& s, const float* dy, const float* gates,
                                   const float* extra, const float* h, const float* c, float* dh,
                                   float* dc, float* dx_gates, float* dh_gates,
                                   cudaStream_t stream);

// Y [T, D, B, H] of direction s.direction from its h [T + 1, B, H]: zero past a sample's length.
absl::Status RecurrentOutput(const RecurrentStep& s, const float* h, float* y, cudaStream_t stream);

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_RECURRENT_KERNELS_H_
