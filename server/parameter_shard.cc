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

// Whether no element is inf or NaN: an exponent of all ones. Integer-only, so the loop
// vectorises at -O3 without fast-math.
bool AllFinite(const void* data, int64_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + i * sizeof(float), sizeof(bits));
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
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
    return absl::InvalidArgumentError(
        absl::StrCat("shard index ", options.shard, " is not in [0, ", options.num_shards, ")"));
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
  if (options.lr_schedule.has_value()) {
    if (absl::Status s = ValidateLrSchedule(*options.lr_schedule); !s.ok()) return s;
  }
  if (options.limits.max_model_bytes < 1 || options.limits.max_chunks < 1 ||
      options.limits.max_chunk_elements < 1) {
    return absl::InvalidArgumentError("model limits must be positive");
  }
  if (options.log == nullptr) return absl::InvalidArgumentError("no log sink");
  auto optimizer = CreateOptimizer(options.optimizer);
  if (!optimizer.ok()) return optimizer.status();
  return std::unique_ptr<ParameterShard>(new ParameterShard(options, *std::move(optimizer)));
}

ParameterShard::ParameterShard(const ParameterShardOptions& options,
                               std::unique_ptr<Optimizer> optimizer)
    : options_(options), optimizer_(std::move(optimizer)) {}

absl::Status ParameterShard::CheckCaller(absl::string_view job_id, int rank) const {
  if (shutdown_) return absl::UnavailableError("parameter server is shutting down");
  if (rank < 0 || rank >= options_.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is not in [0, ",
                                                   options_.num_workers, "): this server expects ",
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
    return absl::FailedPreconditionError(absl::StrCat("shard mismatch: the worker expects ",
                                                      model.num_shards, " shards, this is shard ",
                                                      options_.shard, " of ", options_.num_shards));
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

absl::StatusOr<int> ParameterShard::SlotOf(const ChunkView& c, const ShardMap& map,
                                           const std::vector<OwnedChunk>& owned) const {
  const int global = map.Find(c.tensor_id, c.chunk_index);
  if (global < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown chunk ", Key(c.tensor_id, c.chunk_index)));
  }
  const ChunkSpec& spec = map.chunks()[global];
  if (spec.shard != options_.shard) {
    return absl::FailedPreconditionError(absl::StrCat("chunk ", Key(c.tensor_id, c.chunk_index),
                                                      " belongs to shard ", spec.shard,
                                                      ", not to shard ", options_.shard));
  }
  if (c.dtype != DType::kFp32) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", Key(c.tensor_id, c.chunk_index),
                                                   " has dtype ", DTypeName(c.dtype),
                                                   "; this shard stores fp32"));
  }
  const size_t expected = static_cast<size_t>(spec.count) * ElementSize(c.dtype);
  if (c.data.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", Key(c.tensor_id, c.chunk_index),
                                                   " has ", c.data.size(), " bytes, expected ",
                                                   expected, " (", spec.count, " fp32 elements)"));
  }
  // owned is in the map's order, so a binary search by global index finds the slot.
  auto it = std::lower_bound(owned.begin(), owned.end(), global,
                             [](const OwnedChunk& o, int g) { return o.global_index < g; });
  return static_cast<int>(it - owned.begin());
}

absl::Status ParameterShard::MatchChunks(absl::Span<const ChunkView> chunks, const ShardMap& map,
                                         const std::vector<OwnedChunk>& owned,
                                         std::vector<int>& order) const {
  order.assign(owned.size(), -1);
  for (int i = 0; i < static_cast<int>(chunks.size()); ++i) {
    auto slot = SlotOf(chunks[i], map, owned);
    if (!slot.ok()) return slot.status();
    if (order[*slot] >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", Key(chunks[i].tensor_id, chunks[i].chunk_index), " appears twice"));
    }
    order[*slot] = i;
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
  if (auto s = ValidateModel(model, options_.limits); !s.ok()) return s;
  if (auto s = CheckModel(model); !s.ok()) return s;
  auto map = ShardMap::Build(model.tensors, {model.num_shards, model.max_chunk_elements});
  if (!map.ok()) return map.status();

  std::vector<OwnedChunk> owned;
  int64_t local = 0, largest = 0;
  const int n = options_.num_workers;
  for (int g : map->ChunksOfShard(options_.shard)) {
    OwnedChunk o;
    o.spec = map->chunks()[g];
    o.global_index = g;
    o.local_offset = local;
    o.grads.assign(n, nullptr);
    o.holds.resize(n);
    o.clock.assign(n, 0);
    o.base_version.assign(n, 0);
    o.observed.assign(n, 0);
    o.rank_skipped.assign(n, false);
    local += o.spec.count;
    largest = std::max(largest, o.spec.count);
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
    return MinVersion();
  }
  weights_.resize(local);
  for (size_t slot = 0; slot < owned.size(); ++slot) {
    std::memcpy(weights_.data() + owned[slot].local_offset, chunks[order[slot]].data.data(),
                chunks[order[slot]].data.size());
  }
  sum_.assign(largest, 0.0f);
  owned_ = std::move(owned);
  map_ = *std::move(map);
  job_id_ = std::string(job_id);
  init_fingerprint_ = fp.value();
  return 0;
}

absl::StatusOr<int64_t> ParameterShard::Pull(absl::string_view job_id, int rank,
                                             const ModelDescription& model, absl::Time deadline,
                                             const ChunkSink& sink) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return map_.has_value() || shutdown_; };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("shard ", options_.shard, ": rank 0 did not initialise the weights in time"));
  }
  if (auto s = CheckCaller(job_id, rank); !s.ok()) return s;
  if (auto s = CheckModel(model); !s.ok()) return s;
  Emit(sink);
  return MinVersion();
}

absl::StatusOr<int64_t> ParameterShard::PushPull(absl::string_view job_id, int rank, int64_t step,
                                                 absl::Span<const ChunkView> chunks,
                                                 absl::Time deadline, const ChunkSink& sink,
                                                 int64_t* staleness, bool overflow, bool* skipped) {
  {
    absl::MutexLock lock(&mu_);
    if (auto s = CheckCaller(job_id, rank); !s.ok()) return s;
    if (auto s = CheckReady(); !s.ok()) return s;
    if (step < 0) return absl::OutOfRangeError(absl::StrCat("step ", step, " is negative"));
    std::vector<int> order;
    if (auto s = MatchChunks(chunks, *map_, owned_, order); !s.ok()) return s;
    // All or nothing: every chunk must accept the step before any records it.
    for (const OwnedChunk& o : owned_) {
      if (auto s = CheckStep(o, rank, step); !s.ok()) return s;
    }
    // An unflagged inf/NaN anywhere in the push skips it on every chunk, as a flag would:
    // BSP skips the step, SSP/async drop the push.
    const bool bsp = options_.policy == SyncPolicy::kBsp;
    for (size_t slot = 0; slot < owned_.size() && !overflow; ++slot) {
      const OwnedChunk& o = owned_[slot];
      const bool retry =
          bsp ? (step != o.version || o.grads[rank] != nullptr) : step != o.clock[rank];
      if (!retry && !AllFinite(chunks[order[slot]].data.data(), o.spec.count)) {
        overflow = true;
        NoteNonFinite(step, o.spec, /*dropped_push=*/!bsp);
      }
    }
    for (size_t slot = 0; slot < owned_.size(); ++slot) {
      Push(owned_[slot], rank, step, chunks[order[slot]].data, nullptr, overflow);
    }
  }
  int64_t version = 0, most_stale = 0;
  bool any_skipped = false;
  for (int slot = 0; slot < num_chunks(); ++slot) {
    auto pulled = PullChunk(rank, step, slot, deadline, sink);
    if (!pulled.ok()) return pulled.status();
    version = slot == 0 ? pulled->version : std::min(version, pulled->version);
    most_stale = std::max(most_stale, pulled->staleness);
    any_skipped = any_skipped || pulled->skipped;
  }
  if (staleness != nullptr) *staleness = most_stale;
  if (skipped != nullptr) *skipped = any_skipped;
  return version;
}

absl::StatusOr<int> ParameterShard::PushChunk(absl::string_view job_id, int rank, int64_t step,
                                              const ChunkView& chunk,
                                              std::shared_ptr<const void> hold, bool overflow) {
  absl::MutexLock lock(&mu_);
  if (auto s = CheckCaller(job_id, rank); !s.ok()) return s;
  if (auto s = CheckReady(); !s.ok()) return s;
  if (step < 0) return absl::OutOfRangeError(absl::StrCat("step ", step, " is negative"));
  auto slot = SlotOf(chunk, *map_, owned_);
  if (!slot.ok()) return slot.status();
  OwnedChunk& o = owned_[*slot];
  if (auto s = CheckStep(o, rank, step); !s.ok()) return s;
  Push(o, rank, step, chunk.data, std::move(hold), overflow);
  return *slot;
}

absl::Status ParameterShard::CheckReady() const {
  if (!map_.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard, " has no weights yet: rank 0 must Init first"));
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::CheckStep(const OwnedChunk& o, int rank, int64_t step) const {
  if (options_.policy == SyncPolicy::kBsp) {
    // Step `version` is open; step `version - 1` completed (a retry gets its result).
    if (step == o.version || step == o.version - 1) return absl::OkStatus();
    return absl::OutOfRangeError(
        absl::StrCat("step ", step, " is outside the window [", o.version - 1, ", ", o.version,
                     "] of shard ", options_.shard, " (chunk ",
                     Key(o.spec.tensor_id, o.spec.chunk_index), " is at version ", o.version, ")"));
  }
  // SSP/async: the rank's next push, or a retry of its last one.
  if (step == o.clock[rank] || step == o.clock[rank] - 1) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat("rank ", rank, " pushed step ", step,
                                            ", expected step ", o.clock[rank], " on shard ",
                                            options_.shard));
}

void ParameterShard::Push(OwnedChunk& o, int rank, int64_t step, absl::string_view data,
                          std::shared_ptr<const void> hold, bool overflow) {
  const int64_t n = o.spec.count;
  if (options_.policy == SyncPolicy::kBsp) {
    // A retry of a counted push (step still open, or completed) changes nothing.
    if (step != o.version || o.grads[rank] != nullptr) return;
    if (hold == nullptr || reinterpret_cast<uintptr_t>(data.data()) % alignof(float) != 0) {
      auto copy = std::make_shared<std::vector<float>>(n);
      std::memcpy(copy->data(), data.data(), n * sizeof(float));
      o.grads[rank] = copy->data();
      o.holds[rank] = std::move(copy);
    } else {
      o.grads[rank] = reinterpret_cast<const float*>(data.data());
      o.holds[rank] = std::move(hold);
    }
    ++o.num_pushed;
    o.overflow = o.overflow || overflow;
    CountStaleness(0);
    if (o.num_pushed == options_.num_workers) ApplyStep(o);
    return;
  }
  if (step != o.clock[rank]) return;  // A retry of the last push: not applied again.
  o.observed[rank] = o.version - o.base_version[rank];
  o.rank_skipped[rank] = overflow;
  if (overflow) {  // Dropped: the worker moves on (its clock), the weights do not.
    ++o.clock[rank];
    CountStaleness(o.observed[rank]);
    return;
  }
  const float scale = 1.0f / static_cast<float>(options_.num_workers);
  float* scaled = sum_.data();
  for (int64_t i = 0; i < n; ++i) {
    float g;
    std::memcpy(&g, data.data() + i * sizeof(float), sizeof(float));
    scaled[i] = g * scale;
  }
  if (!AllFinite(scaled, n)) {  // Dropped like a flagged overflow.
    NoteNonFinite(step, o.spec, /*dropped_push=*/true);
    o.rank_skipped[rank] = true;
    ++o.clock[rank];
    CountStaleness(o.observed[rank]);
    return;
  }
  optimizer_->Apply(absl::MakeSpan(weights_.data() + o.local_offset, n),
                    absl::MakeConstSpan(scaled, n), o.state, RateAt(step));
  ++o.clock[rank];
  ++o.version;
  CountStaleness(o.observed[rank]);
}

float ParameterShard::RateAt(int64_t step) const {
  return options_.lr_schedule.has_value() ? LearningRateAt(*options_.lr_schedule, step)
                                          : options_.optimizer.learning_rate;
}

void ParameterShard::ApplyStep(OwnedChunk& o) {
  const int64_t n = o.spec.count;
  // Mixed precision: some worker's gradient had inf/NaN (flagged, or found in another chunk
  // of this step); nobody's counts.
  bool skip = o.overflow || o.version == nonfinite_step_;
  const float* g = nullptr;
  if (!skip) {
    g = AverageGradients(o);
    if (!AllFinite(g, n)) {
      NoteNonFinite(o.version, o.spec, /*dropped_push=*/false);
      skip = true;
    }
  }
  if (!skip) {
    // Under BSP a chunk's version is the step it completes (skipped steps count too).
    optimizer_->Apply(absl::MakeSpan(weights_.data() + o.local_offset, n),
                      absl::MakeConstSpan(g, n), o.state, RateAt(o.version));
  }
  o.last_skipped = skip;
  o.overflow = false;
  std::fill(o.grads.begin(), o.grads.end(), nullptr);
  for (auto& h : o.holds) h.reset();
  o.num_pushed = 0;
  ++o.version;
}

const float* ParameterShard::AverageGradients(const OwnedChunk& o) {
  const int workers = options_.num_workers;
  if (workers == 1) return o.grads[0];
  // Fixed-order summation (rank 0, 1, ...) makes runs bit-reproducible.
  const int64_t n = o.spec.count;
  float* sum = sum_.data();
  std::memcpy(sum, o.grads[0], n * sizeof(float));
  for (int r = 1; r < workers; ++r) {
    const float* x = o.grads[r];
    for (int64_t i = 0; i < n; ++i) sum[i] += x[i];
  }
  const float scale = 1.0f / static_cast<float>(workers);
  for (int64_t i = 0; i < n; ++i) sum[i] *= scale;
  return sum;
}

void ParameterShard::NoteNonFinite(int64_t step, const ChunkSpec& spec, bool dropped_push) {
  int64_t& count = dropped_push ? nonfinite_pushes_ : nonfinite_steps_;
  if (!dropped_push) {
    if (step == nonfinite_step_) return;  // This step is counted already.
    nonfinite_step_ = step;
  }
  if (++count > 1) return;  // Logged once per kind; later ones are only counted.
  options_.log(absl::StrCat("ps shard ", options_.shard, ": step ", step, " chunk ",
                            Key(spec.tensor_id, spec.chunk_index),
                            ": gradient has inf/NaN but no overflow flag; ",
                            dropped_push ? "push dropped" : "step skipped",
                            " (further occurrences only counted: GetShardInfo ",
                            dropped_push ? "nonfinite_pushes" : "nonfinite_steps", ")"));
}

absl::StatusOr<PulledChunk> ParameterShard::PullChunk(int rank, int64_t step, int slot,
                                                      absl::Time deadline, const ChunkSink& sink,
                                                      const std::atomic<bool>* abandoned) {
  auto gave_up = [abandoned] { return abandoned != nullptr && abandoned->load(); };
  const absl::Status cancelled =
      absl::CancelledError(absl::StrCat("rank ", rank, " step ", step, ": the call ended"));
  absl::MutexLock lock(&mu_);
  if (rank < 0 || rank >= options_.num_workers || slot < 0 ||
      slot >= static_cast<int>(owned_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("PullChunk: no rank ", rank, " or chunk slot ",
                                                   slot, " on shard ", options_.shard));
  }
  OwnedChunk& o = owned_[slot];
  PulledChunk result;
  if (options_.policy == SyncPolicy::kBsp) {
    auto done = [this, &o, step, &gave_up]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return o.version > step || shutdown_ || gave_up();
    };
    const bool woke = mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
    if (o.version <= step && gave_up()) return cancelled;
    if (!woke) {
      std::vector<int> missing;
      for (int r = 0; r < options_.num_workers; ++r) {
        if (o.grads[r] == nullptr) missing.push_back(r);
      }
      return absl::DeadlineExceededError(
          absl::StrCat("step ", step, " on shard ", options_.shard,
                       " timed out waiting for rank(s) ", absl::StrJoin(missing, ","), " (",
                       o.num_pushed, " of ", options_.num_workers, " workers pushed)"));
    }
    if (o.version <= step) return absl::UnavailableError("parameter server is shutting down");
    result.skipped = o.last_skipped;
  } else {
    if (o.clock[rank] <= step) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", rank, " pulls step ", step, " of a chunk it has not pushed"));
    }
    if (options_.policy == SyncPolicy::kSsp) {
      // Having pushed `step`, the worker may compute step + 1 once the slowest has pushed
      // step + 1 - staleness (clock >= step + 1 - staleness).
      const int64_t needed = step + 1 - options_.staleness;
      auto caught_up = [this, &o, needed, &gave_up]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return shutdown_ || gave_up() ||
               *std::min_element(o.clock.begin(), o.clock.end()) >= needed;
      };
      const bool woke = mu_.AwaitWithDeadline(absl::Condition(&caught_up), deadline);
      if (gave_up()) return cancelled;
      if (!woke) {
        std::vector<int> slow;
        for (int r = 0; r < options_.num_workers; ++r) {
          if (o.clock[r] < needed) slow.push_back(r);
        }
        return absl::DeadlineExceededError(absl::StrCat(
            "step ", step, " on shard ", options_.shard, " timed out waiting for rank(s) ",
            absl::StrJoin(slow, ","), " to reach step ", needed - 1, " (staleness bound ",
            options_.staleness, ")"));
      }
      if (shutdown_) return absl::UnavailableError("parameter server is shutting down");
    }
    o.base_version[rank] = o.version;
    result.staleness = o.observed[rank];
    result.skipped = o.rank_skipped[rank];
  }
  result.version = o.version;
  sink(o.spec, absl::MakeConstSpan(weights_.data() + o.local_offset, o.spec.count));
  return result;
}

int ParameterShard::num_chunks() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(owned_.size());
}

void ParameterShard::CountStaleness(int64_t s) {
  ++pushes_;
  sum_staleness_ += s;
  max_staleness_ = std::max(max_staleness_, s);
}

int64_t ParameterShard::MinVersion() const {
  int64_t v = owned_.empty() ? 0 : owned_[0].version;
  for (const OwnedChunk& o : owned_) v = std::min(v, o.version);
  return v;
}

void ParameterShard::Emit(const ChunkSink& sink) const {
  for (const OwnedChunk& o : owned_) {
    sink(o.spec, absl::MakeConstSpan(weights_.data() + o.local_offset, o.spec.count));
  }
}

void ParameterShard::WakeWaiters() {
  absl::MutexLock lock(&mu_);  // Waiters re-evaluate their conditions when it is released.
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
  info.version = MinVersion();
  info.pushes = pushes_;
  info.max_staleness = max_staleness_;
  info.mean_staleness = pushes_ > 0 ? static_cast<double>(sum_staleness_) / pushes_ : 0;
  info.nonfinite_steps = nonfinite_steps_;
  info.nonfinite_pushes = nonfinite_pushes_;
  return info;
}

}  // namespace dptrain
