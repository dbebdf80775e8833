#include "server/parameter_shard.h"

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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

std::string Key(int tensor_id, int chunk_index) {
  return absl::StrCat("(tensor ", tensor_id, ", chunk ", chunk_index, ")");
}

}  // namespace

absl::StatusOr<SyncPolicy> ParseSyncPolicy(absl::string_view name) {
  if (name == "bsp") return SyncPolicy::kBsp;
  if (name == "ssp") return SyncPolicy::kSsp;
  if (name == "async") return SyncPolicy::kAsync;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown sync policy '", name, "' (expected bsp, ssp or async)"));
}

absl::StatusOr<std::unique_ptr<ParameterShard>> ParameterShard::Create(
    const ParameterShardOptions& options) {
  if (options.num_shards < 1 || options.shard < 0 || options.shard >= options.num_shards) {
    return absl::InvalidArgumentError(absl::StrCat("shard index ", options.shard,
                                                   " is not in [0, ", options.num_shards, ")"));
  }
  if (options.num_workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_workers must be >= 1, got ", options.num_workers));
  }
  if (options.staleness < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("staleness must be >= 0, got ", options.staleness));
  }
  if (options.step_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("step_timeout must be positive");
  }
  auto optimizer = CreateOptimizer(options.optimizer);
  if (!optimizer.ok()) return optimizer.status();
  return std::unique_ptr<ParameterShard>(new ParameterShard(options, *std::move(optimizer)));
}

ParameterShard::ParameterShard(const ParameterShardOptions& options,
                               std::unique_ptr<Optimizer> optimizer)
    : options_(options), optimizer_(std::move(optimizer)) {
  pushed_.assign(options.num_workers, false);
  pending_.resize(options.num_workers);
  clock_.assign(options.num_workers, 0);
  base_version_.assign(options.num_workers, 0);
}

absl::Status ParameterShard::CheckCaller(absl::string_view job_id, int rank) const {
  if (shutdown_) return absl::UnavailableError("parameter server is shutting down");
  if (rank < 0 || rank >= options_.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " is not in [0, ", options_.num_workers, "): this server expects ",
        options_.num_workers, " workers"));
  }
  if (map_.has_value() && job_id != job_id_) {
    return absl::FailedPreconditionError(absl::StrCat("job id '", job_id, "' does not match '",
                                                      job_id_, "' that this shard serves"));
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::CheckModel(const ModelDescription& model) const {
  if (model.num_shards != options_.num_shards) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard mismatch: the worker expects ", model.num_shards, " shards, this is shard ",
        options_.shard, " of ", options_.num_shards));
  }
  if (!map_.has_value()) return absl::OkStatus();
  const ShardMap& map = *map_;
  if (model.max_chunk_elements != map.options().max_chunk_elements) {
    return absl::FailedPreconditionError(
        absl::StrCat("model mismatch: max_chunk_elements ", model.max_chunk_elements,
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

absl::Status ParameterShard::MatchChunks(absl::Span<const ChunkView> chunks, const ShardMap& map,
                                         const std::vector<OwnedChunk>& owned,
                                         std::vector<int>& order) const {
  order.assign(owned.size(), -1);
  for (int i = 0; i < static_cast<int>(chunks.size()); ++i) {
    const ChunkView& c = chunks[i];
    const int global = map.Find(c.tensor_id, c.chunk_index);
    if (global < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown chunk ", Key(c.tensor_id, c.chunk_index)));
    }
    const ChunkSpec& spec = map.chunks()[global];
    if (spec.shard != options_.shard) {
      return absl::FailedPreconditionError(
          absl::StrCat("chunk ", Key(c.tensor_id, c.chunk_index), " belongs to shard ",
                       spec.shard, ", not to shard ", options_.shard));
    }
    if (c.dtype != DType::kFp32) {
      return absl::InvalidArgumentError(absl::StrCat("chunk ", Key(c.tensor_id, c.chunk_index),
                                                     " has dtype ", DTypeName(c.dtype),
                                                     "; this shard stores fp32"));
    }
    const size_t expected = static_cast<size_t>(spec.count) * ElementSize(c.dtype);
    if (c.data.size() != expected) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", Key(c.tensor_id, c.chunk_index), " has ", c.data.size(),
                       " bytes, expected ", expected, " (", spec.count, " fp32 elements)"));
    }
    // owned is in the map's order, so a binary search by global index finds the slot.
    auto it = std::lower_bound(owned.begin(), owned.end(), global,
                               [](const OwnedChunk& o, int g) { return o.global_index < g; });
    const int slot = static_cast<int>(it - owned.begin());
    if (order[slot] >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", Key(c.tensor_id, c.chunk_index), " appears twice"));
    }
    order[slot] = i;
  }
  for (size_t slot = 0; slot < owned.size(); ++slot) {
    if (order[slot] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "missing chunk ", Key(owned[slot].spec.tensor_id, owned[slot].spec.chunk_index),
          ": every request carries all ", owned.size(), " chunks of shard ", options_.shard));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParameterShard::Init(absl::string_view job_id, int rank,
                                             const ModelDescription& model,
                                             absl::Span<const ChunkView> chunks) {
  absl::MutexLock lock(&mu_);
  if (auto s = CheckCaller(job_id, rank); !s.ok()) return s;
  if (rank != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("only rank 0 sets the initial weights; rank ", rank, " must Pull"));
  }
  if (auto s = CheckModel(model); !s.ok()) return s;
  auto map = ShardMap::Build(model.tensors, {model.num_shards, model.max_chunk_elements});
  if (!map.ok()) return map.status();

  std::vector<OwnedChunk> owned;
  int64_t local = 0;
  for (int g : map->ChunksOfShard(options_.shard)) {
    OwnedChunk o;
    o.spec = map->chunks()[g];
    o.global_index = g;
    o.local_offset = local;
    local += o.spec.count;
    owned.push_back(std::move(o));
  }
  std::vector<int> order;
  if (auto s = MatchChunks(chunks, *map, owned, order); !s.ok()) return s;

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
    if (fp.value() != init_fingerprint_) {
      return absl::AlreadyExistsError(absl::StrCat(
          "shard ", options_.shard,
          " is already initialised with different weights; restart the server to start anew"));
    }
    return version_;
  }
  weights_.resize(local);
  for (size_t slot = 0; slot < owned.size(); ++slot) {
    std::memcpy(weights_.data() + owned[slot].local_offset, chunks[order[slot]].data.data(),
                chunks[order[slot]].data.size());
  }
  for (auto& p : pending_) p.assign(local, 0.0f);
  sum_.assign(local, 0.0f);
  owned_ = std::move(owned);
  map_ = *std::move(map);
  job_id_ = std::string(job_id);
  init_fingerprint_ = fp.value();
  version_ = 0;
  return version_;
}

absl::StatusOr<int64_t> ParameterShard::Pull(absl::string_view job_id, int rank,
                                             const ModelDescription& model, absl::Time deadline,
                                             const ChunkSink& sink) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return map_.has_value() || shutdown_;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("shard ", options_.shard, ": rank 0 did not initialise the weights in time"));
  }
  if (auto s = CheckCaller(job_id, rank); !s.ok()) return s;
  if (auto s = CheckModel(model); !s.ok()) return s;
  Emit(sink);
  return version_;
}

absl::StatusOr<int64_t> ParameterShard::PushPull(absl::string_view job_id, int rank, int64_t step,
                                                 absl::Span<const ChunkView> chunks,
                                                 absl::Time deadline, const ChunkSink& sink,
                                                 int64_t* staleness) {
  absl::MutexLock lock(&mu_);
  if (auto s = CheckCaller(job_id, rank); !s.ok()) return s;
  if (!map_.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard, " has no weights yet: rank 0 must Init first"));
  }
  if (step < 0) return absl::OutOfRangeError(absl::StrCat("step ", step, " is negative"));
  std::vector<int> order;
  if (auto s = MatchChunks(chunks, *map_, owned_, order); !s.ok()) return s;
  if (options_.policy != SyncPolicy::kBsp) {
    return PushPullStale(rank, step, chunks, order, deadline, sink, staleness);
  }
  if (staleness != nullptr) *staleness = 0;
  if (step == version_ - 1) {
    // A retry of a push that was counted and completed: answer with the result.
    Emit(sink);
    return version_;
  }
  if (step != version_) {
    return absl::OutOfRangeError(absl::StrCat("step ", step, " is outside the window [",
                                              version_ - 1, ", ", version_, "] of shard ",
                                              options_.shard, " (current version ", version_, ")"));
  }
  if (!pushed_[rank]) {
    std::vector<float>& buffer = pending_[rank];
    for (size_t slot = 0; slot < owned_.size(); ++slot) {
      std::memcpy(buffer.data() + owned_[slot].local_offset, chunks[order[slot]].data.data(),
                  chunks[order[slot]].data.size());
    }
    pushed_[rank] = true;
    ++num_pushed_;
    CountStaleness(0);
    if (num_pushed_ == options_.num_workers) ApplyStep();
  }  // else: a retry while the step is still open; it waits like the original.

  auto done = [this, step]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return version_ > step || shutdown_;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "step ", step, " on shard ", options_.shard, " timed out waiting for rank(s) ",
        MissingRanks(), " (", num_pushed_, " of ", options_.num_workers, " workers pushed)"));
  }
  if (version_ <= step) return absl::UnavailableError("parameter server is shutting down");
  Emit(sink);
  return version_;
}

absl::StatusOr<int64_t> ParameterShard::PushPullStale(int rank, int64_t step,
                                                      absl::Span<const ChunkView> chunks,
                                                      const std::vector<int>& order,
                                                      absl::Time deadline, const ChunkSink& sink,
                                                      int64_t* staleness) {
  int64_t observed = 0;
  if (step == clock_[rank]) {
    observed = version_ - base_version_[rank];
    const float scale = 1.0f / static_cast<float>(options_.num_workers);
    for (size_t slot = 0; slot < owned_.size(); ++slot) {
      OwnedChunk& o = owned_[slot];
      const float* g = reinterpret_cast<const float*>(chunks[order[slot]].data.data());
      float* scaled = sum_.data() + o.local_offset;
      for (int64_t i = 0; i < o.spec.count; ++i) scaled[i] = g[i] * scale;
      optimizer_->Apply(absl::MakeSpan(weights_.data() + o.local_offset, o.spec.count),
                        absl::MakeConstSpan(scaled, o.spec.count), o.state);
    }
    ++clock_[rank];
    ++version_;
    CountStaleness(observed);
  } else if (step != clock_[rank] - 1) {  // Else: a retry of the last push, not re-applied.
    return absl::OutOfRangeError(absl::StrCat("rank ", rank, " pushed step ", step,
                                              ", expected step ", clock_[rank], " on shard ",
                                              options_.shard));
  }
  if (options_.policy == SyncPolicy::kSsp) {
    // Having pushed `step`, the worker may compute step + 1 once the slowest has pushed
    // step + 1 - staleness (clock >= step + 1 - staleness).
    const int64_t needed = step + 1 - options_.staleness;
    auto caught_up = [this, needed]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return shutdown_ || *std::min_element(clock_.begin(), clock_.end()) >= needed;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&caught_up), deadline)) {
      std::vector<int> slow;
      for (int r = 0; r < options_.num_workers; ++r) {
        if (clock_[r] < needed) slow.push_back(r);
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "step ", step, " on shard ", options_.shard, " timed out waiting for rank(s) ",
          absl::StrJoin(slow, ","), " to reach step ", needed - 1, " (staleness bound ",
          options_.staleness, ")"));
    }
    if (shutdown_) return absl::UnavailableError("parameter server is shutting down");
  }
  base_version_[rank] = version_;
  if (staleness != nullptr) *staleness = observed;
  Emit(sink);
  return version_;
}

void ParameterShard::CountStaleness(int64_t s) {
  ++pushes_;
  sum_staleness_ += s;
  max_staleness_ = std::max(max_staleness_, s);
}

void ParameterShard::ApplyStep() {
  // Fixed-order summation (rank 0, 1, ...) makes runs bit-reproducible.
  const size_t n = sum_.size();
  std::memcpy(sum_.data(), pending_[0].data(), n * sizeof(float));
  for (int r = 1; r < options_.num_workers; ++r) {
    const float* g = pending_[r].data();
    for (size_t i = 0; i < n; ++i) sum_[i] += g[i];
  }
  const float scale = 1.0f / static_cast<float>(options_.num_workers);
  for (size_t i = 0; i < n; ++i) sum_[i] *= scale;
  for (OwnedChunk& o : owned_) {
    optimizer_->Apply(absl::MakeSpan(weights_.data() + o.local_offset, o.spec.count),
                      absl::MakeConstSpan(sum_.data() + o.local_offset, o.spec.count), o.state);
  }
  pushed_.assign(options_.num_workers, false);
  num_pushed_ = 0;
  ++version_;
}

void ParameterShard::Emit(const ChunkSink& sink) const {
  for (const OwnedChunk& o : owned_) {
    sink(o.spec, absl::MakeConstSpan(weights_.data() + o.local_offset, o.spec.count));
  }
}

std::string ParameterShard::MissingRanks() const {
  std::vector<int> missing;
  for (int r = 0; r < options_.num_workers; ++r) {
    if (!pushed_[r]) missing.push_back(r);
  }
  return absl::StrJoin(missing, ",");
}

void ParameterShard::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
}

ParameterShard::Info ParameterShard::GetInfo() const {
  absl::MutexLock lock(&mu_);
  Info info;
  info.initialized = map_.has_value();
  info.job_id = job_id_;
  info.version = version_;
  info.pushes = pushes_;
  info.max_staleness = max_staleness_;
  info.mean_staleness = pushes_ > 0 ? static_cast<double>(sum_staleness_) / pushes_ : 0;
  return info;
}

}  // namespace dptrain
