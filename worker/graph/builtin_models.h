// The built-in networks (mlp, lenet, resnet18; worker/nn/architectures.h describes them) as
// graphs, and the CPU model that trains them: the same executor, op registry and nn::Model as
// an ONNX file's (graph_model.h), so a built-in network is one more graph, not a second kind of
// model.
//
// The graphs keep the built-ins' contract: parameters and buffers named and laid out as
// PyTorch's state_dict of d2l's modules ("1.weight", "1.0.conv1.weight", ...; layer indices
// as in nn.Sequential), the initial weights of architectures.h's InitializeParams for the same
// seed and init, and (with fused residuals) the numbers of the layers they always ran.
#ifndef DPTRAIN_WORKER_GRAPH_BUILTIN_MODELS_H_
#define DPTRAIN_WORKER_GRAPH_BUILTIN_MODELS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/graph/graph.h"
#include "worker/nn/architectures.h"
#include "worker/nn/model.h"

namespace dptrain {
namespace graph {

struct BuiltinGraphOptions {
  std::string name;  // "mlp" | "lenet" | "resnet18"
  nn::NetworkShape shape;
  uint64_t seed = 0;
  std::string init = "default";  // As nn::ModelOptions::init.
  // resnet18's blocks as one Residual node each (layer_ops.h; the fast path), or false: the
  // same block in plain ONNX ops (Conv, BatchNormalization, Relu, Add), as an exporter would
  // write it.
  bool fused_residuals = true;
};

// The graph of a built-in network with its initial weights (running means 0, variances 1).
// InvalidArgument for an unknown name or init, or a shape the network cannot take (the
// messages of nn::BuildNetwork and nn::InitializeParams).
absl::StatusOr<Graph> BuiltinGraph(const BuiltinGraphOptions& options);
// The same for a model's options (their name, shape, seed and init; fused residuals).
absl::StatusOr<Graph> BuiltinGraph(const nn::ModelOptions& options);

// A d2l-style ResNet (nn::ResNetConfig) as a graph with every weight 0 (tests fill them).
absl::StatusOr<Graph> ResNetGraph(const nn::ResNetConfig& config, bool fused_residuals = true);

// The CPU model of a built-in network: BuiltinGraph run by CreateGraphModel with the options'
// threads, dense_gemm, conv_algorithm and optimizer; name() is options.name. The errors of
// both.
absl::StatusOr<std::unique_ptr<nn::Model>> CreateBuiltinModel(const nn::ModelOptions& options);

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_BUILTIN_MODELS_H_
