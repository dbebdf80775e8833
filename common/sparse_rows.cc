#include "common/sparse_rows.h"

#include <cmath>

#include "common/mix.h"

namespace dptrain {
namespace {

// A uniform in (0, 1) from 53 random bits (never 0: the logarithm below needs > 0).
double Uniform(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53; }

}  // namespace

int RowShard(int64_t row, int num_shards) { return static_cast<int>(row % num_shards); }

void InitialRow(uint64_t seed, absl::string_view table, int64_t row, absl::Span<float> out) {
  uint64_t key = Mix64(seed);
  for (char c : table) key = Mix64(key ^ static_cast<uint8_t>(c));
  key = Mix64(key ^ static_cast<uint64_t>(row));
  for (size_t i = 0; i < out.size(); i += 2) {
    // Box-Muller: two normals from two uniforms.
    const double u1 = Uniform(Mix64(key + 2 * i)), u2 = Uniform(Mix64(key + 2 * i + 1));
    const double radius = std::sqrt(-2.0 * std::log(u1)), angle = 2.0 * M_PI * u2;
    out[i] = static_cast<float>(radius * std::cos(angle));
    if (i + 1 < out.size()) out[i + 1] = static_cast<float>(radius * std::sin(angle));
  }
}

}  // namespace dptrain
