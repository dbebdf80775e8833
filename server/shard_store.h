// What a parameter-server shard stores: the chunks it owns (weights, optimizer state,
// version), the shard map they come from, the job id and the init fingerprint. This is the
// state a checkpoint holds (Snapshot/Restore); how pushes become updates is the
// aggregation policy's (aggregation_policy.h). Not thread-safe: ParameterShard guards it.
#ifndef DPTRAIN_SERVER_SHARD_STORE_H_
#define DPTRAIN_SERVER_SHARD_STORE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/optimizer.h"
#include "common/shard_map.h"
#include "server/checkpoint.h"
#include "server/model_limits.h"

namespace dptrain {

// A chunk's payload as received: a view into the request, valid during the call.
struct ChunkView {
  int tensor_id = 0;
  int chunk_index = 0;
  DType dtype = DType::kUnspecified;
  absl::string_view data;
};

// Receives the shard's weights, chunk by chunk in (tensor_id, chunk_index) order. Called
// with the shard's lock held: copy, do not call back into the shard.
using ChunkSink = std::function<void(const ChunkSpec&, absl::Span<const float>)>;

struct StoredChunk {
  ChunkSpec spec;
  int global_index = 0;      // Into the shard map's chunks().
  int64_t local_offset = 0;  // Into the shard's weights.
  OptimizerState state;
  int64_t version = 0;  // BSP: steps applied (skipped ones too); SSP/async: pushes applied.
};

// "(tensor 3, chunk 1)".
std::string ChunkKeyString(int tensor_id, int chunk_index);

class ShardStore {
 public:
  ShardStore(int shard, int num_shards, const Optimizer* optimizer)
      : shard_(shard), num_shards_(num_shards), optimizer_(optimizer) {}

  bool initialized() const { return map_.has_value(); }
  const ShardMap& map() const { return *map_; }
  const std::string& job_id() const { return job_id_; }
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  StoredChunk& chunk(int slot) { return chunks_[slot]; }
  const StoredChunk& chunk(int slot) const { return chunks_[slot]; }
  int64_t largest_chunk() const { return largest_; }
  int64_t num_elements() const { return static_cast<int64_t>(weights_.size()); }
  // The lowest chunk version (0 before Init).
  int64_t MinVersion() const;

  // FailedPrecondition naming the difference if `model` is not the stored one (or, before
  // Init, not for this shard count).
  absl::Status CheckModel(const ModelDescription& model) const;
  // The slot of an owned chunk, or the status saying why `chunk` is not one (unknown,
  // another shard's, wrong dtype or size).
  absl::StatusOr<int> SlotOf(const ChunkView& chunk) const;
  // Checks that `chunks` holds each owned chunk exactly once; on success fills
  // order[slot] = index into chunks of the chunk at slot.
  absl::Status MatchChunks(absl::Span<const ChunkView> chunks, std::vector<int>& order) const;

  // Sets the model and the initial weights (a model within limits, checked by the caller).
  // A repeat of the same Init returns false and changes nothing; a different one is
  // AlreadyExists; true when initialised now.
  absl::StatusOr<bool> Init(absl::string_view job_id, const ModelDescription& model,
                            absl::Span<const ChunkView> chunks);

  // weights(slot) -= optimizer step of `gradient` (the chunk's size) at `rate`; the
  // version is the caller's to advance.
  void Apply(int slot, const float* gradient, float rate);
  absl::Span<const float> weights(int slot) const {
    return absl::MakeConstSpan(weights_.data() + chunks_[slot].local_offset,
                               chunks_[slot].spec.count);
  }
  void Emit(const ChunkSink& sink) const;

  // Everything a restarted shard needs, tagged with `step` and the policy's name.
  ShardCheckpoint Snapshot(int64_t step, absl::string_view policy) const;
  // Replaces the whole state with `checkpoint`'s. FailedPrecondition naming the field if it
  // belongs to another shard, shard count or optimizer, or does not match its own model
  // description; the store is unchanged on failure.
  absl::Status Restore(const ShardCheckpoint& checkpoint);

 private:
  absl::StatusOr<int> SlotIn(const ChunkView& chunk, const ShardMap& map,
                             const std::vector<StoredChunk>& owned) const;
  absl::Status MatchIn(absl::Span<const ChunkView> chunks, const ShardMap& map,
                       const std::vector<StoredChunk>& owned, std::vector<int>& order) const;
  // The owned chunks of `map` with offsets, and the number of elements they hold.
  std::vector<StoredChunk> Layout(const ShardMap& map, int64_t& elements, int64_t& largest) const;

  const int shard_;
  const int num_shards_;
  const Optimizer* const optimizer_;
  std::optional<ShardMap> map_;
  std::string job_id_;
  uint64_t init_fingerprint_ = 0;
  std::vector<StoredChunk> chunks_;  // In the shard map's order.
  std::vector<float> weights_;       // The chunks back to back.
  int64_t largest_ = 0;
};

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_SHARD_STORE_H_
