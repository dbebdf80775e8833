// The ONNX fixtures of worker/graph/testdata (tools/make_onnx_fixtures.py): each model's file
// and PyTorch's float64 results of one train-mode step from its weights, and the checks that a
// model's step matches them. Shared by the CPU's onnx_import_test and the GPU's gpu_graph_test.
#ifndef DPTRAIN_WORKER_GRAPH_ONNX_FIXTURES_TESTING_H_
#define DPTRAIN_WORKER_GRAPH_ONNX_FIXTURES_TESTING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "worker/graph/graph.h"
#include "worker/nn/model.h"

namespace dptrain {
namespace graph {
namespace testing_fixtures {

inline constexpr char kTestdata[] = "worker/graph/testdata";

std::string OnnxPath(const std::string& model, const std::string& dir = kTestdata);
std::string ReferencePath(const std::string& model, const std::string& dir = kTestdata);
std::vector<double> ToDouble(const float* data, int64_t n);

// The reference's input batch, with class labels, or target values (a regression fixture's
// "targets": [batch, outputs]).
struct Batch {
  std::vector<float> images;
  std::vector<nn::Label> labels;
  std::vector<float> targets;
  int size = 0;  // Samples.
  bool regression() const { return !targets.empty(); }
  nn::Targets scored() const {
    return regression() ? nn::Targets::Values(targets.data()) : nn::Targets(labels.data());
  }
};
Batch ReferenceBatch(const SafetensorsContents& ref);

// Expects the model's gradients equal `prefix` + name of `ref` for every parameter (relative L2
// error <= 1e-4 per tensor, every element within 1e-3 of the tensor's largest gradient), and
// that the model has exactly PyTorch's parameters.
void ExpectGradientsMatch(nn::Model& model, const SafetensorsContents& ref,
                          const std::string& prefix);

// One TrainStep of `model` on the reference batch (labels, or a regression fixture's targets,
// for a model made with mse): PyTorch's loss (1e-5 relative), gradients
// (ExpectGradientsMatch, "grad.") and updated buffers ("after.", 1e-5).
void ExpectTrainStepMatches(nn::Model& model, const SafetensorsContents& ref);
// How far a float model's loss may be from the reference's (float64) loss: 1e-5 of it, or
// twice as far as PyTorch's own float32 loss of the step was where the fixture holds it
// ("float32_loss": through a deep network such as Inception v3, float32 alone moves the loss
// by ~2e-5 of itself).
double FloatLossTolerance(const SafetensorsContents& ref);

// One train-mode step of `graph` (Dropout off) by the CPU executor in double, against the
// reference: the loss (1e-7 relative: the reference holds float32s), every parameter's gradient
// (relative L2 error <= 1e-7; gradients that vanish up to rounding, rms <= 1e-9, such as the bias
// of a batch norm whose output only feeds another batch norm, are skipped) and the updated buffers
// (1e-7). Exact where float32 need not be: in a deep float32 network a max-pooling window whose two
// largest values lie within rounding of each other may pick the other one than PyTorch's float64
// run, sending that window's gradient elsewhere (measured on torchvision's SqueezeNet and
// GoogLeNet), and deep stacks of batch norms amplify rounding (PyTorch's own float32 step is
// 2 % off its float64 one on RegNetY-400MF).
void ExpectDoubleStepMatches(const Graph& graph, const SafetensorsContents& ref);

}  // namespace testing_fixtures
}  // namespace graph
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_GRAPH_ONNX_FIXTURES_TESTING_H_
