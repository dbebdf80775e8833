// Fuzzes the shard's first line of defence against an Init (server/model_limits
// ValidateModel) and what it protects (common/shard_map ShardMap::Build): any declaration
// and any limits. Checks: ValidateModel never overflows (UBSan) and answers OK or
// InvalidArgument; whatever it accepts builds a shard map cheaply (for the shard counts a
// server can have: ParameterShard::Init compares num_shards with its own before building)
// whose chunks respect the limits, cover every tensor exactly and are each owned once.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/shard_map.h"
#include "server/model_limits.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

// The shard counts tried: a declaration must equal the server's own shard count
// (ParameterShard::CheckModel, before a map is built), a handful of processes. Building is
// O(chunks x shards), so larger counts would only slow the fuzzer down.
constexpr int kMaxServerShards = 64;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  dptrain::ModelLimits limits;
  if (in.ConsumeBool()) {
    limits.max_model_bytes = in.ConsumeIntegral<int64_t>();
    limits.max_chunks = in.ConsumeIntegralInRange<int64_t>(0, int64_t{1} << 16);
    limits.max_chunk_elements = in.ConsumeIntegral<int64_t>();
  }
  dptrain::ModelDescription model;
  model.num_shards = in.ConsumeIntegral<int>();
  model.max_chunk_elements = in.ConsumeIntegral<int64_t>();
  const int count = in.ConsumeIntegralInRange<int>(0, 256);
  for (int i = 0; i < count && in.remaining_bytes() > 0; ++i) {
    std::string name = in.ConsumeRandomLengthString(16);
    model.tensors.push_back({std::move(name), in.ConsumeIntegral<int64_t>()});
  }
  const absl::Status valid = dptrain::ValidateModel(model, limits);
  if (!valid.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(valid));
    return 0;
  }
  FUZZ_CHECK(model.num_shards >= 1 && !model.tensors.empty());
  if (model.num_shards > kMaxServerShards) return 0;
  absl::StatusOr<dptrain::ShardMap> map =
      dptrain::ShardMap::Build(model.tensors, {model.num_shards, model.max_chunk_elements});
  FUZZ_CHECK(map.ok());
  FUZZ_CHECK(static_cast<int64_t>(map->chunks().size()) <= limits.max_chunks);
  FUZZ_CHECK(map->total_elements() <= limits.max_model_bytes / 4);
  std::vector<int64_t> covered(model.tensors.size(), 0);
  for (const dptrain::ChunkSpec& c : map->chunks()) {
    FUZZ_CHECK(c.count >= 1 && c.count <= model.max_chunk_elements);
    FUZZ_CHECK(c.offset == covered[c.tensor_id]);
    covered[c.tensor_id] += c.count;
    FUZZ_CHECK(c.shard >= 0 && c.shard < model.num_shards);
    FUZZ_CHECK(map->Find(c.tensor_id, c.chunk_index) >= 0);
  }
  int64_t owned = 0;
  for (int s = 0; s < model.num_shards; ++s) owned += map->ChunksOfShard(s).size();
  FUZZ_CHECK(owned == static_cast<int64_t>(map->chunks().size()));
  for (size_t t = 0; t < model.tensors.size(); ++t) {
    FUZZ_CHECK(covered[t] == model.tensors[t].num_elements);
  }
  return 0;
}
