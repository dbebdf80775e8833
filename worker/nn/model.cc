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
namespace {

// A Sequential<float> run on the CPU, parameters and gradients in flat buffers owned here.
class CpuModel final : public Model {
 public:
  // `weights` holds net.num_params() initial values. `pool` (may be null) is handed to the layers.
  // `optimizer` (may be null) is ApplyUpdate's rule.
  CpuModel(std::string name, Sequential<float> net, std::vector<float> weights,
           std::unique_ptr<ThreadPool> pool, ConvAlgorithm conv_algorithm,
           std::unique_ptr<Optimizer> optimizer)
      : name_(std::move(name)),
        pool_(std::move(pool)),
        net_(std::move(net)),
        weights_(std::move(weights)),
        grads_(net_.num_params() + 1, 0.0f),  // + the overflow flag's slot
        optimizer_(std::move(optimizer)),
        buffer_values_(net_.num_buffers()) {
    net_.InitBuffers(buffer_values_.data());
    net_.SetThreadPool(pool_.get());
    net_.SetConvAlgorithm(conv_algorithm);
    params_ = DescribeParams(net_);
    buffers_ = DescribeBuffers(net_);
  }

  const std::vector<ParamInfo>& params() const override { return params_; }
  std::vector<float>& weights() override { return weights_; }
  absl::Span<const float> grads() const override {
    return absl::MakeConstSpan(grads_.data(), grads_.size() - 1);
  }
  // The CPU never overflows: the flag slot stays 0 (a reducer may leave another value).
  absl::Span<float> gradient_exchange() override { return absl::MakeSpan(grads_); }
  absl::Status ApplyUpdate(float learning_rate) override {
    if (optimizer_ == nullptr) return NoOptimizer(name_);
    if (static_cast<int64_t>(weights_.size()) != net_.num_params()) return WrongWeights();
    optimizer_->Apply(absl::MakeSpan(weights_), grads(), optimizer_state_, learning_rate);
    return absl::OkStatus();
  }
  absl::StatusOr<OptimizerState> ExportOptimizerState() const override {
    if (optimizer_ == nullptr) return NoOptimizer(name_);
    return optimizer_state_;
  }
  absl::Status ImportOptimizerState(OptimizerState state) override {
    if (optimizer_ == nullptr) return NoOptimizer(name_);
    if (absl::Status s = CheckOptimizerState(state, net_.num_params()); !s.ok()) return s;
    optimizer_state_ = std::move(state);
    return absl::OkStatus();
  }
  const std::vector<ParamInfo>& buffers() const override { return buffers_; }
  std::vector<float>& buffer_values() override { return buffer_values_; }
  std::string name() const override { return name_; }
  Dims input_dims() const override { return net_.input_dims(); }
  int num_classes() const override { return static_cast<int>(net_.output_dims().size()); }

  absl::StatusOr<BatchResult> TrainStep(const float* images, const uint8_t* labels,
                                        int batch) override {
    if (absl::Status s = Prepare(images, labels, batch); !s.ok()) return s;
    largest_train_batch_ = std::max(largest_train_batch_, batch);
    const absl::Time start = absl::Now();
    TensorRef<float> logits = net_.Forward(images, batch, /*training=*/true);
    float* grad_logits = EnsureSize(grad_logits_, logits.size());
    const LossOutput loss =
        SoftmaxCrossEntropy(logits.data, labels, batch, num_classes(), grad_logits);
    const absl::Time forward_end = absl::Now();
    net_.Backward({grad_logits, batch, logits.dims});
    grads_.back() = 0.0f;
    BatchResult result{loss.loss, loss.correct};
    result.forward_seconds = absl::ToDoubleSeconds(forward_end - start);
    result.backward_seconds = absl::ToDoubleSeconds(absl::Now() - forward_end);
    return result;
  }

  // A batch larger than the largest training batch so far is evaluated in pieces of that size:
  // the layers' buffers grow to the largest batch they see and never shrink, so one 500-image
  // evaluation batch would have doubled ResNet-18's activation memory for the whole run.
  absl::StatusOr<BatchResult> Evaluate(const float* images, const uint8_t* labels,
                                       int batch) override {
    if (absl::Status s = Prepare(images, labels, batch); !s.ok()) return s;
    const int piece = largest_train_batch_ > 0 ? std::min(batch, largest_train_batch_) : batch;
    double loss_sum = 0;
    int64_t correct = 0;
    for (int begin = 0; begin < batch; begin += piece) {
      const int n = std::min(piece, batch - begin);
      TensorRef<float> logits =
          net_.Forward(images + begin * net_.input_dims().size(), n, /*training=*/false);
      const LossOutput loss =
          SoftmaxCrossEntropy<float>(logits.data, labels + begin, n, num_classes(), nullptr);
      loss_sum += static_cast<double>(loss.loss) * n;
      correct += loss.correct;
    }
    return BatchResult{loss_sum / batch, correct};
  }

 private:
  // Validates a call and (re)binds the layers to the flat buffers if the caller replaced them.
  absl::Status Prepare(const float* images, const uint8_t* labels, int batch) {
    if (absl::Status s = CheckBatch(images, labels, batch, num_classes()); !s.ok()) return s;
    if (static_cast<int64_t>(weights_.size()) != net_.num_params()) return WrongWeights();
    if (static_cast<int64_t>(buffer_values_.size()) != net_.num_buffers()) {
      return absl::FailedPreconditionError(absl::StrCat(name_, ": buffer_values() has ",
                                                        buffer_values_.size(), " values, expected ",
                                                        net_.num_buffers()));
    }
    if (buffer_values_.data() != bound_buffers_) {
      net_.BindBuffers(buffer_values_.data());
      bound_buffers_ = buffer_values_.data();
    }
    if (weights_.data() != bound_weights_) {
      net_.BindParams(weights_.data(), grads_.data());
      bound_weights_ = weights_.data();
    }
    return absl::OkStatus();
  }

  absl::Status WrongWeights() const {
    return absl::FailedPreconditionError(absl::StrCat(name_, ": weights() has ", weights_.size(),
                                                      " values, expected ", net_.num_params()));
  }

  const std::string name_;
  std::unique_ptr<ThreadPool> pool_;  // Declared before net_, whose layers point to it.
  Sequential<float> net_;
  std::vector<ParamInfo> params_;
  std::vector<float> weights_;
  std::vector<float> grads_;  // The gradient, then the overflow flag's slot.
  std::unique_ptr<Optimizer> optimizer_;
  OptimizerState optimizer_state_;
  std::vector<ParamInfo> buffers_;
  std::vector<float> buffer_values_;
  std::vector<float> grad_logits_;
  int largest_train_batch_ = 0;
  const float* bound_weights_ = nullptr;
  const float* bound_buffers_ = nullptr;
};

}  // namespace

absl::StatusOr<OptimizerState> Model::ExportOptimizerState() const {
  return absl::UnimplementedError(
      absl::StrCat(name(), " on this device cannot export its optimizer state"));
}

absl::Status Model::ImportOptimizerState(OptimizerState) {
  return absl::UnimplementedError(
      absl::StrCat(name(), " on this device cannot import an optimizer state"));
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

absl::Status CheckBatch(const float* images, const uint8_t* labels, int batch, int classes) {
  if (batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("batch must be >= 1, got ", batch));
  }
  if (images == nullptr || labels == nullptr) {
    return absl::InvalidArgumentError("null images or labels");
  }
  for (int i = 0; i < batch; ++i) {
    if (labels[i] >= classes) {
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

absl::StatusOr<std::unique_ptr<Model>> CreateModel(const ModelOptions& options) {
  if (options.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("threads must be >= 0, got ", options.threads));
  }
  absl::StatusOr<InitialNetwork> initial = BuildInitialNetwork(options);
  if (!initial.ok()) return initial.status();
  std::unique_ptr<Optimizer> optimizer;
  if (options.optimizer.has_value()) {
    absl::StatusOr<std::unique_ptr<Optimizer>> made = CreateOptimizer(*options.optimizer);
    if (!made.ok()) return made.status();
    optimizer = *std::move(made);
  }
  std::unique_ptr<ThreadPool> pool;
  bool convolutions = false;
  for (const ParamInfo& p : DescribeParams(initial->net)) convolutions |= p.shape.size() == 4;
  if (options.threads > 1) {
    DenseGemm dense = options.dense_gemm;
    if (dense == DenseGemm::kByModel) {
      // The measured rule (thread_pool.h): BLAS threads for a model of Linear layers only.
      dense = convolutions ? DenseGemm::kPoolSplit : DenseGemm::kBlasThreads;
    }
    if (dense == DenseGemm::kBlasThreads) {
      // No pool: BLAS's threads are the model's (a pool's threads beside them would
      // oversubscribe the cores).
      SetBlasThreads(options.threads);
    } else {
      // The layers split the batch over the pool's threads, each running single-threaded GEMMs
      // (BLAS threads on top would oversubscribe the cores).
      pool = std::make_unique<ThreadPool>(options.threads);
      SetBlasThreads(1);
    }
  } else if (options.threads == 1) {
    SetBlasThreads(1);
    // Runs everything on the caller; it lends oneDNN's convolutions their shared scratch.
    if (convolutions) pool = std::make_unique<ThreadPool>(1);
  }
  return std::make_unique<CpuModel>(options.name, std::move(initial->net),
                                    std::move(initial->weights), std::move(pool),
                                    options.conv_algorithm, std::move(optimizer));
}

}  // namespace nn
}  // namespace dptrain
