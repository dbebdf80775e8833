// An in-memory image classification dataset (Fashion-MNIST, CIFAR, ImageFolder, .npy arrays),
// or of samples of integer ids (Dataset::ids: token ids for a text model, from .npy).
//
// Images are stored back to back, each image channels x rows x cols (NCHW per sample: channel
// planes, each row-major): as float values in `images` (image i starts at
// images[i * image_size()]), or, for byte data read as bytes (IDX, CIFAR, ImageFolder, uint8 .npy),
// as bytes in `bytes`, a quarter of the memory, whose value is byte / 255 (ToTensor's), then
// normalised per channel if Normalize (worker/data/transforms.h) recorded a mean and standard
// deviation, computed as Normalize computes it on floats, so both stores give the same values
// bit for bit. A third store holds no images: an ImageSource reads them as training reaches
// them (an image folder or a uint8 .npy array too large to hold: worker/data/image_stream.h,
// npy_reader.h), as bytes read like the byte store's. Read images with ReadImage (any store) or
// CopyImages (held stores); image() is for float stores. Labels are nn::Label (int32); a data set
// has at most kMaxClasses classes. A regression set has target values instead of labels
// (`targets`, from a float labels .npy). A Dataset is a plain value: copy or move it freely (copies
// share a source); readers must not mutate it while another thread reads it.
#ifndef DPTRAIN_WORKER_DATA_DATASET_H_
#define DPTRAIN_WORKER_DATA_DATASET_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/nn/tensor.h"

namespace dptrain {

// How a reader that can has a set's images: all read (and decoded) at load and held, or read
// as training reaches them through an ImageSource, or (auto) held unless they would take more
// memory than the reader's limit.
enum class DataLoading { kLoad, kStream, kAuto };

// Images read from elsewhere as they are needed, as bytes (channels x rows x cols each, the
// byte store's layout). Thread-safe.
class ImageSource {
 public:
  virtual ~ImageSource() = default;
  // The examples in the order Read will next be asked for them (an epoch's sample order, from
  // a batch on): the source may prepare them ahead. A new plan replaces the last.
  virtual void Plan(absl::Span<const int64_t> order) = 0;
  // Image `index`'s bytes into out (image_size() bytes); index in [0, size). Reads in the
  // planned order are the fast ones; any other is answered too, at its own cost. An error
  // names what failed (e.g. the file).
  virtual absl::Status Read(int64_t index, uint8_t* out) = 0;
};

// Classes 0..kMaxClasses-1 (nn::Label is int32): a bound on what a reader accepts (a label file
// of absurd values is refused, not turned into a million-way output), not a limit of the models.
inline constexpr int kMaxClasses = 1 << 20;

struct Dataset {
  int64_t size = 0;  // Number of examples.
  int channels = 1;  // 1 (gray) or 3 (RGB) from the readers.
  int rows = 0;
  int cols = 0;
  std::vector<float> images;    // size * image_size() values, or empty with byte storage.
  std::vector<nn::Label> labels;  // size labels in [0, num_classes); empty for regression.
  int num_classes = 10;           // In [1, kMaxClasses]; 0 for regression.
  // Regression: `targets_per_sample` finite target values per sample (a model output each, as
  // nn.MSELoss's target), back to back in `targets`, in place of labels. 0: class labels.
  int targets_per_sample = 0;
  std::vector<float> targets;
  // The samples are integer ids (token or category ids for a model's embedding tables, from an
  // integer .npy array), `channels` per sample (rows and cols are 1), held as floats in
  // `images` (exact: every id is below 2^24); no pixel scaling, normalisation or augmentation
  // applies to them.
  bool ids = false;
  // Byte storage: size * image_size() bytes; `images` is then empty.
  bool byte_storage = false;
  std::vector<uint8_t> bytes;
  // With byte storage, the per-channel normalisation Normalize recorded (empty: none).
  std::vector<float> norm_mean, norm_inv_std;
  // Images read as needed (byte_storage is then true, `bytes` and `images` empty).
  std::shared_ptr<ImageSource> source;

  // The samples are feature vectors (a float .npy array of shape (N, F); or any set of 1x1
  // images, which are as much vectors): `channels` values per sample, rows and cols 1; crops
  // and flips apply to images.
  bool features() const { return !ids && rows == 1 && cols == 1; }
  bool regression() const { return targets_per_sample > 0; }
  // What a batch from sample `first` on is scored against (labels, or target values).
  nn::Targets targets_from(int64_t first) const {
    if (regression()) return nn::Targets::Values(targets.data() + first * targets_per_sample);
    return nn::Targets(labels.data() + first);
  }
  // "integer ids", "feature vectors" or "images": what the set holds, for messages.
  const char* kind() const {
    return ids ? "integer ids" : features() ? "feature vectors" : "images";
  }

  // Values per image: channels * rows * cols.
  int64_t image_size() const { return static_cast<int64_t>(channels) * rows * cols; }
  // Whether it holds `size` labels, or size * targets_per_sample target values (regression).
  bool scores_consistent() const {
    return regression() ? static_cast<int64_t>(targets.size()) == size * targets_per_sample
                        : static_cast<int64_t>(labels.size()) == size;
  }
  // First pixel of image i of a float store; requires 0 <= i < size.
  const float* image(int64_t i) const { return images.data() + i * image_size(); }
  float* mutable_image(int64_t i) { return images.data() + i * image_size(); }
  int label(int64_t i) const { return labels[i]; }
  // Whether the store holds size * image_size() values (floats or bytes).
  bool consistent() const {
    const size_t n = static_cast<size_t>(size * image_size());
    if (source != nullptr) return size >= 0 && byte_storage && bytes.empty() && images.empty();
    return size >= 0 && (byte_storage ? bytes.size() == n && images.empty() : images.size() == n);
  }

  // The float values of images [first, first + count), back to back, into `out`
  // (count * image_size() floats); requires them in range and held (no source).
  void CopyImages(int64_t first, int64_t count, float* out) const {
    const int64_t n = image_size();
    if (!byte_storage) {
      std::copy(image(first), image(first) + count * n, out);
      return;
    }
    for (int64_t i = 0; i < count; ++i) BytesToValues(bytes.data() + (first + i) * n, out + i * n);
  }

  // The float values of image `index` into `out` (image_size() floats), from any store;
  // requires index in range. Only a source's read can fail.
  absl::Status ReadImage(int64_t index, float* out, std::vector<uint8_t>& scratch) const {
    if (source == nullptr) {
      CopyImages(index, 1, out);
      return absl::OkStatus();
    }
    scratch.resize(static_cast<size_t>(image_size()));
    if (absl::Status s = source->Read(index, scratch.data()); !s.ok()) return s;
    BytesToValues(scratch.data(), out);
    return absl::OkStatus();
  }

  // One image's bytes as values: byte / 255, then the recorded normalisation.
  void BytesToValues(const uint8_t* in, float* out) const {
    const int64_t plane = static_cast<int64_t>(rows) * cols;
    const bool norm = !norm_mean.empty();
    for (int c = 0; c < channels; ++c) {
      const float m = norm ? norm_mean[c] : 0.0f, inv = norm ? norm_inv_std[c] : 1.0f;
      for (int64_t k = 0; k < plane; ++k) {
        const float v = static_cast<float>(in[c * plane + k]) / 255.0f;
        out[c * plane + k] = norm ? (v - m) * inv : v;
      }
    }
  }

  // Keeps only the first n examples (all of them if n <= 0 or n >= size): quick runs on a
  // subset, e.g. ResNet-18 on a CPU.
  void KeepFirst(int64_t n) {
    if (n <= 0 || n >= size) return;
    size = n;
    if (source != nullptr) {
      // Nothing held: the source is asked only for indices below n.
    } else if (byte_storage) {
      bytes.resize(static_cast<size_t>(n * image_size()));
    } else {
      images.resize(static_cast<size_t>(n * image_size()));
    }
    if (regression()) {
      targets.resize(static_cast<size_t>(n * targets_per_sample));
    } else {
      labels.resize(static_cast<size_t>(n));
    }
  }
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_DATA_DATASET_H_
