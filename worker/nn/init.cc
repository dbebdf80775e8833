#include "worker/nn/init.h"

#include <cmath>

namespace dptrain {
namespace nn {

double InitRng::Uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

double InitRng::Normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  const double u1 = 1.0 - Uniform();  // (0, 1]: log(u1) is finite.
  const double u2 = Uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 2.0 * M_PI * u2;
  spare_ = r * std::sin(theta);
  has_spare_ = true;
  return r * std::cos(theta);
}

void FillNormal(InitRng& rng, double mean, double stddev, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(mean + stddev * rng.Normal());
}

void FillUniform(InitRng& rng, double lo, double hi, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(lo + (hi - lo) * rng.Uniform());
}

void ComputeFans(const std::vector<int64_t>& shape, int64_t* fan_in, int64_t* fan_out) {
  int64_t receptive = 1;
  for (size_t i = 2; i < shape.size(); ++i) receptive *= shape[i];
  *fan_in = (shape.size() > 1 ? shape[1] : 1) * receptive;
  *fan_out = (shape.empty() ? 1 : shape[0]) * receptive;
}

double XavierUniformBound(const std::vector<int64_t>& shape) {
  int64_t fan_in, fan_out;
  ComputeFans(shape, &fan_in, &fan_out);
  return std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
}

}  // namespace nn
}  // namespace dptrain
