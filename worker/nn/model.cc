#include "worker/nn/model.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/nn/architectures.h"
#include "worker/nn/gemm.h"
#include "worker/nn/sequential.h"
#include "worker/nn/softmax_cross_entropy.h"
#include "worker/nn/thread_pool.h"

namespace dptrain {
namespace nn {
absl::StatusOr<OptimizerState> Model::ExportOptimizerState() const {
  return absl::UnimplementedError(
      absl::StrCat(name(), " on this device cannot export its optimizer state"));
}

absl::Status Model::ImportOptimizerState(OptimizerState) {
  return absl::UnimplementedError(
      absl::StrCat(name(), " on this device cannot import an optimizer state"));
}

absl::Status Model::HoldTrainingData(const HeldData&) {
  return absl::UnimplementedError(
      absl::StrCat(name(), " on this device reads each batch where the caller gathered it"));
}

absl::StatusOr<BatchResult> Model::TrainStepHeld(absl::Span<const HeldSample>) {
  return absl::UnimplementedError(absl::StrCat(name(), " on this device holds no training data"));
}

absl::Status Model::CheckOptimizerState(const OptimizerState& state, int64_t num_params) {
  for (const std::vector<float>* v : {&state.momentum_buffer, &state.exp_avg, &state.exp_avg_sq}) {
    if (!v->empty() && static_cast<int64_t>(v->size()) != num_params) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer state of ", v->size(), " values for ", num_params, " weights"));
    }
  }
  if (state.steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer state after ", state.steps, " steps"));
  }
  return absl::OkStatus();
}

absl::Status Model::NoOptimizer(const std::string& model) {
  return absl::FailedPreconditionError(
      absl::StrCat(model,
                   ": ApplyUpdate needs an update rule (ModelOptions::optimizer); in ps and master "
                   "mode the parameter server applies it"));
}

absl::Status CheckBatch(const float* images, Targets targets, int batch, int classes) {
  if (batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("batch must be >= 1, got ", batch));
  }
  if (images == nullptr || (targets.labels == nullptr) == (targets.values == nullptr)) {
    return absl::InvalidArgumentError("null images, or not exactly one of labels and targets");
  }
  if (targets.values != nullptr) return absl::OkStatus();
  const Label* labels = targets.labels;
  for (int i = 0; i < batch; ++i) {
    if (labels[i] < 0 || labels[i] >= classes) {
      return absl::InvalidArgumentError(absl::StrCat("label ", int{labels[i]}, " of sample ", i,
                                                     " is not in [0, ", classes, ")"));
    }
  }
  return absl::OkStatus();
}

namespace {

// Params (or buffers) of every layer of `net`, laid out from `offset(i)` for layer i.
template <typename Specs, typename Offset>
std::vector<ParamInfo> Describe(const Sequential<float>& net, Specs specs, Offset offset) {
  std::vector<ParamInfo> infos;
  for (int i = 0; i < net.num_layers(); ++i) {
    int64_t at = offset(i);
    for (TensorSpec& spec : specs(net.layer(i))) {
      const int64_t size = spec.size();
      infos.push_back({absl::StrCat(i, ".", spec.name), std::move(spec.shape), at, size});
      at += size;
    }
  }
  return infos;
}

}  // namespace

std::vector<ParamInfo> DescribeParams(const Sequential<float>& net) {
  return Describe(
      net, [](const Layer<float>& l) { return l.ParamSpecs(); },
      [&net](int i) { return net.param_offset(i); });
}

std::vector<ParamInfo> DescribeBuffers(const Sequential<float>& net) {
  return Describe(
      net, [](const Layer<float>& l) { return l.BufferSpecs(); },
      [&net](int i) { return net.buffer_offset(i); });
}

absl::StatusOr<InitialNetwork> BuildInitialNetwork(const ModelOptions& options) {
  absl::StatusOr<Sequential<float>> net = BuildNetwork<float>(options.name, options.shape);
  if (!net.ok()) return net.status();
  std::vector<float> weights(net->num_params());
  if (absl::Status s =
          InitializeParams(options.name, *net, options.seed, weights.data(), options.init);
      !s.ok()) {
    return s;
  }
  return InitialNetwork{*std::move(net), std::move(weights)};
}

MathThreads PlanMathThreads(int threads, DenseGemm dense_gemm, bool convolutions) {
  MathThreads plan;
  if (threads > 1) {
    if (dense_gemm == DenseGemm::kByModel) {
      // The measured rule (thread_pool.h): BLAS threads for a model of Linear layers only.
      dense_gemm = convolutions ? DenseGemm::kPoolSplit : DenseGemm::kBlasThreads;
    }
    if (dense_gemm == DenseGemm::kBlasThreads) {
      // No pool: BLAS's threads are the model's (a pool's threads beside them would
      // oversubscribe the cores).
      plan.blas_threads = threads;
    } else {
      // The layers split the batch over the pool's threads, each running single-threaded GEMMs
      // (BLAS threads on top would oversubscribe the cores).
      plan.pool = std::make_unique<ThreadPool>(threads);
      plan.blas_threads = 1;
    }
  } else if (threads == 1) {
    plan.blas_threads = 1;
    // Runs everything on the caller; it lends oneDNN's convolutions their shared scratch.
    if (convolutions) plan.pool = std::make_unique<ThreadPool>(1);
  }
  return plan;
}

}  // namespace nn
}  // namespace dptrain
