// Window geometry shared by AvgPool2d and MaxPool2d (PyTorch's kernel_size, stride, padding
// and ceil_mode with dilation 1), and the checks and output size both derive from it.
#ifndef DPTRAIN_WORKER_NN_POOL2D_OPTIONS_H_
#define DPTRAIN_WORKER_NN_POOL2D_OPTIONS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "worker/nn/layer.h"

namespace dptrain {
namespace nn {

struct Pool2dOptions {
  int kernel_h = 2;
  int kernel_w = 2;
  int stride_h = 2;
  int stride_w = 2;
  int pad_h = 0;
  int pad_w = 0;
  // Output size rounded up (PyTorch's ceil_mode=True): a last, partial window is kept if it
  // starts inside the input or its left padding.
  bool ceil_mode = false;
  // AvgPool2d: whether padded zeros count in a window's divisor (PyTorch's default), or only
  // the input elements it covers (count_include_pad=False). MaxPool2d ignores it.
  bool count_include_pad = true;

  // As nn.*Pool2d(kernel_size=k, stride=s, padding=p); stride 0 means stride = kernel.
  static Pool2dOptions Square(int kernel, int stride = 0, int padding = 0) {
    const int s = stride == 0 ? kernel : stride;
    return {kernel, kernel, s, s, padding, padding};
  }
};

// "<layer>(kernel_size=(kh, kw), stride=(sh, sw), padding=(ph, pw))".
inline std::string PoolToString(const char* layer, const Pool2dOptions& o) {
  return absl::StrCat(layer, "(kernel_size=(", o.kernel_h, ", ", o.kernel_w, "), stride=(",
                      o.stride_h, ", ", o.stride_w, "), padding=(", o.pad_h, ", ", o.pad_w, ")",
                      o.ceil_mode ? ", ceil_mode=True" : "", ")");
}

// The pooled length of `in` (padded by `pad` each side) for a window `k` moved by `stride`, as
// PyTorch computes it (pooling_output_shape).
inline int PooledLength(int in, int k, int stride, int pad, bool ceil_mode) {
  const int span = in + 2 * pad - k;
  int out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
  // The last window must start inside the input or its left padding.
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

// The pooled size of `input`; InvalidArgument for a bad window (PyTorch also requires
// padding <= kernel / 2) or a window larger than the padded input.
inline absl::StatusOr<Dims> PoolOutputDims(const char* layer, const Pool2dOptions& o,
                                           const Dims& input) {
  if (o.kernel_h < 1 || o.kernel_w < 1 || o.stride_h < 1 || o.stride_w < 1 || o.pad_h < 0 ||
      o.pad_w < 0 || 2 * o.pad_h > o.kernel_h || 2 * o.pad_w > o.kernel_w) {
    return absl::InvalidArgumentError(
        absl::StrCat(PoolToString(layer, o), ": invalid configuration"));
  }
  const int ph = input.h + 2 * o.pad_h, pw = input.w + 2 * o.pad_w;
  if (input.c < 1 || ph < o.kernel_h || pw < o.kernel_w) {
    return absl::InvalidArgumentError(
        absl::StrCat(PoolToString(layer, o), ": does not fit input ", input.ToString()));
  }
  return Dims{input.c, PooledLength(input.h, o.kernel_h, o.stride_h, o.pad_h, o.ceil_mode),
              PooledLength(input.w, o.kernel_w, o.stride_w, o.pad_w, o.ceil_mode)};
}

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_POOL2D_OPTIONS_H_
