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
  if (!options.fill.empty() && static_cast<int>(options.fill.size()) != shape.channels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AugmentBatch: ", options.fill.size(), " fill values for ", shape.channels, " channels"));
  }
  if (!options.enabled()) return absl::OkStatus();
  const int pad = options.crop_padding, h = shape.height, w = shape.width;
  std::vector<float> scratch(values);
  for (int i = 0; i < n; ++i) {
    const AugmentChoice choice = ChooseAugment(options, key, sample_indices[i]);
    if (!choice.flip && choice.offset_y == pad && choice.offset_x == pad) continue;
    float* image = images.data() + i * values;
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
