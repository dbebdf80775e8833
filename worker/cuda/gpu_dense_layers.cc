// GpuLinear (cuBLAS) and GpuConv2d (cuDNN), and the tensor descriptor they share.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/cuda/gpu_layers.h"
#include "worker/cuda/half.h"
#include "worker/cuda/library_status.h"

namespace dptrain {
namespace cuda {
namespace {

constexpr float kOne = 1.0f;
constexpr float kZero = 0.0f;

}  // namespace

TensorDescriptor::~TensorDescriptor() {
  if (desc_ != nullptr) cudnnDestroyTensorDescriptor(desc_);
}

absl::Status TensorDescriptor::Set(int n, int c, int h, int w, cudnnDataType_t type) {
  if (desc_ == nullptr) DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnCreateTensorDescriptor(&desc_));
  DPTRAIN_CUDNN_RETURN_IF_ERROR(
      cudnnSetTensor4dDescriptor(desc_, CUDNN_TENSOR_NCHW, type, n, c, h, w));
  return absl::OkStatus();
}

// ---- Linear -------------------------------------------------------------------------------
//
// Row-major [rows, cols] is column-major [cols, rows] to cuBLAS, so with X [B, in],
// W [out, in] and Y [B, out] row-major:
//   Y^T = W^T-as-stored x X^T  ->  gemm(T, N, out, B, in, W, in, X, in, Y, out)
//   dX^T = W x dY^T            ->  gemm(N, N, in, B, out, W, in, dY, out, dX, in)
//   dW^T = X^T x dY            ->  gemm(N, T, in, out, B, X, in, dY, out, dW, in)

std::string GpuLinear::ToString() const { return absl::StrCat("Linear(", in_, ", ", out_, ")"); }

std::vector<nn::TensorSpec> GpuLinear::ParamSpecs() const {
  return {{"weight", {out_, in_}}, {"bias", {out_}}};
}

void GpuLinear::BindParams(const float* params, float* grads) {
  w_ = params;
  dw_ = grads;
}

// c (fp32) = op(a) op(b): SGEMM in fp32, GemmEx on 16-bit a and b otherwise.
absl::Status GpuLinear::Gemm(DeviceContext& ctx, bool trans_a, bool trans_b, int m, int n, int k,
                             const void* a, int lda, const void* b, int ldb, float* c, int ldc) {
  const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const Precision p = ctx.options().precision;
  if (!IsHalf(p)) {
    DPTRAIN_CUBLAS_RETURN_IF_ERROR(cublasSgemm(ctx.cublas(), ta, tb, m, n, k, &kOne,
                                               static_cast<const float*>(a), lda,
                                               static_cast<const float*>(b), ldb, &kZero, c, ldc));
    return absl::OkStatus();
  }
  DPTRAIN_CUBLAS_RETURN_IF_ERROR(
      cublasGemmEx(ctx.cublas(), ta, tb, m, n, k, &kOne, a, CublasType(p), lda, b, CublasType(p),
                   ldb, &kZero, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

absl::StatusOr<DeviceTensor> GpuLinear::Forward(DeviceContext& ctx, DeviceTensor input,
                                                bool training) {
  input_ = input;
  const int b = input.batch;
  const Precision p = ctx.options().precision;
  const void* x = input.data;
  const void* w = w_;
  if (IsHalf(p)) {
    DPTRAIN_ASSIGN_OR_RETURN(uint16_t * xh, x_half_.Ensure(ctx, input.size()));
    DPTRAIN_ASSIGN_OR_RETURN(uint16_t * wh, w_half_.Ensure(ctx, int64_t{out_} * in_));
    DPTRAIN_RETURN_IF_ERROR(ToHalf(p, input.data, xh, input.size(), ctx.stream()));
    DPTRAIN_RETURN_IF_ERROR(ToHalf(p, w_, wh, int64_t{out_} * in_, ctx.stream()));
    x = xh;
    w = wh;
  }
  DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, int64_t{b} * out_));
  DPTRAIN_RETURN_IF_ERROR(Gemm(ctx, true, false, out_, b, in_, w, in_, x, in_, y, out_));
  DPTRAIN_RETURN_IF_ERROR(y_desc_.Set(b, out_, 1, 1));
  DPTRAIN_RETURN_IF_ERROR(bias_desc_.Set(1, out_, 1, 1));
  DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnAddTensor(ctx.cudnn(), &kOne, bias_desc_.get(),
                                               w_ + int64_t{out_} * in_, &kOne, y_desc_.get(), y));
  return DeviceTensor{y, b, {out_, 1, 1}};
}

absl::StatusOr<DeviceTensor> GpuLinear::Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                 bool need_input_grad) {
  const int b = grad_output.batch;
  const Precision p = ctx.options().precision;
  const void* dy = grad_output.data;
  const void* x = input_.data;
  const void* w = w_;
  if (IsHalf(p)) {  // x and w were cast by Forward.
    DPTRAIN_ASSIGN_OR_RETURN(uint16_t * dyh, dy_half_.Ensure(ctx, grad_output.size()));
    DPTRAIN_RETURN_IF_ERROR(ToHalf(p, grad_output.data, dyh, grad_output.size(), ctx.stream()));
    dy = dyh;
    x = x_half_.data();
    w = w_half_.data();
  }
  DPTRAIN_RETURN_IF_ERROR(Gemm(ctx, false, true, in_, out_, b, x, in_, dy, out_, dw_, in_));
  DPTRAIN_RETURN_IF_ERROR(y_desc_.Set(b, out_, 1, 1));
  DPTRAIN_CUDNN_RETURN_IF_ERROR(
      cudnnConvolutionBackwardBias(ctx.cudnn(), &kOne, y_desc_.get(), grad_output.data, &kZero,
                                   bias_desc_.get(), dw_ + int64_t{out_} * in_));
  if (!need_input_grad) return DeviceTensor{};
  DPTRAIN_ASSIGN_OR_RETURN(float* dx, grad_input_.Ensure(ctx, int64_t{b} * in_));
  DPTRAIN_RETURN_IF_ERROR(Gemm(ctx, false, false, in_, b, out_, w, in_, dy, out_, dx, in_));
  return DeviceTensor{dx, b, input_.dims};
}

// ---- Conv2d -------------------------------------------------------------------------------

GpuConv2d::~GpuConv2d() {
  if (filter_ != nullptr) cudnnDestroyFilterDescriptor(filter_);
  for (cudnnConvolutionDescriptor_t d : {conv_fwd_, conv_bwd_data_, conv_bwd_filter_}) {
    if (d != nullptr) cudnnDestroyConvolutionDescriptor(d);
  }
}

std::string GpuConv2d::ToString() const {
  return absl::StrCat("Conv2d(", o_.in_channels, ", ", o_.out_channels, ", kernel_size=(",
                      o_.kernel_h, ", ", o_.kernel_w, "), stride=(", o_.stride_h, ", ", o_.stride_w,
                      "), padding=(", o_.pad_h, ", ", o_.pad_w, ")",
                      groups_ > 1 ? absl::StrCat(", groups=", groups_) : "", ")");
}

std::vector<nn::TensorSpec> GpuConv2d::ParamSpecs() const {
  return {{"weight", {o_.out_channels, o_.in_channels / groups_, o_.kernel_h, o_.kernel_w}},
          {"bias", {o_.out_channels}}};
}

void GpuConv2d::BindParams(const float* params, float* grads) {
  w_ = params;
  dw_ = grads;
}

absl::Status GpuConv2d::Describe(DeviceContext& ctx) {
  if (filter_ != nullptr) return absl::OkStatus();
  const Precision p = ctx.options().precision;
  DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnCreateFilterDescriptor(&filter_));
  DPTRAIN_CUDNN_RETURN_IF_ERROR(
      cudnnSetFilter4dDescriptor(filter_, CudnnType(p), CUDNN_TENSOR_NCHW, o_.out_channels,
                                 o_.in_channels / groups_, o_.kernel_h, o_.kernel_w));
  for (cudnnConvolutionDescriptor_t* d : {&conv_fwd_, &conv_bwd_data_, &conv_bwd_filter_}) {
    DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnCreateConvolutionDescriptor(d));
    DPTRAIN_CUDNN_RETURN_IF_ERROR(
        cudnnSetConvolution2dDescriptor(*d, o_.pad_h, o_.pad_w, o_.stride_h, o_.stride_w, 1, 1,
                                        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    if (groups_ > 1) DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionGroupCount(*d, groups_));
  }
  DPTRAIN_RETURN_IF_ERROR(bias_desc_.Set(1, o_.out_channels, 1, 1));
  return absl::OkStatus();
}

namespace {

// The fastest algorithm of cuDNN's measured list that succeeded, fits the workspace limit,
// without TF32 does not round through tensor ops and, when asked, is deterministic.
// Strict fp32: no tensor-op rounding anywhere.
bool Strict(const DeviceContext& ctx) {
  return !ctx.options().tf32 && !IsHalf(ctx.options().precision);
}

// The math type a search starts from: strict fp32 (no tensor-op rounding) unless TF32 was
// allowed; 16-bit data on tensor cores. Accumulation is fp32 in every case.
cudnnMathType_t SearchMath(const DeviceContext& ctx) {
  return IsHalf(ctx.options().precision) ? CUDNN_TENSOR_OP_MATH
         : ctx.options().tf32            ? CUDNN_DEFAULT_MATH
                                         : CUDNN_FMA_MATH;
}

template <typename Perf>
absl::StatusOr<Perf> Choose(const Perf* perfs, int count, const DeviceContext& ctx,
                            const char* what) {
  for (int i = 0; i < count; ++i) {
    const Perf& p = perfs[i];
    if (p.status != CUDNN_STATUS_SUCCESS) continue;
    if (p.memory > ctx.options().max_workspace_bytes) continue;
    if (ctx.options().deterministic && p.determinism != CUDNN_DETERMINISTIC) continue;
    // Without TF32 no tensor-op result is taken; the descriptor's FMA math type (not the
    // reported one, which cuDNN 9 may give as default) is what keeps the kernels strict.
    if (Strict(ctx) && (p.mathType == CUDNN_TENSOR_OP_MATH ||
                        p.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)) {
      continue;
    }
    return p;
  }
  return absl::InternalError(absl::StrCat(what, ": cuDNN found no usable algorithm among ", count));
}

}  // namespace

absl::StatusOr<const GpuConv2d::Plan*> GpuConv2d::PlanFor(DeviceContext& ctx, int batch) {
  DPTRAIN_RETURN_IF_ERROR(Describe(ctx));
  if (batch != described_batch_) {
    const cudnnDataType_t type = CudnnType(ctx.options().precision);
    DPTRAIN_RETURN_IF_ERROR(x_desc_.Set(batch, in_dims_, type));
    DPTRAIN_RETURN_IF_ERROR(y_desc_.Set(batch, out_dims_, type));
    DPTRAIN_RETURN_IF_ERROR(y32_desc_.Set(batch, out_dims_));
    described_batch_ = batch;
  }
  auto it = plans_.find(batch);
  if (it != plans_.end()) {
    DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(conv_fwd_, it->second.fwd_math));
    DPTRAIN_CUDNN_RETURN_IF_ERROR(
        cudnnSetConvolutionMathType(conv_bwd_data_, it->second.bwd_data_math));
    DPTRAIN_CUDNN_RETURN_IF_ERROR(
        cudnnSetConvolutionMathType(conv_bwd_filter_, it->second.bwd_filter_math));
    return &it->second;
  }
  // Once per batch size: let cuDNN time its algorithms on this shape (it allocates its own
  // scratch for that) and keep the fastest usable one of each direction. The descriptors
  // may carry an earlier plan's math type: every search starts from the base one.
  for (cudnnConvolutionDescriptor_t d : {conv_fwd_, conv_bwd_data_, conv_bwd_filter_}) {
    DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(d, SearchMath(ctx)));
  }
  constexpr int kMax = 16;
  Plan plan;
  int n = 0;
  // Deterministic: cuDNN's heuristic ranking instead of timings (PyTorch's benchmark=False
  // with deterministic=True), so that every process picks the same algorithms and two runs
  // of a job compute bitwise the same.
  const bool timed = !ctx.options().deterministic;
  cudnnConvolutionFwdAlgoPerf_t fwd[kMax];
  DPTRAIN_CUDNN_RETURN_IF_ERROR(
      timed ? cudnnFindConvolutionForwardAlgorithm(ctx.cudnn(), x_desc_.get(), filter_, conv_fwd_,
                                                   y_desc_.get(), kMax, &n, fwd)
            : cudnnGetConvolutionForwardAlgorithm_v7(ctx.cudnn(), x_desc_.get(), filter_, conv_fwd_,
                                                     y_desc_.get(), kMax, &n, fwd));
  DPTRAIN_ASSIGN_OR_RETURN(cudnnConvolutionFwdAlgoPerf_t f, Choose(fwd, n, ctx, "conv forward"));
  cudnnConvolutionBwdDataAlgoPerf_t bwd_data[kMax];
  DPTRAIN_CUDNN_RETURN_IF_ERROR(timed ? cudnnFindConvolutionBackwardDataAlgorithm(
                                            ctx.cudnn(), filter_, y_desc_.get(), conv_bwd_data_,
                                            x_desc_.get(), kMax, &n, bwd_data)
                                      : cudnnGetConvolutionBackwardDataAlgorithm_v7(
                                            ctx.cudnn(), filter_, y_desc_.get(), conv_bwd_data_,
                                            x_desc_.get(), kMax, &n, bwd_data));
  DPTRAIN_ASSIGN_OR_RETURN(cudnnConvolutionBwdDataAlgoPerf_t d,
                           Choose(bwd_data, n, ctx, "conv backward data"));
  cudnnConvolutionBwdFilterAlgoPerf_t bwd_filter[kMax];
  DPTRAIN_CUDNN_RETURN_IF_ERROR(timed ? cudnnFindConvolutionBackwardFilterAlgorithm(
                                            ctx.cudnn(), x_desc_.get(), y_desc_.get(),
                                            conv_bwd_filter_, filter_, kMax, &n, bwd_filter)
                                      : cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                                            ctx.cudnn(), x_desc_.get(), y_desc_.get(),
                                            conv_bwd_filter_, filter_, kMax, &n, bwd_filter));
  DPTRAIN_ASSIGN_OR_RETURN(cudnnConvolutionBwdFilterAlgoPerf_t g,
                           Choose(bwd_filter, n, ctx, "conv backward filter"));
  // With TF32 each direction runs in the math type its algorithm was timed with (as
  // PyTorch does); strict fp32 keeps FMA math on every descriptor.
  auto math = [&ctx](cudnnMathType_t found) { return Strict(ctx) ? CUDNN_FMA_MATH : found; };
  plan.fwd = f.algo;
  plan.fwd_bytes = f.memory;
  plan.fwd_math = math(f.mathType);
  plan.bwd_data = d.algo;
  plan.bwd_data_bytes = d.memory;
  plan.bwd_data_math = math(d.mathType);
  plan.bwd_filter = g.algo;
  plan.bwd_filter_bytes = g.memory;
  plan.bwd_filter_math = math(g.mathType);
  DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(conv_fwd_, plan.fwd_math));
  DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnSetConvolutionMathType(conv_bwd_data_, plan.bwd_data_math));
  DPTRAIN_CUDNN_RETURN_IF_ERROR(
      cudnnSetConvolutionMathType(conv_bwd_filter_, plan.bwd_filter_math));
  if (!timed) {  // The heuristics' workspace figures are estimates: ask for the real ones.
    DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnGetConvolutionForwardWorkspaceSize(
        ctx.cudnn(), x_desc_.get(), filter_, conv_fwd_, y_desc_.get(), plan.fwd, &plan.fwd_bytes));
    DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnGetConvolutionBackwardDataWorkspaceSize(
        ctx.cudnn(), filter_, y_desc_.get(), conv_bwd_data_, x_desc_.get(), plan.bwd_data,
        &plan.bwd_data_bytes));
    DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnGetConvolutionBackwardFilterWorkspaceSize(
        ctx.cudnn(), x_desc_.get(), y_desc_.get(), conv_bwd_filter_, filter_, plan.bwd_filter,
        &plan.bwd_filter_bytes));
  }
  return &plans_.emplace(batch, plan).first->second;
}

absl::StatusOr<DeviceTensor> GpuConv2d::Forward(DeviceContext& ctx, DeviceTensor input,
                                                bool training) {
  input_ = input;
  const int b = input.batch;
  const Precision p = ctx.options().precision;
  DPTRAIN_ASSIGN_OR_RETURN(const Plan* plan, PlanFor(ctx, b));
  const int64_t out_size = int64_t{b} * out_dims_.size();
  DPTRAIN_ASSIGN_OR_RETURN(float* y, output_.Ensure(ctx, out_size));
  DPTRAIN_ASSIGN_OR_RETURN(void* ws, ctx.Workspace(plan->fwd_bytes));
  if (!IsHalf(p)) {
    DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnConvolutionForward(
        ctx.cudnn(), &kOne, x_desc_.get(), input.data, filter_, w_, conv_fwd_, plan->fwd, ws,
        plan->fwd_bytes, &kZero, y_desc_.get(), y));
  } else {
    DPTRAIN_ASSIGN_OR_RETURN(uint16_t * xh, x_half_.Ensure(ctx, input.size()));
    DPTRAIN_ASSIGN_OR_RETURN(uint16_t * wh, w_half_.Ensure(ctx, weight_size()));
    DPTRAIN_ASSIGN_OR_RETURN(uint16_t * yh, y_half_.Ensure(ctx, out_size));
    DPTRAIN_RETURN_IF_ERROR(ToHalf(p, input.data, xh, input.size(), ctx.stream()));
    DPTRAIN_RETURN_IF_ERROR(ToHalf(p, w_, wh, weight_size(), ctx.stream()));
    DPTRAIN_CUDNN_RETURN_IF_ERROR(
        cudnnConvolutionForward(ctx.cudnn(), &kOne, x_desc_.get(), xh, filter_, wh, conv_fwd_,
                                plan->fwd, ws, plan->fwd_bytes, &kZero, y_desc_.get(), yh));
    DPTRAIN_RETURN_IF_ERROR(FromHalf(p, yh, y, out_size, ctx.stream()));
  }
  DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnAddTensor(ctx.cudnn(), &kOne, bias_desc_.get(),
                                               w_ + weight_size(), &kOne, y32_desc_.get(), y));
  return DeviceTensor{y, b, out_dims_};
}

absl::StatusOr<DeviceTensor> GpuConv2d::Backward(DeviceContext& ctx, DeviceTensor grad_output,
                                                 bool need_input_grad) {
  const int b = grad_output.batch;
  const Precision p = ctx.options().precision;
  DPTRAIN_ASSIGN_OR_RETURN(const Plan* plan, PlanFor(ctx, b));
  DPTRAIN_CUDNN_RETURN_IF_ERROR(
      cudnnConvolutionBackwardBias(ctx.cudnn(), &kOne, y32_desc_.get(), grad_output.data, &kZero,
                                   bias_desc_.get(), dw_ + weight_size()));
  // The operands: fp32 as they are, or the 16-bit copies (x and w cast by Forward).
  const void* x = input_.data;
  const void* w = w_;
  const void* dy = grad_output.data;
  void* dw = dw_;
  if (IsHalf(p)) {
    DPTRAIN_ASSIGN_OR_RETURN(uint16_t * dyh, dy_half_.Ensure(ctx, grad_output.size()));
    DPTRAIN_RETURN_IF_ERROR(ToHalf(p, grad_output.data, dyh, grad_output.size(), ctx.stream()));
    DPTRAIN_ASSIGN_OR_RETURN(uint16_t * dwh, dw_half_.Ensure(ctx, weight_size()));
    x = x_half_.data();
    w = w_half_.data();
    dy = dyh;
    dw = dwh;
  }
  DPTRAIN_ASSIGN_OR_RETURN(void* ws, ctx.Workspace(plan->bwd_filter_bytes));
  DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardFilter(
      ctx.cudnn(), &kOne, x_desc_.get(), x, y_desc_.get(), dy, conv_bwd_filter_, plan->bwd_filter,
      ws, plan->bwd_filter_bytes, &kZero, filter_, dw));
  if (IsHalf(p)) {
    DPTRAIN_RETURN_IF_ERROR(
        FromHalf(p, static_cast<const uint16_t*>(dw), dw_, weight_size(), ctx.stream()));
  }
  if (!need_input_grad) return DeviceTensor{};
  const int64_t in_size = int64_t{b} * in_dims_.size();
  DPTRAIN_ASSIGN_OR_RETURN(float* dx, grad_input_.Ensure(ctx, in_size));
  void* dx_out = dx;
  if (IsHalf(p)) {
    DPTRAIN_ASSIGN_OR_RETURN(dx_out, dx_half_.Ensure(ctx, in_size));
  }
  DPTRAIN_ASSIGN_OR_RETURN(ws, ctx.Workspace(plan->bwd_data_bytes));
  DPTRAIN_CUDNN_RETURN_IF_ERROR(cudnnConvolutionBackwardData(
      ctx.cudnn(), &kOne, filter_, w, y_desc_.get(), dy, conv_bwd_data_, plan->bwd_data, ws,
      plan->bwd_data_bytes, &kZero, x_desc_.get(), dx_out));
  if (IsHalf(p)) {
    DPTRAIN_RETURN_IF_ERROR(
        FromHalf(p, static_cast<const uint16_t*>(dx_out), dx, in_size, ctx.stream()));
  }
  return DeviceTensor{dx, b, in_dims_};
}

}  // namespace cuda
}  // namespace dptrain
