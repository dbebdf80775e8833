#include "server/shard_store.h"

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dptrain {
namespace {

// FNV-1a over the model description and the initial weights, to tell a repeated Init
// from a different one without keeping a copy of the initial weights.
class Fingerprint {
 public:
  void Add(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) hash_ = (hash_ ^ p[i]) * 1099511628211ull;
  }
  void Add(int64_t v) { Add(&v, sizeof(v)); }
  void Add(absl::string_view s) {
    Add(static_cast<int64_t>(s.size()));
    Add(s.data(), s.size());
  }
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 14695981039346656037ull;
};

}  // namespace

std::string ChunkKeyString(int tensor_id, int chunk_index) {
  return absl::StrCat("(tensor ", tensor_id, ", chunk ", chunk_index, ")");
}

int64_t ShardStore::MinVersion() const {
  int64_t v = chunks_.empty() ? 0 : chunks_[0].version;
  for (const StoredChunk& c : chunks_) v = std::min(v, c.version);
  return v;
}

absl::Status ShardStore::CheckModel(const ModelDescription& model) const {
  if (model.num_shards != num_shards_) {
    return absl::FailedPreconditionError(absl::StrCat("shard mismatch: the worker expects ",
                                                      model.num_shards, " shards, this is shard ",
                                                      shard_, " of ", num_shards_));
  }
  if (!map_.has_value()) return absl::OkStatus();
  const ShardMap& map = *map_;
  if (model.max_chunk_elements != map.options().max_chunk_elements) {
    return absl::FailedPreconditionError(absl::StrCat("model mismatch: max_chunk_elements ",
                                                      model.max_chunk_elements,
                                                      " != ", map.options().max_chunk_elements));
  }
  if (model.tensors.size() != map.tensors().size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("model mismatch: the worker's model has ", model.tensors.size(),
                     " tensors, the initialised one has ", map.tensors().size()));
  }
  for (size_t i = 0; i < model.tensors.size(); ++i) {
    const TensorInfo& a = model.tensors[i];
    const TensorInfo& b = map.tensors()[i];
    if (a.name != b.name || a.num_elements != b.num_elements) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model mismatch at tensor ", i, ": worker has '", a.name, "' with ", a.num_elements,
          " elements, the initialised model has '", b.name, "' with ", b.num_elements));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ShardStore::SlotOf(const ChunkView& c) const {
  return SlotIn(c, *map_, chunks_);
}

absl::Status ShardStore::MatchChunks(absl::Span<const ChunkView> chunks,
                                     std::vector<int>& order) const {
  return MatchIn(chunks, *map_, chunks_, order);
}

absl::StatusOr<int> ShardStore::SlotIn(const ChunkView& c, const ShardMap& map,
                                       const std::vector<StoredChunk>& owned) const {
  const int global = map.Find(c.tensor_id, c.chunk_index);
  if (global < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown chunk ", ChunkKeyString(c.tensor_id, c.chunk_index)));
  }
  const ChunkSpec& spec = map.chunks()[global];
  if (spec.shard != shard_) {
    return absl::FailedPreconditionError(
        absl::StrCat("chunk ", ChunkKeyString(c.tensor_id, c.chunk_index), " belongs to shard ",
                     spec.shard, ", not to shard ", shard_));
  }
  if (c.dtype != DType::kFp32) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ",
                                                   ChunkKeyString(c.tensor_id, c.chunk_index),
                                                   " has dtype ", DTypeName(c.dtype),
                                                   "; this shard stores fp32"));
  }
  const size_t expected = static_cast<size_t>(spec.count) * ElementSize(c.dtype);
  if (c.data.size() != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", ChunkKeyString(c.tensor_id, c.chunk_index), " has ", c.data.size(),
                     " bytes, expected ", expected, " (", spec.count, " fp32 elements)"));
  }
  // `owned` is in the map's order, so a binary search by global index finds the slot.
  auto it = std::lower_bound(owned.begin(), owned.end(), global,
                             [](const StoredChunk& o, int g) { return o.global_index < g; });
  return static_cast<int>(it - owned.begin());
}

absl::Status ShardStore::MatchIn(absl::Span<const ChunkView> chunks, const ShardMap& map,
                                 const std::vector<StoredChunk>& owned,
                                 std::vector<int>& order) const {
  order.assign(owned.size(), -1);
  for (int i = 0; i < static_cast<int>(chunks.size()); ++i) {
    auto slot = SlotIn(chunks[i], map, owned);
    if (!slot.ok()) return slot.status();
    if (order[*slot] >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", ChunkKeyString(chunks[i].tensor_id, chunks[i].chunk_index), " appears twice"));
    }
    order[*slot] = i;
  }
  for (size_t slot = 0; slot < owned.size(); ++slot) {
    if (order[slot] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "missing chunk ",
          ChunkKeyString(owned[slot].spec.tensor_id, owned[slot].spec.chunk_index),
          ": every request carries all ", owned.size(), " chunks of shard ", shard_));
    }
  }
  return absl::OkStatus();
}

std::vector<StoredChunk> ShardStore::Layout(const ShardMap& map, int64_t& elements,
                                            int64_t& largest) const {
  std::vector<StoredChunk> owned;
  elements = 0;
  largest = 0;
  for (int g : map.ChunksOfShard(shard_)) {
    StoredChunk& o = owned.emplace_back();
    o.spec = map.chunks()[g];
    o.global_index = g;
    o.local_offset = elements;
    elements += o.spec.count;
    largest = std::max(largest, o.spec.count);
  }
  return owned;
}

absl::StatusOr<bool> ShardStore::Init(absl::string_view job_id, const ModelDescription& model,
                                      absl::Span<const ChunkView> chunks) {
  if (auto s = CheckModel(model); !s.ok()) return s;
  auto map = ShardMap::Build(model.tensors, {model.num_shards, model.max_chunk_elements});
  if (!map.ok()) return map.status();
  int64_t elements = 0, largest = 0;
  std::vector<StoredChunk> owned = Layout(*map, elements, largest);
  std::vector<int> order;
  if (auto s = MatchIn(chunks, *map, owned, order); !s.ok()) return s;

  Fingerprint fp;
  fp.Add(job_id);
  fp.Add(int64_t{model.num_shards});
  fp.Add(model.max_chunk_elements);
  for (const TensorInfo& t : model.tensors) {
    fp.Add(t.name);
    fp.Add(t.num_elements);
  }
  for (int i : order) fp.Add(chunks[i].data.data(), chunks[i].data.size());

  if (map_.has_value()) {
    if (fp.value() != init_fingerprint_ || job_id != job_id_) {
      return absl::AlreadyExistsError(absl::StrCat(
          "shard ", shard_,
          " is already initialised with different weights; restart the server to start anew"));
    }
    return false;
  }
  weights_.resize(elements);
  for (size_t slot = 0; slot < owned.size(); ++slot) {
    std::memcpy(weights_.data() + owned[slot].local_offset, chunks[order[slot]].data.data(),
                chunks[order[slot]].data.size());
  }
  chunks_ = std::move(owned);
  largest_ = largest;
  map_ = *std::move(map);
  job_id_ = std::string(job_id);
  init_fingerprint_ = fp.value();
  return true;
}

void ShardStore::Apply(int slot, const float* gradient, float rate) {
  StoredChunk& c = chunks_[slot];
  optimizer_->Apply(absl::MakeSpan(weights_.data() + c.local_offset, c.spec.count),
                    absl::MakeConstSpan(gradient, c.spec.count), c.state, rate);
}

void ShardStore::Emit(const ChunkSink& sink) const {
  for (int slot = 0; slot < num_chunks(); ++slot) sink(chunks_[slot].spec, weights(slot));
}

ShardCheckpoint ShardStore::Snapshot(int64_t step, absl::string_view policy) const {
  ShardCheckpoint cp;
  cp.job_id = job_id_;
  cp.shard = shard_;
  cp.num_shards = num_shards_;
  cp.init_fingerprint = init_fingerprint_;
  cp.model.tensors = map_->tensors();
  cp.model.num_shards = num_shards_;
  cp.model.max_chunk_elements = map_->options().max_chunk_elements;
  cp.optimizer = optimizer_->options().name;
  cp.policy = std::string(policy);
  cp.step = step;
  cp.chunks.reserve(chunks_.size());
  for (int slot = 0; slot < num_chunks(); ++slot) {
    const StoredChunk& c = chunks_[slot];
    ChunkCheckpoint& out = cp.chunks.emplace_back();
    out.tensor_id = c.spec.tensor_id;
    out.chunk_index = c.spec.chunk_index;
    out.version = c.version;
    const absl::Span<const float> w = weights(slot);
    out.weights.assign(w.begin(), w.end());
    out.state = c.state;
  }
  return cp;
}

absl::Status ShardStore::Restore(const ShardCheckpoint& cp) {
  auto mismatch = [&](absl::string_view what, const auto& theirs, const auto& ours) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint of step ", cp.step, " has ",
                                                      what, " ", theirs, ", this shard ", ours));
  };
  if (cp.shard != shard_) return mismatch("shard", cp.shard, shard_);
  if (cp.num_shards != num_shards_ || cp.model.num_shards != num_shards_) {
    return mismatch("shard count", cp.num_shards, num_shards_);
  }
  if (cp.optimizer != optimizer_->options().name) {
    return mismatch("optimizer", cp.optimizer, optimizer_->options().name);
  }
  if (map_.has_value() && (cp.job_id != job_id_ || cp.init_fingerprint != init_fingerprint_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint of step ", cp.step, " belongs to another job or initialisation (job '",
        cp.job_id, "', this shard serves '", job_id_, "')"));
  }
  if (map_.has_value()) {
    if (auto s = CheckModel(cp.model); !s.ok()) return s;
  }
  auto map = ShardMap::Build(cp.model.tensors, {cp.model.num_shards, cp.model.max_chunk_elements});
  if (!map.ok()) return map.status();
  int64_t elements = 0, largest = 0;
  std::vector<StoredChunk> owned = Layout(*map, elements, largest);
  if (owned.size() != cp.chunks.size()) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint of step ", cp.step, " holds ",
                                                      cp.chunks.size(), " chunks, the model gives shard ",
                                                      shard_, " ", owned.size()));
  }
  for (size_t slot = 0; slot < owned.size(); ++slot) {
    const ChunkCheckpoint& c = cp.chunks[slot];
    const ChunkSpec& spec = owned[slot].spec;
    if (c.tensor_id != spec.tensor_id || c.chunk_index != spec.chunk_index ||
        static_cast<int64_t>(c.weights.size()) != spec.count || c.version < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint of step ", cp.step, ": chunk ", slot, " is ",
                       ChunkKeyString(c.tensor_id, c.chunk_index), " with ", c.weights.size(),
                       " elements, expected ", ChunkKeyString(spec.tensor_id, spec.chunk_index),
                       " with ", spec.count));
    }
  }
  std::vector<float> weights(elements);
  for (size_t slot = 0; slot < owned.size(); ++slot) {
    const ChunkCheckpoint& c = cp.chunks[slot];
    std::copy(c.weights.begin(), c.weights.end(), weights.begin() + owned[slot].local_offset);
    owned[slot].state = c.state;
    owned[slot].version = c.version;
  }
  weights_ = std::move(weights);
  chunks_ = std::move(owned);
  largest_ = largest;
  map_ = *std::move(map);
  job_id_ = cp.job_id;
  init_fingerprint_ = cp.init_fingerprint;
  return absl::OkStatus();
}

}  // namespace dptrain
