// Test helpers: small graphs built in code, and the gradient check of a whole graph through the
// executor (double backward against central finite differences, float against double), as
// worker/nn/layer_check.h does for one layer. Failures are reported through gtest EXPECTs.
#ifndef DPTRAIN_WORKER_GRAPH_GRAPH_CHECK_H_
#define DPTRAIN_WORKER_GRAPH_GRAPH_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/graph/executor.h"
#include "worker/graph/graph.h"
#include "worker/graph/op_registry.h"

namespace dptrain {
namespace graph {

// A node of `op` named `name`.
Node MakeNode(const std::string& op, const std::string& name, std::vector<std::string> inputs,
              std::vector<std::string> outputs, std::map<std::string, Attribute> attributes = {});
// A float constant of `shape` drawn from U(-scale, scale) (seeded by `seed`), or of `offset` +
// that (e.g. batch-norm variances around 1).
NamedConstant RandomConstant(const std::string& name, std::vector<int64_t> shape, uint64_t seed,
                             double scale = 0.5, double offset = 0);
NamedConstant IntConstant(const std::string& name, std::vector<int64_t> values);
// A float scalar constant (shape []).
NamedConstant FloatScalar(const std::string& name, float value);
// A graph from input "x" of `dims` through `nodes` to the first output of the last node.
Graph Chain(nn::Dims dims, std::vector<Node> nodes, std::vector<NamedConstant> constants = {});

// e.Forward(...)'s view, failing the test (and giving an empty view) if it fails.
template <typename T>
nn::TensorRef<T> ForwardOk(Executor<T>& e, const T* input, int batch, bool training) {
  absl::StatusOr<nn::TensorRef<T>> y = e.Forward(input, batch, training);
  EXPECT_TRUE(y.ok()) << y.status();
  return y.ok() ? *y : nn::TensorRef<T>{};
}

struct GraphCheckOptions {
  int batch = 3;
  uint64_t seed = 1;
  bool training = true;
  double fd_step = 1e-6;
  double fd_tolerance = 1e-6;     // Relative: double analytic vs finite differences.
  double float_tolerance = 2e-5;  // Relative: float vs double.
  int max_fd_checks = 300;        // Per tensor (the input and each parameter).
};

// Builds `graph` in double and float with `registry`, runs forward and backward on random
// input with L = sum(g * output) for a random g, and checks d(L)/d(input) and every parameter's
// gradient against central differences (double), and the float results against the double
// ones. Fails the test if the graph does not build.
void CheckGraphGradients(const Graph& graph, const OpRegistry& registry,
                         const GraphCheckOptions& options = {});

}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_GRAPH_CHECK_H_
