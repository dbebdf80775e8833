// Reader for image classification data sets laid out as torchvision's ImageFolder:
//
//   DIR/train/<class>/<image>    the training set
//   DIR/test/<class>/<image>     the test set
//
// Classes are the sorted names of the folders in DIR/train, labelled 0, 1, ... in that order
// (at most kMaxClasses, about a million); num_classes is their count for both sets. DIR/test may
// hold the same classes or a subset of them, labelled as in DIR/train. Images are the files
// whose names end in .png, .jpg or .jpeg (any case) in a class folder or any folder under it
// (links followed), in torchvision's order: folders by path, then each one's files by name
// (byte order); other files are skipped, and so is every file or folder whose name starts
// with '.' (unlike torchvision, which would make a class of .ipynb_checkpoints); a class
// folder without images is an error.
//
// Images are decoded as worker/data/image_decode.h says (PNG through libpng, JPEG through
// libjpeg; alpha dropped; 16-bit to 8 by the high byte). The loaded Dataset has channels 3
// (RGB, gray images replicated to the three channels) unless every image of the set is
// grayscale and options.color is false, then channels 1. The worker loads a test split with
// color set when its training set is RGB; a training set all gray beside test images in colour
// is what the trainer's shape check reports. All images of a set must have the same
// width and height, unless options.size brings each one to one size as it is decoded
// (torchvision's Resize(S) + CenterCrop(S), or Resize((H, W)); worker/data/image_resize.h).
// Pixels are byte / 255 (torchvision's ToTensor), NCHW, held as bytes (Dataset::byte_storage:
// read them with Dataset::CopyImages).
//
// Decoding (and resizing) runs on a small pool of threads (std::thread) owned by the call; the
// result does not depend on their number. To stream (options.loading), the images' headers are
// read at load instead (ProbeImageFile: their size and channels, so that the set's shape and
// the errors above but a corrupt image's data are known before training); a stream's read of an
// image that fails is an error of that read, naming the file. Only resized images are kept, so a
// folder of large photos needs no more memory than the set at its final size. Errors are one-line
// statuses naming a folder or file: NotFound (no DIR/train or DIR/<split> folder), InvalidArgument
// (no class folders, more than 256, a test class missing from train, a class folder without images,
// an image that cannot be decoded, an image of another size than the set's first), or the error of
// a failed read. When several images fail, the first in the set's order is reported.
//
// Thread-compatible: the function touches no shared state.
#ifndef DPTRAIN_WORKER_DATA_IMAGE_FOLDER_H_
#define DPTRAIN_WORKER_DATA_IMAGE_FOLDER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/dataset.h"
#include "worker/data/image_resize.h"

namespace dptrain {

struct ImageFolderOptions {
  // Decoding threads; 0: min(std::thread::hardware_concurrency(), 8), at least 1. At most 64.
  int threads = 0;
  // The size every image is brought to (default: kept, and then all must agree).
  ImageSize size;
  // All decoded at load and held (as bytes), or decoded as training reads them
  // (worker/data/image_stream.h: the Dataset then has a source and holds no image), or (auto)
  // the first unless the decoded set would take more than stream_above_bytes or more than a
  // load holds (max_load_values).
  DataLoading loading = DataLoading::kLoad;
  int64_t stream_above_bytes = int64_t{1} << 32;  // For kAuto.
  // A load holds at most this many values (each image counted as 3 channels: 16 GiB of
  // bytes); beyond, kLoad fails (ResourceExhausted) and kAuto streams.
  int64_t max_load_values = int64_t{1} << 34;
  // RGB (3 channels) even if every image is gray, as torchvision loads every image: the test
  // split of a training set in colour.
  bool color = false;
};

// Loads DIR/train (train = true) or DIR/test.
absl::StatusOr<Dataset> LoadImageFolder(const std::string& dir, bool train,
                                        const ImageFolderOptions& options = {});

// The sorted class folder names of `split_dir` (e.g. DIR/train), '.'-names skipped. NotFound if
// it is not a directory.
absl::StatusOr<std::vector<std::string>> ListClassFolders(const std::string& split_dir);

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_DATA_IMAGE_FOLDER_H_
