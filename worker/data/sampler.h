// DistributedSampler: which dataset indices each rank visits in an epoch.
//
// Same semantics as PyTorch's torch.utils.data.DistributedSampler(shuffle=True,
// drop_last=False), with our own portable PRNG (so the permutations differ from PyTorch's but
// are identical on every platform and standard library):
//   1. global order: a permutation of [0, dataset_size) that depends only on (seed, epoch,
//      dataset_size) (the identity when shuffle is false);
//   2. padding: the order is extended cyclically from its start, global[j] = global[j % n], up
//      to total_size = ceil(n / world_size) * world_size;
//   3. interleaving: rank r gets global[r], global[r + world_size], global[r + 2 * world_size],
//      ..., num_samples() = total_size / world_size indices, the same count on every rank.
//
// The property data-parallel training relies on: with world_size N and a per-rank batch b
// (rank batch i = its indices [i*b, min((i+1)*b, num_samples))), the union over ranks of batch
// i is exactly the slice global[i*N*b, min((i+1)*N*b, total_size)). Since global[0, n) does not
// depend on world_size, these are the samples that one worker (world_size 1, same seed and
// epoch) with batch N*b sees in its batch i; only the last batch may differ, by the padding.
//
// Thread-safe: a DistributedSampler is immutable after Create.
#ifndef DPTRAIN_WORKER_DATA_SAMPLER_H_
#define DPTRAIN_WORKER_DATA_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace dptrain {

struct SamplerOptions {
  int64_t dataset_size = 0;
  int world_size = 1;
  int rank = 0;
  uint64_t seed = 0;
  bool shuffle = true;
};

class DistributedSampler {
 public:
  // Fails with InvalidArgument for dataset_size < 1, world_size < 1 or rank outside
  // [0, world_size).
  static absl::StatusOr<DistributedSampler> Create(const SamplerOptions& options);

  const SamplerOptions& options() const { return options_; }
  // Indices per rank in every epoch: ceil(dataset_size / world_size).
  int64_t num_samples() const { return num_samples_; }
  // num_samples() * world_size.
  int64_t total_size() const { return num_samples_ * options_.world_size; }

  // The padded global order of `epoch` (steps 1 and 2 above), total_size() indices.
  std::vector<int64_t> GlobalIndices(int64_t epoch) const;
  // This rank's indices for `epoch`, num_samples() of them, each in [0, dataset_size).
  std::vector<int64_t> EpochIndices(int64_t epoch) const;

 private:
  explicit DistributedSampler(const SamplerOptions& options);

  SamplerOptions options_;
  int64_t num_samples_ = 0;
};

// Batches per epoch for a rank with `num_samples` indices: ceil(num_samples / batch_size), the
// last batch possibly short. Requires batch_size >= 1.
int64_t NumBatches(int64_t num_samples, int batch_size);

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_DATA_SAMPLER_H_
