// Fuzzes the IDX reader (worker/data/idx_reader) through its public entry, LoadIdxPair, with
// an images file and a labels file made from the input (raw or gzip: zlib reads both).
// Input: FuzzedDataProvider's random-length string for the images file, the rest for the
// labels file. Checks: a loaded data set holds exactly what its header promised (pixels in
// [0, 1], labels < num_classes, as many labels as images); errors are InvalidArgument or
// DataLoss only; no allocation beyond the bytes that arrived (libFuzzer's -rss_limit_mb and
// -malloc_limit_mb catch one).
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/fuzz/fuzz_check.h"
#include "worker/data/idx_reader.h"

namespace {

std::string& Dir() {
  static std::string dir;
  return dir;
}

void Write(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  FUZZ_CHECK(f != nullptr);
  FUZZ_CHECK(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
  FUZZ_CHECK(std::fclose(f) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  if (tmp == nullptr) tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/idx_fuzz.XXXXXX";
  FUZZ_CHECK(mkdtemp(dir.data()) != nullptr);
  Dir() = dir;
  std::atexit([] {
    std::remove((Dir() + "/images").c_str());
    std::remove((Dir() + "/labels").c_str());
    rmdir(Dir().c_str());
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const std::string images = Dir() + "/images", labels = Dir() + "/labels";
  Write(images, in.ConsumeRandomLengthString());
  Write(labels, in.ConsumeRemainingBytesAsString());
  absl::StatusOr<dptrain::Dataset> loaded = dptrain::LoadIdxPair(images, labels);
  if (!loaded.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(loaded.status()) || absl::IsDataLoss(loaded.status()));
    return 0;
  }
  const dptrain::Dataset& d = *loaded;
  FUZZ_CHECK(d.rows >= 1 && d.cols >= 1 && d.num_classes == 10);
  FUZZ_CHECK(static_cast<int64_t>(d.labels.size()) == d.size);
  FUZZ_CHECK(static_cast<int64_t>(d.images.size()) == d.size * d.rows * d.cols);
  for (float p : d.images) FUZZ_CHECK(p >= 0.0f && p <= 1.0f);
  for (uint8_t l : d.labels) FUZZ_CHECK(l < d.num_classes);
  return 0;
}
