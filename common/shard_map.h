// The shard map: which parameter-server shard owns which chunk of which tensor.
//
// A pure, deterministic function of the model's tensor list and the shard count, so every
// worker and every shard computes the same map independently. Tensors larger than
// `max_chunk_elements` are split into nearly equal chunks, so a large layer spreads over
// shards; chunks are then assigned largest-first to the least-loaded shard (ties go to the
// lower shard index), which balances bytes across shards.
#ifndef DPTRAIN_COMMON_SHARD_MAP_H_
#define DPTRAIN_COMMON_SHARD_MAP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dptrain {

struct TensorInfo {
  std::string name;
  int64_t num_elements = 0;
};

struct ChunkSpec {
  int tensor_id = 0;
  int chunk_index = 0;
  int64_t offset = 0;       // First element within the tensor.
  int64_t count = 0;        // Number of elements.
  int64_t flat_offset = 0;  // First element within all tensors laid out back to back.
  int shard = 0;
};

struct ShardMapOptions {
  int num_shards = 1;
  // 1 Mi fp32 elements = 4 MiB, the partition size BytePS found to pipeline well.
  int64_t max_chunk_elements = int64_t{1} << 20;
};

class ShardMap {
 public:
  // Fails with InvalidArgument for an empty tensor list, a tensor with no elements,
  // num_shards < 1 or max_chunk_elements < 1.
  static absl::StatusOr<ShardMap> Build(const std::vector<TensorInfo>& tensors,
                                        const ShardMapOptions& options);

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const ShardMapOptions& options() const { return options_; }
  // All chunks, ordered by (tensor_id, chunk_index).
  const std::vector<ChunkSpec>& chunks() const { return chunks_; }
  // Indices into chunks() owned by `shard`, in (tensor_id, chunk_index) order.
  const std::vector<int>& ChunksOfShard(int shard) const { return by_shard_[shard]; }
  // Index into chunks() of the key, or -1 if there is no such chunk.
  int Find(int tensor_id, int chunk_index) const;
  int64_t total_elements() const { return total_elements_; }
  int64_t ShardElements(int shard) const;

 private:
  std::vector<TensorInfo> tensors_;
  ShardMapOptions options_;
  std::vector<ChunkSpec> chunks_;
  std::vector<int> first_chunk_of_tensor_;
  std::vector<std::vector<int>> by_shard_;
  int64_t total_elements_ = 0;
};

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_SHARD_MAP_H_
