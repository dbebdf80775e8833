#include "worker/cuda/gpu_recurrent.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/cuda/cuda_status.h"
#include "worker/cuda/graph_operand.h"
#include "worker/cuda/kernels.h"
#include "worker/cuda/library_status.h"
#include "worker/cuda/recurrent_kernels.h"

namespace dptrain {
namespace cuda {
namespace {

using Spec = graph::TwinSpec<float>::Recurrent;

// Row-major [r, c] is column-major [c, r] to cuBLAS. With X [T B, I], W_ih [G, I], W_hh [G, H],
// h [B, H] and the gate gradients dG [T B, G] row-major:
//   P = X W_ih^T         ->  gemm(T, N, G, T B, I, W_ih, I, X, I, P, G)
//   Q = h W_hh^T         ->  gemm(T, N, G, B, H, W_hh, H, h, H, Q, G)
//   dh += dG_s W_hh      ->  gemm(N, N, H, B, G, W_hh, H, dG_s, G, dh, H)
//   dW_ih = dG^T X       ->  gemm(N, T, I, G, T B, X, I, dG, G, dW_ih, I)
//   dX += dG W_ih        ->  gemm(N, N, I, T B, G, W_ih, I, dG, G, dX, I)
//   db = dG^T 1          ->  gemv(N, G, T B, dG, G, ones)
absl::Status Gemm(DeviceContext& ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                  const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                  int64_t ldc) {
  const float one = 1.0f;
  DPTRAIN_CUBLAS_RETURN_IF_ERROR(cublasSgemm(
      ctx.cublas(), trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &one, a, static_cast<int>(lda),
      b, static_cast<int>(ldb), &beta, c, static_cast<int>(ldc)));
  return absl::OkStatus();
}

class RecurrentTwin final : public GpuNode {
 public:
  RecurrentTwin(const graph::NodeImpl<float>& cpu, Spec spec, std::vector<nn::Dims> input_dims)
      : cpu_(cpu),
        spec_(std::move(spec)),
        input_dims_(std::move(input_dims)),
        gates_((spec_.gru ? 3 : 4) * spec_.hidden),
        per_direction_(spec_.biases ? 4 : 2),
        direction_(spec_.directions) {
    tensors_.reserve(spec_.tensors.size());
    for (const auto& t : spec_.tensors) tensors_.emplace_back(t.source, t.held, t.size);
  }

  // The tensors' slots in the CPU node's order: one per learned tensor (per buffer).
  void BindParams(absl::Span<const float* const> params, absl::Span<float* const> grads) override {
    size_t at = 0;
    for (size_t k = 0; k < tensors_.size(); ++k) {
      if (spec_.tensors[k].source != graph::OperandSource::kParam) continue;
      tensors_[k].BindParams(params.subspan(at, 1), grads.subspan(at, 1));
      ++at;
    }
  }
  void BindBuffers(absl::Span<float* const> buffers) override {
    size_t at = 0;
    for (size_t k = 0; k < tensors_.size(); ++k) {
      if (spec_.tensors[k].source != graph::OperandSource::kBuffer) continue;
      tensors_[k].BindBuffers(buffers.subspan(at, 1));
      ++at;
    }
  }

  absl::StatusOr<DeviceTensor> Forward(DeviceContext& ctx, absl::Span<const DeviceTensor> inputs,
                                       bool) override {
    output_size_ = -1;  // Until this Forward succeeds.
    x_ = inputs[0];
    batch_ = x_.batch;
    const int64_t steps = spec_.steps, b = batch_, h = spec_.hidden, state = b * h;
    if (steps * b * std::max(gates_, spec_.in) > std::numeric_limits<int>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(
          steps, " steps of ", b, " samples: too many for one cuBLAS product (2^31 - 1 elements)"));
    }
    lengths_ = nullptr;
    if (spec_.lengths) DPTRAIN_RETURN_IF_ERROR(CheckLengths(ctx, inputs[1]));
    for (int d = 0; d < spec_.directions; ++d) {
      Direction& dir = direction_[d];
      DPTRAIN_ASSIGN_OR_RETURN(const float* w_ih, tensors_[Tensor(d, 0)].Values(ctx));
      DPTRAIN_ASSIGN_OR_RETURN(const float* w_hh, tensors_[Tensor(d, 1)].Values(ctx));
      const float* b_ih = nullptr;
      const float* b_hh = nullptr;
      if (spec_.biases) {
        DPTRAIN_ASSIGN_OR_RETURN(b_ih, tensors_[Tensor(d, 2)].Values(ctx));
        DPTRAIN_ASSIGN_OR_RETURN(b_hh, tensors_[Tensor(d, 3)].Values(ctx));
      }
      DPTRAIN_ASSIGN_OR_RETURN(float* products, dir.x_products.Ensure(ctx, steps * b * gates_));
      DPTRAIN_ASSIGN_OR_RETURN(float* hs, dir.h.Ensure(ctx, (steps + 1) * state));
      float* cs = nullptr;
      if (!spec_.gru) {
        DPTRAIN_ASSIGN_OR_RETURN(cs, dir.c.Ensure(ctx, (steps + 1) * state));
      }
      DPTRAIN_ASSIGN_OR_RETURN(float* gates, dir.gates.Ensure(ctx, steps * b * gates_));
      DPTRAIN_ASSIGN_OR_RETURN(float* extra, dir.extra.Ensure(ctx, steps * state));
      DPTRAIN_ASSIGN_OR_RETURN(float* step_products, h_products_.Ensure(ctx, b * gates_));
      DPTRAIN_RETURN_IF_ERROR(Gemm(ctx, true, false, gates_, steps * b, spec_.in, w_ih, spec_.in,
                                   x_.data, spec_.in, 0.0f, products, gates_));
      DPTRAIN_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(hs, 0, state * sizeof(float), ctx.stream()));  // The zero state.
      if (cs != nullptr) {
        DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(cs, 0, state * sizeof(float), ctx.stream()));
      }
      for (int64_t s = 0; s < steps; ++s) {
        DPTRAIN_RETURN_IF_ERROR(Gemm(ctx, true, false, gates_, b, h, w_hh, h, hs + s * state, h,
                                     0.0f, step_products, gates_));
        DPTRAIN_RETURN_IF_ERROR(RecurrentStepForward(Step(d, s), products, step_products, b_ih,
                                                     b_hh, hs, cs, gates, extra, ctx.stream()));
      }
    }
    // Y [T, D, B, H], or the last h or c of each direction [D, B, H].
    const int64_t out_size = (spec_.output == 0 ? steps : 1) * spec_.directions * state;
    DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, out_size));
    for (int d = 0; d < spec_.directions; ++d) {
      const Direction& dir = direction_[d];
      if (spec_.output == 0) {
        DPTRAIN_RETURN_IF_ERROR(RecurrentOutput(Step(d, 0), dir.h.data(), y, ctx.stream()));
      } else {
        const float* last = (spec_.output == 1 ? dir.h : dir.c).data() + steps * state;
        DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(y + d * state, last, state * sizeof(float),
                                                     cudaMemcpyDeviceToDevice, ctx.stream()));
      }
    }
    output_size_ = out_size;
    return DeviceTensor{y, batch_, cpu_.output_dims()};
  }

  absl::StatusOr<std::vector<DeviceTensor>> Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                     const std::vector<bool>& need) override {
    if (output_size_ < 0 || grad_output.size() != output_size_) {
      return absl::FailedPreconditionError("Backward without the Forward of this gradient");
    }
    const int64_t steps = spec_.steps, b = batch_, h = spec_.hidden, state = b * h;
    const int64_t rows = steps * b;  // Of the input and of the gates' gradients.
    float* dx = nullptr;
    if (need[0]) {
      DPTRAIN_ASSIGN_OR_RETURN(dx, grad_input_.Ensure(ctx, rows * spec_.in));
    }
    DPTRAIN_ASSIGN_OR_RETURN(float* dh, dh_.Ensure(ctx, state));
    DPTRAIN_ASSIGN_OR_RETURN(float* dc, dc_.Ensure(ctx, state));
    DPTRAIN_ASSIGN_OR_RETURN(float* dx_gates, dx_gates_.Ensure(ctx, rows * gates_));
    DPTRAIN_ASSIGN_OR_RETURN(float* dh_gates, dh_gates_.Ensure(ctx, rows * gates_));
    DPTRAIN_ASSIGN_OR_RETURN(float* ones, ones_.Ensure(ctx, rows));
    DPTRAIN_RETURN_IF_ERROR(Fill(ones, rows, 1.0f, ctx.stream()));
    const float* dy = spec_.output == 0 ? grad_output.data : nullptr;
    for (int d = 0; d < spec_.directions; ++d) {
      const Direction& dir = direction_[d];
      DPTRAIN_ASSIGN_OR_RETURN(const float* w_ih, tensors_[Tensor(d, 0)].Values(ctx));
      DPTRAIN_ASSIGN_OR_RETURN(const float* w_hh, tensors_[Tensor(d, 1)].Values(ctx));
      DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dh, 0, state * sizeof(float), ctx.stream()));
      DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(dc, 0, state * sizeof(float), ctx.stream()));
      if (spec_.output != 0) {  // The last h's (or c's) gradient starts the way back.
        DPTRAIN_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(spec_.output == 1 ? dh : dc, grad_output.data + d * state,
                            state * sizeof(float), cudaMemcpyDeviceToDevice, ctx.stream()));
      }
      // Rows of times a sample does not reach stay zero.
      DPTRAIN_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(dx_gates, 0, rows * gates_ * sizeof(float), ctx.stream()));
      for (int64_t s = steps - 1; s >= 0; --s) {
        float* dh_step = dh_gates + s * b * gates_;
        DPTRAIN_RETURN_IF_ERROR(RecurrentStepBackward(Step(d, s), dy, dir.gates.data(),
                                                      dir.extra.data(), dir.h.data(), dir.c.data(),
                                                      dh, dc, dx_gates, dh_step, ctx.stream()));
        DPTRAIN_RETURN_IF_ERROR(
            Gemm(ctx, false, false, h, b, gates_, w_hh, h, dh_step, gates_, 1.0f, dh, h));
      }
      // Over all steps at once: the weights' gradients (h[0 .. T) are the steps' previous h),
      // the biases' and d(input).
      if (float* g = tensors_[Tensor(d, 0)].grad(); g != nullptr) {
        DPTRAIN_RETURN_IF_ERROR(Gemm(ctx, false, true, spec_.in, gates_, rows, x_.data, spec_.in,
                                     dx_gates, gates_, 0.0f, g, spec_.in));
      }
      if (float* g = tensors_[Tensor(d, 1)].grad(); g != nullptr) {
        DPTRAIN_RETURN_IF_ERROR(
            Gemm(ctx, false, true, h, gates_, rows, dir.h.data(), h, dh_gates, gates_, 0.0f, g, h));
      }
      if (spec_.biases) {
        DPTRAIN_RETURN_IF_ERROR(ColumnSums(ctx, dx_gates, rows, ones, Tensor(d, 2)));
        DPTRAIN_RETURN_IF_ERROR(ColumnSums(ctx, dh_gates, rows, ones, Tensor(d, 3)));
      }
      if (dx != nullptr) {
        DPTRAIN_RETURN_IF_ERROR(Gemm(ctx, false, false, spec_.in, rows, gates_, w_ih, spec_.in,
                                     dx_gates, gates_, d == 0 ? 0.0f : 1.0f, dx, spec_.in));
      }
    }
    std::vector<DeviceTensor> grads(spec_.lengths ? 2 : 1);
    if (dx != nullptr) grads[0] = DeviceTensor{dx, batch_, input_dims_[0]};
    if (spec_.lengths && need[1]) {  // Lengths are counts: no gradient.
      DPTRAIN_ASSIGN_OR_RETURN(float* zero, grad_lengths_.Ensure(ctx, b));
      DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(zero, 0, b * sizeof(float), ctx.stream()));
      grads[1] = DeviceTensor{zero, batch_, input_dims_[1]};
    }
    return grads;
  }

 private:
  // One direction's values of the last Forward (recurrent_kernels.h's layouts).
  struct Direction {
    DeviceBuffer<float> x_products, h, c, gates, extra;
  };

  size_t Tensor(int direction, int k) const {
    return static_cast<size_t>(direction * per_direction_ + k);
  }
  RecurrentStep Step(int direction, int64_t step) const {
    RecurrentStep s;
    s.gru = spec_.gru;
    s.direction = direction;
    s.directions = spec_.directions;
    s.step = step;
    s.steps = spec_.steps;
    s.batch = batch_;
    s.hidden = spec_.hidden;
    s.lengths = lengths_;
    return s;
  }

  // With lengths, each step reads them back to check them (CheckLengths).
  bool Replayable() const override { return !spec_.lengths; }

  // The lengths on the host, refused with the CPU node's message (CheckInputs reads only them).
  absl::Status CheckLengths(DeviceContext& ctx, const DeviceTensor& lengths) {
    host_lengths_.resize(lengths.size());
    if (!host_lengths_.empty()) {
      DPTRAIN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_lengths_.data(), lengths.data,
                                                   host_lengths_.size() * sizeof(float),
                                                   cudaMemcpyDeviceToHost, ctx.stream()));
    }
    DPTRAIN_RETURN_IF_ERROR(ctx.Synchronize());
    const nn::TensorRef<float> host[2] = {{nullptr, x_.batch, x_.dims},
                                          {host_lengths_.data(), lengths.batch, lengths.dims}};
    DPTRAIN_RETURN_IF_ERROR(cpu_.CheckInputs(absl::MakeConstSpan(host, 2), /*training=*/true));
    lengths_ = lengths.data;
    return absl::OkStatus();
  }

  // Gradient of bias tensor k: the sums of the columns of `gate_grads` [rows, G].
  absl::Status ColumnSums(DeviceContext& ctx, const float* gate_grads, int64_t rows,
                          const float* ones, size_t k) {
    float* g = tensors_[k].grad();
    if (g == nullptr) return absl::OkStatus();
    const float one = 1.0f, zero = 0.0f;
    DPTRAIN_CUBLAS_RETURN_IF_ERROR(cublasSgemv(ctx.cublas(), CUBLAS_OP_N, static_cast<int>(gates_),
                                               static_cast<int>(rows), &one, gate_grads,
                                               static_cast<int>(gates_), ones, 1, &zero, g, 1));
    return absl::OkStatus();
  }

  const graph::NodeImpl<float>& cpu_;
  const Spec spec_;
  const std::vector<nn::Dims> input_dims_;
  const int64_t gates_;  // G: 4H or 3H.
  const int per_direction_;
  std::vector<GraphOperand> tensors_;  // The CPU node's, in its order.
  std::vector<Direction> direction_;
  DeviceTensor x_;  // The last Forward's input, valid until Backward returns.
  int batch_ = 0;
  const float* lengths_ = nullptr;  // The last Forward's lengths (device), or null.
  std::vector<float> host_lengths_;
  int64_t output_size_ = -1;  // Of the last Forward that succeeded; -1: none yet.
  DeviceBuffer<float> h_products_, output_, grad_input_, dh_, dc_, dx_gates_, dh_gates_, ones_,
      grad_lengths_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuNode>> MakeRecurrentTwin(const GpuNodeContext& ctx) {
  const graph::TwinSpec<float> spec = ctx.cpu.twin();
  const Spec& r = spec.recurrent;
  const size_t tensors = static_cast<size_t>(r.directions) * (r.biases ? 4 : 2);
  if (r.hidden < 1 || r.steps < 1 || r.in < 1 || r.tensors.size() != tensors ||
      ctx.input_dims.size() != (r.lengths ? 2u : 1u)) {
    return ctx.Error("this form of the op");
  }
  return std::unique_ptr<GpuNode>(std::make_unique<RecurrentTwin>(ctx.cpu, r, ctx.input_dims));
}

}  // namespace cuda
}  // namespace dptrain
