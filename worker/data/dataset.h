// An in-memory image classification dataset (Fashion-MNIST, CIFAR, ImageFolder, .npy arrays).
//
// Images are stored back to back as float values, each image channels x rows x cols (NCHW per
// sample: channel planes, each row-major), so image i starts at images[i * image_size()]. The
// readers scale bytes to [0, 1] (byte / 255, as torchvision's ToTensor); float .npy data and
// Normalize (worker/data/transforms.h) may leave that range. Labels are bytes, so a data set has
// at most kMaxClasses classes. A Dataset is a plain value: copy or move it freely; readers must
// not mutate it while another thread reads it.
#ifndef DPTRAIN_WORKER_DATA_DATASET_H_
#define DPTRAIN_WORKER_DATA_DATASET_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dptrain {

// Labels are uint8_t: classes 0..255.
inline constexpr int kMaxClasses = 256;

struct Dataset {
  int64_t size = 0;  // Number of examples.
  int channels = 1;  // 1 (gray) or 3 (RGB) from the readers.
  int rows = 0;
  int cols = 0;
  std::vector<float> images;    // size * image_size() values.
  std::vector<uint8_t> labels;  // size labels in [0, num_classes).
  int num_classes = 10;         // In [1, kMaxClasses].

  // Values per image: channels * rows * cols.
  int64_t image_size() const { return static_cast<int64_t>(channels) * rows * cols; }
  // First pixel of image i; requires 0 <= i < size.
  const float* image(int64_t i) const { return images.data() + i * image_size(); }
  float* mutable_image(int64_t i) { return images.data() + i * image_size(); }
  int label(int64_t i) const { return labels[i]; }

  // Keeps only the first n examples (all of them if n <= 0 or n >= size): quick runs on a
  // subset, e.g. ResNet-18 on a CPU.
  void KeepFirst(int64_t n) {
    if (n <= 0 || n >= size) return;
    size = n;
    images.resize(static_cast<size_t>(n * image_size()));
    labels.resize(static_cast<size_t>(n));
  }
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_DATA_DATASET_H_
