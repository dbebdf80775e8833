#include "common/shard_map.h"

#include <algorithm>
#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dptrain {

absl::StatusOr<ShardMap> ShardMap::Build(const std::vector<TensorInfo>& tensors,
                                         const ShardMapOptions& options) {
  if (tensors.empty()) return absl::InvalidArgumentError("shard map: no tensors");
  if (options.num_shards < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard map: num_shards must be >= 1, got ", options.num_shards));
  }
  if (options.max_chunk_elements < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard map: max_chunk_elements must be >= 1, got ", options.max_chunk_elements));
  }
  ShardMap map;
  map.tensors_ = tensors;
  map.options_ = options;
  int64_t flat = 0;
  for (int t = 0; t < static_cast<int>(tensors.size()); ++t) {
    const int64_t n = tensors[t].num_elements;
    if (n < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard map: tensor ", t, " '", tensors[t].name, "' has ", n, " elements"));
    }
    map.first_chunk_of_tensor_.push_back(static_cast<int>(map.chunks_.size()));
    const int64_t pieces = (n + options.max_chunk_elements - 1) / options.max_chunk_elements;
    for (int64_t c = 0; c < pieces; ++c) {
      // Nearly equal pieces: the first n % pieces chunks get one element more.
      const int64_t base = n / pieces, extra = n % pieces;
      ChunkSpec spec;
      spec.tensor_id = t;
      spec.chunk_index = static_cast<int>(c);
      spec.offset = c * base + std::min(c, extra);
      spec.count = base + (c < extra ? 1 : 0);
      spec.flat_offset = flat + spec.offset;
      map.chunks_.push_back(spec);
    }
    flat += n;
  }
  map.total_elements_ = flat;

  // Largest chunk first to the least-loaded shard; every tie broken deterministically.
  std::vector<int> order(map.chunks_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return map.chunks_[a].count > map.chunks_[b].count;
  });
  std::vector<int64_t> load(options.num_shards, 0);
  for (int i : order) {
    const int shard = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    map.chunks_[i].shard = shard;
    load[shard] += map.chunks_[i].count;
  }
  map.by_shard_.resize(options.num_shards);
  for (int i = 0; i < static_cast<int>(map.chunks_.size()); ++i) {
    map.by_shard_[map.chunks_[i].shard].push_back(i);
  }
  return map;
}

int ShardMap::Find(int tensor_id, int chunk_index) const {
  if (tensor_id < 0 || tensor_id >= static_cast<int>(tensors_.size()) || chunk_index < 0) {
    return -1;
  }
  const int first = first_chunk_of_tensor_[tensor_id];
  const int end = tensor_id + 1 < static_cast<int>(tensors_.size())
                      ? first_chunk_of_tensor_[tensor_id + 1]
                      : static_cast<int>(chunks_.size());
  return first + chunk_index < end ? first + chunk_index : -1;
}

int64_t ShardMap::ShardElements(int shard) const {
  int64_t total = 0;
  for (int i : by_shard_[shard]) total += chunks_[i].count;
  return total;
}

}  // namespace dptrain
