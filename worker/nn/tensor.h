// Minimal tensor plumbing for the CPU layers: per-sample dims, a read-only NCHW view and a
// grow-only scratch buffer. Nothing here allocates on its own; layers own their buffers.
#ifndef DPTRAIN_WORKER_NN_TENSOR_H_
#define DPTRAIN_WORKER_NN_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

namespace dptrain {
namespace nn {

// A class index (a sample's label): int32, so that a data set may have ImageNet's 1,000 classes
// or far more (worker/data/dataset.h bounds them).
using Label = int32_t;

// What a batch's outputs are scored against: one class label per sample (classification), or
// target values (regression: as many per sample as the model has outputs, back to back, as
// nn.MSELoss's target). Exactly one of the two is set; a Label pointer converts to Targets,
// the common case.
struct Targets {
  Targets(const Label* class_labels) : labels(class_labels) {}  // NOLINT: implicit on purpose.
  static Targets Values(const float* target_values) {
    Targets t(nullptr);
    t.values = target_values;
    return t;
  }
  // The targets of the samples from `first` on (`per_sample` values each for regression).
  Targets From(int64_t first, int per_sample) const {
    if (values != nullptr) return Values(values + first * per_sample);
    return Targets(labels == nullptr ? nullptr : labels + first);
  }

  const Label* labels = nullptr;
  const float* values = nullptr;
};

// Shape of one sample: channels x height x width. A feature vector of length f is {f, 1, 1}.
struct Dims {
  int c = 0;
  int h = 1;
  int w = 1;

  int64_t size() const { return int64_t{c} * h * w; }
  bool operator==(const Dims& o) const { return c == o.c && h == o.h && w == o.w; }
  bool operator!=(const Dims& o) const { return !(*this == o); }
  std::string ToString() const;
};

// Read-only view of `batch` samples of `dims` each, stored NCHW and back to back. Not owned.
template <typename T>
struct TensorRef {
  const T* data = nullptr;
  int batch = 0;
  Dims dims;

  int64_t size() const { return int64_t{batch} * dims.size(); }
};

// Name and shape of one learnable tensor of a layer ("weight" [out, in], "bias" [out], ...).
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;

  int64_t size() const;
};

// Returns a pointer to at least `n` elements of `buffer`, growing it if needed. The buffer never
// shrinks, so repeated steps with the same (or a smaller) batch do not allocate. Contents beyond
// what the caller wrote before are unspecified.
template <typename T>
T* EnsureSize(std::vector<T>& buffer, int64_t n) {
  if (static_cast<int64_t>(buffer.size()) < n) buffer.resize(n);
  return buffer.data();
}

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_TENSOR_H_
