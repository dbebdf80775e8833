// A training set that the model keeps where it computes (a GPU's memory: nn::Model's
// HoldTrainingData), so that each step sends only its samples' indices and their augmentation
// choices instead of the batch's pixels: the images as bytes (worker/data/dataset.h's byte
// storage), each value made as Dataset::BytesToValues makes it (byte / 255, then the recorded
// per-channel normalisation) and cropped and flipped as AugmentBatch does
// (worker/data/transforms.h: a window shifted in the zero-padded image, then mirrored).
//
// HeldValue is the per-element function that the CUDA gather kernel runs and that the host
// tests (worker/held_batches_test) check bit for bit against GatherBatch + AugmentBatch.
#ifndef DPTRAIN_WORKER_NN_HELD_DATA_H_
#define DPTRAIN_WORKER_NN_HELD_DATA_H_

#include <cstdint>

#include "common/host_device.h"

#ifndef __CUDACC__
#include <vector>

#include "absl/types/span.h"
#include "worker/nn/tensor.h"
#endif

namespace dptrain {
namespace nn {

// One sample of a step: the image's index in the held set, and what AugmentBatch does to it:
// output pixel (y, x) shows pixel (y + shift_y, (flip ? cols - 1 - x : x) + shift_x) of the
// image, or the channel's fill value where that lies outside it.
struct HeldSample {
  int64_t index = 0;
  int32_t shift_y = 0;
  int32_t shift_x = 0;
  int32_t flip = 0;  // 0 or 1.
  int32_t unused = 0;
};

// Value (c, y, x) of `sample`, whose image is `image` (channels x rows x cols bytes, planar).
// `mean` and `inv_std`: per channel, or null (no normalisation); `fill`: per channel, or null
// (padding is 0).
DPTRAIN_HOST_DEVICE inline float HeldValue(const uint8_t* image, int rows, int cols, int c, int y,
                                           int x, const HeldSample& sample, const float* mean,
                                           const float* inv_std, const float* fill) {
  const int sy = y + sample.shift_y;
  const int sx = (sample.flip != 0 ? cols - 1 - x : x) + sample.shift_x;
  if (sy < 0 || sy >= rows || sx < 0 || sx >= cols) return fill != nullptr ? fill[c] : 0.0f;
  const int64_t plane = static_cast<int64_t>(rows) * cols;
  const float v =
      static_cast<float>(image[c * plane + static_cast<int64_t>(sy) * cols + sx]) / 255.0f;
  return mean != nullptr ? (v - mean[c]) * inv_std[c] : v;
}

#ifndef __CUDACC__
// The training set as the model keeps it. The spans need only outlive HoldTrainingData (the
// model copies them).
struct HeldData {
  int64_t size = 0;
  int channels = 0, rows = 0, cols = 0;
  absl::Span<const uint8_t> bytes;   // size * channels * rows * cols.
  absl::Span<const Label> labels;    // size.
  std::vector<float> mean, inv_std;  // Per channel, or both empty: no normalisation.
  std::vector<float> fill;           // Per channel, or empty: padding is 0.
};
#endif

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_HELD_DATA_H_
