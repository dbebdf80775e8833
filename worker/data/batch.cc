#include "worker/data/batch.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace dptrain {

absl::Status CheckImageShape(const Dataset& data, const ImageShape& model_input,
                             absl::string_view model, absl::string_view what) {
  if (data.channels == model_input.channels && data.rows == model_input.height &&
      data.cols == model_input.width) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, " holds ", data.channels, "x", data.rows, "x", data.cols, " images but model ", model,
      " takes ", model_input.channels, "x", model_input.height, "x", model_input.width, " inputs"));
}

absl::Status GatherBatch(const Dataset& data, absl::Span<const int64_t> indices,
                         absl::Span<float> images, absl::Span<uint8_t> labels) {
  const int64_t pixels = data.image_size();
  const int64_t n = static_cast<int64_t>(indices.size());
  if (static_cast<int64_t>(images.size()) < n * pixels || static_cast<int64_t>(labels.size()) < n) {
    return absl::InvalidArgumentError(
        absl::StrCat("a batch of ", n, " samples of ", pixels, " values does not fit buffers of ",
                     images.size(), " values and ", labels.size(), " labels"));
  }
  if (!data.consistent() || static_cast<int64_t>(data.labels.size()) != data.size) {
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
    labels[i] = data.labels[indices[i]];
  }
  return absl::OkStatus();
}

}  // namespace dptrain
