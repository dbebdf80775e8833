// Deterministic parameter initialisation. std::mt19937_64 is fully specified by the standard and
// the transforms to uniform and normal values are our own (std::normal_distribution is
// implementation-defined), so the same seed gives the same weights with any standard library.
#ifndef DPTRAIN_WORKER_NN_INIT_H_
#define DPTRAIN_WORKER_NN_INIT_H_

#include <cstdint>
#include <random>
#include <vector>

namespace dptrain {
namespace nn {

class InitRng {
 public:
  explicit InitRng(uint64_t seed) : engine_(seed) {}

  // Uniform in [0, 1), from the top 53 bits of one engine output.
  double Uniform();
  // Standard normal by the Box-Muller transform; the second value of each pair is kept for the
  // next call.
  double Normal();

 private:
  std::mt19937_64 engine_;
  bool has_spare_ = false;
  double spare_ = 0;
};

// out[i] ~ N(mean, stddev^2), i < n, drawn in order.
void FillNormal(InitRng& rng, double mean, double stddev, float* out, int64_t n);
// out[i] ~ U[lo, hi), i < n, drawn in order.
void FillUniform(InitRng& rng, double lo, double hi, float* out, int64_t n);

// PyTorch's fans of a weight of `shape` [out, in, k...] (at least 2-D): fan_in = in * prod(k),
// fan_out = out * prod(k).
void ComputeFans(const std::vector<int64_t>& shape, int64_t* fan_in, int64_t* fan_out);
// The bound a of nn.init.xavier_uniform_ (gain 1), which draws from U(-a, a):
// sqrt(6 / (fan_in + fan_out)).
double XavierUniformBound(const std::vector<int64_t>& shape);

}  // namespace nn
}  // namespace dptrain

#endif  // DPTRAIN_WORKER_NN_INIT_H_
