// Fuzzes the IDX reader (worker/data/idx_reader) through its public entry, LoadIdxPair, with
// an images file and a labels file made from the input (raw or gzip: zlib reads both), and the
// rest of the worker's data path up to the first batch: the shape check against a 1x28x28
// model input (worker/data/batch.h), the distributed sampler's first epoch and the gathering
// of the first batch into a buffer sized for the model's input, as the trainer does (ASan
// catches any read or write past a buffer; issue 30 item 2).
// Input: FuzzedDataProvider's random-length string for the images file, the rest for the
// labels file. Checks: a loaded data set holds exactly what its header promised (pixels in
// [0, 1], labels < num_classes, as many labels as images); errors are InvalidArgument or
// DataLoss only; no allocation beyond the bytes that arrived (libFuzzer's -rss_limit_mb and
// -malloc_limit_mb catch one).
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_files.h"
#include "worker/data/batch.h"
#include "worker/data/idx_reader.h"
#include "worker/data/sampler.h"

namespace {

std::string dir;  // LLVMFuzzerInitialize's.

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  dir = fuzz_files::MakeDir("idx_fuzz", {"images", "labels"});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const std::string images = dir + "/images", labels = dir + "/labels";
  fuzz_files::Write(images, in.ConsumeRandomLengthString());
  fuzz_files::Write(labels, in.ConsumeRemainingBytesAsString());
  absl::StatusOr<dptrain::Dataset> loaded = dptrain::LoadIdxPair(images, labels);
  if (!loaded.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(loaded.status()) || absl::IsDataLoss(loaded.status()));
    return 0;
  }
  const dptrain::Dataset& d = *loaded;
  FUZZ_CHECK(d.channels == 1 && d.rows >= 1 && d.cols >= 1 && d.num_classes == 10);
  FUZZ_CHECK(static_cast<int64_t>(d.labels.size()) == d.size);
  FUZZ_CHECK(d.consistent() && d.byte_storage);
  std::vector<float> values(static_cast<size_t>(d.size * d.image_size()));
  if (d.size > 0) d.CopyImages(0, d.size, values.data());
  for (float p : values) FUZZ_CHECK(p >= 0.0f && p <= 1.0f);
  for (dptrain::nn::Label l : d.labels) FUZZ_CHECK(l >= 0 && l < d.num_classes);

  // Reader to first batch, as the trainer goes for a model that takes 1x28x28 images.
  const dptrain::ImageShape model_input{1, 28, 28};
  const absl::Status shape = dptrain::CheckImageShape(d, model_input, "mlp", "the data");
  FUZZ_CHECK(shape.ok() == (d.rows == 28 && d.cols == 28));
  if (!shape.ok() || d.size < 1) return 0;
  auto sampler = dptrain::DistributedSampler::Create({d.size, 2, 0, /*seed=*/1, true});
  FUZZ_CHECK(sampler.ok());
  const std::vector<int64_t> indices = sampler->EpochIndices(0);
  constexpr int kBatch = 4;
  const size_t n = std::min<size_t>(kBatch, indices.size());
  std::vector<float> batch_images(kBatch * 28 * 28);
  std::vector<dptrain::nn::Label> batch_labels(kBatch);
  FUZZ_CHECK(dptrain::GatherBatch(d, absl::MakeConstSpan(indices).first(n),
                                  absl::MakeSpan(batch_images), absl::MakeSpan(batch_labels))
                 .ok());
  for (size_t i = 0; i < n; ++i) FUZZ_CHECK(batch_labels[i] < d.num_classes);
  return 0;
}
