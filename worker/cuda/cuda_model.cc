#include "worker/cuda/cuda_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/cuda/gpu_graph.h"
#include "worker/cuda/gpu_network.h"
#include "worker/cuda/half.h"
#include "worker/cuda/kernels.h"
#include "worker/cuda/library_status.h"
#include "worker/graph/builtin_models.h"
#include "worker/nn/architectures.h"
#include "worker/nn/batch_sample.h"

namespace dptrain {
namespace cuda {
namespace {

// The CPU network's and the GPU network's layouts must be the same, name for name.
absl::Status SameLayout(const char* what, const std::vector<nn::ParamInfo>& cpu,
                        const std::vector<nn::TensorSpec>& gpu) {
  bool same = cpu.size() == gpu.size();
  for (size_t i = 0; same && i < cpu.size(); ++i) {
    same = cpu[i].name == gpu[i].name && cpu[i].shape == gpu[i].shape;
  }
  if (same) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("CUDA network's ", what, " differ from the CPU network's"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(const nn::ModelOptions& options,
                                                             const DeviceOptions& device) {
  if (options.optimizer.has_value()) {
    DPTRAIN_RETURN_IF_ERROR(CreateOptimizer(*options.optimizer).status());  // Its checks.
  }
  absl::StatusOr<nn::InitialNetwork> initial = nn::BuildInitialNetwork(options);
  if (!initial.ok()) return initial.status();
  const nn::Sequential<float>& cpu = initial->net;
  absl::StatusOr<std::unique_ptr<GpuSequentialBlock>> gpu = ToGpu(cpu);
  if (!gpu.ok()) return gpu.status();
  std::vector<nn::ParamInfo> params = nn::DescribeParams(cpu);
  std::vector<nn::ParamInfo> buffers = nn::DescribeBuffers(cpu);
  DPTRAIN_RETURN_IF_ERROR(SameLayout("parameters", params, (*gpu)->ParamSpecs()));
  DPTRAIN_RETURN_IF_ERROR(SameLayout("buffers", buffers, (*gpu)->BufferSpecs()));
  std::vector<float> buffer_values(cpu.num_buffers());
  cpu.InitBuffers(buffer_values.data());
  DPTRAIN_ASSIGN_OR_RETURN(
      std::unique_ptr<CudaModel> model,
      Assemble(options.name, options.optimizer, device, nullptr, *std::move(gpu), std::move(params),
               std::move(initial->weights), std::move(buffers), std::move(buffer_values),
               cpu.input_dims(), static_cast<int>(cpu.output_dims().size()),
               options.label_smoothing));
  DPTRAIN_RETURN_IF_ERROR(model->SetClassWeights(options.class_weights));
  return model;
}

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::CreateFromGraph(
    const graph::Graph& graph, const graph::OpRegistry& cpu_ops,
    const graph::GraphModelOptions& options, const DeviceOptions& device) {
  if (options.optimizer.has_value()) {
    DPTRAIN_RETURN_IF_ERROR(CreateOptimizer(*options.optimizer).status());  // Its checks.
  }
  DPTRAIN_RETURN_IF_ERROR(graph::CheckLabelSmoothing(options));
  graph::ExecutorOptions plan_options;
  plan_options.seed = options.seed;
  absl::StatusOr<std::unique_ptr<graph::Executor<float>>> plan =
      options.dropout
          ? graph::Executor<float>::Create(graph, cpu_ops, plan_options)
          : graph::Executor<float>::Create(graph::WithoutDropout(graph), cpu_ops, plan_options);
  if (!plan.ok()) return plan.status();
  const nn::Dims out = (*plan)->output_dims();
  DPTRAIN_RETURN_IF_ERROR(graph::CheckClassifierOutput(graph, (*plan)->output_shape()));
  DPTRAIN_ASSIGN_OR_RETURN(std::unique_ptr<GpuGraph> gpu, GpuGraph::Create(**plan, GpuOps()));
  const graph::Executor<float>& cpu = **plan;
  std::vector<float> weights = cpu.initial_params();
  std::vector<float> buffer_values = cpu.initial_buffers();
  std::vector<nn::ParamInfo> params = cpu.params(), buffers = cpu.buffers();
  const nn::Dims input = cpu.input_dims();
  const int classes = static_cast<int>(out.size());
  DPTRAIN_ASSIGN_OR_RETURN(
      std::unique_ptr<CudaModel> model,
      Assemble(options.name, options.optimizer, device, *std::move(plan), std::move(gpu),
               std::move(params), std::move(weights), std::move(buffers), std::move(buffer_values),
               input, classes, options.label_smoothing));
  model->loss_ = static_cast<int>(options.loss);  // graph::Loss's numbering (nn::ElementLossOf).
  DPTRAIN_RETURN_IF_ERROR(model->SetClassWeights(options.class_weights));
  return model;
}

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::CreateBuiltinFromGraph(
    const nn::ModelOptions& options, const DeviceOptions& device) {
  DPTRAIN_ASSIGN_OR_RETURN(const graph::Graph graph, graph::BuiltinGraph(options));
  graph::GraphModelOptions model;
  model.name = options.name;
  model.optimizer = options.optimizer;
  model.label_smoothing = options.label_smoothing;
  model.class_weights = options.class_weights;
  model.seed = options.seed;
  return CreateFromGraph(graph, graph::BuiltinOps(), model, device);
}

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Assemble(
    std::string name, std::optional<OptimizerOptions> optimizer, const DeviceOptions& device,
    std::unique_ptr<graph::Executor<float>> plan, std::unique_ptr<GpuNetwork> net,
    std::vector<nn::ParamInfo> params, std::vector<float> weights,
    std::vector<nn::ParamInfo> buffers, std::vector<float> buffer_values, nn::Dims input_dims,
    int classes, double label_smoothing) {
  if (!(label_smoothing >= 0 && label_smoothing < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("label smoothing must be in [0, 1), got ", label_smoothing));
  }
  std::optional<LossScaler> scaler;
  if (IsHalf(device.precision)) {
    LossScalerOptions scaling;
    scaling.initial_scale = device.initial_loss_scale;
    absl::StatusOr<LossScaler> made = LossScaler::Create(scaling);
    if (!made.ok()) return made.status();
    scaler = *made;
  }
  absl::StatusOr<std::unique_ptr<DeviceContext>> ctx = DeviceContext::Create(device);
  if (!ctx.ok()) return ctx.status();
  std::unique_ptr<CudaModel> model(new CudaModel(
      std::move(name), std::move(optimizer), *std::move(ctx), std::move(scaler), std::move(net),
      std::move(params), std::move(weights), std::move(buffers), std::move(buffer_values)));
  model->plan_ = std::move(plan);
  if (model->plan_ != nullptr) {
    // A batch norm applied twice (a module used twice: one set of running statistics bound to
    // both nodes) counts two batches a step, as PyTorch's module called twice does.
    std::vector<int64_t> counted;
    for (int64_t offset : model->batch_counters_) {
      int uses = 0;
      for (const auto& node : model->plan_->nodes()) {
        uses += static_cast<int>(
            std::count(node.buffer_offsets.begin(), node.buffer_offsets.end(), offset));
      }
      counted.insert(counted.end(), uses, offset);  // None: a counter no node updates.
    }
    model->batch_counters_ = std::move(counted);
  }
  model->input_dims_ = input_dims;
  model->classes_ = classes;
  model->label_smoothing_ = label_smoothing;
  DPTRAIN_RETURN_IF_ERROR(model->Allocate());
  return model;
}

CudaModel::CudaModel(std::string name, std::optional<OptimizerOptions> optimizer,
                     std::unique_ptr<DeviceContext> ctx, std::optional<LossScaler> scaler,
                     std::unique_ptr<GpuNetwork> net, std::vector<nn::ParamInfo> params,
                     std::vector<float> weights, std::vector<nn::ParamInfo> buffers,
                     std::vector<float> buffer_values)
    : name_(std::move(name)),
      optimizer_(std::move(optimizer)),
      ctx_(std::move(ctx)),
      net_(std::move(net)),
      params_(std::move(params)),
      buffer_infos_(std::move(buffers)),
      weights_(std::move(weights)),
      grads_(weights_.size() + 1, 0.0f),
      buffer_values_(std::move(buffer_values)),
      scaler_(std::move(scaler)) {
  for (const nn::ParamInfo& b : buffer_infos_) {
    if (absl::EndsWith(b.name, "num_batches_tracked")) batch_counters_.push_back(b.offset);
  }
}

CudaModel::~CudaModel() {
  if (copy_stream_ != nullptr) cudaStreamSynchronize(copy_stream_);
  for (cudaEvent_t e : layer_done_) cudaEventDestroy(e);
  if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
  if (grads_pinned_) cudaHostUnregister(grads_.data());
  for (Staging& slot : staging_) {
    if (slot.copied != nullptr) {
      cudaEventSynchronize(slot.copied);
      cudaEventDestroy(slot.copied);
    }
    if (slot.host != nullptr) cudaFreeHost(slot.host);
  }
}

absl::Status CudaModel::Allocate() {
  const int64_t n = static_cast<int64_t>(weights_.size());
  DPTRAIN_ASSIGN_OR_RETURN(float* w, d_weights_.Ensure(*ctx_, n));
  DPTRAIN_ASSIGN_OR_RETURN(float* g, d_grads_.Ensure(*ctx_, n));
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(g, 0, n * sizeof(float), ctx_->stream()));
  net_->BindParams(w, g);
  if (!buffer_values_.empty()) {
    DPTRAIN_ASSIGN_OR_RETURN(float* b,
                             d_buffers_.Ensure(*ctx_, static_cast<int64_t>(buffer_values_.size())));
    net_->BindBuffers(b);
  }
  // The gradient copies: a stream of their own, one event per layer, and page-locked host
  // memory (grads_ never moves) so that they run asynchronously. Without the lock (some
  // sandboxes refuse it) a copy into pageable memory would block the host until the layer's
  // backward is done, serialising the step: grads() then copies everything at once.
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  layer_done_.resize(net_->num_parts(), nullptr);
  for (cudaEvent_t& e : layer_done_) {
    DPTRAIN_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  grads_pinned_ = !grads_.empty() && cudaHostRegister(grads_.data(), grads_.size() * sizeof(float),
                                                      cudaHostRegisterDefault) == cudaSuccess;
  if (!grads_pinned_) cudaGetLastError();  // Clear it; not an error for later checks.
  net_->set_grads_ready([this](int layer, int64_t offset, int64_t size) -> absl::Status {
    if (scaler_) {  // Unscale this layer's gradients and count their inf/NaN.
      DPTRAIN_RETURN_IF_ERROR(UnscaleAndCheck(d_grads_.data() + offset, size,
                                              1.0f / scaler_->scale(), d_non_finite_.data(),
                                              ctx_->stream()));
    }
    return CopiesDuringBackward() ? CopyGradsOut(layer, offset, size) : absl::OkStatus();
  });
  DPTRAIN_RETURN_IF_ERROR(d_non_finite_.Ensure(*ctx_, 1).status());
  DPTRAIN_RETURN_IF_ERROR(d_loss_.Ensure(*ctx_, 1).status());
  DPTRAIN_RETURN_IF_ERROR(d_correct_.Ensure(*ctx_, 1).status());
  return ctx_->Synchronize();
}

// The GPU networks are the built-in ones, which all take Fashion-MNIST's images.
nn::Dims CudaModel::input_dims() const { return input_dims_; }

std::vector<float>& CudaModel::weights() {
  if (weights_newer_on_device_ && sticky_.ok()) sticky_ = DownloadWeights();
  weights_up_to_date_on_device_ = false;  // The caller may write them.
  return weights_;
}

void CudaModel::SyncGradsToHost() const {
  if (grad_copies_in_flight_ && sticky_.ok()) sticky_ = WaitForGradCopies();
  if (grads_at_ == Grads::kCopying && sticky_.ok()) grads_at_ = Grads::kOnHost;
  if (grads_at_ == Grads::kOnDevice && sticky_.ok()) sticky_ = DownloadGrads();
}

absl::Span<const float> CudaModel::grads() const {
  SyncGradsToHost();
  return absl::MakeConstSpan(grads_.data(), grads_.size() - 1);
}

absl::Span<float> CudaModel::gradient_exchange() {
  SyncGradsToHost();
  // A peer needs the gradients: from now on they come down during backward.
  copy_grads_during_backward_ = true;
  if (!exchanged_) grads_.back() = last_overflow_ ? 1.0f : 0.0f;
  exchanged_ = true;
  return absl::MakeSpan(grads_);
}

absl::Status CudaModel::CopyGradsOut(int layer, int64_t offset, int64_t size) {
  cudaEvent_t done = layer_done_[layer];
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaEventRecord(done, ctx_->stream()));
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_, done, 0));
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(grads_.data() + offset, d_grads_.data() + offset,
                                               size * sizeof(float), cudaMemcpyDeviceToHost,
                                               copy_stream_));
  grad_copies_in_flight_ = true;
  return absl::OkStatus();
}

absl::Status CudaModel::WaitForGradCopies() const {
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_stream_));
  grad_copies_in_flight_ = false;
  return absl::OkStatus();
}

std::vector<float>& CudaModel::buffer_values() {
  if (buffers_newer_on_device_ && sticky_.ok()) sticky_ = DownloadBuffers();
  buffers_up_to_date_on_device_ = false;
  return buffer_values_;
}

absl::Status CudaModel::DownloadWeights() {
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(weights_.data(), d_weights_.data(),
                                               weights_.size() * sizeof(float),
                                               cudaMemcpyDeviceToHost, ctx_->stream()));
  DPTRAIN_RETURN_IF_ERROR(ctx_->Synchronize());
  weights_newer_on_device_ = false;
  return absl::OkStatus();
}

absl::Status CudaModel::DownloadGrads() const {
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(grads_.data(), d_grads_.data(),
                                               (grads_.size() - 1) * sizeof(float),
                                               cudaMemcpyDeviceToHost, ctx_->stream()));
  DPTRAIN_RETURN_IF_ERROR(ctx_->Synchronize());
  grads_at_ = Grads::kOnHost;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> CudaModel::DeviceGradsForTest() const {
  DPTRAIN_RETURN_IF_ERROR(sticky_);
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_stream_));
  DPTRAIN_RETURN_IF_ERROR(ctx_->Synchronize());
  std::vector<float> out(d_grads_.size());
  DPTRAIN_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(out.data(), d_grads_.data(), out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return out;
}

absl::Status CudaModel::DownloadBuffers() {
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(buffer_values_.data(), d_buffers_.data(),
                                               buffer_values_.size() * sizeof(float),
                                               cudaMemcpyDeviceToHost, ctx_->stream()));
  DPTRAIN_RETURN_IF_ERROR(ctx_->Synchronize());
  // cuDNN does not count batches; the host adds the steps run since the last download.
  for (int64_t offset : batch_counters_) {
    buffer_values_[offset] += static_cast<float>(uncounted_batches_);
  }
  uncounted_batches_ = 0;
  buffers_newer_on_device_ = false;
  return absl::OkStatus();
}

absl::Status CudaModel::Upload() {
  if (weights_.size() != static_cast<size_t>(d_weights_.size())) {
    return absl::FailedPreconditionError(absl::StrCat(name_, ": weights() has ", weights_.size(),
                                                      " values, expected ", d_weights_.size()));
  }
  if (buffer_values_.size() != static_cast<size_t>(d_buffers_.size())) {
    return absl::FailedPreconditionError(absl::StrCat(name_, ": buffer_values() has ",
                                                      buffer_values_.size(), " values, expected ",
                                                      d_buffers_.size()));
  }
  if (!weights_up_to_date_on_device_) {
    DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_weights_.data(), weights_.data(),
                                                 weights_.size() * sizeof(float),
                                                 cudaMemcpyHostToDevice, ctx_->stream()));
    weights_up_to_date_on_device_ = true;
  }
  if (!buffers_up_to_date_on_device_ && !buffer_values_.empty()) {
    DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_buffers_.data(), buffer_values_.data(),
                                                 buffer_values_.size() * sizeof(float),
                                                 cudaMemcpyHostToDevice, ctx_->stream()));
    buffers_up_to_date_on_device_ = true;
  }
  return absl::OkStatus();
}

absl::StatusOr<nn::BatchResult> CudaModel::Step(const float* images, nn::Targets targets, int batch,
                                                bool training) {
  DPTRAIN_RETURN_IF_ERROR(sticky_);
  DPTRAIN_RETURN_IF_ERROR(nn::CheckBatch(images, targets, batch, classes_));
  if (targets.values != nullptr && loss_ == 0) {
    return absl::UnimplementedError(
        absl::StrCat(name_,
                     ": target values (regression) need --loss=mse, l1 or bce; softmax "
                     "cross-entropy takes class labels"));
  }
  DropStepGraph();  // The buffers below may grow (a grown one frees its old block).
  DPTRAIN_RETURN_IF_ERROR(Upload());
  const nn::Dims dims = input_dims_;
  const int64_t pixels = int64_t{batch} * dims.size();
  DPTRAIN_ASSIGN_OR_RETURN(float* x, d_images_.Ensure(*ctx_, pixels));
  DPTRAIN_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(x, images, pixels * sizeof(float), cudaMemcpyHostToDevice, ctx_->stream()));
  if (targets.values != nullptr) {  // batch x outputs target values.
    const int64_t n = int64_t{batch} * classes_;
    DPTRAIN_ASSIGN_OR_RETURN(float* t, d_targets_.Ensure(*ctx_, n));
    DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(t, targets.values, n * sizeof(float),
                                                 cudaMemcpyHostToDevice, ctx_->stream()));
    return Run(x, nullptr, t, batch, training, /*may_defer=*/false);
  }
  DPTRAIN_ASSIGN_OR_RETURN(nn::Label * y, d_labels_.Ensure(*ctx_, batch));
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(y, targets.labels, batch * sizeof(nn::Label),
                                               cudaMemcpyHostToDevice, ctx_->stream()));
  return Run(x, y, nullptr, batch, training, /*may_defer=*/false);
}

absl::Status CudaModel::EnqueueStep(float* x, const nn::Label* y, const float* targets, int batch,
                                    bool training, float* loss_sum_at, int* correct_at) {
  const nn::Dims dims = input_dims_;
  DPTRAIN_ASSIGN_OR_RETURN(DeviceTensor logits,
                           net_->Forward(*ctx_, DeviceTensor{x, batch, dims}, training));
  DPTRAIN_ASSIGN_OR_RETURN(float* dlogits, d_grad_logits_.Ensure(*ctx_, logits.size()));
  // Zeroed first (a failed step may have left a partial sum).
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(loss_sum_at, 0, sizeof(float), ctx_->stream()));
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(correct_at, 0, sizeof(int), ctx_->stream()));
  if (loss_ == 0 && !class_weights_.empty()) {
    DPTRAIN_RETURN_IF_ERROR(WeightedSoftmaxCrossEntropy(
        logits.data, y, batch, classes_, label_smoothing_, d_class_weights_.data(),
        all_class_weights_, d_weight_sum_.data(), loss_sum_at, correct_at, dlogits,
        ctx_->stream()));
  } else if (loss_ == 0) {  // graph::Loss::kSoftmaxCrossEntropy.
    DPTRAIN_RETURN_IF_ERROR(SoftmaxCrossEntropy(logits.data, y, batch, classes_,
                                                static_cast<float>(label_smoothing_), loss_sum_at,
                                                correct_at, dlogits, ctx_->stream()));
  } else {
    DPTRAIN_RETURN_IF_ERROR(ElementwiseLoss(loss_, logits.data, targets,
                                            targets != nullptr ? nullptr : y, batch, classes_,
                                            loss_sum_at, correct_at, dlogits, ctx_->stream()));
  }
  if (!training) return absl::OkStatus();
  if (scaler_) {
    // d(scale * loss)/d(logits); d_non_finite_ is borrowed for the kernel's count, then
    // zeroed for the gradients' check.
    DPTRAIN_RETURN_IF_ERROR(UnscaleAndCheck(dlogits, logits.size(), scaler_->scale(),
                                            d_non_finite_.data(), ctx_->stream()));
    DPTRAIN_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(d_non_finite_.data(), 0, sizeof(int), ctx_->stream()));
  }
  // The last step's copies read d_grads_ and write grads_: let them finish first.
  if (grad_copies_in_flight_) DPTRAIN_RETURN_IF_ERROR(WaitForGradCopies());
  grads_at_ = Grads::kOnDevice;  // Until the backward below completed.
  exchanged_ = false;
  return net_->Backward(*ctx_, DeviceTensor{dlogits, batch, logits.dims}, false).status();
}

void CudaModel::DropStepGraph() {
  step_graph_.Reset();
  warm_batch_ = 0;
}

void CudaModel::NoteBackwardEnqueued() {
  grads_at_ = CopiesDuringBackward() ? Grads::kCopying : Grads::kOnDevice;
  exchanged_ = false;
  if (!buffer_values_.empty()) {
    buffers_newer_on_device_ = true;
    ++uncounted_batches_;
  }
}

absl::StatusOr<nn::BatchResult> CudaModel::Run(float* x, const nn::Label* y, const float* targets,
                                               int batch, bool training, bool may_defer) {
  // An eager step may grow the buffers or the cuDNN workspace that a step graph uses, and set
  // the layers up for another batch size: the next held step runs eagerly before a capture.
  DropStepGraph();
  const bool defer = training && may_defer && deferring_;
  if (defer && pending_batches_.size() >= static_cast<size_t>(kMaxDeferredSteps)) {
    // Before the forward pass, whose batch norms would update their statistics.
    return absl::FailedPreconditionError(absl::StrCat(
        name_, ": ", pending_batches_.size(), " deferred steps pending (TakeResults reads them)"));
  }
  // A deferred step's loss and count go to its own slot; else to d_loss_ and d_correct_, read
  // below.
  float* loss_sum_at = d_loss_.data();
  int* correct_at = d_correct_.data();
  if (defer) {
    loss_sum_at = d_deferred_loss_.data() + pending_batches_.size();
    correct_at = d_deferred_correct_.data() + pending_batches_.size();
  }
  DPTRAIN_RETURN_IF_ERROR(EnqueueStep(x, y, targets, batch, training, loss_sum_at, correct_at));
  if (training) NoteBackwardEnqueued();
  const bool weighted = loss_ == 0 && !class_weights_.empty();
  if (defer) {
    pending_batches_.push_back(batch);
    nn::BatchResult pending{0, 0};
    pending.deferred = true;
    return pending;
  }
  float loss_sum = 0;
  int correct = 0;
  int non_finite = 0;
  if (training && scaler_) {
    DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&non_finite, d_non_finite_.data(), sizeof(int),
                                                 cudaMemcpyDeviceToHost, ctx_->stream()));
  }
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&loss_sum, d_loss_.data(), sizeof(float),
                                               cudaMemcpyDeviceToHost, ctx_->stream()));
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&correct, d_correct_.data(), sizeof(int),
                                               cudaMemcpyDeviceToHost, ctx_->stream()));
  double weight_sum = 0;  // Class weights: the batch's sum of label weights.
  if (weighted) {
    DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&weight_sum, d_weight_sum_.data(), sizeof(double),
                                                 cudaMemcpyDeviceToHost, ctx_->stream()));
  }
  DPTRAIN_RETURN_IF_ERROR(ctx_->Synchronize());
  if (training) last_overflow_ = non_finite > 0;
  // The weighted kernel adds the mean itself (over the label weights); the others, sums.
  nn::BatchResult result{weighted ? loss_sum : static_cast<double>(loss_sum) / batch, correct,
                         non_finite > 0};
  if (weighted) result.weight = weight_sum;
  return result;
}

absl::Status CudaModel::SetClassWeights(const std::vector<double>& weights) {
  if (weights.empty()) return absl::OkStatus();
  if (loss_ != 0 || static_cast<int>(weights.size()) != classes_) {
    return absl::InvalidArgumentError(
        absl::StrCat(weights.size(), " class weights for a model of ", classes_,
                     " outputs (one per class, for softmax cross-entropy only)"));
  }
  double all = 0;
  for (size_t k = 0; k < weights.size(); ++k) {
    if (!(std::isfinite(weights[k]) && weights[k] >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("class weight ", weights[k], " (class ", k, ") is not finite and >= 0"));
    }
    all += weights[k];
  }
  DPTRAIN_ASSIGN_OR_RETURN(double* d, d_class_weights_.Ensure(*ctx_, classes_));
  DPTRAIN_RETURN_IF_ERROR(d_weight_sum_.Ensure(*ctx_, 2).status());
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d, weights.data(), weights.size() * sizeof(double),
                                               cudaMemcpyHostToDevice, ctx_->stream()));
  DPTRAIN_RETURN_IF_ERROR(ctx_->Synchronize());  // `weights` is the caller's.
  class_weights_ = weights;
  all_class_weights_ = all;
  return absl::OkStatus();
}

absl::StatusOr<nn::BatchResult> CudaModel::TrainStep(const float* images, nn::Targets targets,
                                                     int batch) {
  return Step(images, targets, batch, /*training=*/true);
}

absl::StatusOr<nn::BatchResult> CudaModel::Evaluate(const float* images, nn::Targets targets,
                                                    int batch) {
  return Step(images, targets, batch, /*training=*/false);
}

absl::Status CudaModel::ApplyUpdate(float learning_rate) {
  DPTRAIN_RETURN_IF_ERROR(sticky_);
  if (!optimizer_.has_value()) return NoOptimizer(name_);
  const OptimizerOptions& o = *optimizer_;
  const int64_t n = d_grads_.size();
  DPTRAIN_RETURN_IF_ERROR(Upload());
  if (exchanged_) {
    // The caller's (averaged) gradient replaces the device's. The next TrainStep waits for
    // this copy on the same stream before it writes grads_ again.
    DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_grads_.data(), grads_.data(), n * sizeof(float),
                                                 cudaMemcpyHostToDevice, ctx_->stream()));
  }
  if (o.name == "sgd") {
    float* momentum = nullptr;
    if (o.momentum != 0) {
      DPTRAIN_ASSIGN_OR_RETURN(momentum, d_momentum_.Ensure(*ctx_, n));
    }
    DPTRAIN_RETURN_IF_ERROR(SgdUpdate(d_weights_.data(), d_grads_.data(), momentum, n,
                                      learning_rate, o.momentum, o.weight_decay,
                                      /*first=*/optimizer_steps_ == 0, o.nesterov, ctx_->stream()));
  } else {  // adam, adamw (CreateOptimizer accepted the name).
    if (optimizer_steps_ == 0) {
      DPTRAIN_RETURN_IF_ERROR(d_exp_avg_.Ensure(*ctx_, n).status());
      DPTRAIN_RETURN_IF_ERROR(d_exp_avg_sq_.Ensure(*ctx_, n).status());
      DPTRAIN_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(d_exp_avg_.data(), 0, n * sizeof(float), ctx_->stream()));
      DPTRAIN_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(d_exp_avg_sq_.data(), 0, n * sizeof(float), ctx_->stream()));
    }
    DPTRAIN_RETURN_IF_ERROR(
        AdamUpdate(d_weights_.data(), d_grads_.data(), d_exp_avg_.data(), d_exp_avg_sq_.data(), n,
                   AdamScalarsAt(o, optimizer_steps_ + 1, learning_rate), ctx_->stream()));
  }
  ++optimizer_steps_;
  weights_newer_on_device_ = true;
  if (!exchanged_) return absl::OkStatus();
  // grads_ is the caller's until the copy above has read it.
  return ctx_->Synchronize();
}

absl::StatusOr<OptimizerState> CudaModel::ExportOptimizerState() const {
  DPTRAIN_RETURN_IF_ERROR(sticky_);
  if (!optimizer_.has_value()) return NoOptimizer(name_);
  OptimizerState state;
  state.steps = optimizer_steps_;
  if (optimizer_steps_ == 0) return state;  // No state yet, as on the CPU.
  const int64_t n = static_cast<int64_t>(weights_.size());
  auto down = [&](const DeviceBuffer<float>& from, std::vector<float>& to) -> absl::Status {
    to.resize(n);
    DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(to.data(), from.data(), n * sizeof(float),
                                                 cudaMemcpyDeviceToHost, ctx_->stream()));
    return absl::OkStatus();
  };
  if (optimizer_->name == "sgd") {
    if (optimizer_->momentum != 0)
      DPTRAIN_RETURN_IF_ERROR(down(d_momentum_, state.momentum_buffer));
  } else {
    DPTRAIN_RETURN_IF_ERROR(down(d_exp_avg_, state.exp_avg));
    DPTRAIN_RETURN_IF_ERROR(down(d_exp_avg_sq_, state.exp_avg_sq));
  }
  DPTRAIN_RETURN_IF_ERROR(ctx_->Synchronize());
  return state;
}

absl::Status CudaModel::ImportOptimizerState(OptimizerState state) {
  DPTRAIN_RETURN_IF_ERROR(sticky_);
  if (!optimizer_.has_value()) return NoOptimizer(name_);
  const int64_t n = static_cast<int64_t>(weights_.size());
  DPTRAIN_RETURN_IF_ERROR(CheckOptimizerState(state, n));
  const bool sgd = optimizer_->name == "sgd";
  // What the device's update reads after `steps` steps (the first one creates it).
  std::vector<std::pair<std::vector<float>*, DeviceBuffer<float>*>> needed;
  if (state.steps > 0 && sgd && optimizer_->momentum != 0) {
    needed.push_back({&state.momentum_buffer, &d_momentum_});
  } else if (state.steps > 0 && !sgd) {
    needed.push_back({&state.exp_avg, &d_exp_avg_});
    needed.push_back({&state.exp_avg_sq, &d_exp_avg_sq_});
  }
  for (const auto& [values, buffer] : needed) {
    if (values->empty()) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer state after ", state.steps,
                                                     " steps of ", optimizer_->name,
                                                     " lacks a vector its update needs"));
    }
  }
  for (const auto& [values, buffer] : needed) {
    DPTRAIN_ASSIGN_OR_RETURN(float* device, buffer->Ensure(*ctx_, n));
    DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device, values->data(), n * sizeof(float),
                                                 cudaMemcpyHostToDevice, ctx_->stream()));
  }
  // The host vectors go away with `state`: wait for the copies.
  DPTRAIN_RETURN_IF_ERROR(ctx_->Synchronize());
  optimizer_steps_ = state.steps;
  return absl::OkStatus();
}

void CudaModel::RecordStepOutcome(bool skipped) {
  if (scaler_) scaler_->Update(skipped);
}

absl::Status CudaModel::ApplySgd(float lr) {
  DPTRAIN_RETURN_IF_ERROR(sticky_);
  if (!(lr > 0)) return absl::InvalidArgumentError(absl::StrCat("lr must be > 0, got ", lr));
  if (scaler_) {
    scaler_->Update(last_overflow_);
    if (last_overflow_) return absl::OkStatus();  // Skipped, as GradScaler.step() would.
  }
  DPTRAIN_RETURN_IF_ERROR(Upload());
  DPTRAIN_RETURN_IF_ERROR(SgdUpdate(d_weights_.data(), d_grads_.data(), nullptr, d_weights_.size(),
                                    lr, 0.0f, 0.0f, true, false, ctx_->stream()));
  weights_newer_on_device_ = true;
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace dptrain
