// CudaModel's held training set (HoldTrainingData, TrainStepHeld), its deferred results
// and the step replayed as a CUDA graph (DeviceOptions::cuda_graphs, step_graph.h).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/cuda/cuda_model.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/kernels.h"
#include "worker/nn/batch_sample.h"

namespace dptrain {
namespace cuda {

absl::Status CudaModel::HoldTrainingData(const nn::HeldData& data) {
  DPTRAIN_RETURN_IF_ERROR(sticky_);
  const nn::Dims dims = input_dims_;
  const int64_t image = int64_t{data.channels} * data.rows * data.cols;
  const size_t channels = static_cast<size_t>(std::max(data.channels, 0));
  if (data.mean.size() != data.inv_std.size() ||
      (!data.mean.empty() && data.mean.size() != channels) ||
      (!data.fill.empty() && data.fill.size() != channels)) {
    return absl::InvalidArgumentError(
        absl::StrCat("held data of ", data.channels, " channels with ", data.mean.size(),
                     " means, ", data.inv_std.size(), " inverse deviations and ", data.fill.size(),
                     " fill values (one per channel each, or none)"));
  }
  if (input_is_ids() || data.channels != dims.c || data.rows != dims.h || data.cols != dims.w ||
      data.size < 1 || static_cast<int64_t>(data.bytes.size()) != data.size * image ||
      static_cast<int64_t>(data.labels.size()) != data.size) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": held data of ", data.size, " images of ", data.channels, "x", data.rows, "x",
        data.cols, " (", data.bytes.size(), " bytes, ", data.labels.size(),
        " labels) does not match the model's input ", dims.c, "x", dims.h, "x", dims.w));
  }
  for (int64_t i = 0; i < data.size; ++i) {
    if (data.labels[i] < 0 || data.labels[i] >= classes_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "held sample ", i, " has label ", data.labels[i], ", not in [0, ", classes_, ")"));
    }
  }
  // At most half of what the device has free: the steps' activations need the rest.
  size_t free_bytes = 0, total_bytes = 0;
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  const double needed = static_cast<double>(data.bytes.size()) +
                        static_cast<double>(data.labels.size()) * sizeof(nn::Label);
  if (needed > 0.5 * static_cast<double>(free_bytes)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the training set's ", static_cast<int64_t>(needed / (1 << 20)),
        " MiB would take more than half of the GPU's free ", free_bytes >> 20, " MiB"));
  }
  DropStepGraph();  // It reads the held set it was captured with.
  held_ = HeldSet{};
  if (absl::Status s = CopyHeldData(data); !s.ok()) {
    held_ = HeldSet{};  // Nothing half held: its memory goes back.
    return s;
  }
  return absl::OkStatus();
}

absl::Status CudaModel::CopyHeldData(const nn::HeldData& data) {
  const int64_t image = int64_t{data.channels} * data.rows * data.cols;
  const size_t channels = static_cast<size_t>(data.channels);
  DPTRAIN_ASSIGN_OR_RETURN(uint8_t * bytes, held_.bytes.Ensure(*ctx_, data.size * image));
  DPTRAIN_ASSIGN_OR_RETURN(nn::Label * labels, held_.labels.Ensure(*ctx_, data.size));
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(bytes, data.bytes.data(), data.bytes.size(),
                                               cudaMemcpyHostToDevice, ctx_->stream()));
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(labels, data.labels.data(),
                                               data.labels.size() * sizeof(nn::Label),
                                               cudaMemcpyHostToDevice, ctx_->stream()));
  // mean, inv_std, fill: per channel each, back to back where given.
  std::vector<float> per_channel = data.mean;
  per_channel.insert(per_channel.end(), data.inv_std.begin(), data.inv_std.end());
  per_channel.insert(per_channel.end(), data.fill.begin(), data.fill.end());
  if (!per_channel.empty()) {
    DPTRAIN_ASSIGN_OR_RETURN(float* d, held_.per_channel.Ensure(*ctx_, per_channel.size()));
    DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d, per_channel.data(),
                                                 per_channel.size() * sizeof(float),
                                                 cudaMemcpyHostToDevice, ctx_->stream()));
  }
  DPTRAIN_RETURN_IF_ERROR(ctx_->Synchronize());  // The caller's arrays may go now.
  const float* d = held_.per_channel.data();
  held_.mean = data.mean.empty() ? nullptr : d;
  held_.inv_std = data.mean.empty() ? nullptr : d + channels;
  held_.fill = data.fill.empty() ? nullptr : d + (data.mean.empty() ? 0 : 2 * channels);
  held_.size = data.size;
  return absl::OkStatus();
}

absl::StatusOr<const nn::HeldSample*> CudaModel::StageSamples(
    absl::Span<const nn::HeldSample> samples) {
  Staging& slot = staging_[next_staging_];
  if (slot.copied == nullptr) {
    DPTRAIN_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
  } else {
    DPTRAIN_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot.copied));  // Its last copy is done.
  }
  if (slot.capacity < samples.size()) {
    if (slot.host != nullptr) DPTRAIN_CUDA_RETURN_IF_ERROR(cudaFreeHost(slot.host));
    slot.host = nullptr;
    slot.capacity = 0;
    DPTRAIN_CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&slot.host),
                                               samples.size() * sizeof(nn::HeldSample),
                                               cudaHostAllocDefault));
    slot.capacity = samples.size();
  }
  std::copy(samples.begin(), samples.end(), slot.host);
  return slot.host;
}

absl::StatusOr<nn::BatchResult> CudaModel::TrainStepHeld(absl::Span<const nn::HeldSample> samples) {
  DPTRAIN_RETURN_IF_ERROR(sticky_);
  if (held_.size == 0) {
    return absl::FailedPreconditionError(absl::StrCat(name_, ": no training data held"));
  }
  if (samples.empty() || samples.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(samples.size(), " held samples in a batch"));
  }
  for (size_t i = 0; i < samples.size(); ++i) {
    if (samples[i].index < 0 || samples[i].index >= held_.size) {
      return nn::AtBatchSample(absl::InvalidArgumentError(absl::StrCat(
                                   nn::BatchSampleText(static_cast<int64_t>(i)), " is held sample ",
                                   samples[i].index, ", outside the ", held_.size, " held")),
                               static_cast<int>(i));
    }
  }
  // The buffers below grow for a larger batch (a grown one frees its old block): a graph of
  // another batch size goes first.
  if (step_graph_.ready() && samples.size() != static_cast<size_t>(graph_batch_)) {
    DropStepGraph();
  }
  DPTRAIN_RETURN_IF_ERROR(Upload());
  const int batch = static_cast<int>(samples.size());
  const nn::Dims dims = input_dims_;
  DPTRAIN_ASSIGN_OR_RETURN(float* x, d_images_.Ensure(*ctx_, int64_t{batch} * dims.size()));
  DPTRAIN_ASSIGN_OR_RETURN(nn::Label * y, d_labels_.Ensure(*ctx_, batch));
  DPTRAIN_ASSIGN_OR_RETURN(nn::HeldSample * s, d_held_samples_.Ensure(*ctx_, batch));
  // Through a page-locked slot of our own: the copy is asynchronous, and the caller's samples
  // may go as soon as this returns, though the step (deferred) may not have run yet.
  DPTRAIN_ASSIGN_OR_RETURN(const nn::HeldSample* staged, StageSamples(samples));
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(s, staged, batch * sizeof(nn::HeldSample),
                                               cudaMemcpyHostToDevice, ctx_->stream()));
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaEventRecord(staging_[next_staging_].copied, ctx_->stream()));
  next_staging_ = 1 - next_staging_;
  // The step graph (see the header): the copy above stays outside it (its slot alternates).
  const bool replayable = ctx_->options().cuda_graphs && graph_refusal_.ok() && deferring_ &&
                          !CopiesDuringBackward() && net_->Replayable() &&
                          pending_batches_.size() < static_cast<size_t>(kMaxDeferredSteps);
  if (replayable && (step_graph_.ready() ? batch == graph_batch_ : batch == warm_batch_)) {
    absl::StatusOr<nn::BatchResult> replayed = ReplayHeldStep(x, y, s, batch);
    if (replayed.ok() || graph_refusal_.ok()) return replayed;
    // The capture failed and ran nothing: this step runs eagerly, as every later one.
  }
  DPTRAIN_RETURN_IF_ERROR(GatherHeldBatch(held_.bytes.data(), held_.labels.data(), s, batch, dims.c,
                                          dims.h, dims.w, held_.mean, held_.inv_std, held_.fill, x,
                                          y, ctx_->stream()));
  absl::StatusOr<nn::BatchResult> result =
      Run(x, y, nullptr, batch, /*training=*/true, /*may_defer=*/true);
  warm_batch_ = result.ok() ? batch : 0;
  return result;
}

absl::StatusOr<nn::BatchResult> CudaModel::ReplayHeldStep(float* x, nn::Label* y,
                                                          const nn::HeldSample* samples,
                                                          int batch) {
  if (grad_copies_in_flight_) DPTRAIN_RETURN_IF_ERROR(WaitForGradCopies());
  if (!step_graph_.ready()) {
    // The graph writes the step's loss and count to d_loss_ and d_correct_; each replay's are
    // then copied to its slot.
    absl::Status captured = step_graph_.Capture(ctx_->stream(), [&]() -> absl::Status {
      DPTRAIN_RETURN_IF_ERROR(GatherHeldBatch(
          held_.bytes.data(), held_.labels.data(), samples, batch, input_dims_.c, input_dims_.h,
          input_dims_.w, held_.mean, held_.inv_std, held_.fill, x, y, ctx_->stream()));
      return EnqueueStep(x, y, nullptr, batch, /*training=*/true, d_loss_.data(),
                         d_correct_.data());
    });
    if (!captured.ok()) {
      graph_refusal_ = absl::UnavailableError(
          absl::StrCat(name_, ": the step cannot be captured as a CUDA graph (", captured.message(),
                       "); it runs eagerly"));
      return graph_refusal_;
    }
    graph_batch_ = batch;
  }
  if (absl::Status launched = step_graph_.Launch(ctx_->stream()); !launched.ok()) {
    DropStepGraph();
    graph_refusal_ = launched;  // Later steps run eagerly; this one reports the failure.
    return launched;
  }
  ++graph_replays_;
  NoteBackwardEnqueued();
  const size_t slot = pending_batches_.size();
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_deferred_loss_.data() + slot, d_loss_.data(),
                                               sizeof(float), cudaMemcpyDeviceToDevice,
                                               ctx_->stream()));
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_deferred_correct_.data() + slot, d_correct_.data(),
                                               sizeof(int), cudaMemcpyDeviceToDevice,
                                               ctx_->stream()));
  pending_batches_.push_back(batch);
  nn::BatchResult pending{0, 0};
  pending.deferred = true;
  return pending;
}

bool CudaModel::DeferResults(bool on) {
  if (!on) {
    if (!pending_batches_.empty()) return deferring_;  // TakeResults first.
    deferring_ = false;
    return false;
  }
  // Mixed precision reads each step's overflow; class weights, each step's sum of them.
  if (scaler_ || !class_weights_.empty() || !sticky_.ok()) return false;
  // The slots (each zeroed by the step that writes it).
  if (!d_deferred_loss_.Ensure(*ctx_, kMaxDeferredSteps).ok() ||
      !d_deferred_correct_.Ensure(*ctx_, kMaxDeferredSteps).ok()) {
    return false;
  }
  deferring_ = true;
  return true;
}

absl::StatusOr<std::vector<nn::BatchResult>> CudaModel::TakeResults() {
  DPTRAIN_RETURN_IF_ERROR(sticky_);
  const size_t n = pending_batches_.size();
  std::vector<nn::BatchResult> results;
  if (n == 0) return results;
  std::vector<float> loss_sums(n);
  std::vector<int> correct(n);
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(loss_sums.data(), d_deferred_loss_.data(),
                                               n * sizeof(float), cudaMemcpyDeviceToHost,
                                               ctx_->stream()));
  DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(correct.data(), d_deferred_correct_.data(),
                                               n * sizeof(int), cudaMemcpyDeviceToHost,
                                               ctx_->stream()));
  DPTRAIN_RETURN_IF_ERROR(ctx_->Synchronize());
  for (size_t i = 0; i < n; ++i) {
    results.push_back(
        nn::BatchResult{static_cast<double>(loss_sums[i]) / pending_batches_[i], correct[i]});
  }
  pending_batches_.clear();
  return results;
}

}  // namespace cuda
}  // namespace dptrain
