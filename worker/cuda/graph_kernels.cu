#include "worker/cuda/graph_kernels.h"

#include <algorithm>

#include "worker/cuda/cuda_status.h"
#include "worker/cuda/kernel_launch.h"

namespace dptrain {
namespace cuda {
namespace {

__device__ float FunctionValue(int f, float x, float a, float b, float c) {
  switch (f) {
    case 1:
      return tanhf(x);
    case 2:
      return erff(x);
    case 3:
      return fmaxf(0.0f, fminf(1.0f, a * x + b));
    case 4:
      return x * fmaxf(0.0f, fminf(1.0f, x / 6.0f + 0.5f));
    case 6:
      return b * (x > 0.0f ? x : a * (expf(x) - 1.0f));
    case 7:
      return x > 20.0f ? x : log1pf(expf(x));
    case 8:
      return x / (1.0f + fabsf(x));
    case 9:
      return expf(x);
    case 10:
      return logf(x);
    case 11:
      return sqrtf(x);
    case 12:
      return -x;
    case 13:
      return fabsf(x);
    case 14:
      return 1.0f / x;
    case 15:
      return powf(x, a);
    case 16:
      return sinf(x);
    case 17:
      return cosf(x);
    case 18:
      return (x == a) != (b != 0.0f) ? 1.0f : 0.0f;
    case 19:
      return truncf(x);
    default:
      return x < a ? a + b * (x - a) : x > c ? c : x;
  }
}

__device__ float FunctionSlope(int f, float x, float y, float a, float b, float c) {
  switch (f) {
    case 1:
      return 1.0f - y * y;
    case 2:
      return 1.1283791670955126f * expf(-x * x);  // 2 / sqrt(pi).
    case 3: {
      const float z = a * x + b;
      return z > 0.0f && z < 1.0f ? a : 0.0f;
    }
    case 4:
      return x < -3.0f ? 0.0f : x > 3.0f ? 1.0f : x / 3.0f + 0.5f;
    case 6:
      return b * (x > 0.0f ? 1.0f : a * expf(x));
    case 7:
      return x > 20.0f ? 1.0f : 1.0f / (1.0f + expf(-x));
    case 8:
      return 1.0f / ((1.0f + fabsf(x)) * (1.0f + fabsf(x)));
    case 9:
      return y;  // exp(x).
    case 10:
      return 1.0f / x;
    case 11:
      return 0.5f / y;  // 0.5 / sqrt(x).
    case 12:
      return -1.0f;
    case 13:
      return x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : 0.0f;
    case 14:
      return -1.0f / (x * x);
    case 15:
      return a == 0.0f ? 0.0f : a * powf(x, a - 1.0f);
    case 16:
      return cosf(x);
    case 17:
      return -sinf(x);
    default:
      return x < a ? b : x > c ? 0.0f : 1.0f;
  }
}

__global__ void ElementwiseForwardKernel(int f, const float* x, float* y, int64_t n, float a,
                                         float b, float c) {
  DPTRAIN_GRID_STRIDE(i, n) { y[i] = FunctionValue(f, x[i], a, b, c); }
}

__global__ void ElementwiseBackwardKernel(int f, const float* x, const float* y, const float* dy,
                                          float* dx, int64_t n, float a, float b, float c) {
  DPTRAIN_GRID_STRIDE(i, n) {
    // Comparisons and integer casts pass no gradient (0, not dy * 0: dy may be infinite).
    dx[i] = f == 18 || f == 19 ? 0.0f
                               : dy[i] * FunctionSlope(f, x != nullptr ? x[i] : 0.0f,
                                                       y != nullptr ? y[i] : 0.0f, a, b, c);
  }
}

__device__ float Apply(int op, float a, float b) {
  return op == 0   ? a + b
         : op == 1 ? a - b
         : op == 2 ? a * b
         : op == 4 ? (a > 0.0f ? a : a * b)  // PRelu, b the slope.
                   : a / b;
}
__device__ float PartialA(int op, float a, float b) {
  if (op == 4) return a > 0.0f ? 1.0f : b;
  return op == 2 ? b : op == 3 ? 1.0f / b : 1.0f;
}
__device__ float PartialB(int op, float a, float b) {
  if (op == 4) return a > 0.0f ? 0.0f : a;
  return op == 0 ? 1.0f : op == 1 ? -1.0f : op == 2 ? a : -a / (b * b);
}
// The other operand's element for element i of the full one (graph::BinaryNode::OtherIndex).
__device__ int64_t OtherIndex(const OperandLayout& l, int64_t i) {
  switch (l.broadcast) {
    case 2:
      return 0;
    case 1:
      return l.batched ? i / l.plane : i / l.plane % l.channels;
    case 3:
      return i / (l.channels * l.plane) * l.plane + i % l.plane;
    default:
      return l.batched ? i : i % (l.channels * l.plane);
  }
}
__device__ float Other(const OperandLayout& l, const float* other, float scalar, int64_t i) {
  return other == nullptr ? scalar : other[OtherIndex(l, i)];
}

__global__ void BinaryForwardKernel(int op, OperandLayout layout, bool swapped, const float* full,
                                    const float* other, float scalar, float* y, int64_t n) {
  DPTRAIN_GRID_STRIDE(i, n) {
    const float b = Other(layout, other, scalar, i);
    y[i] = swapped ? Apply(op, b, full[i]) : Apply(op, full[i], b);
  }
}

__global__ void BinaryBackwardFullKernel(int op, OperandLayout layout, bool swapped,
                                         const float* full, const float* other, float scalar,
                                         const float* dy, float* dfull, int64_t n) {
  DPTRAIN_GRID_STRIDE(i, n) {
    const float a = full[i], b = Other(layout, other, scalar, i);
    dfull[i] = dy[i] * (swapped ? PartialB(op, b, a) : PartialA(op, a, b));
  }
}

// One thread per element j of `other`: the partials of the full elements that read it, in
// increasing order as the CPU adds them up (an outer run of `outer` blocks `outer_stride` apart,
// each `inner` elements `inner_stride` apart, from `base`).
__global__ void BinaryBackwardOtherKernel(int op, OperandLayout l, bool swapped, const float* full,
                                          const float* other, const float* dy, float* dother,
                                          int64_t m, int64_t n) {
  DPTRAIN_GRID_STRIDE(j, m) {
    const int64_t sample = l.channels * l.plane;
    int64_t base = j, outer = 1, outer_stride = 0, inner = 1, inner_stride = 1;
    if (l.broadcast == 2) {
      base = 0;
      inner = n;
    } else if (l.broadcast == 1 && l.batched) {
      base = j * l.plane;
      inner = l.plane;
    } else if (l.broadcast == 1) {
      base = j * l.plane;
      outer = n / sample;
      outer_stride = sample;
      inner = l.plane;
    } else if (l.broadcast == 3) {
      base = j / l.plane * sample + j % l.plane;
      inner = l.channels;
      inner_stride = l.plane;
    } else if (!l.batched) {
      outer = n / sample;
      outer_stride = sample;
    }
    const float b = other[j];
    float sum = 0.0f;
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t k = 0; k < inner; ++k) {
        const int64_t i = base + o * outer_stride + k * inner_stride;
        const float a = full[i];
        // Rounded as the CPU rounds (no fused multiply-add).
        sum = __fadd_rn(sum, __fmul_rn(dy[i], swapped ? PartialA(op, b, a) : PartialB(op, a, b)));
      }
    }
    dother[j] = sum;
  }
}

// The mean over the channels at each pixel: one thread per (sample, pixel).
__global__ void ChannelMeanForwardKernel(const float* x, float* y, int batch, int channels,
                                         int64_t plane) {
  const int64_t n = int64_t{batch} * plane;
  DPTRAIN_GRID_STRIDE(t, n) {
    const int64_t s = t / plane, p = t % plane;
    float sum = 0.0f;
    for (int c = 0; c < channels; ++c) sum += x[(s * channels + c) * plane + p];
    y[t] = sum / static_cast<float>(channels);
  }
}

__global__ void ChannelMeanBackwardKernel(const float* dy, float* dx, int batch, int channels,
                                          int64_t plane) {
  const int64_t n = int64_t{batch} * channels * plane;
  DPTRAIN_GRID_STRIDE(i, n) {
    dx[i] = dy[i / (channels * plane) * plane + i % plane] / static_cast<float>(channels);
  }
}

// Instance normalization: one thread per (sample, channel) plane, the statistics in double as
// the CPU node's.
__global__ void InstanceNormForwardKernel(const float* x, const float* scale, const float* bias,
                                          float* y, float* xhat, float* inv_std, int batch,
                                          int channels, int64_t plane, double eps) {
  const int64_t planes = int64_t{batch} * channels;
  DPTRAIN_GRID_STRIDE(q, planes) {
    const float* in = x + q * plane;
    const int c = static_cast<int>(q % channels);
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < plane; ++i) mean += in[i];
    mean /= static_cast<double>(plane);
    for (int64_t i = 0; i < plane; ++i) var += (in[i] - mean) * (in[i] - mean);
    var /= static_cast<double>(plane);
    const float inv = static_cast<float>(1.0 / sqrt(var + eps));
    inv_std[q] = inv;
    for (int64_t i = 0; i < plane; ++i) {
      const float h = static_cast<float>((in[i] - mean) * inv);
      xhat[q * plane + i] = h;
      y[q * plane + i] = __fadd_rn(__fmul_rn(h, scale[c]), bias[c]);
    }
  }
}

// d(scale) and d(B) per channel, summed sample by sample as the CPU node adds them up.
__global__ void InstanceNormParamGradKernel(const float* dy, const float* xhat, float* scale_grad,
                                            float* bias_grad, int batch, int channels,
                                            int64_t plane) {
  DPTRAIN_GRID_STRIDE(c, channels) {
    float gs = 0.0f, gb = 0.0f;
    for (int s = 0; s < batch; ++s) {
      const int64_t q = int64_t{s} * channels + c;
      for (int64_t i = 0; i < plane; ++i) {
        gs = __fadd_rn(gs, __fmul_rn(dy[q * plane + i], xhat[q * plane + i]));
        gb = __fadd_rn(gb, dy[q * plane + i]);
      }
    }
    scale_grad[c] = gs;
    bias_grad[c] = gb;
  }
}

__global__ void InstanceNormInputGradKernel(const float* dy, const float* xhat,
                                            const float* inv_std, const float* scale, float* dx,
                                            int batch, int channels, int64_t plane) {
  const int64_t planes = int64_t{batch} * channels;
  DPTRAIN_GRID_STRIDE(q, planes) {
    const double g = scale[q % channels];
    double sum = 0.0, dot = 0.0;
    for (int64_t i = 0; i < plane; ++i) {
      const double d = dy[q * plane + i] * g;
      sum += d;
      dot += d * xhat[q * plane + i];
    }
    const double k = inv_std[q] / static_cast<double>(plane);
    for (int64_t i = 0; i < plane; ++i) {
      const double d = dy[q * plane + i] * g;
      dx[q * plane + i] = static_cast<float>(
          k * (static_cast<double>(plane) * d - sum - xhat[q * plane + i] * dot));
    }
  }
}

__global__ void PadForwardKernel(const float* x, float* y, int64_t planes, int in_h, int in_w,
                                 int out_h, int out_w, int top, int left) {
  const int64_t n = planes * out_h * out_w;
  DPTRAIN_GRID_STRIDE(i, n) {
    const int64_t p = i / (int64_t{out_h} * out_w);
    const int r = static_cast<int>(i / out_w % out_h) - top;
    const int c = static_cast<int>(i % out_w) - left;
    y[i] = r >= 0 && r < in_h && c >= 0 && c < in_w ? x[(p * in_h + r) * in_w + c] : 0.0f;
  }
}

__global__ void PadBackwardKernel(const float* dy, float* dx, int64_t planes, int in_h, int in_w,
                                  int out_h, int out_w, int top, int left) {
  const int64_t n = planes * in_h * in_w;
  DPTRAIN_GRID_STRIDE(i, n) {
    const int64_t p = i / (int64_t{in_h} * in_w);
    const int r = static_cast<int>(i / in_w % in_h);
    const int c = static_cast<int>(i % in_w);
    dx[i] = dy[(p * out_h + r + top) * out_w + c + left];
  }
}

// One thread per output element: its source channel by the shuffle's permutation.
__global__ void ChannelShuffleKernel(const float* x, float* y, int batch, int channels, int groups,
                                     int64_t plane) {
  const int64_t n = int64_t{batch} * channels * plane;
  const int per_group = channels / groups;
  DPTRAIN_GRID_STRIDE(i, n) {
    const int64_t sample = i / (int64_t{channels} * plane);
    const int out_channel = static_cast<int>(i / plane % channels);
    const int in_channel = out_channel % groups * per_group + out_channel / groups;
    y[i] = x[(sample * channels + in_channel) * plane + i % plane];
  }
}

// One thread per (sample, pixel), over the channels (few: a classifier's head).
__global__ void SoftmaxForwardKernel(const float* x, float* y, int batch, int channels,
                                     int64_t plane, bool log) {
  const int64_t n = int64_t{batch} * plane;
  DPTRAIN_GRID_STRIDE(t, n) {
    const int64_t at = t / plane * channels * plane + t % plane;
    const float* in = x + at;
    float* out = y + at;
    float top = in[0];
    for (int k = 1; k < channels; ++k) top = fmaxf(top, in[k * plane]);
    float sum = 0.0f;
    for (int k = 0; k < channels; ++k) sum += expf(in[k * plane] - top);
    const float log_sum = logf(sum) + top;
    for (int k = 0; k < channels; ++k) {
      out[k * plane] = log ? in[k * plane] - log_sum : expf(in[k * plane] - log_sum);
    }
  }
}

__global__ void SoftmaxBackwardKernel(const float* y, const float* dy, float* dx, int batch,
                                      int channels, int64_t plane, bool log) {
  const int64_t n = int64_t{batch} * plane;
  DPTRAIN_GRID_STRIDE(t, n) {
    const int64_t at = t / plane * channels * plane + t % plane;
    float dot = 0.0f;
    for (int k = 0; k < channels; ++k) {
      dot += log ? dy[at + k * plane] : dy[at + k * plane] * y[at + k * plane];
    }
    for (int k = 0; k < channels; ++k) {
      const int64_t i = at + k * plane;
      dx[i] = log ? dy[i] - expf(y[i]) * dot : y[i] * (dy[i] - dot);
    }
  }
}

__global__ void TransposeKernel(const float* in, float* out, int64_t rows, int64_t cols) {
  DPTRAIN_GRID_STRIDE(i, rows * cols) {
    const int64_t r = i / cols, c = i % cols;
    out[c * rows + r] = in[i];
  }
}

// The windows (oh, ow) that contain input element (r, c): oh * stride - pad <= r < that +
// kernel, clamped to the output.
struct WindowRange {
  int oh0, oh1, ow0, ow1;
};
__device__ WindowRange WindowsOf(const PoolGeometry& g, int r, int c) {
  return {max(0, (r + g.pad_h - g.kernel_h + g.stride_h) / g.stride_h),
          min(g.out_h - 1, (r + g.pad_h) / g.stride_h),
          max(0, (c + g.pad_w - g.kernel_w + g.stride_w) / g.stride_w),
          min(g.out_w - 1, (c + g.pad_w) / g.stride_w)};
}

__global__ void MaxPoolForwardKernel(const float* x, float* y, int32_t* argmax, PoolGeometry g) {
  const int64_t n = g.planes * g.out_h * g.out_w;
  DPTRAIN_GRID_STRIDE(i, n) {
    const int64_t p = i / (int64_t{g.out_h} * g.out_w);
    const int oh = static_cast<int>(i / g.out_w % g.out_h), ow = static_cast<int>(i % g.out_w);
    const int r0 = oh * g.stride_h - g.pad_h, c0 = ow * g.stride_w - g.pad_w;
    const float* plane = x + p * g.in_h * g.in_w;
    float best = -INFINITY;
    int32_t at = -1;
    for (int r = max(r0, 0); r < min(r0 + g.kernel_h, g.in_h); ++r) {
      for (int c = max(c0, 0); c < min(c0 + g.kernel_w, g.in_w); ++c) {
        const float v = plane[r * g.in_w + c];
        if (at < 0 || v > best || (isnan(v) && !isnan(best))) {  // NaN wins, as on the CPU.
          best = v;
          at = r * g.in_w + c;
        }
      }
    }
    y[i] = best;
    argmax[i] = at;
  }
}

// One thread per input element: the dy of every window whose maximum it is, added in the
// windows' row-major order (the CPU layer's order: deterministic, and the same bits).
__global__ void MaxPoolBackwardKernel(const float* dy, const int32_t* argmax, float* dx,
                                      PoolGeometry g) {
  const int64_t n = g.planes * g.in_h * g.in_w;
  DPTRAIN_GRID_STRIDE(i, n) {
    const int64_t p = i / (int64_t{g.in_h} * g.in_w);
    const int r = static_cast<int>(i / g.in_w % g.in_h), c = static_cast<int>(i % g.in_w);
    const int32_t self = r * g.in_w + c;
    const WindowRange w = WindowsOf(g, r, c);
    const int64_t base = p * g.out_h * g.out_w;
    float sum = 0.0f;
    for (int oh = w.oh0; oh <= w.oh1; ++oh) {
      for (int ow = w.ow0; ow <= w.ow1; ++ow) {
        const int64_t o = base + int64_t{oh} * g.out_w + ow;
        if (argmax[o] == self) sum += dy[o];
      }
    }
    dx[i] = sum;
  }
}

__global__ void AvgPoolForwardKernel(const float* x, float* y, const float* scale, PoolGeometry g) {
  const int64_t n = g.planes * g.out_h * g.out_w;
  DPTRAIN_GRID_STRIDE(i, n) {
    const int64_t p = i / (int64_t{g.out_h} * g.out_w);
    const int oh = static_cast<int>(i / g.out_w % g.out_h), ow = static_cast<int>(i % g.out_w);
    const int r0 = oh * g.stride_h - g.pad_h, c0 = ow * g.stride_w - g.pad_w;
    const float* plane = x + p * g.in_h * g.in_w;
    float sum = 0.0f;
    for (int r = max(r0, 0); r < min(r0 + g.kernel_h, g.in_h); ++r) {
      for (int c = max(c0, 0); c < min(c0 + g.kernel_w, g.in_w); ++c) sum += plane[r * g.in_w + c];
    }
    y[i] = sum * scale[oh * g.out_w + ow];
  }
}

__global__ void AvgPoolBackwardKernel(const float* dy, const float* scale, float* dx,
                                      PoolGeometry g) {
  const int64_t n = g.planes * g.in_h * g.in_w;
  DPTRAIN_GRID_STRIDE(i, n) {
    const int64_t p = i / (int64_t{g.in_h} * g.in_w);
    const int r = static_cast<int>(i / g.in_w % g.in_h), c = static_cast<int>(i % g.in_w);
    const WindowRange w = WindowsOf(g, r, c);
    const int64_t base = p * g.out_h * g.out_w;
    float sum = 0.0f;
    for (int oh = w.oh0; oh <= w.oh1; ++oh) {
      for (int ow = w.ow0; ow <= w.ow1; ++ow) {
        sum += dy[base + int64_t{oh} * g.out_w + ow] * scale[oh * g.out_w + ow];
      }
    }
    dx[i] = sum;
  }
}

// One thread per sample (feature counts are small: a normalization after a Linear).
__global__ void LayerNormForwardKernel(const float* x, const float* scale, const float* bias,
                                       float* y, float* xhat, float* inv_std, int batch,
                                       int64_t size, double eps) {
  DPTRAIN_GRID_STRIDE(n, batch) {
    const float* in = x + n * size;
    double mean = 0, var = 0;
    for (int64_t i = 0; i < size; ++i) mean += in[i];
    mean /= static_cast<double>(size);
    for (int64_t i = 0; i < size; ++i) var += (in[i] - mean) * (in[i] - mean);
    var /= static_cast<double>(size);
    const float inv = static_cast<float>(1.0 / sqrt(var + eps));
    inv_std[n] = inv;
    for (int64_t i = 0; i < size; ++i) {
      const float h = static_cast<float>((in[i] - mean) * inv);
      xhat[n * size + i] = h;
      y[n * size + i] = __fadd_rn(__fmul_rn(h, scale[i]), bias != nullptr ? bias[i] : 0.0f);
    }
  }
}

// One thread per feature: its scale and bias gradients over the batch, in sample order.
__global__ void LayerNormParamGradKernel(const float* dy, const float* xhat, float* scale_grad,
                                         float* bias_grad, int batch, int64_t size) {
  DPTRAIN_GRID_STRIDE(i, size) {
    float ds = 0.0f, db = 0.0f;
    for (int n = 0; n < batch; ++n) {
      ds = __fadd_rn(ds, __fmul_rn(dy[n * size + i], xhat[n * size + i]));
      db = __fadd_rn(db, dy[n * size + i]);
    }
    scale_grad[i] = ds;
    if (bias_grad != nullptr) bias_grad[i] = db;
  }
}

__global__ void LayerNormInputGradKernel(const float* dy, const float* xhat, const float* inv_std,
                                         const float* scale, float* dx, int batch, int64_t size) {
  DPTRAIN_GRID_STRIDE(n, batch) {
    double sum = 0, dot = 0;
    for (int64_t i = 0; i < size; ++i) {
      const double d = static_cast<double>(dy[n * size + i]) * scale[i];
      sum += d;
      dot += d * xhat[n * size + i];
    }
    const double k = inv_std[n] / static_cast<double>(size);
    for (int64_t i = 0; i < size; ++i) {
      const double d = static_cast<double>(dy[n * size + i]) * scale[i];
      dx[n * size + i] = static_cast<float>(k * (size * d - sum - xhat[n * size + i] * dot));
    }
  }
}

}  // namespace

absl::Status ElementwiseForward(int function, const float* x, float* y, int64_t n, float a, float b,
                                float c, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  ElementwiseForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(function, x, y, n, a, b, c);
  return Launched("ElementwiseForwardKernel<<<>>>");
}

absl::Status ElementwiseBackward(int function, const float* x, const float* y, const float* dy,
                                 float* dx, int64_t n, float a, float b, float c,
                                 cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  ElementwiseBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(function, x, y, dy, dx, n, a, b, c);
  return Launched("ElementwiseBackwardKernel<<<>>>");
}

absl::Status BinaryForward(int op, const OperandLayout& layout, bool swapped, const float* full,
                           const float* other, float scalar, float* y, int64_t n,
                           cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  BinaryForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(op, layout, swapped, full, other, scalar,
                                                          y, n);
  return Launched("BinaryForwardKernel<<<>>>");
}

absl::Status BinaryBackwardFull(int op, const OperandLayout& layout, bool swapped,
                                const float* full, const float* other, float scalar,
                                const float* dy, float* dfull, int64_t n, cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  BinaryBackwardFullKernel<<<Blocks(n), kThreads, 0, stream>>>(op, layout, swapped, full, other,
                                                               scalar, dy, dfull, n);
  return Launched("BinaryBackwardFullKernel<<<>>>");
}

absl::Status BinaryBackwardOther(int op, const OperandLayout& layout, bool swapped,
                                 const float* full, const float* other, const float* dy,
                                 float* dother, int64_t m, int64_t n, cudaStream_t stream) {
  if (m <= 0) return absl::OkStatus();
  BinaryBackwardOtherKernel<<<Blocks(m), kThreads, 0, stream>>>(op, layout, swapped, full, other,
                                                                dy, dother, m, n);
  return Launched("BinaryBackwardOtherKernel<<<>>>");
}

absl::Status ChannelMeanForward(const float* x, float* y, int batch, int channels, int64_t plane,
                                cudaStream_t stream) {
  const int64_t n = int64_t{batch} * plane;
  if (n <= 0) return absl::OkStatus();
  ChannelMeanForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, batch, channels, plane);
  return Launched("ChannelMeanForwardKernel<<<>>>");
}

absl::Status ChannelMeanBackward(const float* dy, float* dx, int batch, int channels, int64_t plane,
                                 cudaStream_t stream) {
  const int64_t n = int64_t{batch} * channels * plane;
  if (n <= 0) return absl::OkStatus();
  ChannelMeanBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(dy, dx, batch, channels, plane);
  return Launched("ChannelMeanBackwardKernel<<<>>>");
}

absl::Status InstanceNormForward(const float* x, const float* scale, const float* bias, float* y,
                                 float* xhat, float* inv_std, int batch, int channels,
                                 int64_t plane, double eps, cudaStream_t stream) {
  const int64_t planes = int64_t{batch} * channels;
  if (planes <= 0) return absl::OkStatus();
  InstanceNormForwardKernel<<<Blocks(planes), kThreads, 0, stream>>>(
      x, scale, bias, y, xhat, inv_std, batch, channels, plane, eps);
  return Launched("InstanceNormForwardKernel<<<>>>");
}

absl::Status InstanceNormBackward(const float* dy, const float* xhat, const float* inv_std,
                                  const float* scale, float* scale_grad, float* bias_grad,
                                  float* dx, int batch, int channels, int64_t plane,
                                  cudaStream_t stream) {
  const int64_t planes = int64_t{batch} * channels;
  if (planes <= 0) {  // No samples: the parameter gradients are zero (overwritten).
    if (scale_grad == nullptr) return absl::OkStatus();
    if (cudaMemsetAsync(scale_grad, 0, channels * sizeof(float), stream) != cudaSuccess ||
        cudaMemsetAsync(bias_grad, 0, channels * sizeof(float), stream) != cudaSuccess) {
      return absl::InternalError("InstanceNormBackward: cudaMemsetAsync failed");
    }
    return absl::OkStatus();
  }
  if (scale_grad != nullptr) {
    InstanceNormParamGradKernel<<<Blocks(channels), kThreads, 0, stream>>>(
        dy, xhat, scale_grad, bias_grad, batch, channels, plane);
    if (absl::Status s = Launched("InstanceNormParamGradKernel<<<>>>"); !s.ok()) return s;
  }
  if (dx == nullptr) return absl::OkStatus();
  InstanceNormInputGradKernel<<<Blocks(planes), kThreads, 0, stream>>>(dy, xhat, inv_std, scale, dx,
                                                                       batch, channels, plane);
  return Launched("InstanceNormInputGradKernel<<<>>>");
}

absl::Status ChannelShuffle(const float* x, float* y, int batch, int channels, int groups,
                            int64_t plane, cudaStream_t stream) {
  const int64_t n = int64_t{batch} * channels * plane;
  if (n <= 0) return absl::OkStatus();
  ChannelShuffleKernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, batch, channels, groups, plane);
  return Launched("ChannelShuffleKernel<<<>>>");
}

absl::Status PadForward(const float* x, float* y, int64_t planes, int in_h, int in_w, int out_h,
                        int out_w, int top, int left, cudaStream_t stream) {
  const int64_t n = planes * out_h * out_w;
  if (n <= 0) return absl::OkStatus();
  PadForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, planes, in_h, in_w, out_h, out_w, top,
                                                       left);
  return Launched("PadForwardKernel<<<>>>");
}

absl::Status PadBackward(const float* dy, float* dx, int64_t planes, int in_h, int in_w, int out_h,
                         int out_w, int top, int left, cudaStream_t stream) {
  const int64_t n = planes * in_h * in_w;
  if (n <= 0) return absl::OkStatus();
  PadBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(dy, dx, planes, in_h, in_w, out_h, out_w,
                                                        top, left);
  return Launched("PadBackwardKernel<<<>>>");
}

absl::Status SoftmaxChannelsForward(const float* x, float* y, int batch, int channels,
                                    int64_t plane, bool log, cudaStream_t stream) {
  const int64_t n = int64_t{batch} * plane;
  if (n <= 0) return absl::OkStatus();
  SoftmaxForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, batch, channels, plane, log);
  return Launched("SoftmaxForwardKernel<<<>>>");
}

absl::Status SoftmaxChannelsBackward(const float* y, const float* dy, float* dx, int batch,
                                     int channels, int64_t plane, bool log, cudaStream_t stream) {
  const int64_t n = int64_t{batch} * plane;
  if (n <= 0) return absl::OkStatus();
  SoftmaxBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(y, dy, dx, batch, channels, plane, log);
  return Launched("SoftmaxBackwardKernel<<<>>>");
}

absl::Status Transpose(const float* in, float* out, int64_t rows, int64_t cols,
                       cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return absl::OkStatus();
  TransposeKernel<<<Blocks(n), kThreads, 0, stream>>>(in, out, rows, cols);
  return Launched("TransposeKernel<<<>>>");
}

absl::Status MaxPoolForward(const float* x, float* y, int32_t* argmax, const PoolGeometry& g,
                            cudaStream_t stream) {
  const int64_t n = g.planes * g.out_h * g.out_w;
  if (n <= 0) return absl::OkStatus();
  MaxPoolForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, argmax, g);
  return Launched("MaxPoolForwardKernel<<<>>>");
}

absl::Status MaxPoolBackward(const float* dy, const int32_t* argmax, float* dx,
                             const PoolGeometry& g, cudaStream_t stream) {
  const int64_t n = g.planes * g.in_h * g.in_w;
  if (n <= 0) return absl::OkStatus();
  MaxPoolBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(dy, argmax, dx, g);
  return Launched("MaxPoolBackwardKernel<<<>>>");
}

absl::Status AvgPoolForward(const float* x, float* y, const float* scale, const PoolGeometry& g,
                            cudaStream_t stream) {
  const int64_t n = g.planes * g.out_h * g.out_w;
  if (n <= 0) return absl::OkStatus();
  AvgPoolForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, scale, g);
  return Launched("AvgPoolForwardKernel<<<>>>");
}

absl::Status AvgPoolBackward(const float* dy, const float* scale, float* dx, const PoolGeometry& g,
                             cudaStream_t stream) {
  const int64_t n = g.planes * g.in_h * g.in_w;
  if (n <= 0) return absl::OkStatus();
  AvgPoolBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(dy, scale, dx, g);
  return Launched("AvgPoolBackwardKernel<<<>>>");
}

absl::Status LayerNormForward(const float* x, const float* scale, const float* bias, float* y,
                              float* xhat, float* inv_std, int batch, int64_t size, double eps,
                              cudaStream_t stream) {
  if (batch <= 0 || size <= 0) return absl::OkStatus();
  LayerNormForwardKernel<<<Blocks(batch), kThreads, 0, stream>>>(x, scale, bias, y, xhat, inv_std,
                                                                 batch, size, eps);
  return Launched("LayerNormForwardKernel<<<>>>");
}

absl::Status LayerNormBackward(const float* dy, const float* xhat, const float* inv_std,
                               const float* scale, float* scale_grad, float* bias_grad, float* dx,
                               int batch, int64_t size, cudaStream_t stream) {
  if (batch <= 0 || size <= 0) return absl::OkStatus();
  LayerNormParamGradKernel<<<Blocks(size), kThreads, 0, stream>>>(dy, xhat, scale_grad, bias_grad,
                                                                  batch, size);
  if (absl::Status s = Launched("LayerNormParamGradKernel<<<>>>"); !s.ok()) return s;
  if (dx == nullptr) return absl::OkStatus();
  LayerNormInputGradKernel<<<Blocks(batch), kThreads, 0, stream>>>(dy, xhat, inv_std, scale, dx,
                                                                   batch, size);
  return Launched("LayerNormInputGradKernel<<<>>>");
}

}  // namespace cuda
}  // namespace dptrain
