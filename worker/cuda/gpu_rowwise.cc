#include "worker/cuda/gpu_rowwise.h"

#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace dptrain {
namespace cuda {
namespace {

class RowwiseTwin final : public GpuNode {
 public:
  RowwiseTwin(std::unique_ptr<GpuNode> inner, int64_t in_row, int64_t out_row, nn::Dims in_dims,
              nn::Dims out_dims)
      : inner_(std::move(inner)),
        in_row_(in_row),
        out_row_(out_row),
        in_dims_(in_dims),
        out_dims_(out_dims) {}

  void BindParams(absl::Span<const float* const> params, absl::Span<float* const> grads) override {
    inner_->BindParams(params, grads);
  }
  void BindBuffers(absl::Span<float* const> buffers) override { inner_->BindBuffers(buffers); }
  bool Replayable() const override { return inner_->Replayable(); }

  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, absl::Span<const DeviceTensor> inputs,
                                       bool training) override {
    const DeviceTensor& x = inputs[0];
    DPTRAIN_ASSIGN_OR_RETURN(const int rows, Rows(x.size(), in_row_));
    const DeviceTensor as_rows{x.data, rows, nn::Dims{static_cast<int>(in_row_), 1, 1}};
    DPTRAIN_ASSIGN_OR_RETURN(const DeviceTensor y,
                             inner_->Forward(ctx, absl::MakeConstSpan(&as_rows, 1), training));
    batch_ = x.batch;
    return DeviceTensor{y.data, x.batch, out_dims_};
  }

  absl::StatusOr<std::vector<DeviceTensor>> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                     const std::vector<bool>& need) override {
    DPTRAIN_ASSIGN_OR_RETURN(const int rows, Rows(grad_output.size(), out_row_));
    const DeviceTensor as_rows{grad_output.data, rows, nn::Dims{static_cast<int>(out_row_), 1, 1}};
    DPTRAIN_ASSIGN_OR_RETURN(std::vector<DeviceTensor> dx, inner_->Backward(ctx, as_rows, need));
    if (need[0]) dx[0] = DeviceTensor{dx[0].data, batch_, in_dims_};
    return dx;
  }

 private:
  static absl::StatusOr<int> Rows(int64_t elements, int64_t row) {
    const int64_t rows = elements / row;
    if (rows > std::numeric_limits<int>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(rows, " rows (at most 2^31 - 1)"));
    }
    return static_cast<int>(rows);
  }

  const std::unique_ptr<GpuNode> inner_;
  const int64_t in_row_, out_row_;
  const nn::Dims in_dims_, out_dims_;
  int batch_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuNode>> MakeRowwiseTwin(const GpuNodeContext& ctx, int64_t row,
                                                         const GpuOpRegistry& registry) {
  const graph::NodeImpl<float>* inner = ctx.cpu.twin().rowwise;
  if (inner == nullptr || ctx.input_dims.size() != 1) return ctx.Error("this form of the op");
  const int64_t out_row = inner->output_dims().size();
  if (row < 1 || out_row < 1 || row > std::numeric_limits<int>::max()) {
    return ctx.Error(absl::StrCat("rows of ", row, " elements"));
  }
  GpuNodeContext row_ctx{ctx.name, ctx.op, *inner, {nn::Dims{static_cast<int>(row), 1, 1}}};
  DPTRAIN_ASSIGN_OR_RETURN(std::unique_ptr<GpuNode> twin, registry.Create(row_ctx));
  return std::unique_ptr<GpuNode>(std::make_unique<RowwiseTwin>(
      std::move(twin), row, out_row, ctx.input_dims[0], ctx.cpu.output_dims()));
}

}  // namespace cuda
}  // namespace dptrain
