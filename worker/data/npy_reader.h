// Reader for data sets stored as NumPy .npy arrays (np.save): images, token ids or feature
// vectors, with class labels or regression targets.
//
// A directory holds train_images.npy, train_labels.npy (the training set) and
// test_images.npy, test_labels.npy (the test set); token ids may be named train_ids.npy and
// test_ids.npy instead (which must then hold ids), feature vectors train_features.npy and
// test_features.npy (which must then hold them). Format versions 1.0, 2.0 and 3.0 are read;
// the header must be a dict with exactly 'descr', 'fortran_order' and 'shape'.
//
// Images: dtype uint8 ('|u1' or '<u1'; loaded as byte / 255, as torchvision's ToTensor) or
// little-endian float32 or float64 ('<f4', '<f8'; loaded as is, float64 rounded to float32;
// every value must be finite in float32), C order, shape
//   (N, H, W)                                      one channel;
//   (N, H, W, C) if C is 1, 3 or 4 and H is not    channels last (NHWC), transposed to NCHW;
//   (N, C, H, W) otherwise                         channels first (NCHW).
// So (N, 32, 32, 3) is NHWC, (N, 3, 32, 32) and (N, 1, 28, 28) are NCHW, and the ambiguous
// (N, 3, 32, 3) is taken as NCHW. Saving NCHW avoids any doubt.
// Feature vectors (tabular data): float32 or float64 of shape (N, F): F values per sample,
// held as Fx1x1 images (Dataset::features()), checked finite as float images are.
// Token ids: any little-endian integer dtype (uint8 included) of shape (N, L): L ids per
// sample (Dataset::ids), each in [0, 2^24) (held as floats, which hold those exactly), for a
// model whose input is ids (a text model's nn.Embedding); always held, never streamed.
// Labels: shape (N,), any little-endian integer dtype ('|i1', '<i2', '<i4', '<i8', '|u1',
// '<u1', '<u2', '<u4', '<u8'), values in [0, kMaxClasses) (2^20). Or regression targets: a
// float32 or float64 labels file of shape (N,) (one per sample) or (N, T) (T per sample, T up
// to kMaxClasses), every value finite in float32 (Dataset::targets; num_classes 0); both
// splits must then hold targets. (N,) targets score a model's [batch, 1] output element by
// element, as PyTorch's loss(out.squeeze(1), t), not broadcast.
//
// Errors are one-line statuses that name the offending file:
//   NotFound         a missing file;
//   InvalidArgument  not a .npy file, an unsupported version, a malformed header,
//                    fortran_order True, a big-endian or unsupported dtype, a wrong shape,
//                    an image count that differs from the label count, a negative label or
//                    one too large (naming its index), an id outside [0, 2^24) (naming its
//                    sample and position), a float value not finite (naming its sample and
//                    index), ids or floats asked to stream, an ids or features file holding
//                    something else, a bad num_classes option (or one given with regression
//                    targets), float labels in one split and class labels in the other;
//   DataLoss         data shorter than the header promises (truncated) or longer.
// Corrupt headers cannot cause huge allocations: a header's shape is checked against the
// file's actual size before anything is allocated.
//
// Thread-compatible: the functions touch no shared state.
#ifndef DPTRAIN_WORKER_DATA_NPY_READER_H_
#define DPTRAIN_WORKER_DATA_NPY_READER_H_

#include <string>

#include "absl/status/statusor.h"
#include "worker/data/dataset.h"

namespace dptrain {

struct NpyOptions {
  // 0: the largest label + 1 (for LoadNpy: over both splits' label files present, so that
  // the training and the test set agree). Else in [1, kMaxClasses], and every label must be
  // below it.
  int num_classes = 0;
  // uint8 images held (kLoad), or read from the file as training reaches them (kStream: the
  // Dataset has a source, Dataset::source; float images, ids and features refuse it,
  // InvalidArgument), or (kAuto) streamed when they are more than stream_above_bytes (float
  // arrays and ids are held whatever their size).
  DataLoading loading = DataLoading::kLoad;
  int64_t stream_above_bytes = int64_t{1} << 32;
};

// Loads one images file and its labels file.
absl::StatusOr<Dataset> LoadNpyPair(const std::string& images_path, const std::string& labels_path,
                                    const NpyOptions& options = {});

// Loads DIR/train_{images,labels}.npy (train = true) or DIR/test_{images,labels}.npy.
absl::StatusOr<Dataset> LoadNpy(const std::string& dir, bool train, const NpyOptions& options = {});

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_DATA_NPY_READER_H_
