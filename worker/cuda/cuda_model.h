// The CUDA backend's nn::Model: the CPU model's network, layout and initial weights (same
// seed, same values), computed on one GPU. The whole step runs on the device; the host
// vectors behind weights(), grads() and buffer_values() are brought up to date lazily, so
// only what the caller reads or writes crosses the bus:
//   - weights() copies the device weights down if the device changed them (ApplySgd), and
//     marks them to be copied up before the next step (the caller may write them);
//   - grads() / gradient_exchange(): nothing is copied until a caller asks. Once a caller
//     has asked for gradient_exchange() (a peer needs the gradient: all-reduce, PS), each
//     later step copies each layer's gradients down (into page-locked memory, on a second
//     stream) as soon as backward has produced them, overlapping the layers below, and the
//     accessors wait for the last copy (if the memory cannot be page-locked, they copy them
//     all instead). A lone replica never asks: its gradient never leaves the device, and
//     ApplyUpdate reads it there;
//   - buffer_values() likewise for batch norm's running statistics.
// Mixed precision (DeviceOptions::precision fp16/bf16): convolutions and dense products run
// on 16-bit copies (gpu_layers.h) and the rest in fp32, with fp32 master weights; the loss
// gradient is multiplied by the loss scale, each layer's gradients are unscaled and checked
// for inf/NaN as backward produces them, and TrainStep reports an overflow
// (BatchResult::overflow). RecordStepOutcome (or ApplySgd) then moves the scale with
// GradScaler's rule (common/loss_scaler.h).
//
// A failed copy inside those accessors (which cannot return a Status) is kept and returned
// by the next TrainStep, Evaluate or ApplySgd.
#ifndef DPTRAIN_WORKER_CUDA_CUDA_MODEL_H_
#define DPTRAIN_WORKER_CUDA_CUDA_MODEL_H_

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/loss_scaler.h"
#include "common/optimizer.h"
#include "worker/cuda/device_context.h"
#include "worker/cuda/gpu_layers.h"
#include "worker/cuda/step_graph.h"
#include "worker/graph/executor.h"
#include "worker/graph/graph_model.h"
#include "worker/nn/model.h"

namespace dptrain {
namespace cuda {

class CudaModel final : public nn::Model {
 public:
  // InvalidArgument as graph::CreateBuiltinModel for a bad name, init or optimizer; Unavailable
  // (naming the CUDA call) without a working GPU. options.threads is ignored.
  static absl::StatusOr<std::unique_ptr<CudaModel>> Create(const nn::ModelOptions& options,
                                                           const DeviceOptions& device);
  // A graph model (worker/graph/graph_model.h) on the GPU: the CPU executor's layout, names
  // and initial weights, each node run by its CUDA twin (gpu_graph.h). `cpu_ops` builds the
  // CPU plan. InvalidArgument / Unimplemented, one line naming the node, for a graph the CPU
  // executor refuses or a node without a twin; InvalidArgument for a loss other than
  // softmax cross-entropy (the only one on the GPU so far). options.threads is ignored.
  static absl::StatusOr<std::unique_ptr<CudaModel>> CreateFromGraph(
      const graph::Graph& graph, const graph::OpRegistry& cpu_ops,
      const graph::GraphModelOptions& options, const DeviceOptions& device);
  // A built-in network (mlp, lenet, resnet18) as its graph (worker/graph/builtin_models.h)
  // through CreateFromGraph: the same layout and initial weights as Create, each node run by
  // its twin. Create still builds the built-ins from their Sequential, the path verified on a
  // GPU; this one is verified against it by gpu_graph_test on a GPU before it replaces it.
  // The errors of both.
  static absl::StatusOr<std::unique_ptr<CudaModel>> CreateBuiltinFromGraph(
      const nn::ModelOptions& options, const DeviceOptions& device);
  ~CudaModel() override;

  const std::vector<nn::ParamInfo>& params() const override { return params_; }
  std::vector<float>& weights() override;
  absl::Span<const float> grads() const override;
  absl::Span<float> gradient_exchange() override;
  // The update rule of ModelOptions::optimizer (torch.optim.SGD with momentum and weight
  // decay, Adam, AdamW; their state on the device) where the weights are. The gradient:
  // what the caller left in gradient_exchange() if it asked for it since the last
  // TrainStep (the replicas' average goes up), else the device's own. The weights never
  // cross the bus.
  absl::Status ApplyUpdate(float learning_rate) override;
  // ApplyUpdate's state copied down from / up to the device (momentum, Adam's moments, the
  // step count), in the CPU model's layout: a checkpoint of either can resume on the other.
  absl::StatusOr<OptimizerState> ExportOptimizerState() const override;
  absl::Status ImportOptimizerState(OptimizerState state) override;
  const std::vector<nn::ParamInfo>& buffers() const override { return buffer_infos_; }
  std::vector<float>& buffer_values() override;
  absl::StatusOr<nn::BatchResult> TrainStep(const float* images, nn::Targets targets,
                                            int batch) override;
  absl::StatusOr<nn::BatchResult> Evaluate(const float* images, nn::Targets targets,
                                           int batch) override;
  // The training set in device memory (bytes and labels, up to half of the free memory; else
  // ResourceExhausted); a step then uploads only its samples and gathers, scales, normalises,
  // crops and flips them by one kernel (nn::HeldValue), the rest of the step as TrainStep's.
  bool CanHoldData() const override { return true; }
  // Results read later (fp32 only): each TrainStepHeld's loss and count go to a slot on the
  // device, and the step returns without waiting for the device; TakeResults copies them down.
  // TrainStep, whose batch is the caller's memory, still waits (BatchResult::deferred false).
  bool DeferResults(bool on) override;
  absl::StatusOr<std::vector<nn::BatchResult>> TakeResults() override;
  absl::Status HoldTrainingData(const nn::HeldData& data) override;
  // HoldTrainingData's copies into held_ (checked data; held_ empty).
  absl::Status CopyHeldData(const nn::HeldData& data);
  // With DeviceOptions::cuda_graphs, while results are deferred and the network is
  // Replayable (no dropout, no lookups) and no gradient copies run during backward: the first
  // step of a batch size runs eagerly, the next one is captured as a CUDA graph, and later
  // ones of that size replay it (one launch). Any eager step (another batch size, Evaluate,
  // TrainStep) or new held data drops the graph; a capture that fails keeps graphs off for
  // this model (graph_refusal says why) and the step runs eagerly.
  absl::StatusOr<nn::BatchResult> TrainStepHeld(absl::Span<const nn::HeldSample> samples) override;
  // Steps run by replaying a graph so far, and why graphs are off (OK: they are not).
  int64_t graph_replays() const { return graph_replays_; }
  const absl::Status& graph_refusal() const { return graph_refusal_; }
  std::string name() const override { return name_; }
  nn::Dims input_dims() const override;
  // A graph model's (its plan's): ids or images, and the bound ids must be below.
  bool input_is_ids() const override { return plan_ != nullptr && plan_->input_ids(); }
  int64_t input_id_limit() const override { return plan_ != nullptr ? plan_->input_id_limit() : 0; }
  int num_classes() const override { return classes_; }
  void RecordStepOutcome(bool skipped) override;

  // Plain SGD on the device, w -= lr * grads(), nothing crossing the bus: the single-GPU
  // training step of the benchmark. In fp16/bf16 it also records the step's outcome: after
  // an overflow it skips the update and backs the scale off. InvalidArgument for lr <= 0.
  absl::Status ApplySgd(float lr);

  // The loss scale of the next step (1 in fp32).
  float loss_scale() const override { return scaler_ ? scaler_->scale() : 1.0f; }
  // What the caching allocator handed out (blocks in use; the cache is not counted).
  int64_t device_memory_bytes() const override {
    return static_cast<int64_t>(ctx_->allocator().stats().in_use_bytes);
  }

  // See the top of the file: whether each step copies its gradients down during backward
  // (default: from the first gradient_exchange() on).
  void set_copy_grads_during_backward(bool on) { copy_grads_during_backward_ = on; }

  // Tests only: waits for all work and copies the device's gradient down whole, on the
  // compute stream, bypassing the copies of grads() (to check those bitwise).
  absl::StatusOr<std::vector<float>> DeviceGradsForTest() const;

  // Waits for everything enqueued (ApplySgd returns before its kernel ran).
  absl::Status Synchronize() { return ctx_->Synchronize(); }

  const std::string& device_name() const { return ctx_->device_name(); }

 private:
  CudaModel(std::string name, std::optional<OptimizerOptions> optimizer,
            std::unique_ptr<DeviceContext> ctx, std::optional<LossScaler> scaler,
            std::unique_ptr<GpuNetwork> net, std::vector<nn::ParamInfo> params,
            std::vector<float> weights, std::vector<nn::ParamInfo> buffers,
            std::vector<float> buffer_values);
  // The device, the loss scaler and the model around `net`, allocated. `plan` (may be null):
  // the CPU executor that a graph network follows, kept as long as the model.
  static absl::StatusOr<std::unique_ptr<CudaModel>> Assemble(
      std::string name, std::optional<OptimizerOptions> optimizer, const DeviceOptions& device,
      std::unique_ptr<graph::Executor<float>> plan, std::unique_ptr<GpuNetwork> net,
      std::vector<nn::ParamInfo> params, std::vector<float> weights,
      std::vector<nn::ParamInfo> buffers, std::vector<float> buffer_values, nn::Dims input_dims,
      int classes, double label_smoothing);
  absl::Status Allocate();
  // Checks the call, copies stale host state up and the batch in; then Run.
  absl::StatusOr<nn::BatchResult> Step(const float* images, nn::Targets targets, int batch,
                                       bool training);
  // The network, the loss and (training) backward on the batch at x (images) and y (labels)
  // in device memory.
  // `targets` (batch x classes_ values, for an element-wise loss) or labels `y`. `may_defer`:
  // the step's inputs are the model's own (held data), so it may return before they are read
  // (DeferResults); the host path's are the caller's, read before Run synchronises.
  absl::StatusOr<nn::BatchResult> Run(float* x, const nn::Label* y, const float* targets, int batch,
                                      bool training, bool may_defer);
  // Run's device work: forward, the loss summed into *loss_sum_at and the correct answers
  // counted into *correct_at (both zeroed first), and (training) backward. Nothing waits for
  // the device, so a CUDA graph may capture it.
  absl::Status EnqueueStep(float* x, const nn::Label* y, const float* targets, int batch,
                           bool training, float* loss_sum_at, int* correct_at);
  // The host's record of a training step whose backward is enqueued.
  void NoteBackwardEnqueued();
  // Drops the step graph before anything it reads or writes may move or be set up for another
  // batch size; the next held step then runs eagerly before a capture.
  void DropStepGraph();
  // TrainStepHeld's replay of the step graph (captured first if there is none), the samples
  // at `samples` on the device; Unavailable if the capture failed (nothing ran then).
  absl::StatusOr<nn::BatchResult> ReplayHeldStep(float* x, nn::Label* y,
                                                 const nn::HeldSample* samples, int batch);
  absl::Status Upload();
  absl::Status DownloadWeights();
  absl::Status DownloadGrads() const;
  absl::Status DownloadBuffers();
  // GpuSequentialBlock::GradsReady: enqueues the copy of one layer's gradients.
  absl::Status CopyGradsOut(int layer, int64_t offset, int64_t size);
  bool CopiesDuringBackward() const { return copy_grads_during_backward_ && grads_pinned_; }
  // Waits for the gradient copies of the last step, if any are in flight.
  absl::Status WaitForGradCopies() const;
  // Brings grads_ up to date (the accessors).
  void SyncGradsToHost() const;

  const std::string name_;
  nn::Dims input_dims_ = nn::kImageDims;  // One sample, and the output size: from the network.
  int classes_ = nn::kNumClasses;
  double label_smoothing_ = 0;  // Softmax cross-entropy's (nn.CrossEntropyLoss's).
  // graph::Loss: 0 softmax cross-entropy, else nn::ElementLossOf's mse, l1 or bce.
  int loss_ = 0;
  // Softmax cross-entropy's class weights (nn.CrossEntropyLoss's weight=; empty: none) and their
  // sum (on the device: d_class_weights_).
  std::vector<double> class_weights_;
  double all_class_weights_ = 0;
  // Checks and keeps them (after Assemble: the class count and loss are known).
  absl::Status SetClassWeights(const std::vector<double>& weights);
  const std::optional<OptimizerOptions> optimizer_;  // ApplyUpdate's rule.
  // Declared first so that it is destroyed last: every buffer below returns to its cache.
  std::unique_ptr<DeviceContext> ctx_;
  std::unique_ptr<graph::Executor<float>> plan_;  // A graph network's plan (else null).
  std::unique_ptr<GpuNetwork> net_;
  std::vector<nn::ParamInfo> params_;
  std::vector<nn::ParamInfo> buffer_infos_;
  std::vector<float> weights_;
  mutable std::vector<float> grads_;  // The gradient, then the overflow flag's slot.
  std::vector<float> buffer_values_;
  // Offsets of the num_batches_tracked buffers, once per node that counts into each.
  std::vector<int64_t> batch_counters_;

  DeviceBuffer<float> d_weights_;
  DeviceBuffer<float> d_grads_;
  DeviceBuffer<float> d_buffers_;
  DeviceBuffer<float> d_images_;
  DeviceBuffer<nn::Label> d_labels_;
  DeviceBuffer<float> d_targets_;  // A batch's target values (element-wise losses).
  // The class weights, and a batch's sum of its label weights and that sum's inverse.
  DeviceBuffer<double> d_class_weights_, d_weight_sum_;
  DeviceBuffer<float> d_grad_logits_;
  DeviceBuffer<float> d_loss_;  // [0]: summed loss
  DeviceBuffer<int> d_correct_;
  DeviceBuffer<int> d_non_finite_;  // inf/NaN gradients seen while unscaling
  DeviceBuffer<float> d_momentum_;  // ApplyUpdate's momentum buffer (sgd)
  DeviceBuffer<float> d_exp_avg_;   // ApplyUpdate's moments (adam, adamw)
  DeviceBuffer<float> d_exp_avg_sq_;
  int64_t optimizer_steps_ = 0;
  // The held training set (HoldTrainingData): size 0 until then.
  struct HeldSet {
    int64_t size = 0;
    DeviceBuffer<uint8_t> bytes;
    DeviceBuffer<nn::Label> labels;
    DeviceBuffer<float> per_channel;  // mean, inv_std and fill, where given.
    const float* mean = nullptr;
    const float* inv_std = nullptr;
    const float* fill = nullptr;
  };
  HeldSet held_;
  // DeferResults: per pending step its loss sum and correct count (kMaxDeferredSteps slots,
  // zeroed by the step that writes it), and its batch size.
  bool deferring_ = false;
  DeviceBuffer<float> d_deferred_loss_;
  DeviceBuffer<int> d_deferred_correct_;
  std::vector<int> pending_batches_;
  DeviceBuffer<nn::HeldSample> d_held_samples_;
  // Page-locked slots the held samples go up from, used in turn; `copied` is recorded after a
  // slot's copy, which the slot's next use waits for.
  struct Staging {
    nn::HeldSample* host = nullptr;
    size_t capacity = 0;
    cudaEvent_t copied = nullptr;
  };
  std::array<Staging, 2> staging_;
  int next_staging_ = 0;
  // The held step as a CUDA graph (TrainStepHeld): its batch size, the batch size of the last
  // eager held step (a capture needs one of the same size just before), the replays, and why
  // graphs are off for this model (OK: they are not).
  StepGraph step_graph_;
  int graph_batch_ = 0;
  int warm_batch_ = 0;
  int64_t graph_replays_ = 0;
  absl::Status graph_refusal_;
  // The samples in the next staging slot (waiting for its last copy first).
  absl::StatusOr<const nn::HeldSample*> StageSamples(absl::Span<const nn::HeldSample> samples);

  std::optional<LossScaler> scaler_;  // fp16/bf16 only
  bool last_overflow_ = false;

  cudaStream_t copy_stream_ = nullptr;   // Device-to-host gradient copies.
  std::vector<cudaEvent_t> layer_done_;  // Per part of the network: its backward was enqueued.
  bool grads_pinned_ = false;            // grads_ is page-locked (cudaHostRegister).
  bool copy_grads_during_backward_ = false;
  bool exchanged_ = false;  // gradient_exchange() was handed out since the last TrainStep.
  mutable bool grad_copies_in_flight_ = false;

  bool weights_up_to_date_on_device_ = false;  // Else the host's are copied up first.
  bool weights_newer_on_device_ = false;       // ApplySgd ran since the last download.
  // Where the last step's gradients are: grads_ (zeros before the first step), being copied
  // there during backward, or on the device only.
  enum class Grads { kOnHost, kCopying, kOnDevice };
  mutable Grads grads_at_ = Grads::kOnHost;
  bool buffers_up_to_date_on_device_ = false;
  bool buffers_newer_on_device_ = false;
  int64_t uncounted_batches_ = 0;  // Training steps not yet in the host's num_batches_tracked.
  mutable absl::Status sticky_;    // A failed lazy copy, returned by the next call.
};

}  // namespace cuda
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_CUDA_CUDA_MODEL_H_
