// The worker's model: a network with its parameters and gradients in flat fp32 buffers, laid out
// exactly as the parameter server and the all-reduce see them, plus one call for a training step
// (forward + backward) and one for evaluation.
//
// Backends implement Model: on the CPU, worker/graph's graph model (the built-in networks are
// graphs too: worker/graph/builtin_models.h's CreateBuiltinModel); on a GPU, the CUDA
// backend's. A Model is not
// thread-safe: one thread at a time may call it, and buffers returned by weights()/grads() are
// only stable between calls from that thread.
#ifndef DPTRAIN_WORKER_NN_MODEL_H_
#define DPTRAIN_WORKER_NN_MODEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/optimizer.h"
#include "worker/nn/architectures.h"
#include "worker/nn/held_data.h"
#include "worker/nn/sequential.h"
#include "worker/nn/thread_pool.h"

namespace dptrain {
namespace nn {

// One learnable tensor: its PyTorch state_dict name, its shape and where it lies in the flat
// weights()/grads() buffers.
struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset;
  int64_t size;
};

struct BatchResult {
  double loss;      // The mean loss over the batch (softmax cross-entropy, or the model's).
  int64_t correct;  // Samples with argmax(logits) == label (0 for regression targets).
  // Mixed precision: grads() has inf/NaN at the current loss scale; the step must not be
  // applied (by anyone: the flag travels in gradient_exchange()). Always false in fp32.
  bool overflow = false;
  // TrainStep: the forward pass (with the loss) and the backward pass, where the backend
  // measured them (the CPU model; -1 elsewhere, e.g. a GPU's asynchronous launches).
  double forward_seconds = -1;
  double backward_seconds = -1;
  // What `loss` is a mean over, so that batches combine (sum(loss * weight) / sum(weight)):
  // with class weights, the sum of the samples' label weights; -1: the batch's samples (every
  // other loss). LossWeight() reads it.
  double weight = -1;
  // A training step under Model::DeferResults: the step was enqueued, its loss and correct
  // count are not known yet (0 here); TakeResults gives them.
  bool deferred = false;
};

// `result`'s weight (BatchResult::weight) for a batch of `batch` samples.
inline double LossWeight(const BatchResult& result, int batch) {
  return result.weight >= 0 ? result.weight : batch;
}

class Model {
 public:
  virtual ~Model() = default;

  // Parameters in a fixed order, named as PyTorch's state_dict names the equivalent
  // nn.Sequential of the d2l code ("1.weight", "1.bias", ...). Offsets are increasing and the
  // tensors lie back to back: the sizes sum to weights().size().
  virtual const std::vector<ParamInfo>& params() const = 0;

  // All parameters back to back (flat fp32). The caller may overwrite the values between steps
  // (e.g. with weights pulled from the parameter server), or even assign a new vector of the same
  // size; a step with a vector of another size fails with FailedPrecondition.
  virtual std::vector<float>& weights() = 0;
  // d(mean loss)/d(weights) of the last TrainStep, in the layout of weights(); zeros before the
  // first step. After a GradientReducer averaged gradient_exchange(), the average.
  virtual absl::Span<const float> grads() const = 0;

  // The gradient as a synchroniser exchanges it (worker/comm/step_sync.h): grads() followed
  // by one slot, the last TrainStep's overflow flag (1 if BatchResult::overflow, else 0).
  // A reducer averages it in place and ApplyUpdate then applies the average; a parameter
  // store reads it. A model whose gradient lives on a device copies it to the host for this
  // (and only for this: a lone replica never asks).
  virtual absl::Span<float> gradient_exchange() = 0;

  // The model's own update rule (ModelOptions::optimizer) at `learning_rate` (the
  // schedule's rate of this step) on its weights, with grads() (or what a reducer left in
  // gradient_exchange()): all-reduce mode, where every replica applies the same averaged
  // gradient. Optimizer state (momentum, Adam's moments) stays with the model.
  // FailedPrecondition for a model made without an optimizer.
  virtual absl::Status ApplyUpdate(float learning_rate) = 0;

  // ApplyUpdate's optimizer state, whole-model vectors in the layout of weights() (empty until
  // the optimizer first needs one), for all-reduce mode's checkpoints: every replica holds the
  // same. FailedPrecondition without an optimizer; Unimplemented where the model cannot export
  // it (the default).
  virtual absl::StatusOr<OptimizerState> ExportOptimizerState() const;
  // Replaces that state (from a checkpoint). InvalidArgument for a vector that is neither empty
  // nor of weights()'s size, or a negative step count; the state is unchanged then.
  virtual absl::Status ImportOptimizerState(OptimizerState state);

  // Buffers: non-learnt state (batch norm's running_mean, running_var and num_batches_tracked),
  // named and shaped as in PyTorch's state_dict ("0.1.running_mean", a scalar [] for
  // num_batches_tracked, which PyTorch stores as int64 and this model as a float count). They are
  // NOT in weights()/grads(), so the parameter server never averages them: TrainStep updates
  // them locally from each batch, Evaluate reads them. Laid out like params(): back to back in
  // buffer_values(), whose values the caller may overwrite (e.g. from a checkpoint) or replace
  // with a vector of the same size. Empty for models without batch norm (mlp, lenet).
  virtual const std::vector<ParamInfo>& buffers() const { return no_buffers_; }
  virtual std::vector<float>& buffer_values() { return no_buffer_values_; }

  // Forward + backward on `batch` images (batch * input_dims().size() floats, NCHW) with
  // labels in [0, num_classes()), or target values (num_classes() per sample: regression, for a
  // model whose loss takes them). Overwrites grads() with d(mean loss)/d(weights).
  // InvalidArgument for batch < 1, null pointers or a label out of range; Unimplemented for
  // target values to a model whose loss needs labels (softmax cross-entropy); grads() is
  // unchanged then. Batch norm runs in training mode (batch
  // statistics, buffers updated), so for resnet18 the gradient of a batch of 2b is NOT the mean
  // of the gradients of its halves, unlike mlp and lenet (and as with PyTorch's DDP without
  // SyncBatchNorm, each worker normalises with its own batch's statistics).
  virtual absl::StatusOr<BatchResult> TrainStep(const float* images, Targets targets,
                                                int batch) = 0;
  // A training set kept where the model computes (a GPU's memory; held_data.h), so that a
  // step sends only its samples' indices and augmentation choices. CanHoldData: whether the
  // model can (false by default: the caller gathers each batch for TrainStep).
  virtual bool CanHoldData() const { return false; }
  // Keeps a copy of `data` (replacing one held before). InvalidArgument for arrays that do not
  // match its size and shape, or a label out of range; ResourceExhausted where it does not fit
  // (the caller then gathers batches as before); Unimplemented by default.
  virtual absl::Status HoldTrainingData(const HeldData& data);
  // TrainStep on the batch of held samples `samples` (each value HeldValue of its image):
  // the same result as TrainStep on that batch gathered on the host. FailedPrecondition before
  // HoldTrainingData; InvalidArgument for no samples or an index outside the held set;
  // Unimplemented by default.
  virtual absl::StatusOr<BatchResult> TrainStepHeld(absl::Span<const HeldSample> samples);
  // Step results read later, so that a step need not wait for its device (a GPU's loss and
  // accuracy stay there until asked). DeferResults(true) asks for it and returns whether the
  // model does it (false by default, and for a step that must be read at once: mixed
  // precision's overflow decides the next update); from then on a training step may return
  // BatchResult::deferred (where its inputs are the model's own: a GPU's TrainStepHeld; a
  // step that returns its results says so by the flag's being false), and TakeResults returns
  // the deferred steps' results in order (waiting for them) and forgets them. At most
  // kMaxDeferredSteps may be pending: a step past that fails with FailedPrecondition.
  // DeferResults(false) only after TakeResults left none pending.
  static constexpr int kMaxDeferredSteps = 1024;
  virtual bool DeferResults(bool on) { return false; }
  virtual absl::StatusOr<std::vector<BatchResult>> TakeResults() {
    return std::vector<BatchResult>{};
  }
  // Forward only, in evaluation mode (batch norm uses the running statistics of buffers()).
  // Leaves grads() and the buffers alone. Same errors as TrainStep.
  virtual absl::StatusOr<BatchResult> Evaluate(const float* images, Targets targets, int batch) = 0;

  // Mixed precision: after the gradient of the last TrainStep went through the optimizer
  // path, whether that step was skipped (by any worker's overflow): the loss scale backs off
  // or grows, as GradScaler's update(). No-op for fp32 models.
  virtual void RecordStepOutcome(bool skipped) {}

  // "mlp", "lenet" or "resnet18".
  virtual std::string name() const = 0;
  // The shape of one input sample (1x28x28 for the built-in networks): TrainStep and
  // Evaluate read batch * input_dims().size() floats, so the caller checks its data against
  // it once, before any step (worker/data/batch.h).
  virtual Dims input_dims() const = 0;
  // Whether a sample is integer ids (token or category ids for embedding tables, as floats:
  // a graph model with an int64 input, graph.h) rather than image or feature values. Data of
  // the other kind is refused before any step (worker/data/batch.h).
  virtual bool input_is_ids() const { return false; }
  // Ids must be below this (the fewest rows of the embedding tables that read them), known
  // before any step; 0: no bound known beforehand (a step still refuses an id that is not a
  // row of its table).
  virtual int64_t input_id_limit() const { return 0; }
  // The classes the model tells apart (its output's size): labels are in [0, num_classes()).
  // For regression, the values it predicts per sample (as many targets per sample).
  virtual int num_classes() const = 0;

  // For the metrics: the loss scale of the next step (1 without mixed precision), and the
  // device memory the model's allocator has handed out (-1: none, e.g. the CPU).
  virtual float loss_scale() const { return 1.0f; }
  virtual int64_t device_memory_bytes() const { return -1; }

 protected:
  // The FailedPrecondition of ApplyUpdate without an optimizer.
  static absl::Status NoOptimizer(const std::string& model);
  // ImportOptimizerState's InvalidArgument: why `state` cannot be the optimizer state of
  // `num_params` weights, or OK.
  static absl::Status CheckOptimizerState(const OptimizerState& state, int64_t num_params);

 private:
  const std::vector<ParamInfo> no_buffers_;
  std::vector<float> no_buffer_values_;
};

struct ModelOptions {
  std::string name;  // "mlp" | "lenet" | "resnet18"
  // Seeds the deterministic initialisation: the same seed gives bit-identical weights.
  uint64_t seed = 0;
  // Math threads. > 1: under DenseGemm::kPoolSplit the model owns an intra-op pool of this many
  // threads (the caller's included) over which the layers split each batch (samples for
  // convolutions and Linear's forward, channels for batch norm, element ranges for
  // activations), and sets OpenBLAS to 1 thread (process-wide!), each pool thread running its
  // own single-threaded GEMMs; under kBlasThreads there is no pool and OpenBLAS is set to this
  // many threads (process-wide). 1: no pool, OpenBLAS set to 1 thread. 0: no pool, the BLAS
  // default left alone. Results depend on the thread count (the per-thread partial weight
  // gradients are summed in thread order) but not on scheduling: the same threads give
  // bit-identical results.
  int threads = 0;
  // Weight initialisation: "default" (the model's d2l choice) | "normal" | "xavier" | "kaiming";
  // see InitializeParams in architectures.h. Biases 0, batch-norm weights 1 in every case.
  std::string init = "default";
  // Softmax cross-entropy's label smoothing (nn.CrossEntropyLoss's label_smoothing), in [0, 1).
  double label_smoothing = 0;
  // Softmax cross-entropy's class weights (nn.CrossEntropyLoss's weight): one per class, each
  // >= 0; empty: none (the CPU only so far).
  std::vector<double> class_weights;
  // The update rule of ApplyUpdate (all-reduce mode); none where a parameter server
  // applies it (ps, master).
  std::optional<OptimizerOptions> optimizer;
  // With threads > 1: how the model uses those threads (thread_pool.h's DenseGemm: a pool the
  // layers split over, BLAS's own threads for whole GEMMs and no pool, or by the measured
  // rule: BLAS threads for a model without convolutions).
  DenseGemm dense_gemm = DenseGemm::kPoolSplit;
  // How the float convolutions compute (layer.h's ConvAlgorithm). kAuto: oneDNN where the
  // measured rule (onednn_conv.h's PreferOneDnn) says it is faster, for a model with a pool
  // (threads >= 1: at threads == 1 a model with convolutions gets a pool of one thread, which
  // runs everything on the caller, so that the layers share oneDNN's batch-sized scratch).
  ConvAlgorithm conv_algorithm = ConvAlgorithm::kAuto;
  // The input and class count the network is built for (the data's; architectures.h).
  NetworkShape shape;
};

// What the CUDA backend builds a built-in network from: the CPU network (layers, dims, layout)
// and the initial weights the CPU model of it has (the same InitializeParams), and the
// ParamInfo lists of its
// parameters and buffers, named "<layer index>.<name>" as Model::params()/buffers().
struct InitialNetwork {
  Sequential<float> net;
  std::vector<float> weights;
};
absl::StatusOr<InitialNetwork> BuildInitialNetwork(const ModelOptions& options);
std::vector<ParamInfo> DescribeParams(const Sequential<float>& net);
std::vector<ParamInfo> DescribeBuffers(const Sequential<float>& net);

// The argument checks of TrainStep and Evaluate, shared by the backends: InvalidArgument for
// batch < 1, null images, no targets (or both labels and values), or a label outside
// [0, classes) (naming the sample).
absl::Status CheckBatch(const float* images, Targets targets, int batch, int classes);

// How a model uses `threads` math threads (ModelOptions::threads and dense_gemm, whose comments
// say the rules; `convolutions`: whether it has any): the pool to hand its layers (null: none)
// and the BLAS threads to set (process-wide) once the model is known to build (0: leave BLAS
// alone).
struct MathThreads {
  std::unique_ptr<ThreadPool> pool;
  int blas_threads = 0;
};
MathThreads PlanMathThreads(int threads, DenseGemm dense_gemm, bool convolutions);

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_MODEL_H_
