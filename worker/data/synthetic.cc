#include "worker/data/synthetic.h"

#include <algorithm>
#include <random>
#include <vector>

namespace dptrain {
namespace {

// Uniform in [0, 1) from the top 24 bits, exact in float.
float Unit(std::mt19937_64& gen) { return static_cast<float>(gen() >> 40) * (1.0f / (1 << 24)); }

}  // namespace

Dataset MakeSyntheticDataset(int64_t size, int rows, int cols, uint64_t seed) {
  Dataset data;
  data.rows = std::max(rows, 1);
  data.cols = std::max(cols, 1);
  if (size < 1 || rows < 1 || cols < 1) return data;
  data.size = size;
  const int64_t pixels = data.image_size();
  std::mt19937_64 gen(seed ^ 0x5EED5EED5EED5EEDull);
  std::vector<float> prototypes(data.num_classes * pixels);
  for (float& p : prototypes) p = Unit(gen);
  data.labels.resize(size);
  data.images.resize(size * pixels);
  for (int64_t i = 0; i < size; ++i) {
    const int label = static_cast<int>(gen() % data.num_classes);
    data.labels[i] = static_cast<nn::Label>(label);
    const float* proto = prototypes.data() + label * pixels;
    float* image = data.mutable_image(i);
    for (int64_t p = 0; p < pixels; ++p) image[p] = 0.5f * proto[p] + 0.5f * Unit(gen);
  }
  return data;
}

}  // namespace dptrain
