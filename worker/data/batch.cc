#include "worker/data/batch.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dptrain {

absl::Status CheckImageShape(const Dataset& data, const ImageShape& model_input,
                             absl::string_view model, absl::string_view what) {
  if (data.ids == model_input.ids && data.channels == model_input.channels &&
      data.rows == model_input.height && data.cols == model_input.width) {
    if (!data.ids || model_input.ids_below <= 0 || !data.consistent()) return absl::OkStatus();
    const float limit = static_cast<float>(model_input.ids_below);
    const int64_t length = data.image_size();
    for (int64_t k = 0; k < data.size * length; ++k) {
      if (data.images[k] < limit) continue;
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": id ", absl::StrFormat("%.9g", data.images[k]), " at sample ",
                       k / length, ", position ", k % length, " is not below ",
                       model_input.ids_below, ", the rows of model ", model, "'s embedding table"));
    }
    return absl::OkStatus();
  }
  // "3x32x32 images", "16 integer id(s) per sample", "24 feature(s) per sample" (a feature
  // vector is Fx1x1); the model's images are "inputs" beside the data's images.
  auto describe = [](bool ids, int c, int h, int w, absl::string_view images) {
    if (ids) return absl::StrCat(int64_t{c} * h * w, " integer id(s) per sample");
    if (h == 1 && w == 1) return absl::StrCat(c, " feature(s) per sample");
    return absl::StrCat(c, "x", h, "x", w, " ", images);
  };
  return absl::InvalidArgumentError(absl::StrCat(
      what, " holds ", describe(data.ids, data.channels, data.rows, data.cols, "images"),
      " but model ", model, " takes ",
      describe(model_input.ids, model_input.channels, model_input.height, model_input.width,
               data.ids ? "images" : "inputs"),
      data.ids && !model_input.ids && model_input.height == 1 && model_input.width == 1
          ? " (an integer .npy array of rank 2 is read as ids: save features as float32)"
          : ""));
}

absl::Status GatherBatch(const Dataset& data, absl::Span<const int64_t> indices,
                         absl::Span<float> images, absl::Span<nn::Label> labels,
                         absl::Span<float> targets) {
  const int64_t pixels = data.image_size();
  const int64_t n = static_cast<int64_t>(indices.size());
  const int64_t per_sample = data.targets_per_sample;
  const bool fits = data.regression() ? static_cast<int64_t>(targets.size()) >= n * per_sample
                                      : static_cast<int64_t>(labels.size()) >= n;
  if (static_cast<int64_t>(images.size()) < n * pixels || !fits) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a batch of ", n, " samples of ", pixels, " values does not fit buffers of ", images.size(),
        " values and ",
        data.regression()
            ? absl::StrCat(targets.size(), " target values (", per_sample, " per sample)")
            : absl::StrCat(labels.size(), " labels")));
  }
  if (!data.consistent() || !data.scores_consistent()) {
    return absl::InvalidArgumentError("the data set's arrays do not match its size");
  }
  for (int64_t idx : indices) {
    if (idx < 0 || idx >= data.size) {
      return absl::InvalidArgumentError(
          absl::StrCat("sample index ", idx, " is outside the data set of ", data.size));
    }
  }
  std::vector<uint8_t> scratch;
  for (int64_t i = 0; i < n; ++i) {
    if (absl::Status s = data.ReadImage(indices[i], images.data() + i * pixels, scratch); !s.ok()) {
      return s;
    }
    if (data.regression()) {
      std::copy_n(data.targets.data() + indices[i] * per_sample, per_sample,
                  targets.data() + i * per_sample);
    } else {
      labels[i] = data.labels[indices[i]];
    }
  }
  return absl::OkStatus();
}

}  // namespace dptrain
