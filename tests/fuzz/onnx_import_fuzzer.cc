// Fuzzes the ONNX import (worker/graph/onnx_import: a ModelProto as PyTorch exports it, read with
// Debian's libonnx protobuf messages, then the import-time rewrites) and what gpu_worker does next
// with a model file: the op check of every node, the CPU model built by the graph executor, and
// one training step on a batch of 2.
// Checks: a refused file is InvalidArgument (one line); a model that builds has weights, a
// [classes] output and input dims as the graph says, and its step either trains (finite or not:
// the weights are the file's) or fails with a status, never a crash, a read past a buffer (ASan)
// or undefined behaviour (UBSan). Models whose input sample exceeds 4,096 values or whose
// initializers exceed 1M values are parsed and checked but not built (a big model is no bug).
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_check.h"
#include "worker/graph/graph_model.h"
#include "worker/graph/onnx_import.h"
#include "worker/graph/op_registry.h"

namespace {

void CheckError(const absl::Status& s) {
  const std::string message(s.message());
  if (!(absl::IsInvalidArgument(s) || absl::IsUnimplemented(s)) ||
      message.find('\n') != std::string::npos) {
    std::fprintf(stderr, "unexpected error: %s\n", s.ToString().c_str());
  }
  FUZZ_CHECK(absl::IsInvalidArgument(s) || absl::IsUnimplemented(s));
  FUZZ_CHECK(message.find('\n') == std::string::npos);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dptrain::graph;
  static const OpRegistry* registry = new OpRegistry(BuiltinOps());
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<Graph> graph = ParseOnnxGraph(bytes, "fuzz");
  if (!graph.ok()) {
    CheckError(graph.status());
    return 0;
  }
  FUZZ_CHECK(graph->input_dims.size() > 0);
  if (const absl::Status supported = CheckOpsSupported(*graph, *registry); !supported.ok()) {
    CheckError(supported);
    return 0;
  }
  int64_t constant_values = 0;
  for (const NamedConstant& c : graph->constants) {
    constant_values += static_cast<int64_t>(c.value.floats.size() + c.value.ints.size());
  }
  if (graph->input_dims.size() > 4096 || constant_values > (1 << 20)) return 0;
  GraphModelOptions options;
  options.threads = 1;
  options.seed = 1;
  absl::StatusOr<std::unique_ptr<dptrain::nn::Model>> model =
      CreateGraphModel(*graph, *registry, options);
  if (!model.ok()) {
    CheckError(model.status());
    return 0;
  }
  dptrain::nn::Model& m = **model;
  FUZZ_CHECK(m.input_dims() == graph->input_dims);
  FUZZ_CHECK(m.num_classes() >= 1);
  FUZZ_CHECK(m.grads().size() == m.weights().size());
  const int batch = 2;
  // Images, or ids 0, 1, 2, ... (a model whose input is token ids refuses 0.5: a step of its
  // embedding lookups needs whole ids, some of them beyond a small table's rows).
  std::vector<float> images(static_cast<size_t>(batch * m.input_dims().size()), 0.5f);
  if (m.input_is_ids()) {
    for (size_t i = 0; i < images.size(); ++i) images[i] = static_cast<float>(i % 7);
  }
  std::vector<dptrain::nn::Label> labels(batch, 0);
  absl::StatusOr<dptrain::nn::BatchResult> step = m.TrainStep(images.data(), labels.data(), batch);
  if (!step.ok()) CheckError(step.status());
  return 0;
}
