// Kernels of the graph ops' CUDA twins (gpu_graph.h): element-wise functions, the binary ops
// with their broadcasts, zero padding, softmax over the channels, a transpose, max pooling of
// any output size (ceil_mode); each the
// device version of the CPU node's loops (worker/graph/shape_ops.cc, multi_input_ops.cc),
// checked against them by gpu_graph_test. Pointers are device memory; every function
// enqueues on `stream` and returns a Status naming the launch that failed.
#ifndef DPTRAIN_WORKER_CUDA_GRAPH_KERNELS_H_
#define DPTRAIN_WORKER_CUDA_GRAPH_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"

namespace dptrain {
namespace cuda {

// graph::ElementFunction's numbering: 1 tanh, 2 erf, 3 hard sigmoid (a, b), 4 hard swish,
// 5 piecewise linear (low a, slope below b, high c), 6 elu/selu (alpha a, scale b),
// 7 softplus, 8 softsign, 9 exp, 10 log, 11 sqrt, 12 neg, 13 abs, 14 reciprocal, 15 pow
// (exponent a), 16 sin, 17 cos, 18 equal (1 where (x == a) != (b != 0), no gradient),
// 19 trunc (no gradient).
absl::Status ElementwiseForward(int function, const float* x, float* y, int64_t n, float a, float b,
                                float c, cudaStream_t stream);
// dx = dy * f'(x) (tanh, exp and sqrt read y).
absl::Status ElementwiseBackward(int function, const float* x, const float* y, const float* dy,
                                 float* dx, int64_t n, float a, float b, float c,
                                 cudaStream_t stream);

// How the other operand of a binary op lines up with element i of the full one (graph::
// Broadcast: 0 same dims, 1 per channel, 2 one value, 3 per pixel; `batched`: a computed value,
// one per sample, or a tensor of the model, one for all): the CPU node's OtherIndex.
struct OperandLayout {
  int broadcast = 0;
  bool batched = true;
  int channels = 1;   // C of the full operand.
  int64_t plane = 1;  // H * W of the full operand.
};

// graph::BinaryOp (0 add, 1 sub, 2 mul, 3 div, 4 prelu with the other operand the slope):
// y[i] = f(full[i], other) or, swapped, f(other, full[i]); `other` null: the constant `scalar`.
absl::Status BinaryForward(int op, const OperandLayout& layout, bool swapped, const float* full,
                           const float* other, float scalar, float* y, int64_t n,
                           cudaStream_t stream);
// d/d full, element by element.
absl::Status BinaryBackwardFull(int op, const OperandLayout& layout, bool swapped,
                                const float* full, const float* other, float scalar,
                                const float* dy, float* dfull, int64_t n, cudaStream_t stream);
// d/d other (overwritten): `m` elements, each summed over the `n` full elements that read it,
// in increasing order.
absl::Status BinaryBackwardOther(int op, const OperandLayout& layout, bool swapped,
                                 const float* full, const float* other, const float* dy,
                                 float* dother, int64_t m, int64_t n, cudaStream_t stream);

// ReduceMean over the channels, kept as one ([C, H, W] -> [1, H, W]), and its backward.
absl::Status ChannelMeanForward(const float* x, float* y, int batch, int channels, int64_t plane,
                                cudaStream_t stream);
absl::Status ChannelMeanBackward(const float* dy, float* dx, int batch, int channels, int64_t plane,
                                 cudaStream_t stream);

// InstanceNormalization over each (sample, channel) plane, as the CPU node (norm_ops.h):
// statistics in double, xhat and inv_std kept for backward. Backward: d(scale) and d(B) per
// channel (when scale_grad is not null), dx (when not null).
absl::Status InstanceNormForward(const float* x, const float* scale, const float* bias, float* y,
                                 float* xhat, float* inv_std, int batch, int channels,
                                 int64_t plane, double eps, cudaStream_t stream);
absl::Status InstanceNormBackward(const float* dy, const float* xhat, const float* inv_std,
                                  const float* scale, float* scale_grad, float* bias_grad,
                                  float* dx, int batch, int channels, int64_t plane,
                                  cudaStream_t stream);

// Zero padding of `planes` planes of in_h x in_w into out_h x out_w at (top, left); backward
// takes the inner window of dy.
absl::Status PadForward(const float* x, float* y, int64_t planes, int in_h, int in_w, int out_h,
                        int out_w, int top, int left, cudaStream_t stream);
absl::Status PadBackward(const float* dy, float* dx, int64_t planes, int in_h, int in_w, int out_h,
                         int out_w, int top, int left, cudaStream_t stream);

// Softmax (or log-softmax) over `channels` at each of `plane` pixels of `batch` samples; and
// its backward from the output y.
absl::Status SoftmaxChannelsForward(const float* x, float* y, int batch, int channels,
                                    int64_t plane, bool log, cudaStream_t stream);
absl::Status SoftmaxChannelsBackward(const float* y, const float* dy, float* dx, int batch,
                                     int channels, int64_t plane, bool log, cudaStream_t stream);

// ShuffleNet's channel shuffle of `batch` samples of `channels` planes of `plane` elements:
// y channel j * groups + i = x channel i * (channels / groups) + j (graph/slice_ops.h).
absl::Status ChannelShuffle(const float* x, float* y, int batch, int channels, int groups,
                            int64_t plane, cudaStream_t stream);

// out[c * rows + r] = in[r * cols + c].
absl::Status Transpose(const float* in, float* out, int64_t rows, int64_t cols,
                       cudaStream_t stream);

// The shape of a direct pooling: `planes` planes of in_h x in_w pooled to out_h x out_w (any
// output size: PyTorch's ceil_mode sizes too, which cuDNN's floor-only pooling cannot give) by
// a kernel_h x kernel_w window moved by the strides over the input padded by pad_h, pad_w.
struct PoolGeometry {
  int64_t planes = 0;
  int in_h = 0, in_w = 0, out_h = 0, out_w = 0;
  int kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
};

// Max pooling by direct loops over each window's part inside the input (padding never wins):
// y and the in-plane index of each window's first maximum (row-major, NaN winning, as the CPU
// layer picks it); backward gives each input element the dy of the windows whose maximum it
// is, summed in the windows' order (deterministic).
absl::Status MaxPoolForward(const float* x, float* y, int32_t* argmax, const PoolGeometry& g,
                            cudaStream_t stream);
absl::Status MaxPoolBackward(const float* dy, const int32_t* argmax, float* dx,
                             const PoolGeometry& g, cudaStream_t stream);

// Average pooling (ceil_mode, count_include_pad=False): each window's sum, row-major from zero
// as the CPU layer sums it, times scale[oy * out_w + ox] (1 / the window's divisor,
// nn::AvgPoolDivisor); backward gives each input element the dy * scale of every window
// covering it, in the windows' order.
absl::Status AvgPoolForward(const float* x, float* y, const float* scale, const PoolGeometry& g,
                            cudaStream_t stream);
absl::Status AvgPoolBackward(const float* dy, const float* scale, float* dx, const PoolGeometry& g,
                             cudaStream_t stream);

// LayerNormalization over each of `batch` samples of `size` values (norm_ops.h), as the CPU
// node computes it: the statistics in double, xhat and inv_std kept for backward; `bias` may be
// null. Backward: d(scale) and d(bias) summed over the batch in sample order (bias_grad may be
// null), and dx (when not null) = inv / S (S dxhat - sum dxhat - xhat sum(dxhat xhat)).
absl::Status LayerNormForward(const float* x, const float* scale, const float* bias, float* y,
                              float* xhat, float* inv_std, int batch, int64_t size, double eps,
                              cudaStream_t stream);
absl::Status LayerNormBackward(const float* dy, const float* xhat, const float* inv_std,
                               const float* scale, float* scale_grad, float* bias_grad, float* dx,
                               int batch, int64_t size, cudaStream_t stream);

// The nodes that only move elements (worker/graph/element_sources.h; any_shape_kernels.cu): the
// gather y[k] = input[s >> 48][s & mask] of sources[k] = s (0 where s < 0), one pointer per
// runtime input; and its backward for one input, dx[e] = the sum of dy over e's readers
// (offsets, readers: graph::Readers), in increasing order.
struct SourceInputs {
  const float* data[16] = {};  // graph::kMaxSourceInputs.
};
absl::Status GatherSources(const int64_t* sources, const SourceInputs& inputs, float* y, int64_t n,
                           cudaStream_t stream);
absl::Status SumReaders(const int64_t* offsets, const int64_t* readers, const float* dy, float* dx,
                        int64_t m, cudaStream_t stream);

// Add, Sub, Mul, Div, Max, Min of a value x and an operand broadcast into it
// (graph/binary_elements.h; `op` numbered as graph::BinaryOp): y[k] = f(x[k], other[indices[k]]);
// dx[k] = d/dx; the operand's gradient at each of its m elements, the sum over its readers
// (offsets, readers: graph::Readers of the indices), overwritten.
absl::Status BroadcastBinaryForward(int op, bool swapped, const float* x, const float* other,
                                    const int64_t* indices, float* y, int64_t n,
                                    cudaStream_t stream);
absl::Status BroadcastBinaryBackwardFull(int op, bool swapped, const float* x, const float* other,
                                         const int64_t* indices, const float* dy, float* dx,
                                         int64_t n, cudaStream_t stream);
absl::Status BroadcastBinaryBackwardOperand(int op, bool swapped, const float* x,
                                            const float* other, const int64_t* offsets,
                                            const int64_t* readers, const float* dy, float* dother,
                                            int64_t m, cudaStream_t stream);

// ReduceMean/Sum/Max/Min/L2 over axes other than the batch's (graph/reduce_elements.h, its
// numbering): each of the m outputs over its readers (offsets, readers) into y, and for a max or
// min the input element taken into arg (may be null otherwise); backward, each of the n inputs
// from the output it adds into (out_of[k]).
absl::Status ReduceForward(int reduction, const int64_t* offsets, const int64_t* readers,
                           const float* x, float scale, float* y, int64_t* arg, int64_t m,
                           cudaStream_t stream);
absl::Status ReduceBackward(int reduction, const int64_t* out_of, const float* x, const float* y,
                            const int64_t* arg, const float* dy, float scale, float* dx, int64_t n,
                            cudaStream_t stream);

// TopK along the middle axis of [outer, n, inner] (graph/reduce_elements.h's order): y and, per
// output element, the input element taken; backward, dx (`size` elements) zero but for those.
absl::Status TopKForward(const float* x, float* y, int64_t* taken, int64_t outer, int64_t n,
                         int64_t inner, int64_t k, bool largest, cudaStream_t stream);
absl::Status TopKBackward(const float* dy, const int64_t* taken, float* dx, int64_t m, int64_t size,
                          cudaStream_t stream);

// Where: y = cond != 0 ? a : b over n elements (constants broadcast beforehand); backward, the
// gradient to a where the condition holds and to b where it does not (da, db may be null).
absl::Status WhereForward(const float* cond, const float* a, const float* b, float* y, int64_t n,
                          cudaStream_t stream);
absl::Status WhereBackward(const float* cond, const float* dy, float* da, float* db, int64_t n,
                           cudaStream_t stream);

// An embedding lookup (graph/element_sources.h): y[k] = table[ids[k / row] * row + k % row] for
// n outputs, the ids checked before; backward, the gradient of each of the `distinct` rows
// looked up (rows[u], its lookups readers[offsets[u] .. offsets[u + 1])), the others untouched.
absl::Status LookupForward(const float* table, const float* ids, int64_t row, float* y, int64_t n,
                           cudaStream_t stream);
absl::Status LookupBackward(const int64_t* rows, const int64_t* offsets, const int64_t* readers,
                            int64_t distinct, const float* dy, int64_t row, float* table_grad,
                            cudaStream_t stream);

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_GRAPH_KERNELS_H_
