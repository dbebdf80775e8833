#include "worker/cuda/gpu_batched_matmul.h"

#include <cublas_v2.h>

#include <array>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/cuda/library_status.h"

namespace dptrain {
namespace cuda {
namespace {

constexpr float kOne = 1.0f, kZero = 0.0f;

// Row-major [r, c] is column-major [c, r] to cuBLAS; per product l, with A [m, k], B [k, n] and
// C [m, n] row-major:
//   C^T = B^T A^T    ->  gemm(N, N, n, m, k, B, n, A, k, C, n)
//   dA^T = B dC^T    ->  gemm(T, N, k, m, n, B, n, dC, n, dA, k)
//   dB^T = dC^T A    ->  gemm(N, T, n, k, m, dC, n, A, k, dB, n)
class BatchedMatMulTwin final : public GpuNode {
 public:
  BatchedMatMulTwin(int m, int k, int n, nn::Dims a_dims, nn::Dims b_dims, nn::Dims out_dims)
      : m_(m), k_(k), n_(n), a_dims_(a_dims), b_dims_(b_dims), out_dims_(out_dims) {}

  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, absl::Span<const DeviceTensor> inputs,
                                       bool) override {
    a_ = inputs[0];
    b_ = inputs[1];
    DPTRAIN_ASSIGN_OR_RETURN(count_, Count(a_.size()));
    DPTRAIN_ASSIGN_OR_RETURN(float* c, output_.Ensure(ctx, int64_t{count_} * m_ * n_));
    DPTRAIN_RETURN_IF_ERROR(Gemm(ctx, false, false, n_, m_, k_, b_.data, n_, int64_t{k_} * n_,
                                 a_.data, k_, int64_t{m_} * k_, c, n_, int64_t{m_} * n_));
    return DeviceTensor{c, a_.batch, out_dims_};
  }

  absl::StatusOr<std::vector<DeviceTensor>> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                     const std::vector<bool>& need) override {
    if (grad_output.size() != int64_t{count_} * m_ * n_) {
      return absl::FailedPreconditionError("Backward without the Forward of this gradient");
    }
    std::vector<DeviceTensor> dx(2);
    if (need[0]) {
      DPTRAIN_ASSIGN_OR_RETURN(float* da, grad_a_.Ensure(ctx, int64_t{count_} * m_ * k_));
      DPTRAIN_RETURN_IF_ERROR(Gemm(ctx, true, false, k_, m_, n_, b_.data, n_, int64_t{k_} * n_,
                                   grad_output.data, n_, int64_t{m_} * n_, da, k_,
                                   int64_t{m_} * k_));
      dx[0] = DeviceTensor{da, a_.batch, a_dims_};
    }
    if (need[1]) {
      DPTRAIN_ASSIGN_OR_RETURN(float* db, grad_b_.Ensure(ctx, int64_t{count_} * k_ * n_));
      DPTRAIN_RETURN_IF_ERROR(Gemm(ctx, false, true, n_, k_, m_, grad_output.data, n_,
                                   int64_t{m_} * n_, a_.data, k_, int64_t{m_} * k_, db, n_,
                                   int64_t{k_} * n_));
      dx[1] = DeviceTensor{db, b_.batch, b_dims_};
    }
    return dx;
  }

 private:
  absl::StatusOr<int> Count(int64_t a_elements) const {
    const int64_t count = a_elements / (int64_t{m_} * k_);
    if (count > std::numeric_limits<int>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(count, " products (at most 2^31 - 1)"));
    }
    return static_cast<int>(count);
  }

  absl::Status Gemm(DeviceContext& ctx, bool trans_a, bool trans_b, int m, int n, int k,
                    const float* a, int lda, int64_t stride_a, const float* b, int ldb,
                    int64_t stride_b, float* c, int ldc, int64_t stride_c) const {
    DPTRAIN_CUBLAS_RETURN_IF_ERROR(cublasSgemmStridedBatched(
        ctx.cublas(), trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, m,
        n, k, &kOne, a, lda, stride_a, b, ldb, stride_b, &kZero, c, ldc, stride_c, count_));
    return absl::OkStatus();
  }

  const int m_, k_, n_;
  const nn::Dims a_dims_, b_dims_, out_dims_;
  DeviceTensor a_, b_;  // The last Forward's inputs, valid until Backward returns.
  int count_ = 0;
  DeviceBuffer<float> output_, grad_a_, grad_b_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuNode>> MakeBatchedMatMulTwin(const GpuNodeContext& ctx) {
  const std::array<int, 3> mkn = ctx.cpu.twin().batched_matmul;
  if (mkn[0] < 1 || mkn[1] < 1 || mkn[2] < 1 || ctx.input_dims.size() != 2) {
    return ctx.Error("this form of the op");
  }
  return std::unique_ptr<GpuNode>(std::make_unique<BatchedMatMulTwin>(
      mkn[0], mkn[1], mkn[2], ctx.input_dims[0], ctx.input_dims[1], ctx.cpu.output_dims()));
}

}  // namespace cuda
}  // namespace dptrain
