// Graph-to-graph rewrites that the ONNX importer applies so that exported graphs use the ops in
// their plain sense (pure functions on a Graph; see onnx_import.h for why).
#ifndef DPTRAIN_WORKER_GRAPH_GRAPH_REWRITES_H_
#define DPTRAIN_WORKER_GRAPH_GRAPH_REWRITES_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/graph/graph.h"

namespace dptrain {
namespace graph {

// Evaluates, in order, every Unsqueeze, Squeeze, Concat, Gather, Cast and Identity node whose
// inputs are all int64 constants, turning its output into a constant and removing the node.
// InvalidArgument naming the node when such a node is malformed (an axis out of range, ...).
absl::Status FoldShapeConstants(Graph& graph);

// MatMul(x, Transpose(W, perm=[1, 0])) with W a 2-D float constant read by nothing else ->
// Gemm(x, W, transB=1). Then MatMul or Gemm without a bias whose output only feeds an Add with a
// float constant of M (= output features) elements -> Gemm with that bias; the Add goes.
void FuseLinear(Graph& graph);

// A view of a state_dict tensor (an initializer unsqueezed or reshaped by constant axes or a
// constant shape: GroupNorm's and PReLU's weight.unsqueeze(1).unsqueeze(2)) read only by Add,
// Sub, Mul, Div or PRelu -> those read the tensor itself, with the view's shape as their
// operand_shape (multi_input_ops.h), so that they learn it under its own name and shape.
void ViewStateOperands(Graph& graph);

// ConvNeXt-style channels-last regions: x.permute(0, 2, 3, 1) (Transpose [0, 2, 3, 1]), then
// ops that work on the last axis (a layer norm written out: ReduceMean over it kept as one,
// Sub, Pow, Add, Sqrt, Div, Mul and Add of [C] weights; Linear layers applied at each pixel:
// Gemm of FuseLinear; element-wise ops such as GELU's), then x.permute(0, 3, 1, 2) (Transpose
// [0, 3, 1, 2]) -> the same ops channels-first without the transposes: ReduceMean over axis 1,
// the [C] operands viewed as [C, 1, 1] (operand_shape, multi_input_ops.h), each Linear a 1x1 Conv
// of its [out, in] weight (layer_ops.h). A region with any other op, another input from outside, or
// a value leaving it other than through a closing Transpose is left alone (and its Transpose
// then refused as unsupported).
void SinkChannelsLast(Graph& graph);

// nn.LayerNorm over the last axis as exported below opset 17, written out: ReduceMean(x, [-1]),
// Sub, Pow(2), ReduceMean, Add(eps), Sqrt, Div, Mul by a 1-D tensor of the model and (if there
// is one) Add of another, each intermediate read only inside the pattern -> one
// LayerNormalization(x, weight[, bias], axis=-1, epsilon) named after the first ReduceMean, in
// the last node's place: the same function, one node instead of nine (run after
// SinkChannelsLast, which moves ConvNeXt's channels-last ones first).
void FuseLayerNorm(Graph& graph);

// Einsum of two operands that is a batched matrix product with the same leading letters
// (attention's "bhid,bhjd->bhij" and "bhij,bhjd->bhid", as torch.einsum exports them) ->
// Transposes where an operand or the output is in another order, and one MatMul, named after
// the Einsum. Other equations are left alone (and refused as unsupported).
void EinsumToMatMul(Graph& graph);

// Split(x, sizes) with constant sizes (input 1 from opset 13, the split attribute before) ->
// one Slice per output along its axis (x.unbind(0), x.chunk(3, -1) as exported), so that each
// output is a node's first output. Without sizes (equal parts: F.glu), the slices' bounds come
// from the Shape of x (Shape, Gather, Add, Div, Mul: evaluated when the model loads): parts
// of ceil(size / n), the last to the end of the axis (ONNX's; smaller where n does not divide).
void SplitToSlices(Graph& graph);

// ShuffleNet's channel shuffle, Reshape(x, s1) -> Transpose(perm=[0, 2, 1, 3, 4]) ->
// Reshape(s2), each intermediate read once -> ChannelShuffle(x, s1, s2) (slice_ops.h) named
// after the Transpose, in the second Reshape's place. The shapes may be computed at run time
// (a dynamic batch axis): the op's factory reads them once the executor has evaluated them.
void FuseChannelShuffle(Graph& graph);

// pack_padded_sequence(x, lengths, enforce_sorted=False) as torch.onnx.export writes it: the
// batch sorted by length (TopK of the lengths, largest first), the sorted batch Gathered, the
// sorted lengths as the recurrent layers' sequence_lens, and Gathers back through the inverse
// order (ScatterElements) -> the layers read the batch and the lengths in their own order and
// the Gathers go (each gather's reader reads what it gathered from; pad_packed_sequence's
// lengths, gathered back, are the lengths). A TopK whose outputs anything else reads is left
// alone (and refused as unsupported). The pattern is trusted to be torch's, where every value
// gathered into sorted order is gathered back before it meets the batch's own order (the axes
// are not checked). So a packed sequence's layers run on any batch size, unlike the export's
// own inverse order (a constant of the export's batch).
void UnsortPackedSequences(Graph& graph);

// One layer of nn.LSTM or nn.GRU as torch.onnx.export writes it: an LSTM or GRU node
// (forward or bidirectional, default activations, the GRU's linear_before_reset=1; each
// sample's length as its sequence_lens, or none) whose W, R and B are, per direction, the
// state_dict's weight_ih, weight_hh, bias_ih and bias_hh with their gate rows re-ordered (Slice,
// Concat, Unsqueeze) and whose initial states are zeros (absent, or a zero constant expanded) ->
// one TorchLSTM or TorchGRU node (recurrent_ops.h) per output the graph reads, reading those
// tensors themselves (so that they are learned under their own names and shapes), in the node's
// place; the re-ordering and the initial states' nodes go once unread. Other LSTM and GRU nodes are
// left alone (and refused as unsupported).
void FuseTorchRecurrent(Graph& graph);

// nn.EmbeddingBag(mode) of the graph's 2-D ids input [B, L] (bags of L equal ids) as
// torch.onnx.export writes it: a Loop over the bags, which the importer reads as op Loop with
// attribute embedding_bag (onnx_import.cc), on the ids flattened (Reshape to [-1]) with offsets
// 0, L, 2L, ... (a constant of the export's batch, or a Range stepping by the ids' second
// dimension) -> Gather of the table by the ids and ReduceSum, ReduceMean or ReduceMax over the
// bag's axis, the offsets' nodes gone once unread (so it runs at any batch size). Any other
// Loop is left (and refused as unsupported).
void FuseEmbeddingBag(Graph& graph);

// For the rewrites: adds to `names` the nodes that compute `values`, and what they read, all
// the way up.
void AddProducers(const Graph& graph, std::vector<std::string> values,
                  std::set<std::string>& names);
// Puts each node's replacements (by its index in graph.nodes) in its place.
void ReplaceNodes(Graph& graph, std::map<size_t, std::vector<Node>> replacements);
// Removes the nodes named in `candidates` whose outputs nothing reads (nor the graph's output),
// again until none is left: what only a rewritten pattern read.
void RemoveUnreadNodes(Graph& graph, const std::set<std::string>& candidates);

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_GRAPH_REWRITES_H_
