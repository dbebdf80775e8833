// Reader for IDX files (the MNIST / Fashion-MNIST format), gzip-compressed or not.
//
// Images: magic 0x00000803 (unsigned bytes, 3 dims), then big-endian int32 count, rows, cols,
// then count * rows * cols pixel bytes. Labels: magic 0x00000801 (unsigned bytes, 1 dim), then
// big-endian int32 count, then count label bytes. A file must hold exactly what its header
// promises: no fewer bytes (truncated) and no more (trailing data). The pixels are held as the
// file's bytes (Dataset::byte_storage; their value is byte / 255, read with
// Dataset::CopyImages).
//
// Errors are one-line statuses that name the offending file:
//   NotFound         the file does not exist;
//   InvalidArgument  bad magic, absurd dimensions, label count != image count,
//                    label value >= 10;
//   DataLoss         truncated data, trailing data, corrupt gzip stream;
//   other codes      the errno of a failed open (e.g. PermissionDenied).
// Corrupt headers cannot cause huge allocations: dimensions are capped (rows, cols <= 4096,
// count * rows * cols <= 2^31 pixels), data are read in chunks and buffers only grow as data
// actually arrive, never beyond what the header promises.
//
// Thread-compatible: the functions touch no shared state.
#ifndef DPTRAIN_WORKER_DATA_IDX_READER_H_
#define DPTRAIN_WORKER_DATA_IDX_READER_H_

#include <string>

#include "absl/status/statusor.h"
#include "worker/data/dataset.h"

namespace dptrain {

// Loads an images file and its labels file into a Dataset (num_classes = 10).
absl::StatusOr<Dataset> LoadIdxPair(const std::string& images_path, const std::string& labels_path);

// Loads the Fashion-MNIST training set (train = true: train-{images-idx3,labels-idx1}-ubyte.gz,
// 60000 images) or test set (t10k-*, 10000 images) from `data_dir`, e.g. the Debian package
// dataset-fashion-mnist's /usr/share/datasets/fashion-mnist.
absl::StatusOr<Dataset> LoadFashionMnist(const std::string& data_dir, bool train);

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_DATA_IDX_READER_H_
