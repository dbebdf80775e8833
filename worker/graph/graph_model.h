// A graph as the worker's nn::Model on the CPU: an Executor<float> with its parameters,
// gradients and buffers in the flat buffers the synchronisers exchange, a loss on the graph's
// output, and ApplyUpdate through common/optimizer.h (the built-in networks are such graphs too:
// builtin_models.h).
//
// The class count (num_classes()) is the output's size: the output must be [batch, classes];
// labels (nn::Label, int32) must be in [0, classes) (nn::CheckBatch). With mse or l1 a batch may
// instead give target values (regression: nn::Targets::Values, `classes` per sample). Like every
// nn::Model, not thread-safe.
#ifndef DPTRAIN_WORKER_GRAPH_GRAPH_MODEL_H_
#define DPTRAIN_WORKER_GRAPH_GRAPH_MODEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/optimizer.h"
#include "worker/graph/graph.h"
#include "worker/graph/op_registry.h"
#include "worker/nn/layer.h"
#include "worker/nn/model.h"

namespace dptrain {
namespace graph {

enum class Loss {
  // Mean softmax cross-entropy, as nn.CrossEntropyLoss().
  kSoftmaxCrossEntropy,
  // Mean over batch x outputs of (output - target)^2, as nn.MSELoss(): against the target
  // values of a regression batch, or onehot(label) for class labels.
  kMse,
  // Mean over batch x outputs of |output - target|, as nn.L1Loss() (the same targets).
  kL1,
  // Mean over batch x outputs of the binary cross-entropy of sigmoid(output) against the target
  // (a probability in [0, 1]: multi-label classification), as nn.BCEWithLogitsLoss() (the
  // same targets).
  kBce,
};

struct GraphModelOptions {
  std::string name;  // What name() says (e.g. the file's base name).
  Loss loss = Loss::kSoftmaxCrossEntropy;
  // Softmax cross-entropy's label smoothing (nn.CrossEntropyLoss's label_smoothing), in [0, 1);
  // 0 for mse.
  double label_smoothing = 0;
  // Softmax cross-entropy's class weights (nn.CrossEntropyLoss's weight): empty, or one per
  // class (the output's size), each finite and >= 0.
  std::vector<double> class_weights;
  // ApplyUpdate's rule (all-reduce mode); none where a parameter server applies it.
  std::optional<OptimizerOptions> optimizer;
  // Seeds the Dropout masks (deterministic per seed, not PyTorch's stream; see shape_ops.h).
  uint64_t seed = 0;
  // False: Dropout is the identity in training too (what a comparison with PyTorch, whose
  // masks cannot be reproduced, needs with dropout turned off on its side as well).
  bool dropout = true;
  // Math threads, as nn::ModelOptions::threads: > 1: an intra-op pool of this many threads
  // and OpenBLAS set to 1 thread (process-wide), or no pool and OpenBLAS this many threads
  // (dense_gemm); 1: OpenBLAS 1 thread (and a pool of one thread for a graph with
  // convolutions, lending oneDNN its scratch); 0: no pool, BLAS left alone.
  int threads = 0;
  // With threads > 1: a pool the nodes split over, or BLAS's own threads (nn::ModelOptions's
  // dense_gemm and nn::PlanMathThreads).
  nn::DenseGemm dense_gemm = nn::DenseGemm::kPoolSplit;
  nn::ConvAlgorithm conv_algorithm = nn::ConvAlgorithm::kAuto;
};

// InvalidArgument unless options.label_smoothing is in [0, 1), and 0 for a loss other than
// softmax cross-entropy, and options.class_weights is empty or (for softmax cross-entropy)
// `classes` values, each finite and >= 0 (classes < 0: the count is not checked).
absl::Status CheckLabelSmoothing(const GraphModelOptions& options, int classes = -1);

// Builds the model with the graph's initial weights and buffers and zero gradients.
// InvalidArgument for what Executor::Create refuses, an output that is not [batch, classes],
// or threads < 0; the optimizer's errors (CreateOptimizer).
absl::StatusOr<std::unique_ptr<nn::Model>> CreateGraphModel(const Graph& graph,
                                                            const OpRegistry& registry,
                                                            const GraphModelOptions& options);

// OK if `output` (the shape of `graph`'s output) is [B, classes] (or [B, classes, 1, 1]); else
// InvalidArgument naming the output. Every backend's model of a graph checks it.
absl::Status CheckClassifierOutput(const Graph& graph, const ValueShape& output);

// `graph` with every Dropout node replaced by an Identity of its data input.
Graph WithoutDropout(Graph graph);

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_GRAPH_MODEL_H_
