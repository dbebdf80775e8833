// An in-memory image classification dataset (Fashion-MNIST and look-alikes).
//
// Images are stored back to back as row-major float pixels scaled to [0, 1] (byte / 255), so
// image i starts at images[i * rows * cols]. A Dataset is a plain value: copy or move it freely;
// readers must not mutate it while another thread reads it.
#ifndef DPTRAIN_WORKER_DATA_DATASET_H_
#define DPTRAIN_WORKER_DATA_DATASET_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dptrain {

struct Dataset {
  int64_t size = 0;  // Number of examples.
  int rows = 0;
  int cols = 0;
  std::vector<float> images;    // size * rows * cols pixels in [0, 1].
  std::vector<uint8_t> labels;  // size labels in [0, num_classes).
  int num_classes = 10;

  // Pixels per image.
  int64_t image_size() const { return static_cast<int64_t>(rows) * cols; }
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
