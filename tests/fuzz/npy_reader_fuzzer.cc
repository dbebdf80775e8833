// Fuzzes the .npy reader (worker/data/npy_reader) through its public entries, LoadNpyPair and
// LoadNpy (a directory whose samples file is train_images.npy, train_ids.npy or
// train_features.npy, which must then hold what it says), with a samples file and a labels
// file made from the input, held or streamed (uint8 images read from the file as training
// goes), a num_classes option or none, and the rest of the worker's data path up to the first
// batch: the shape check against the set's own shape and kind (worker/data/batch.h), the
// sampler's first epoch and the gathering of the first batch into a buffer sized for it.
// Input: FuzzedDataProvider's bool (stream), layout (0: LoadNpyPair; 1, 2, 3: LoadNpy with
// train_ids, train_features, train_images), num_classes (0 to 300), a random-length string for
// the samples file, the rest for the labels file. Checks: a loaded set holds what its header
// promised (labels in [0, num_classes) and as many as samples; float values finite; ids whole
// numbers in [0, 2^24); features and ids one row per sample); errors are InvalidArgument or
// DataLoss only; no allocation beyond the bytes that arrived (libFuzzer's -rss_limit_mb and
// -malloc_limit_mb catch one).
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_files.h"
#include "worker/data/batch.h"
#include "worker/data/npy_reader.h"
#include "worker/data/sampler.h"

namespace {

std::string dir;  // LLVMFuzzerInitialize's.

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  dir = fuzz_files::MakeDir("npy_fuzz",
                            {"samples.npy", "labels.npy", "train_ids.npy", "train_features.npy",
                             "train_images.npy", "train_labels.npy"});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const bool stream = in.ConsumeBool();
  const int layout = in.ConsumeIntegralInRange<int>(0, 3);
  const int num_classes = in.ConsumeIntegralInRange<int>(0, 300);
  static const char* const kSamples[] = {"samples.npy", "train_ids.npy", "train_features.npy",
                                         "train_images.npy"};
  for (const char* name : kSamples) std::remove((dir + "/" + name).c_str());
  const std::string samples = dir + "/" + kSamples[layout];
  const std::string labels = dir + (layout == 0 ? "/labels.npy" : "/train_labels.npy");
  fuzz_files::Write(samples, in.ConsumeRandomLengthString());
  fuzz_files::Write(labels, in.ConsumeRemainingBytesAsString());
  dptrain::NpyOptions options;
  options.loading = stream ? dptrain::DataLoading::kStream : dptrain::DataLoading::kLoad;
  options.num_classes = num_classes;
  absl::StatusOr<dptrain::Dataset> loaded = layout == 0
                                                ? dptrain::LoadNpyPair(samples, labels, options)
                                                : dptrain::LoadNpy(dir, /*train=*/true, options);
  if (!loaded.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(loaded.status()) || absl::IsDataLoss(loaded.status()));
    return 0;
  }
  const dptrain::Dataset& d = *loaded;
  FUZZ_CHECK(d.size >= 1 && d.channels >= 1 && d.rows >= 1 && d.cols >= 1);
  if (d.regression()) {  // A float labels file: target values, finite, no classes.
    FUZZ_CHECK(num_classes == 0 && d.num_classes == 0 && d.labels.empty());
    FUZZ_CHECK(d.targets_per_sample <= dptrain::kMaxClasses);
    FUZZ_CHECK(static_cast<int64_t>(d.targets.size()) == d.size * d.targets_per_sample);
    for (float v : d.targets) FUZZ_CHECK(std::isfinite(v));
  } else {
    FUZZ_CHECK(static_cast<int64_t>(d.labels.size()) == d.size && d.targets.empty());
    FUZZ_CHECK(d.num_classes >= 1 && d.num_classes <= dptrain::kMaxClasses);
    FUZZ_CHECK(num_classes == 0 || d.num_classes == num_classes);
  }
  FUZZ_CHECK(layout != 1 || d.ids);         // train_ids.npy holds ids,
  FUZZ_CHECK(layout != 2 || d.features());  // train_features.npy feature vectors.
  for (dptrain::nn::Label l : d.labels) FUZZ_CHECK(l >= 0 && l < d.num_classes);
  FUZZ_CHECK(d.consistent());
  FUZZ_CHECK(!d.ids || (d.rows == 1 && d.cols == 1 && !d.byte_storage));
  FUZZ_CHECK(d.source == nullptr || stream);
  if (d.source == nullptr && !d.byte_storage) {
    for (float v : d.images) {
      FUZZ_CHECK(std::isfinite(v));
      FUZZ_CHECK(!d.ids || (v >= 0 && v < 16777216.0f && v == std::floor(v)));
    }
  }

  // Reader to first batch, as the trainer goes for a model that takes what the set holds.
  const dptrain::ImageShape model_input{d.channels, d.rows, d.cols, d.ids};
  FUZZ_CHECK(dptrain::CheckImageShape(d, model_input, "model", "the data").ok());
  auto sampler = dptrain::DistributedSampler::Create({d.size, 2, 0, /*seed=*/1, true});
  FUZZ_CHECK(sampler.ok());
  const std::vector<int64_t> indices = sampler->EpochIndices(0);
  constexpr int kBatch = 4;
  const size_t n = std::min<size_t>(kBatch, indices.size());
  if (d.source != nullptr) d.source->Plan(indices);
  std::vector<float> batch_images(static_cast<size_t>(kBatch * d.image_size()));
  std::vector<dptrain::nn::Label> batch_labels(kBatch);
  std::vector<float> batch_targets(static_cast<size_t>(kBatch) * d.targets_per_sample);
  const absl::Status gathered =
      dptrain::GatherBatch(d, absl::MakeConstSpan(indices).first(n), absl::MakeSpan(batch_images),
                           absl::MakeSpan(batch_labels), absl::MakeSpan(batch_targets));
  // A streamed set's read may fail (a file changed under it cannot happen here): only OK.
  FUZZ_CHECK(gathered.ok());
  for (size_t i = 0; i < n && !d.regression(); ++i) FUZZ_CHECK(batch_labels[i] < d.num_classes);
  for (size_t i = 0; i < n && d.regression(); ++i) {  // Each sample's own target values.
    for (int k = 0; k < d.targets_per_sample; ++k) {
      FUZZ_CHECK(batch_targets[i * d.targets_per_sample + k] ==
                 d.targets[indices[i] * d.targets_per_sample + k]);
    }
  }
  return 0;
}
