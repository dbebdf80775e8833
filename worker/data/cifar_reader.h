// Reader for the binary versions of CIFAR-10 and CIFAR-100 (the "binary version" tarballs of
// https://www.cs.toronto.edu/~kriz/cifar.html, e.g. extracted to cifar-10-batches-bin/).
//
// CIFAR-10: data_batch_1.bin .. data_batch_5.bin (training set, 50000 images) and
// test_batch.bin (test set, 10000 images); each record is 1 label byte in [0, 10) then 3072
// pixel bytes: the red, green and blue 32x32 planes, each row-major.
// CIFAR-100: train.bin (50000) and test.bin (10000); each record is a coarse label byte, a fine
// label byte in [0, 100) and the same 3072 pixel bytes. The fine label is used.
//
// The loaded Dataset: channels 3, rows 32, cols 32 (the planes as stored, i.e. CHW), pixels
// byte / 255 (torchvision's ToTensor), held as the bytes (Dataset::byte_storage: a quarter of
// the memory of floats; read with Dataset::CopyImages), num_classes 10 or 100.
//
// Errors are one-line statuses that name the offending file:
//   NotFound         no CIFAR file in the directory, or a missing file of the detected set
//                    (all missing files are named);
//   InvalidArgument  both CIFAR-10 and CIFAR-100 files in one directory; a label out of
//                    range (naming the record index);
//   DataLoss         a file whose size is not a whole number of records (naming the record
//                    count), an empty file, a read error.
// Allocations follow the files' actual sizes.
//
// Thread-compatible: the functions touch no shared state.
#ifndef DPTRAIN_WORKER_DATA_CIFAR_READER_H_
#define DPTRAIN_WORKER_DATA_CIFAR_READER_H_

#include <string>

#include "absl/status/statusor.h"
#include "worker/data/dataset.h"

namespace dptrain {

// Loads the training set (train = true) or the test set of the CIFAR-10 or CIFAR-100 files in
// `dir`. The variant is detected from the files present: CIFAR-10 if any data_batch_N.bin or
// test_batch.bin is there, CIFAR-100 if train.bin or test.bin is (both: InvalidArgument).
absl::StatusOr<Dataset> LoadCifar(const std::string& dir, bool train);

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_DATA_CIFAR_READER_H_
