// Ops that wrap a worker/nn layer (ONNX semantics, restricted to what the layer computes; the
// factories refuse the rest with a one-line error naming the node and what is unsupported):
//   Conv                2-D, group 1, dilation 1, symmetric zero padding, optional bias
//                       (nn::Conv2d; a missing bias stays zero and gets no gradient).
//   Gemm, MatMul        y = x B^T + C (Gemm transB=1, PyTorch's Linear) or y = x B + C (transB=0,
//                       MatMul) with B and C constants, alpha = beta = 1, transA = 0; C of [M]
//                       or [1, M], optional (nn::Linear; B is staged transposed for transB=0).
//   Relu, Sigmoid       nn::ReLU, nn::Sigmoid.
//   BatchNormalization  nn::BatchNorm2d over the channels: PyTorch's eps 1e-5 and momentum 0.1
//                       (ONNX momentum 0.9 = 1 - PyTorch's) only. Batch statistics in training,
//                       running ones in evaluation, whatever the file's training_mode says.
//                       Buffers: the file's running mean and variance plus num_batches_tracked
//                       (not exported by PyTorch; named after the running mean, starting at 0),
//                       so that buffers() is a whole PyTorch state_dict's worth.
//   MaxPool             nn::MaxPool2d: 2-D, ceil_mode 0 or 1, dilation 1, symmetric padding.
//   AveragePool         nn::AvgPool2d: as MaxPool; padding only with count_include_pad=1
//                       (PyTorch exports AvgPool2d(padding=p) as Pad + AveragePool anyway).
//   GlobalAveragePool   nn::GlobalAvgPool2d.
//   Flatten             axis 1 (nn::Flatten).
//   Residual            not ONNX: d2l's residual block fused into one node (nn::Residual), the
//                       built-in resnet18's fast path (builtin_models.h); the same as
//                       relu(BN(Conv(relu(BN(Conv(x))))) + shortcut(x)) in plain ops. Inputs:
//                       x, then constants conv1 weight [out, in, 3, 3] and bias, conv2 weight
//                       [out, out, 3, 3] and bias, conv3 (the 1x1 shortcut) weight [out, in,
//                       1, 1] and bias or "" "" for the identity, bn1 scale and bias, bn2 scale
//                       and bias, bn1 running mean and variance, bn2 running mean and variance
//                       (the parameters in nn::Residual's layout order, then the buffers).
//                       Attribute stride (default 1; the identity shortcut needs stride 1 and
//                       in == out).
#ifndef DPTRAIN_WORKER_GRAPH_LAYER_OPS_H_
#define DPTRAIN_WORKER_GRAPH_LAYER_OPS_H_

#include "worker/graph/op_registry.h"

namespace dptrain {
namespace graph {

OpFactory ConvOp();
OpFactory LinearOp();  // Gemm and MatMul.
OpFactory ReluOp();
OpFactory SigmoidOp();
OpFactory BatchNormOp();
OpFactory MaxPoolOp();
OpFactory AveragePoolOp();
OpFactory GlobalAveragePoolOp();
OpFactory ReduceMeanOp();  // Over H and W only.
OpFactory FlattenOp();
OpFactory ResidualOp();

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_LAYER_OPS_H_
