// A test set held out of a training set, for data that comes without one (gpu_worker
// --test_fraction): a seeded random choice, the same on every rank for the same seed, as
// scikit-learn's train_test_split(test_size=fraction, shuffle=True).
// Thread-compatible: the functions touch no shared state.
#ifndef DPTRAIN_WORKER_DATA_HOLDOUT_H_
#define DPTRAIN_WORKER_DATA_HOLDOUT_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "worker/data/dataset.h"

namespace dptrain {

struct HeldOut {
  Dataset train;
  Dataset test;
};

// Splits `data`: ceil(fraction * size) samples, chosen by a permutation seeded with `seed`, are
// the test set and the others the training set, each in the order they had in `data`, with
// `data`'s shape, kind, classes (num_classes as `data`'s, so both agree), normalisation and
// store. InvalidArgument for a fraction outside (0, 1), a split that leaves either side empty,
// or data read as needed (Dataset::source: there is nothing held to split).
absl::StatusOr<HeldOut> HoldOut(Dataset data, double fraction, uint64_t seed);

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_DATA_HOLDOUT_H_
