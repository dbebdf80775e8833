// Synthetic datasets for benchmarks and tests that must not depend on files.
#ifndef DPTRAIN_WORKER_DATA_SYNTHETIC_H_
#define DPTRAIN_WORKER_DATA_SYNTHETIC_H_

#include <cstdint>

#include "worker/data/dataset.h"

namespace dptrain {

// Returns `size` random rows x cols images with labels in [0, 10), a deterministic function of
// the arguments (the same on every platform). Each image is half a fixed random prototype of
// its class and half uniform noise, so the classes are learnable and a training loss on this
// data should fall. Pixels are in [0, 1]. A size < 0 or rows/cols < 1 gives an empty dataset
// (size 0) with those clamped dimensions.
Dataset MakeSyntheticDataset(int64_t size, int rows, int cols, uint64_t seed);

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_DATA_SYNTHETIC_H_
