#include "worker/graph/graph_model.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "worker/graph/executor.h"
#include "worker/nn/batch_sample.h"
#include "worker/nn/gemm.h"
#include "worker/nn/loss_elements.h"
#include "worker/nn/softmax_cross_entropy.h"
#include "worker/nn/thread_pool.h"

namespace dptrain {
namespace graph {
namespace {

static_assert(static_cast<int>(Loss::kMse) == nn::kLossMse &&
                  static_cast<int>(Loss::kL1) == nn::kLossL1 &&
                  static_cast<int>(Loss::kBce) == nn::kLossBce,
              "nn::ElementLossOf numbers the losses as graph::Loss");

// The mean over batch x outputs of LossOf(output, target), the target the target values or
// onehot(label); grad (if not null) = its derivative. Correct counts argmax(y) == label where
// there are labels.
nn::LossOutput ElementwiseLoss(Loss loss, const float* y, nn::Targets targets, int batch,
                               int outputs, float* grad) {
  nn::LossOutput out;
  const double count = static_cast<double>(batch) * outputs;
  double sum = 0;
  for (int n = 0; n < batch; ++n) {
    const float* row = y + int64_t{n} * outputs;
    const float* t = targets.values == nullptr ? nullptr : targets.values + int64_t{n} * outputs;
    for (int k = 0; k < outputs; ++k) {
      const double target = t != nullptr ? t[k] : k == targets.labels[n] ? 1.0 : 0.0;
      const nn::ElementLoss e = nn::ElementLossOf(static_cast<int>(loss), row[k], target);
      sum += e.value;
      if (grad != nullptr)
        grad[int64_t{n} * outputs + k] = static_cast<float>(e.derivative / count);
    }
    if (t == nullptr) {
      out.correct += std::max_element(row, row + outputs) - row == targets.labels[n];
    }
  }
  out.loss = sum / count;
  out.weight = batch;
  return out;
}

}  // namespace

absl::Status CheckLabelSmoothing(const GraphModelOptions& options, int classes) {
  const std::vector<double>& w = options.class_weights;
  if (!w.empty() && options.loss != Loss::kSoftmaxCrossEntropy) {
    return absl::InvalidArgumentError("class weights apply to softmax cross-entropy only");
  }
  if (!w.empty() && classes >= 0 && static_cast<int>(w.size()) != classes) {
    return absl::InvalidArgumentError(
        absl::StrCat(w.size(), " class weights for a model of ", classes, " outputs (classes)"));
  }
  for (size_t k = 0; k < w.size(); ++k) {
    if (!(std::isfinite(w[k]) && w[k] >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("class weight ", w[k], " (class ", k, ") is not finite and >= 0"));
    }
  }
  if (!(options.label_smoothing >= 0 && options.label_smoothing < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("label smoothing must be in [0, 1), got ", options.label_smoothing));
  }
  if (options.label_smoothing != 0 && options.loss != Loss::kSoftmaxCrossEntropy) {
    return absl::InvalidArgumentError("label smoothing applies to softmax cross-entropy only");
  }
  return absl::OkStatus();
}

namespace {

class GraphModel final : public nn::Model {
 public:
  GraphModel(std::string name, Loss loss, double label_smoothing, std::vector<double> class_weights,
             std::unique_ptr<nn::ThreadPool> pool, std::unique_ptr<Executor<float>> executor,
             std::unique_ptr<Optimizer> optimizer)
      : name_(std::move(name)),
        loss_(loss),
        label_smoothing_(label_smoothing),
        class_weights_(std::move(class_weights)),
        pool_(std::move(pool)),
        executor_(std::move(executor)),
        classes_(static_cast<int>(executor_->output_dims().size())),
        weights_(executor_->ReleaseInitialParams()),
        grads_(executor_->num_params() + 1, 0.0f),  // + the overflow flag's slot
        buffer_values_(executor_->ReleaseInitialBuffers()),
        optimizer_(std::move(optimizer)) {}

  const std::vector<nn::ParamInfo>& params() const override { return executor_->params(); }
  std::vector<float>& weights() override { return weights_; }
  absl::Span<const float> grads() const override {
    return absl::MakeConstSpan(grads_.data(), grads_.size() - 1);
  }
  // The CPU never overflows: the flag slot stays 0 (a reducer may leave another value).
  absl::Span<float> gradient_exchange() override { return absl::MakeSpan(grads_); }

  absl::Status ApplyUpdate(float learning_rate) override {
    if (optimizer_ == nullptr) return NoOptimizer(name_);
    DPTRAIN_RETURN_IF_ERROR(CheckSizes());
    optimizer_->Apply(absl::MakeSpan(weights_), grads(), optimizer_state_, learning_rate);
    return absl::OkStatus();
  }
  absl::StatusOr<OptimizerState> ExportOptimizerState() const override {
    if (optimizer_ == nullptr) return NoOptimizer(name_);
    return optimizer_state_;
  }
  absl::Status ImportOptimizerState(OptimizerState state) override {
    if (optimizer_ == nullptr) return NoOptimizer(name_);
    DPTRAIN_RETURN_IF_ERROR(CheckOptimizerState(state, executor_->num_params()));
    optimizer_state_ = std::move(state);
    return absl::OkStatus();
  }

  const std::vector<nn::ParamInfo>& buffers() const override { return executor_->buffers(); }
  std::vector<float>& buffer_values() override { return buffer_values_; }
  std::string name() const override { return name_; }
  nn::Dims input_dims() const override { return executor_->input_dims(); }
  bool input_is_ids() const override { return executor_->input_ids(); }
  int64_t input_id_limit() const override { return executor_->input_id_limit(); }
  int num_classes() const override { return classes_; }

  absl::StatusOr<nn::BatchResult> TrainStep(const float* images, nn::Targets targets,
                                            int batch) override {
    DPTRAIN_RETURN_IF_ERROR(Prepare(images, targets, batch));
    largest_train_batch_ = std::max(largest_train_batch_, batch);
    const absl::Time start = absl::Now();
    DPTRAIN_ASSIGN_OR_RETURN(const nn::TensorRef<float> logits,
                             executor_->Forward(images, batch, /*training=*/true));
    float* grad_logits = nn::EnsureSize(grad_logits_, logits.size());
    const nn::LossOutput loss = ComputeLoss(logits.data, targets, batch, grad_logits);
    const absl::Time forward_end = absl::Now();
    executor_->Backward({grad_logits, batch, logits.dims}, /*need_input_grad=*/false);
    grads_.back() = 0.0f;
    nn::BatchResult result{loss.loss, loss.correct};
    result.weight = loss.weight;
    result.forward_seconds = absl::ToDoubleSeconds(forward_end - start);
    result.backward_seconds = absl::ToDoubleSeconds(absl::Now() - forward_end);
    return result;
  }

  // A batch larger than the largest training batch so far is evaluated in pieces of that size,
  // so that the nodes' buffers (which grow to the largest batch seen) do not grow for it.
  absl::StatusOr<nn::BatchResult> Evaluate(const float* images, nn::Targets targets,
                                           int batch) override {
    DPTRAIN_RETURN_IF_ERROR(Prepare(images, targets, batch));
    const int piece = largest_train_batch_ > 0 ? std::min(batch, largest_train_batch_) : batch;
    double loss_sum = 0, weight_sum = 0;  // The pieces' losses are means over their weights.
    int64_t correct = 0;
    for (int begin = 0; begin < batch; begin += piece) {
      const int n = std::min(piece, batch - begin);
      absl::StatusOr<nn::TensorRef<float>> forward = executor_->Forward(
          images + begin * executor_->input_dims().size(), n, /*training=*/false);
      if (!forward.ok()) return nn::ShiftBatchSample(forward.status(), begin);
      const nn::TensorRef<float> logits = *forward;
      const nn::LossOutput loss =
          ComputeLoss(logits.data, targets.From(begin, classes_), n, nullptr);
      loss_sum += loss.loss * loss.weight;
      weight_sum += loss.weight;
      correct += loss.correct;
    }
    nn::BatchResult result{weight_sum > 0 ? loss_sum / weight_sum : 0.0, correct};
    result.weight = weight_sum;
    return result;
  }

 private:
  nn::LossOutput ComputeLoss(const float* logits, nn::Targets targets, int batch,
                             float* grad) const {
    if (loss_ != Loss::kSoftmaxCrossEntropy) {
      return ElementwiseLoss(loss_, logits, targets, batch, classes_, grad);
    }
    return nn::SoftmaxCrossEntropy<float>(logits, targets.labels, batch, classes_, grad,
                                          label_smoothing_,
                                          class_weights_.empty() ? nullptr : class_weights_.data());
  }

  absl::Status CheckSizes() const {
    if (static_cast<int64_t>(weights_.size()) != executor_->num_params()) {
      return absl::FailedPreconditionError(absl::StrCat(name_, ": weights() has ", weights_.size(),
                                                        " values, expected ",
                                                        executor_->num_params()));
    }
    if (static_cast<int64_t>(buffer_values_.size()) != executor_->num_buffers()) {
      return absl::FailedPreconditionError(absl::StrCat(name_, ": buffer_values() has ",
                                                        buffer_values_.size(), " values, expected ",
                                                        executor_->num_buffers()));
    }
    return absl::OkStatus();
  }

  // Validates a call and (re)binds the executor if the caller replaced a buffer.
  absl::Status Prepare(const float* images, nn::Targets targets, int batch) {
    DPTRAIN_RETURN_IF_ERROR(nn::CheckBatch(images, targets, batch, classes_));
    if (targets.values != nullptr && loss_ == Loss::kSoftmaxCrossEntropy) {
      return absl::UnimplementedError(absl::StrCat(
          name_,
          ": target values (regression) need a loss that takes them (mse, l1, bce), not "
          "softmax cross-entropy, which takes class labels"));
    }
    DPTRAIN_RETURN_IF_ERROR(CheckSizes());
    if (weights_.data() != bound_weights_ || buffer_values_.data() != bound_buffers_ || !bound_) {
      executor_->Bind(weights_.data(), grads_.data(), buffer_values_.data());
      bound_weights_ = weights_.data();
      bound_buffers_ = buffer_values_.data();
      bound_ = true;
    }
    return absl::OkStatus();
  }

  const std::string name_;
  const Loss loss_;
  const double label_smoothing_;
  const std::vector<double> class_weights_;  // Empty: none.
  std::unique_ptr<nn::ThreadPool> pool_;  // Declared before executor_, whose nodes use it.
  std::unique_ptr<Executor<float>> executor_;
  const int classes_;
  std::vector<float> weights_;
  std::vector<float> grads_;  // The gradient, then the overflow flag's slot.
  std::vector<float> buffer_values_;
  std::unique_ptr<Optimizer> optimizer_;
  OptimizerState optimizer_state_;
  std::vector<float> grad_logits_;
  int largest_train_batch_ = 0;
  bool bound_ = false;
  const float* bound_weights_ = nullptr;
  const float* bound_buffers_ = nullptr;
};

}  // namespace

absl::Status CheckClassifierOutput(const Graph& graph, const ValueShape& output) {
  const nn::Dims dims = output.dims_for_ops();
  if (output.IsBatchFirst() && dims.h == 1 && dims.w == 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("graph output '", graph.output, "' has shape ",
                                                 output.ToString(),
                                                 ", expected [B, classes] (or [B, targets])"));
}

Graph WithoutDropout(Graph graph) {
  for (Node& node : graph.nodes) {
    if (node.op != "Dropout") continue;
    node.op = "Identity";
    node.attributes.clear();
    node.inputs.resize(1);
    node.outputs.resize(1);  // The mask output is gone; a node reading it is refused.
  }
  return graph;
}

absl::StatusOr<std::unique_ptr<nn::Model>> CreateGraphModel(const Graph& graph,
                                                            const OpRegistry& registry,
                                                            const GraphModelOptions& options) {
  if (options.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("threads must be >= 0, got ", options.threads));
  }
  DPTRAIN_RETURN_IF_ERROR(CheckLabelSmoothing(options));
  std::unique_ptr<Optimizer> optimizer;
  if (options.optimizer.has_value()) {
    DPTRAIN_ASSIGN_OR_RETURN(optimizer, CreateOptimizer(*options.optimizer));
  }
  bool convolutions = false;
  for (const Node& node : graph.nodes) convolutions |= node.op == "Conv" || node.op == "Residual";
  nn::MathThreads threads = nn::PlanMathThreads(options.threads, options.dense_gemm, convolutions);
  ExecutorOptions executor_options;
  executor_options.seed = options.seed;
  executor_options.pool = threads.pool.get();
  executor_options.conv_algorithm = options.conv_algorithm;
  absl::StatusOr<std::unique_ptr<Executor<float>>> executor =
      options.dropout ? Executor<float>::Create(graph, registry, executor_options)
                      : Executor<float>::Create(WithoutDropout(graph), registry, executor_options);
  if (!executor.ok()) return executor.status();
  DPTRAIN_RETURN_IF_ERROR(CheckClassifierOutput(graph, (*executor)->output_shape()));
  DPTRAIN_RETURN_IF_ERROR(
      CheckLabelSmoothing(options, static_cast<int>((*executor)->output_dims().size())));
  // Set only once the graph is known to build: BLAS threads are process-wide.
  if (threads.blas_threads > 0) nn::SetBlasThreads(threads.blas_threads);
  return std::unique_ptr<nn::Model>(std::make_unique<GraphModel>(
      options.name, options.loss, options.label_smoothing, options.class_weights,
      std::move(threads.pool), *std::move(executor), std::move(optimizer)));
}

}  // namespace graph
}  // namespace dptrain
