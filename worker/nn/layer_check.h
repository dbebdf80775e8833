// Test helpers that check a layer's math: its double-precision forward against an independent
// reference, its double backward against central finite differences, and its float forward and
// backward against its double ones. Failures are reported through gtest EXPECTs.
#ifndef DPTRAIN_WORKER_NN_LAYER_CHECK_H_
#define DPTRAIN_WORKER_NN_LAYER_CHECK_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "worker/nn/layer.h"

namespace dptrain {
namespace nn {

// n values drawn from U(-scale, scale) with a fixed generator seeded by `seed`.
std::vector<double> RandomVector(int64_t n, double scale, uint64_t seed);

// sum(y * g): the scalar loss whose finite differences the checks take.
double Dot(TensorRef<double> y, const std::vector<double>& g);
// At most `limit` indices of [0, n) drawn from `seed`, all of them if n <= limit.
std::vector<int64_t> PickIndices(int64_t n, int limit, uint64_t seed);

// Expects |actual[i] - expected[i]| <= tolerance * max(1e-6, max_j |expected[j]|) for every i, and
// reports the worst element. `what` names the tensor in the failure message.
void ExpectAllClose(const std::string& what, const std::vector<double>& actual,
                    const std::vector<double>& expected, double tolerance);

// The layer's output, computed directly from the definition (plain loops, double), for a batch
// `x` and the layer's flat parameters `params`.
using ReferenceForward = std::function<std::vector<double>(
    const std::vector<double>& x, const std::vector<double>& params, int batch)>;

struct LayerCheckOptions {
  int batch = 2;
  Dims input;
  uint64_t seed = 1;
  double input_scale = 1.0;  // Inputs and parameters are drawn from U(-scale, scale).
  double param_scale = 0.5;
  double fd_step = 1e-6;
  // Relative bound for double analytic vs finite-difference gradients.
  double fd_tolerance = 1e-6;
  // Relative bound for float vs double results (forward and backward).
  double float_tolerance = 2e-5;
  // At most this many elements per tensor get a finite-difference check (chosen at random).
  int max_fd_checks = 400;
  // Mode of every Forward (false: evaluation mode, e.g. batch norm with running statistics).
  bool training = true;
  // Initial buffer values (Layer::BufferSpecs layout) for the double layer; the float one gets
  // them rounded. Empty: the layer's InitBuffers.
  std::function<void(std::vector<double>& buffers)> init_buffers;
  // What the float layer computes with (its pool, convolution algorithm); the double layer
  // always runs on the calling thread.
  LayerContext<float> float_context;
};

// Runs every check on `d` and `f`, two instances of the same layer configuration in double and
// float. `reference` may be empty to skip the reference comparison. The reference sees the
// parameters only: a layer with buffers is checked against it in evaluation mode, or with
// buffers that do not affect its training-mode output.
void CheckLayer(Layer<double>& d, Layer<float>& f, const LayerCheckOptions& options,
                const ReferenceForward& reference);

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_LAYER_CHECK_H_
