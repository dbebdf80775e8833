// The model a worker declares to a shard, and the bounds a declaration must stay within
// before the shard builds anything from it (shard map, chunk state, weights): a few bytes
// of Init must never make the server allocate gigabytes or spin for seconds.
#ifndef DPTRAIN_SERVER_MODEL_LIMITS_H_
#define DPTRAIN_SERVER_MODEL_LIMITS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/shard_map.h"

namespace dptrain {

// What a worker believes the model and the sharding are; must agree with the shard.
struct ModelDescription {
  std::vector<TensorInfo> tensors;
  int num_shards = 1;
  int64_t max_chunk_elements = 0;
};

struct ModelLimits {
  // fp32 bytes of all tensors together (ps_server --max_model_bytes).
  int64_t max_model_bytes = int64_t{8} << 30;
  // Chunks of the whole model, over all shards (ps_server --max_chunks): each costs the
  // shard per-worker bookkeeping, so this bounds Init's work whatever the chunk size.
  int64_t max_chunks = int64_t{1} << 16;
  // The largest chunk a worker may declare, in elements (1 GiB of fp32).
  int64_t max_chunk_elements = int64_t{1} << 28;
};

// OK if `model` is within `limits`; otherwise InvalidArgument naming the field
// (e.g. "tensors[0].num_elements"). Overflow-safe for any declared values; costs
// O(number of tensors) and allocates nothing.
absl::Status ValidateModel(const ModelDescription& model, const ModelLimits& limits);

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_MODEL_LIMITS_H_
