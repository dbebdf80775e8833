#include "worker/data/data_source.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/data/cifar_reader.h"
#include "worker/data/held_memory.h"
#include "worker/data/idx_reader.h"
#include "worker/data/image_folder.h"
#include "worker/data/input_file.h"
#include "worker/data/npy_reader.h"

namespace dptrain {
namespace {

// DIR/NAME.gz if it is a file or NAME is not; else DIR/NAME.
std::string IdxPath(const std::string& dir, const std::string& name) {
  const std::string gz = JoinPath(dir, name + ".gz");
  const std::string raw = JoinPath(dir, name);
  return IsRegularFile(gz) || !IsRegularFile(raw) ? gz : raw;
}

bool HasClassFolder(const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> classes = ListClassFolders(JoinPath(dir, "train"));
  return classes.ok() && !classes->empty();
}

}  // namespace

absl::StatusOr<std::string> DetectDataFormat(const std::string& dir) {
  if (!IsDirectory(dir)) return absl::NotFoundError(absl::StrCat(dir, ": no such directory"));
  auto has = [&](const char* name) { return IsRegularFile(JoinPath(dir, name)); };
  std::vector<std::string> found;
  if (has("train-images-idx3-ubyte.gz") || has("train-images-idx3-ubyte")) found.push_back("idx");
  if (has("data_batch_1.bin") || has("train.bin")) found.push_back("cifar");
  if (has("train_images.npy") || has("train_ids.npy") || has("train_features.npy")) {
    found.push_back("npy");
  }
  if (HasClassFolder(dir)) found.push_back("imagefolder");
  if (found.empty()) {
    return absl::NotFoundError(absl::StrCat(
        dir,
        ": no data set found; looked for train-images-idx3-ubyte[.gz] (idx), data_batch_1.bin "
        "or train.bin (cifar), train_images.npy, train_ids.npy or train_features.npy (npy), "
        "train/<class>/ folders "
        "(imagefolder)"));
  }
  if (found.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": holds the files of several formats (",
                                                   absl::StrJoin(found, ", "),
                                                   "); name one with the format"));
  }
  return found[0];
}

absl::StatusOr<std::string> TestSplitFiles(const std::string& dir, const std::string& format) {
  std::string chosen = format;
  if (chosen.empty()) {
    absl::StatusOr<std::string> detected = DetectDataFormat(dir);
    if (!detected.ok()) return detected.status();
    chosen = *detected;
  }
  auto has = [&](const char* name) { return IsRegularFile(JoinPath(dir, name)); };
  if (chosen == "idx") {
    return has("t10k-images-idx3-ubyte.gz") || has("t10k-images-idx3-ubyte")
               ? ""
               : "t10k-images-idx3-ubyte[.gz] and t10k-labels-idx1-ubyte[.gz]";
  }
  if (chosen == "cifar") {  // CIFAR-10's test_batch.bin, CIFAR-100's test.bin.
    if (has("test_batch.bin") || has("test.bin")) return "";
    return has("train.bin") ? "test.bin" : "test_batch.bin";
  }
  if (chosen == "npy") {
    // Any test file: the split is there (its reader names what is missing of it).
    return has("test_images.npy") || has("test_ids.npy") || has("test_features.npy") ||
                   has("test_labels.npy")
               ? ""
               : "test_images.npy (or test_ids.npy, test_features.npy) and test_labels.npy";
  }
  if (chosen == "imagefolder") return IsDirectory(JoinPath(dir, "test")) ? "" : "test/<class>/";
  return absl::InvalidArgumentError(
      absl::StrCat("unknown data format '", format,
                   "' (known: idx, cifar, npy, imagefolder, or empty to detect)"));
}

absl::StatusOr<DataLoading> ParseDataLoading(const std::string& text) {
  if (text == "auto") return DataLoading::kAuto;
  if (text == "load") return DataLoading::kLoad;
  if (text == "stream") return DataLoading::kStream;
  return absl::InvalidArgumentError(absl::StrCat("must be auto, load or stream, got '", text, "'"));
}

int64_t AutoStreamAboveBytes() { return std::max<int64_t>(MachineMemoryBytes() / 4, 1); }

absl::StatusOr<Dataset> LoadDataset(const std::string& dir, const std::string& format, bool train,
                                    const LoadOptions& options) {
  std::string chosen = format;
  if (chosen.empty()) {
    absl::StatusOr<std::string> detected = DetectDataFormat(dir);
    if (!detected.ok()) return detected.status();
    chosen = *detected;
  }
  if (chosen == "imagefolder") {
    ImageFolderOptions folder;
    folder.size = options.image_size;
    folder.loading = options.data_loading;
    folder.threads = options.threads;
    folder.color = options.color;
    if (folder.loading == DataLoading::kAuto) folder.stream_above_bytes = AutoStreamAboveBytes();
    return LoadImageFolder(dir, train, folder);
  }
  if (!options.image_size.keep()) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": an image size (", options.image_size.ToString(),
                     ") applies to image folders only; this data set is ", chosen));
  }
  if (chosen == "npy") {
    NpyOptions npy;
    npy.loading = options.data_loading;
    if (npy.loading == DataLoading::kAuto) npy.stream_above_bytes = AutoStreamAboveBytes();
    return LoadNpy(dir, train, npy);
  }
  if (options.data_loading == DataLoading::kStream) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir,
        ": images are streamed (read as training goes) from image folders and .npy arrays "
        "only; this data set is ",
        chosen, ", held in memory"));
  }
  if (chosen == "idx") {
    const std::string prefix = train ? "train" : "t10k";
    return LoadIdxPair(IdxPath(dir, prefix + "-images-idx3-ubyte"),
                       IdxPath(dir, prefix + "-labels-idx1-ubyte"));
  }
  if (chosen == "cifar") return LoadCifar(dir, train);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown data format '", format,
                   "' (known: idx, cifar, npy, imagefolder, or empty to detect)"));
}

}  // namespace dptrain
