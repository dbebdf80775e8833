// SplitMix64's finalizer: a bijective 64-bit mix, the counter-based randomness of the sampler's
// shuffles (worker/data/sampler.cc) and of sparse tables' initial rows (common/sparse_rows.h).
// Fully specified here, so every process and platform draws the same numbers.
#ifndef DPTRAIN_COMMON_MIX_H_
#define DPTRAIN_COMMON_MIX_H_

#include <cstdint>

namespace dptrain {

inline uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_MIX_H_
