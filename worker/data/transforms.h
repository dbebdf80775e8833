// Transforms of image data: per-channel normalization of a whole Dataset, and the standard
// augmentations of a gathered batch: a random resized crop (torchvision's
// RandomResizedCrop(size, scale=(s, 1)), the ImageNet recipe's), a random crop with padding
// (RandomCrop(size, padding), CIFAR's) and a random horizontal flip (RandomHorizontalFlip),
// applied in that order.
//
// Augmentation is deterministic: what happens to a sample is a function of a key (from the
// seed and the epoch: AugmentKey) and the sample's index in the data set, drawn by a
// counter-based hash (SplitMix64's finalizer, common/mix.h). So it does not depend on the
// batch size, on which rank gathers the sample, on thread counts or on what ran before: a
// worker that rejoins or goes back to a step sees exactly the batches of an uninterrupted run.
//
// Thread-compatible: the functions touch no shared state.
#ifndef DPTRAIN_WORKER_DATA_TRANSFORMS_H_
#define DPTRAIN_WORKER_DATA_TRANSFORMS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/data/batch.h"
#include "worker/data/dataset.h"

namespace dptrain {

// x = (x - mean[c]) / std[c] for every value of channel c of every image, as torchvision's
// Normalize. InvalidArgument (changing nothing) unless mean and std have data.channels entries,
// every std is > 0 and finite, every mean finite, and data's arrays match its size.
absl::Status Normalize(Dataset& data, absl::Span<const float> mean, absl::Span<const float> std);

struct AugmentOptions {
  // Random resized crop: a box of a random area in [resized_crop_min_scale, 1] of the image's
  // and a random aspect ratio (width / height, log-uniform in [3/4, 4/3]) at a random place,
  // chosen as torchvision's RandomResizedCrop.get_params chooses it (10 tries, then the
  // centre crop of the image's ratio clamped to the range), is scaled back to the image's size
  // with bilinear interpolation (half-pixel centres, as torch.nn.functional.interpolate with
  // align_corners=False; the box is never larger than the image, so no antialiasing is
  // needed). 0: none; else in (0, 1].
  double resized_crop_min_scale = 0;
  // Random crop: pad each side by this many pixels, then crop a window of the original size
  // at a uniformly random offset in [0, 2 * crop_padding] along each axis. 0: no crop.
  int crop_padding = 0;
  // Random horizontal flip (mirror left-right) with probability 1/2, after the crop.
  bool horizontal_flip = false;
  // The value of padded pixels per channel; empty: 0 in every channel. Padding is applied to
  // the batch as it is: after Normalize, 0 is the mean colour, and torchvision's black padding
  // (before its Normalize) is fill[c] = -mean[c] / std[c].
  std::vector<float> fill;

  bool enabled() const { return resized_crop_min_scale > 0 || crop_padding > 0 || horizontal_flip; }
};

// The box a random resized crop takes from an image: rows [top, top + height), columns
// [left, left + width).
struct CropBox {
  int top = 0;
  int left = 0;
  int height = 0;
  int width = 0;
};

// What AugmentBatch does to one sample.
struct AugmentChoice {
  int offset_y = 0;  // Crop window's top-left corner in the padded image: [0, 2 * padding].
  int offset_x = 0;  // Equal to the padding on both axes: no shift.
  bool flip = false;
};

// The key of one epoch's augmentation.
uint64_t AugmentKey(uint64_t seed, int64_t epoch);

// The choice for sample `sample_index` under `key` (a pure function).
AugmentChoice ChooseAugment(const AugmentOptions& options, uint64_t key, int64_t sample_index);

// The random resized crop's box for sample `sample_index` under `key` in an image of
// height x width (a pure function; options.resized_crop_min_scale in (0, 1]).
CropBox ChooseResizedCrop(const AugmentOptions& options, int height, int width, uint64_t key,
                          int64_t sample_index);

// Augments the first n samples of `images` (each shape.channels x height x width, back to back,
// as GatherBatch leaves them) in place; sample i is data set sample sample_indices[i]. Does
// nothing if !options.enabled(). InvalidArgument (changing nothing) if sample_indices does not
// hold n indices, `images` is smaller than n samples, the shape is not positive, crop_padding
// is outside [0, 1024], resized_crop_min_scale outside {0} and (0, 1], or fill has neither 0
// nor shape.channels entries.
absl::Status AugmentBatch(absl::Span<float> images, int n, const ImageShape& shape,
                          const AugmentOptions& options, uint64_t key,
                          absl::Span<const int64_t> sample_indices);

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_DATA_TRANSFORMS_H_
