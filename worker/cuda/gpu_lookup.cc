#include "worker/cuda/gpu_lookup.h"

#include <cuda_runtime_api.h>

#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/graph_kernels.h"
#include "worker/cuda/graph_operand.h"
#include "worker/cuda/index_plan.h"
#include "worker/graph/element_sources.h"

namespace dptrain {
namespace cuda {
namespace {

class LookupTwin final : public OperandNodeTwin {
 public:
  LookupTwin(const graph::NodeImpl<float>& cpu, nn::Dims ids_dims)
      : OperandNodeTwin(cpu.twin()), cpu_(cpu), ids_dims_(ids_dims) {
    const graph::TwinSpec<float> spec = cpu.twin();
    rows_ = spec.lookup_rows;
    row_ = spec.lookup_row;
    padding_ = spec.lookup_padding;
  }

  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, absl::Span<const DeviceTensor> inputs,
                                       bool) override {
    ids_ = inputs[0];
    const int64_t n = ids_.size();
    host_ids_.resize(n);
    if (n > 0) {
      DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_ids_.data(), ids_.data, n * sizeof(float),
                                                   cudaMemcpyDeviceToHost, ctx.stream()));
    }
    DPTRAIN_RETURN_IF_ERROR(ctx.Synchronize());
    // The CPU node's check and message (the ids' sample and position, the table's name).
    const nn::TensorRef<float> host{host_ids_.data(), ids_.batch, ids_.dims};
    DPTRAIN_RETURN_IF_ERROR(cpu_.CheckInputs(absl::MakeConstSpan(&host, 1), /*training=*/true));
    DPTRAIN_ASSIGN_OR_RETURN(const float* table, operand_->Values(ctx));
    DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, n * row_));
    DPTRAIN_RETURN_IF_ERROR(LookupForward(table, ids_.data, row_, y, n * row_, ctx.stream()));
    return DeviceTensor{y, ids_.batch, cpu_.output_dims()};
  }

  // Each step reads its ids back to check them and plan the backward.
  bool Replayable() const override { return false; }

  absl::StatusOr<std::vector<DeviceTensor>> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                     const std::vector<bool>& need) override {
    const int64_t n = static_cast<int64_t>(host_ids_.size());
    if (grad_output.size() != n * row_) {
      return absl::FailedPreconditionError("Backward without the Forward of this gradient");
    }
    if (float* g = operand_->grad(); g != nullptr) {
      const graph::LookupReaders r = graph::ReadersOfRows(host_ids_.data(), n, rows_, padding_);
      DPTRAIN_RETURN_IF_ERROR(UploadAndWait(ctx, r.rows, rows_of_));
      DPTRAIN_RETURN_IF_ERROR(UploadAndWait(ctx, r.offsets, offsets_));
      DPTRAIN_RETURN_IF_ERROR(UploadAndWait(ctx, r.readers, readers_));
      DPTRAIN_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(g, 0, rows_ * row_ * sizeof(float), ctx.stream()));
      DPTRAIN_RETURN_IF_ERROR(LookupBackward(rows_of_.data(), offsets_.data(), readers_.data(),
                                             static_cast<int64_t>(r.rows.size()), grad_output.data,
                                             row_, g, ctx.stream()));
    }
    std::vector<DeviceTensor> dx(1);
    if (need[0]) {  // Ids are integers: the output does not change with them.
      DPTRAIN_ASSIGN_OR_RETURN(float* zero, grad_ids_.Ensure(ctx, n));
      DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(zero, 0, n * sizeof(float), ctx.stream()));
      dx[0] = DeviceTensor{zero, ids_.batch, ids_dims_};
    }
    return dx;
  }

 private:
  const graph::NodeImpl<float>& cpu_;
  const nn::Dims ids_dims_;
  int64_t rows_ = 0, row_ = 0, padding_ = -1;
  DeviceTensor ids_;
  std::vector<float> host_ids_;  // This step's ids.
  DeviceBuffer<float> output_, grad_ids_;
  DeviceBuffer<int64_t> rows_of_, offsets_, readers_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuNode>> MakeLookupTwin(const GpuNodeContext& ctx) {
  const graph::TwinSpec<float> spec = ctx.cpu.twin();
  if (spec.lookup_row < 1 || spec.operand_size < 1 || ctx.input_dims.size() != 1) {
    return ctx.Error("this form of the op");
  }
  return std::unique_ptr<GpuNode>(std::make_unique<LookupTwin>(ctx.cpu, ctx.input_dims[0]));
}

}  // namespace cuda
}  // namespace dptrain
