#include "worker/data/transforms.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/mix.h"

namespace dptrain {
namespace {

constexpr int kMaxPadding = 1024;
// Separates augmentation's stream from the sampler's and other users of Mix64.
constexpr uint64_t kAugmentTag = 0xA7C3'5E1D'0B4F'9263ull;
// Separates the resized crop's draws from the crop's and flip's.
constexpr uint64_t kResizedCropTag = 0x3D9B'71C4'E250'8A17ull;

// A uniform double in [0, 1) from 53 bits.
double Uniform01(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

// Python's round() of a non-negative double as torchvision's get_params uses it (halves to
// even).
int RoundHalfEven(double v) { return static_cast<int>(std::nearbyint(v)); }

// Scales the box `box` of `src` (h x w, one channel plane) to the whole of `dst` (h x w) with
// bilinear interpolation at half-pixel centres, as F.interpolate(align_corners=False).
void ResizeBoxBilinear(const float* src, int h, int w, const CropBox& box, float* dst) {
  const double sy = static_cast<double>(box.height) / h, sx = static_cast<double>(box.width) / w;
  for (int y = 0; y < h; ++y) {
    const double fy = std::max(0.0, (y + 0.5) * sy - 0.5);
    const int y0 = std::min(static_cast<int>(fy), box.height - 1);
    const int y1 = std::min(y0 + 1, box.height - 1);
    const float ly = static_cast<float>(fy - y0);
    const float* r0 = src + static_cast<int64_t>(box.top + y0) * w + box.left;
    const float* r1 = src + static_cast<int64_t>(box.top + y1) * w + box.left;
    float* out = dst + static_cast<int64_t>(y) * w;
    for (int x = 0; x < w; ++x) {
      const double fx = std::max(0.0, (x + 0.5) * sx - 0.5);
      const int x0 = std::min(static_cast<int>(fx), box.width - 1);
      const int x1 = std::min(x0 + 1, box.width - 1);
      const float lx = static_cast<float>(fx - x0);
      const float top = r0[x0] + (r0[x1] - r0[x0]) * lx;
      const float bottom = r1[x0] + (r1[x1] - r1[x0]) * lx;
      out[x] = top + (bottom - top) * ly;
    }
  }
}

}  // namespace

absl::Status Normalize(Dataset& data, absl::Span<const float> mean, absl::Span<const float> std) {
  if (static_cast<int64_t>(mean.size()) != data.channels ||
      static_cast<int64_t>(std.size()) != data.channels) {
    return absl::InvalidArgumentError(absl::StrCat("Normalize: ", mean.size(), " means and ",
                                                   std.size(), " standard deviations for ",
                                                   data.channels, " channels"));
  }
  for (int c = 0; c < data.channels; ++c) {
    if (!std::isfinite(mean[c]) || !std::isfinite(std[c]) || !(std[c] > 0)) {
      return absl::InvalidArgumentError(absl::StrCat("Normalize: channel ", c, " has mean ",
                                                     mean[c], " and std ", std[c],
                                                     " (std must be > 0, both finite)"));
    }
  }
  if (!data.consistent()) {
    return absl::InvalidArgumentError("Normalize: the data set's arrays do not match its size");
  }
  if (data.byte_storage) {  // Recorded, applied as images are read (CopyImages).
    if (!data.norm_mean.empty()) {
      return absl::FailedPreconditionError("Normalize: the data set is normalised already");
    }
    for (int c = 0; c < data.channels; ++c) {
      data.norm_mean.push_back(mean[c]);
      data.norm_inv_std.push_back(1.0f / std[c]);
    }
    return absl::OkStatus();
  }
  const int64_t plane = static_cast<int64_t>(data.rows) * data.cols;
  for (int64_t i = 0; i < data.size; ++i) {
    float* image = data.mutable_image(i);
    for (int c = 0; c < data.channels; ++c) {
      const float m = mean[c], inv = 1.0f / std[c];
      float* p = image + c * plane;
      for (int64_t k = 0; k < plane; ++k) p[k] = (p[k] - m) * inv;
    }
  }
  return absl::OkStatus();
}

uint64_t AugmentKey(uint64_t seed, int64_t epoch) {
  return Mix64(Mix64(seed ^ kAugmentTag) + static_cast<uint64_t>(epoch));
}

AugmentChoice ChooseAugment(const AugmentOptions& options, uint64_t key, int64_t sample_index) {
  const uint64_t h = Mix64(key ^ Mix64(static_cast<uint64_t>(sample_index)));
  AugmentChoice choice;
  const int pad = options.crop_padding > 0 ? options.crop_padding : 0;
  const uint64_t span = 2 * static_cast<uint64_t>(pad) + 1;
  // Independent bit fields of h: 24 bits per offset (the modulo bias is below 2^-13).
  choice.offset_y = static_cast<int>((h & 0xFFFFFF) % span);
  choice.offset_x = static_cast<int>(((h >> 24) & 0xFFFFFF) % span);
  choice.flip = options.horizontal_flip && (h >> 63) != 0;
  return choice;
}

CropBox ChooseResizedCrop(const AugmentOptions& options, int height, int width, uint64_t key,
                          int64_t sample_index) {
  const uint64_t h = Mix64(key ^ kResizedCropTag ^ Mix64(static_cast<uint64_t>(sample_index)));
  const double area = static_cast<double>(height) * width;
  const double min_scale = options.resized_crop_min_scale;
  const double log_lo = std::log(3.0 / 4.0), log_hi = std::log(4.0 / 3.0);
  for (uint64_t attempt = 0; attempt < 10; ++attempt) {
    auto draw = [&](uint64_t k) { return Uniform01(Mix64(h + 5 * attempt + k)); };
    const double target = area * (min_scale + (1.0 - min_scale) * draw(0));
    const double ratio = std::exp(log_lo + (log_hi - log_lo) * draw(1));
    const int w = RoundHalfEven(std::sqrt(target * ratio));
    const int hh = RoundHalfEven(std::sqrt(target / ratio));
    if (w > 0 && w <= width && hh > 0 && hh <= height) {
      CropBox box;
      box.height = hh;
      box.width = w;
      // Uniform integers in [0, height - hh] and [0, width - w] (the modulo bias is below 2^-32).
      box.top = static_cast<int>((Mix64(h + 5 * attempt + 2) >> 32) % (height - hh + 1));
      box.left = static_cast<int>((Mix64(h + 5 * attempt + 3) >> 32) % (width - w + 1));
      return box;
    }
  }
  // The fallback: the centre crop of the image's aspect ratio clamped to [3/4, 4/3].
  const double in_ratio = static_cast<double>(width) / height;
  CropBox box{0, 0, height, width};
  if (in_ratio < 3.0 / 4.0) {
    box.height = std::min(height, RoundHalfEven(width / (3.0 / 4.0)));
  } else if (in_ratio > 4.0 / 3.0) {
    box.width = std::min(width, RoundHalfEven(height * (4.0 / 3.0)));
  }
  box.top = (height - box.height) / 2;
  box.left = (width - box.width) / 2;
  return box;
}

absl::Status AugmentBatch(absl::Span<float> images, int n, const ImageShape& shape,
                          const AugmentOptions& options, uint64_t key,
                          absl::Span<const int64_t> sample_indices) {
  if (n < 0 || static_cast<int64_t>(sample_indices.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat("AugmentBatch: ", sample_indices.size(),
                                                   " sample indices for ", n, " samples"));
  }
  if (shape.channels < 1 || shape.height < 1 || shape.width < 1) {
    return absl::InvalidArgumentError(absl::StrCat("AugmentBatch: bad image shape ", shape.channels,
                                                   "x", shape.height, "x", shape.width));
  }
  const int64_t plane = static_cast<int64_t>(shape.height) * shape.width;
  const int64_t values = shape.channels * plane;
  if (static_cast<int64_t>(images.size()) / values < n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AugmentBatch: ", images.size(), " values cannot hold ", n, " samples of ", values));
  }
  if (options.crop_padding < 0 || options.crop_padding > kMaxPadding) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AugmentBatch: crop padding ", options.crop_padding, " is not in [0, ", kMaxPadding, "]"));
  }
  if (options.resized_crop_min_scale != 0 &&
      !(options.resized_crop_min_scale > 0 && options.resized_crop_min_scale <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("AugmentBatch: resized crop min scale ",
                                                   options.resized_crop_min_scale,
                                                   " is not in (0, 1] (or 0: none)"));
  }
  if (!options.fill.empty() && static_cast<int>(options.fill.size()) != shape.channels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AugmentBatch: ", options.fill.size(), " fill values for ", shape.channels, " channels"));
  }
  if (!options.enabled()) return absl::OkStatus();
  const int pad = options.crop_padding, h = shape.height, w = shape.width;
  std::vector<float> scratch(values);
  for (int i = 0; i < n; ++i) {
    float* image = images.data() + i * values;
    if (options.resized_crop_min_scale > 0) {
      const CropBox box = ChooseResizedCrop(options, h, w, key, sample_indices[i]);
      if (box.height != h || box.width != w) {
        for (int c = 0; c < shape.channels; ++c) {
          ResizeBoxBilinear(image + c * plane, h, w, box, scratch.data() + c * plane);
        }
        std::copy(scratch.begin(), scratch.end(), image);
      }
    }
    const AugmentChoice choice = ChooseAugment(options, key, sample_indices[i]);
    if (!choice.flip && choice.offset_y == pad && choice.offset_x == pad) continue;
    const int shift_y = choice.offset_y - pad, shift_x = choice.offset_x - pad;
    for (int c = 0; c < shape.channels; ++c) {
      const float fill = options.fill.empty() ? 0.0f : options.fill[c];
      const float* src = image + c * plane;
      float* dst = scratch.data() + c * plane;
      for (int y = 0; y < h; ++y) {
        const int sy = y + shift_y;
        float* out = dst + static_cast<int64_t>(y) * w;
        if (sy < 0 || sy >= h) {
          for (int x = 0; x < w; ++x) out[x] = fill;
          continue;
        }
        const float* row = src + static_cast<int64_t>(sy) * w;
        for (int x = 0; x < w; ++x) {
          // Crop, then flip: output column x shows cropped column (flip ? w - 1 - x : x).
          const int sx = (choice.flip ? w - 1 - x : x) + shift_x;
          out[x] = sx >= 0 && sx < w ? row[sx] : fill;
        }
      }
    }
    std::copy(scratch.begin(), scratch.end(), image);
  }
  return absl::OkStatus();
}

}  // namespace dptrain
