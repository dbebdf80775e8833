#include "worker/data/cifar_reader.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/data/held_memory.h"
#include "worker/data/input_file.h"

namespace dptrain {
namespace {

constexpr int kSide = 32;
constexpr int kChannels = 3;
constexpr int64_t kPixels = kChannels * kSide * kSide;  // 3072.
constexpr int64_t kRecordsPerChunk = 1024;

struct Variant {
  int num_classes;
  int label_bytes;  // Bytes before the pixels; the label used is the last of them.
  std::vector<std::string> train_files;
  std::vector<std::string> test_files;
};

Variant Cifar10() {
  return {10,
          1,
          {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
           "data_batch_5.bin"},
          {"test_batch.bin"}};
}

Variant Cifar100() { return {100, 2, {"train.bin"}, {"test.bin"}}; }

bool AnyPresent(const std::string& dir, const Variant& v) {
  for (const auto* files : {&v.train_files, &v.test_files}) {
    for (const std::string& f : *files) {
      if (IsRegularFile(JoinPath(dir, f))) return true;
    }
  }
  return false;
}

// Appends the records of one file to `out`.
absl::Status ReadFile(const std::string& path, const Variant& v, Dataset& out) {
  absl::StatusOr<InputFile> file = InputFile::Open(path);
  if (!file.ok()) return file.status();
  const int64_t record_bytes = v.label_bytes + kPixels;
  const int64_t records = file->size() / record_bytes;
  if (file->size() % record_bytes != 0) {
    return absl::DataLossError(absl::StrCat(
        path, ": size ", file->size(), " bytes is not a whole number of ", record_bytes,
        "-byte records (", records, " records and ", file->size() % record_bytes, " bytes)"));
  }
  if (records == 0) return absl::DataLossError(absl::StrCat(path, ": empty file (0 records)"));
  // Held as bytes (Dataset::byte_storage), as the file stores them; its size bounds these.
  const size_t old_size = out.labels.size();
  out.byte_storage = true;
  DPTRAIN_RETURN_IF_ERROR(HoldInMemory(out.bytes, (old_size + records) * kPixels, path));
  out.labels.resize(old_size + records);
  std::vector<uint8_t> chunk(std::min(records, kRecordsPerChunk) * record_bytes);
  for (int64_t first = 0; first < records; first += kRecordsPerChunk) {
    const int64_t n = std::min(records - first, kRecordsPerChunk);
    if (absl::Status s = file->ReadExactly(chunk.data(), n * record_bytes, "records"); !s.ok()) {
      return s;
    }
    for (int64_t r = 0; r < n; ++r) {
      const uint8_t* record = chunk.data() + r * record_bytes;
      const int label = record[v.label_bytes - 1];
      if (label >= v.num_classes) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": record ", first + r, " has label ",
                                                       label, ", not in [0, ", v.num_classes, ")"));
      }
      const size_t index = old_size + first + r;
      out.labels[index] = static_cast<nn::Label>(label);
      const uint8_t* pixels = record + v.label_bytes;
      std::copy(pixels, pixels + kPixels, out.bytes.data() + index * kPixels);
    }
  }
  out.size += records;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Dataset> LoadCifar(const std::string& dir, bool train) {
  const Variant c10 = Cifar10(), c100 = Cifar100();
  const bool has10 = AnyPresent(dir, c10), has100 = AnyPresent(dir, c100);
  if (has10 && has100) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir,
                     ": holds both CIFAR-10 (data_batch_N.bin, test_batch.bin) and CIFAR-100 "
                     "(train.bin, test.bin) files; keep one set per directory"));
  }
  if (!has10 && !has100) {
    return absl::NotFoundError(absl::StrCat(
        dir,
        ": no CIFAR files (looked for CIFAR-10's data_batch_1.bin .. data_batch_5.bin, "
        "test_batch.bin and CIFAR-100's train.bin, test.bin)"));
  }
  const Variant& v = has10 ? c10 : c100;
  const std::vector<std::string>& names = train ? v.train_files : v.test_files;
  std::vector<std::string> paths, missing;
  for (const std::string& name : names) {
    paths.push_back(JoinPath(dir, name));
    if (!IsRegularFile(paths.back())) missing.push_back(paths.back());
  }
  if (!missing.empty()) {
    return absl::NotFoundError(
        absl::StrCat("CIFAR-", v.num_classes, " ", train ? "training" : "test",
                     " set incomplete: ", absl::StrJoin(missing, ", "), " not found"));
  }
  Dataset data;
  data.channels = kChannels;
  data.rows = kSide;
  data.cols = kSide;
  data.num_classes = v.num_classes;
  for (const std::string& path : paths) {
    if (absl::Status s = ReadFile(path, v, data); !s.ok()) return s;
  }
  return data;
}

}  // namespace dptrain
