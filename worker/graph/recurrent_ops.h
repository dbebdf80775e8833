// Recurrent layers: nn.LSTM as PyTorch computes it.
//
//   TorchLSTM  (not ONNX: what the importer makes of an ONNX LSTM node that torch.onnx.export
//              wrote for one layer of an nn.LSTM, graph_rewrites.h FuseTorchLstm) inputs X
//              [T, B, I] (sequence-first, the batch on axis 1), weight_ih [4H, I], weight_hh
//              [4H, H], bias_ih [4H], bias_hh [4H]: the state_dict's tensors in PyTorch's gate
//              order (input, forget, cell, output), learned as they are; zero initial states;
//              attributes hidden_size H and `output`: 0 for Y [T, 1, B, H] (every step's h), 1
//              for Y_h [1, B, H] (the last h), 2 for Y_c [1, B, H] (the last c), ONNX's outputs.
//              Forward keeps every step's gates; backward runs back through time (BPTT).
// A node of every output a graph reads (each reads the same weights: their gradients add up,
// as for any weight several nodes read).
#ifndef DPTRAIN_WORKER_GRAPH_RECURRENT_OPS_H_
#define DPTRAIN_WORKER_GRAPH_RECURRENT_OPS_H_

#include "worker/graph/op_registry.h"

namespace dptrain {
namespace graph {

OpFactory TorchLstmOp();

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_RECURRENT_OPS_H_
