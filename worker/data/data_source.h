// One entry to every data set reader: loads a training or test set from a directory in a
// named format, or in the format its files show.
//
// Formats and what each needs in DIR (the training set's files; the test set's are named in
// each reader's header):
//   "idx"          train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz, or the same
//                  uncompressed (Fashion-MNIST, MNIST; worker/data/idx_reader.h). The .gz
//                  file is used when both exist.
//   "cifar"        data_batch_1.bin .. data_batch_5.bin (CIFAR-10) or train.bin (CIFAR-100)
//                  (worker/data/cifar_reader.h).
//   "npy"          train_images.npy and train_labels.npy (worker/data/npy_reader.h).
//   "imagefolder"  train/<class>/<image>.png|.jpg|.jpeg (worker/data/image_folder.h).
//   ""             detect: the format whose training files are present (detection looks at
//                  the training files even when loading the test set): idx if
//                  train-images-idx3-ubyte[.gz] is a file, cifar if data_batch_1.bin or
//                  train.bin is, npy if train_images.npy is, imagefolder if train/ holds a
//                  folder. None: NotFound listing what was looked for; several:
//                  InvalidArgument naming them.
//
// Thread-compatible: the functions touch no shared state.
#ifndef DPTRAIN_WORKER_DATA_DATA_SOURCE_H_
#define DPTRAIN_WORKER_DATA_DATA_SOURCE_H_

#include <string>

#include "absl/status/statusor.h"
#include "worker/data/dataset.h"
#include "worker/data/image_folder.h"
#include "worker/data/image_resize.h"

namespace dptrain {

// The format of the data set in `dir` ("idx", "cifar", "npy" or "imagefolder"), as "" in
// LoadDataset detects it. NotFound if `dir` is not a directory or nothing matches.
absl::StatusOr<std::string> DetectDataFormat(const std::string& dir);

// Whether the data set in `dir` (`format`, or detected when empty) has a test split: "" if it
// has, else the test files it would need (for a message), e.g. "test_batch.bin". The errors of
// DetectDataFormat, or InvalidArgument for an unknown format.
absl::StatusOr<std::string> TestSplitFiles(const std::string& dir, const std::string& format);

struct LoadOptions {
  // Image folders: the size every image is brought to (worker/data/image_resize.h); the
  // other formats hold images of one size and refuse one (InvalidArgument).
  ImageSize image_size;
  // Image folders and .npy arrays: read (and decoded) at load, or as training reads them
  // (worker/data/image_folder.h, npy_reader.h); auto streams a set whose images would take more
  // than a quarter of the memory this process may use (the machine's, or its cgroup's limit if
  // lower), except float32 .npy arrays, which are held. The other formats are held, and refuse
  // kStream (InvalidArgument).
  DataLoading data_loading = DataLoading::kAuto;
  // Image folders: decoding threads (ImageFolderOptions::threads; 0: as many as the cores, at
  // most 8).
  int threads = 0;
  // Image folders: RGB even if every image is gray (ImageFolderOptions::color); the test split
  // of a training set in colour. The other formats ignore it.
  bool color = false;
};

// "auto", "load" or "stream" as a DataLoading; InvalidArgument naming the text otherwise.
absl::StatusOr<DataLoading> ParseDataLoading(const std::string& text);

// The bytes above which auto streams: a quarter of the memory this process may use.
int64_t AutoStreamAboveBytes();

// Loads the training set (train = true) or the test set of the data set in `dir`. InvalidArgument
// for an unknown format; otherwise the reader's errors.
absl::StatusOr<Dataset> LoadDataset(const std::string& dir, const std::string& format, bool train,
                                    const LoadOptions& options = {});

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_DATA_DATA_SOURCE_H_
