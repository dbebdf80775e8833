// Models from ONNX files, as PyTorch exports them for training:
//   torch.onnx.export(model, x, FILE, training=torch.onnx.TrainingMode.TRAINING,
//                     do_constant_folding=False)
// The initializers are the initial weights and buffers, named as the model's state_dict
// ("features.0.weight", "bn1.running_mean"), so trained weights go back into the PyTorch model
// by name (worker/nn/safetensors.h's SaveModel writes them so).
//
// What is read: one graph input (float, [batch, C, H, W], [batch, C, L] or [batch, F]; int64 or
// int32 [batch, L] ids; the batch dimension's size is ignored), or several [batch, n] inputs
// (ids, masks, features: model(input_ids, attention_mask)) taken as one input of their columns
// side by side (kMultiInput, InputColumns), one graph output ([batch, classes]), initializers
// stored in the file (FLOAT, DOUBLE, INT64, INT32 or BOOL), and nodes of the default domain.
// Import-time rewrites, so that the ops keep their plain meaning:
//   - Constant nodes become constants; Unsqueeze, Squeeze, Concat, Gather, Cast and Identity of
//     int64 constants (the traced x.view(x.size(0), -1) chain) are folded into constants.
//   - MatMul(x, Transpose(W)) (a bias-free nn.Linear) becomes Gemm(x, W, transB=1), and
//     MatMul/Gemm followed by Add of a [M] constant becomes one Gemm with that bias.
// Every other op must be in the registry (op_registry.h lists them and their limits); an op that
// is not fails the import at once with one line naming it and its node.
#ifndef DPTRAIN_WORKER_GRAPH_ONNX_IMPORT_H_
#define DPTRAIN_WORKER_GRAPH_ONNX_IMPORT_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/optimizer.h"
#include "worker/graph/graph.h"
#include "worker/graph/graph_model.h"
#include "worker/graph/op_registry.h"
#include "worker/nn/model.h"

namespace dptrain {
namespace graph {

// Of a graph of several inputs: each input's name and its columns [begin, end) of the one
// input; empty for a graph of one input.
struct InputColumns {
  std::string name;
  int64_t begin = 0, end = 0;
};
std::vector<InputColumns> ConcatenatedInputs(const Graph& graph);

// The model's options beyond the file; the fields mean what GraphModelOptions' do.
struct OnnxModelOptions {
  Loss loss = Loss::kSoftmaxCrossEntropy;
  double label_smoothing = 0;
  std::vector<double> class_weights;  // GraphModelOptions::class_weights.
  // Initializers that are buffers of the PyTorch module (MarkBuffers).
  std::vector<std::string> buffers;
  std::optional<OptimizerOptions> optimizer;
  uint64_t seed = 0;
  bool dropout = true;
  int threads = 0;
  nn::DenseGemm dense_gemm = nn::DenseGemm::kPoolSplit;
  nn::ConvAlgorithm conv_algorithm = nn::ConvAlgorithm::kAuto;
};

// InvalidArgument, one line saying how to export instead, for a file that torch.onnx.export
// wrote for evaluation (its defaults): a BatchNormalization without training_mode=1 and without
// its running-statistics outputs (eval mode: Dropout is gone too), or a Conv, Gemm, MatMul or
// normalisation whose weight is named "onnx::..." (constant folding: in eval mode BatchNorm is
// folded into the convolution; the saved weights would not load into the PyTorch model). A
// model without BatchNorm exported in eval mode without folding cannot be told apart (only its
// Dropout is missing).
absl::Status CheckExportedForTraining(const Graph& graph);

// The graph of a serialized ONNX ModelProto, rewritten as above, named `name`. InvalidArgument
// for bytes that do not parse, a graph without the input, output or initializers described
// above, an unsupported tensor type or attribute type, external data, or what
// CheckExportedForTraining refuses. Does not check that the ops exist.
absl::StatusOr<Graph> ParseOnnxGraph(absl::string_view bytes, const std::string& name);

// Marks the initializers named in `names` as buffers of the PyTorch module (register_buffer):
// where an op reads one as a plain operand (Add, Sub, Mul, Div: x - self.mean), it is kept
// fixed (and saved) instead of learned as a parameter, as the file cannot tell them apart.
// InvalidArgument naming the first name that is not an initializer of `graph`.
absl::Status MarkBuffers(Graph& graph, const std::vector<std::string>& names);

// The initializers that `graph`'s Add, Sub, Mul and Div nodes read as plain operands and will
// learn (not marked as buffers), in file order: what a worker tells its user it learns beyond
// the weights of its layers.
std::vector<std::string> LearnedOperands(const Graph& graph);

// nn.Embedding(padding_idx=p) exports as a plain Gather (the ONNX file does not say p), and
// PyTorch both starts row p at zeros and never gives it a gradient. So an embedding lookup (a
// Gather of a 2-D initializer by computed ids) whose table holds exactly one row of zeros is
// taken as having that padding row: its node gets attribute padding_idx (the lookup then adds
// no gradient to it, as PyTorch; another use of the tensor, a tied output layer, still does).
// Applied by ParseOnnxGraph. Returns "table (row p)" for each table so marked, to be said.
std::vector<std::string> MarkPaddingRows(Graph& graph);
// The tables marked so (MarkPaddingRows's descriptions), for a graph already read.
std::vector<std::string> PaddingRows(const Graph& graph);
// Undoes MarkPaddingRows: every row of every table is learned.
void ClearPaddingRows(Graph& graph);

// CheckOpSupported on every node of `graph` but those the executor evaluates when it is built
// (Shape and the int64 arithmetic on it: shape_arithmetic.h; it refuses what it cannot
// evaluate): the first error, or OK.
absl::Status CheckOpsSupported(const Graph& graph, const OpRegistry& registry);

// ParseOnnxGraph of the file at `path`, named after its base name without ".onnx", then
// CheckOpsSupported. Error messages start with the path.
absl::StatusOr<Graph> ReadOnnxGraph(const std::string& path, const OpRegistry& registry);

// The file at `path` as a CPU model (graph_model.h) over BuiltinOps(): weights() are the
// initializers that are parameters, in file order; buffers() batch norm's running statistics
// (and num_batches_tracked); name() the file's base name ("vgg.onnx" -> "vgg"). Error
// messages start with the path.
absl::StatusOr<std::unique_ptr<nn::Model>> LoadOnnxModel(const std::string& path,
                                                         const OnnxModelOptions& options);

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_ONNX_IMPORT_H_
