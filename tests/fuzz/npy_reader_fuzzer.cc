// Fuzzes the .npy reader (worker/data/npy_reader) through its public entry, LoadNpyPair, with
// a samples file and a labels file made from the input, held or streamed (uint8 images read
// from the file as training goes), and the rest of the worker's data path up to the first
// batch: the shape check against the set's own shape and kind (worker/data/batch.h), the
// sampler's first epoch and the gathering of the first batch into a buffer sized for it.
// Input: FuzzedDataProvider's bool (stream), a random-length string for the samples file, the
// rest for the labels file. Checks: a loaded set holds what its header promised (labels in
// [0, num_classes) and as many as samples; float values finite; ids whole numbers in
// [0, 2^24); features and ids one row per sample); errors are InvalidArgument or DataLoss
// only; no allocation beyond the bytes that arrived (libFuzzer's -rss_limit_mb and
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
  dir = fuzz_files::MakeDir("npy_fuzz", {"samples.npy", "labels.npy"});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const bool stream = in.ConsumeBool();
  const std::string samples = dir + "/samples.npy", labels = dir + "/labels.npy";
  fuzz_files::Write(samples, in.ConsumeRandomLengthString());
  fuzz_files::Write(labels, in.ConsumeRemainingBytesAsString());
  dptrain::NpyOptions options;
  options.loading = stream ? dptrain::DataLoading::kStream : dptrain::DataLoading::kLoad;
  absl::StatusOr<dptrain::Dataset> loaded = dptrain::LoadNpyPair(samples, labels, options);
  if (!loaded.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(loaded.status()) || absl::IsDataLoss(loaded.status()));
    return 0;
  }
  const dptrain::Dataset& d = *loaded;
  FUZZ_CHECK(d.size >= 1 && d.channels >= 1 && d.rows >= 1 && d.cols >= 1);
  FUZZ_CHECK(static_cast<int64_t>(d.labels.size()) == d.size);
  FUZZ_CHECK(d.num_classes >= 1 && d.num_classes <= dptrain::kMaxClasses);
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
  const absl::Status gathered =
      dptrain::GatherBatch(d, absl::MakeConstSpan(indices).first(n), absl::MakeSpan(batch_images),
                           absl::MakeSpan(batch_labels));
  // A streamed set's read may fail (a file changed under it cannot happen here): only OK.
  FUZZ_CHECK(gathered.ok());
  for (size_t i = 0; i < n; ++i) FUZZ_CHECK(batch_labels[i] < d.num_classes);
  return 0;
}
