// Recurrent layers: nn.LSTM and nn.GRU as PyTorch computes them.
//
//   TorchLSTM, TorchGRU  (not ONNX: what the importer makes of an ONNX LSTM or GRU node that
//              torch.onnx.export wrote for one layer of an nn.LSTM or nn.GRU, graph_rewrites.h
//              FuseTorchRecurrent) inputs X [T, B, I] (sequence-first, the batch on axis 1),
//              then per direction (forward, then reverse) the state_dict's weight_ih [G, I],
//              weight_hh [G, H] and, both or neither, bias_ih [G], bias_hh [G], with G = 4H
//              (LSTM gates input, forget, cell, output) or 3H (GRU gates reset, update, new; the
//              new gate's hidden product scaled by the reset gate, PyTorch's and ONNX's
//              linear_before_reset=1), learned as they are; zero initial states; attributes
//              hidden_size H, directions (1 or 2, bidirectional) and `output`: 0 for Y [T, D, B,
//              H] (every step's h per direction), 1 for Y_h [D, B, H] (the last h), 2 for the
//              LSTM's Y_c [D, B, H] (the last c), ONNX's outputs. With attribute
//              sequence_lens = 1, a last input [B] holds each sample's length L_n (ONNX's
//              sequence_lens, pack_padded_sequence's lengths; whole numbers in [1, T], else
//              the step fails naming the sample): sample n runs steps 0 .. L_n - 1 (the
//              reverse direction from time L_n - 1 down), its state then stays (Y_h, Y_c) and
//              its Y is zero past L_n, as ONNX and PyTorch compute them.
//              Forward keeps every step's gates; backward runs back through time (BPTT).
// A node of every output a graph reads (each reads the same weights: their gradients add up,
// as for any weight several nodes read).
#ifndef DPTRAIN_WORKER_GRAPH_RECURRENT_OPS_H_
#define DPTRAIN_WORKER_GRAPH_RECURRENT_OPS_H_

#include "worker/graph/op_registry.h"

namespace dptrain {
namespace graph {

OpFactory TorchLstmOp();
OpFactory TorchGruOp();

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_RECURRENT_OPS_H_
