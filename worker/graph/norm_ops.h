// Normalizations that are not worker/nn layers (ONNX semantics, restricted as said; anything else
// is refused by the factory with a one-line error naming the node):
//   LayerNormalization (opset 17; PyTorch's nn.LayerNorm exported with opset_version=17)
//             over each whole sample: axis 1, -3 of a [N, C, H, W] value (nn.LayerNorm([C, H,
//             W]) on a feature map) or -1 of a [N, F] value (nn.LayerNorm(F) after a Linear). Scale
//             and the optional B are constants of the sample's size, learnt; epsilon (1e-5). The
//             Mean and InvStdDev outputs are not computed (a graph that reads them is refused).
//   InstanceNormalization  over each (sample, channel) plane, scale and B one per channel:
//             nn.InstanceNorm2d (affine: learned), and GroupNorm, which exports as this over
//             [N, G, C/G * H * W] with constant scale 1 and B 0, then a per-channel weight and
//             bias (Mul, Add). epsilon (1e-5).
#ifndef DPTRAIN_WORKER_GRAPH_NORM_OPS_H_
#define DPTRAIN_WORKER_GRAPH_NORM_OPS_H_

#include "worker/graph/op_registry.h"

namespace dptrain {
namespace graph {

OpFactory LayerNormalizationOp();
OpFactory InstanceNormalizationOp();

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_NORM_OPS_H_
