#include "server/parameter_shard.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dptrain {

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
  if (options.checkpoints.every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint interval must be >= 0 steps, got ", options.checkpoints.every));
  }
  if (options.checkpoints.every > 0 && options.checkpoints.dir.empty()) {
    return absl::InvalidArgumentError("a checkpoint interval needs a checkpoint directory");
  }
  auto optimizer = CreateOptimizer(options.optimizer);
  if (!optimizer.ok()) return optimizer.status();
  std::unique_ptr<ParameterShard> shard(new ParameterShard(options, *std::move(optimizer)));
  if (options.checkpoints.dir.empty()) return shard;

  FileSystem* fs = options.checkpoints.fs;
  if (fs == nullptr) {
    shard->own_fs_ = std::make_unique<PosixFileSystem>();
    fs = shard->own_fs_.get();
  }
  auto dir = CheckpointDir::Open(
      {options.checkpoints.dir, options.shard, options.checkpoints.keep, fs, options.log});
  if (!dir.ok()) return dir.status();
  shard->checkpoints_ = *std::move(dir);
  auto newest = shard->checkpoints_->LoadNewest();
  if (absl::IsNotFound(newest.status())) return shard;
  if (!newest.ok()) return newest.status();
  absl::MutexLock lock(&shard->mu_);
  if (auto s = shard->RestoreLocked(*newest); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(shard->checkpoints_->PathOf(newest->step), ": ",
                                               s.message()));
  }
  shard->checkpoint_info_.restored_step = newest->step;
  shard->last_snapshot_step_ = newest->step;
  options.log(absl::StrCat("ps shard ", options.shard, ": restored step ", newest->step, " of job '",
                           newest->job_id, "' from ", shard->checkpoints_->PathOf(newest->step)));
  return shard;
}

ParameterShard::ParameterShard(const ParameterShardOptions& options,
                               std::unique_ptr<Optimizer> optimizer)
    : options_(options),
      optimizer_(std::move(optimizer)),
      store_(options.shard, options.num_shards, optimizer_.get()),
      rank_buffers_(options.num_workers,
                    options.limits.max_model_bytes / static_cast<int64_t>(sizeof(float))),
      observer_(options.observer != nullptr ? options.observer : &no_observer_),
      rank_steps_(options.num_workers, -1),
      rank_seen_(options.num_workers, absl::InfinitePast()),
      rank_incarnation_(options.num_workers, 0) {
  PolicyContext context;
  context.shard = options.shard;
  context.num_workers = options.num_workers;
  context.staleness = options.staleness;
  context.store = &store_;
  context.stats = &stats_;
  context.rate_at = [this](int64_t step) { return RateAt(step); };
  context.log = options.log;
  context.observer = observer_;
  policy_ = AggregationPolicy::Create(options.policy, context);
}

float ParameterShard::RateAt(int64_t step) const {
  return options_.lr_schedule.has_value() ? LearningRateAt(*options_.lr_schedule, step)
                                          : options_.optimizer.learning_rate;
}

absl::Status ParameterShard::CheckCaller(absl::string_view job_id, int rank) const {
  if (shutdown_) return absl::UnavailableError("parameter server is shutting down");
  if (rank < 0 || rank >= options_.num_workers) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is not in [0, ",
                                                   options_.num_workers, "): this server expects ",
                                                   options_.num_workers, " workers"));
  }
  if (store_.initialized() && job_id != store_.job_id()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job id '", job_id, "' does not match '", store_.job_id(), "' that this shard serves"));
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::CheckReady() const {
  if (!store_.initialized()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard, " has no weights yet: rank 0 must Init first"));
  }
  return absl::OkStatus();
}

absl::Status ParameterShard::CheckIncarnation(int rank) const {
  if (rank_incarnation_[rank] == incarnation_) return absl::OkStatus();
  return absl::AbortedError(
      absl::StrCat("shard ", options_.shard, " went back to step ", incarnation_step_,
                   " (incarnation ", incarnation_, " of the job) and rank ", rank,
                   " is still in incarnation ", rank_incarnation_[rank], "; rewind to it"));
}

absl::Status ParameterShard::RestoreLocked(const ShardCheckpoint& checkpoint) {
  if (checkpoint.policy != SyncPolicyName(options_.policy)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint of step ", checkpoint.step, " was taken under sync policy ",
                     checkpoint.policy, ", this shard runs ", SyncPolicyName(options_.policy)));
  }
  if (auto s = ValidateModel(checkpoint.model, options_.limits); !s.ok()) return s;
  if (auto s = store_.Restore(checkpoint); !s.ok()) return s;
  policy_->Reset(/*restored=*/true);
  if (!rank_buffers_.Restore(checkpoint.step, checkpoint.world_size, checkpoint.buffers) &&
      !checkpoint.buffers.empty()) {
    options_.log(absl::StrCat("ps shard ", options_.shard, ": the checkpoint of step ",
                              checkpoint.step, " holds batch-norm statistics of ",
                              checkpoint.world_size, " workers, this shard serves ",
                              options_.num_workers, ": they are not restored"));
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
  auto fresh = store_.Init(job_id, model, chunks);
  if (!fresh.ok()) return fresh.status();
  if (*fresh) {
    policy_->Reset(/*restored=*/false);
    return 0;
  }
  return store_.MinVersion();
}

absl::StatusOr<int64_t> ParameterShard::Pull(absl::string_view job_id, int rank,
                                             const ModelDescription& model, absl::Time deadline,
                                             const ChunkSink& sink) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return store_.initialized() || shutdown_;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&ready), deadline)) {
    return absl::DeadlineExceededError(
        absl::StrCat("shard ", options_.shard, ": rank 0 did not initialise the weights in time"));
  }
  if (auto s = CheckCaller(job_id, rank); !s.ok()) return s;
  if (auto s = store_.CheckModel(model); !s.ok()) return s;
  policy_->Rejoin(rank);
  rank_seen_[rank] = absl::Now();
  // A rank that pulls the whole model (at its start, or as it rewinds) resumes from it.
  rank_incarnation_[rank] = incarnation_;
  store_.Emit(sink);
  return store_.MinVersion();
}

absl::StatusOr<int64_t> ParameterShard::PushPull(absl::string_view job_id, int rank, int64_t step,
                                                 absl::Span<const ChunkView> chunks,
                                                 absl::Time deadline, const ChunkSink& sink,
                                                 int64_t* staleness, bool overflow, bool* skipped) {
  std::optional<ShardCheckpoint> due;
  {
    absl::MutexLock lock(&mu_);
    if (auto s = CheckCaller(job_id, rank); !s.ok()) return s;
    if (auto s = CheckReady(); !s.ok()) return s;
    if (auto s = CheckIncarnation(rank); !s.ok()) return s;
    if (step < 0) return absl::OutOfRangeError(absl::StrCat("step ", step, " is negative"));
    std::vector<int> order;
    if (auto s = store_.MatchChunks(chunks, order); !s.ok()) return s;
    // All or nothing: every chunk must accept the step before any records it.
    for (int slot = 0; slot < store_.num_chunks(); ++slot) {
      if (auto s = policy_->CheckStep(slot, rank, step); !s.ok()) return s;
    }
    // An unflagged inf/NaN anywhere in the push skips it on every chunk, as a flag would:
    // BSP skips the step, SSP/async drop the push.
    for (int slot = 0; slot < store_.num_chunks() && !overflow; ++slot) {
      if (policy_->IsRetry(slot, rank, step)) continue;
      if (!AllFinite(chunks[order[slot]].data.data(), store_.chunk(slot).spec.count)) {
        overflow = true;
        policy_->NoteNonFinitePush(step, store_.chunk(slot).spec);
      }
    }
    NotePush(rank, step);
    for (int slot = 0; slot < store_.num_chunks(); ++slot) {
      policy_->Push(slot, rank, step, chunks[order[slot]].data, nullptr, overflow);
    }
    NoteCompleted();
    due = DueCheckpoint();
  }
  WriteCheckpoint(std::move(due));
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
  std::optional<ShardCheckpoint> due;
  int slot = 0;
  {
    absl::MutexLock lock(&mu_);
    if (auto s = CheckCaller(job_id, rank); !s.ok()) return s;
    if (auto s = CheckReady(); !s.ok()) return s;
    if (auto s = CheckIncarnation(rank); !s.ok()) return s;
    if (step < 0) return absl::OutOfRangeError(absl::StrCat("step ", step, " is negative"));
    auto found = store_.SlotOf(chunk);
    if (!found.ok()) return found.status();
    slot = *found;
    if (auto s = policy_->CheckStep(slot, rank, step); !s.ok()) return s;
    NotePush(rank, step);
    policy_->Push(slot, rank, step, chunk.data, std::move(hold), overflow);
    NoteCompleted();
    due = DueCheckpoint();
  }
  WriteCheckpoint(std::move(due));
  return slot;
}

absl::StatusOr<PulledChunk> ParameterShard::PullChunk(int rank, int64_t step, int slot,
                                                      absl::Time deadline, const ChunkSink& sink,
                                                      const std::atomic<bool>* abandoned) {
  auto gave_up = [abandoned] { return abandoned != nullptr && abandoned->load(); };
  absl::MutexLock lock(&mu_);
  if (rank < 0 || rank >= options_.num_workers || slot < 0 || slot >= store_.num_chunks()) {
    return absl::InvalidArgumentError(absl::StrCat("PullChunk: no rank ", rank, " or chunk slot ",
                                                   slot, " on shard ", options_.shard));
  }
  if (auto s = policy_->CheckPull(slot, rank, step); !s.ok()) return s;
  const int64_t generation = generation_;
  const absl::Time wait_start = absl::Now();
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return shutdown_ || gave_up() || generation_ != generation ||
           policy_->Ready(slot, rank, step);
  };
  const bool woke = mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  if (generation_ != generation) {
    return absl::AbortedError(absl::StrCat(
        "shard ", options_.shard, " went back to the checkpoint of step ", store_.MinVersion(),
        " while rank ", rank, " waited for step ", step, "; rewind to it"));
  }
  const bool ready = policy_->Ready(slot, rank, step);
  if (!ready && gave_up()) {
    return absl::CancelledError(absl::StrCat("rank ", rank, " step ", step, ": the call ended"));
  }
  if (!woke) return policy_->TimedOut(slot, rank, step);
  // A complete step is answered even while the shard shuts down: at a job's end in master mode
  // rank 0 may stop the reducer it hosts while another rank's stream still waits for the
  // last step's chunks (the server's grace period lets that answer leave).
  if (!ready) return absl::UnavailableError("parameter server is shutting down");
  PulledChunk result = policy_->Pulled(slot, rank);
  const absl::Time send_start = absl::Now();
  observer_->OnWait(rank, step, wait_start, send_start);
  sink(store_.chunk(slot).spec, store_.weights(slot));
  observer_->OnSend(rank, step, send_start, absl::Now());
  return result;
}

void ParameterShard::NotePush(int rank, int64_t step) {
  const absl::Time now = absl::Now();
  rank_steps_[rank] = step;
  rank_seen_[rank] = now;
  if (options_.policy == SyncPolicy::kBsp && step >= policy_->CompletedStep()) {
    first_push_.emplace(step, now);  // Kept if the step has an earlier push.
  }
}

void ParameterShard::NoteCompleted() {
  if (options_.policy != SyncPolicy::kBsp) return;
  const int64_t completed = policy_->CompletedStep();  // Steps every chunk completed.
  const absl::Time now = absl::Now();
  while (!first_push_.empty() && first_push_.begin()->first < completed) {
    observer_->OnStepComplete(first_push_.begin()->first, first_push_.begin()->second, now);
    first_push_.erase(first_push_.begin());
  }
}

std::optional<ShardCheckpoint> ParameterShard::DueCheckpoint() {
  const int64_t every = options_.checkpoints.every;
  if (every <= 0) return std::nullopt;
  const int64_t completed = policy_->CompletedStep();
  if (completed <= last_snapshot_step_ || completed % every != 0) return std::nullopt;
  last_snapshot_step_ = completed;
  ShardCheckpoint checkpoint = store_.Snapshot(completed, SyncPolicyName(options_.policy));
  checkpoint.buffers = rank_buffers_.TakeForCheckpoint(completed);
  checkpoint.world_size = checkpoint.buffers.empty() ? 0 : options_.num_workers;
  return checkpoint;
}

void ParameterShard::WriteCheckpoint(std::optional<ShardCheckpoint> checkpoint) {
  if (!checkpoint.has_value()) return;
  absl::MutexLock write_lock(&write_mu_);
  const absl::Time start = absl::Now();
  const absl::Status written = checkpoints_->Write(*checkpoint);
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  int64_t bytes = 0;
  for (const ChunkCheckpoint& c : checkpoint->chunks) {
    bytes += static_cast<int64_t>(c.weights.size() + c.state.momentum_buffer.size() +
                                  c.state.exp_avg.size() + c.state.exp_avg_sq.size()) *
             static_cast<int64_t>(sizeof(float));
  }
  bytes += static_cast<int64_t>(checkpoint->buffers.size() * sizeof(float));
  absl::MutexLock lock(&mu_);
  if (!written.ok()) {
    if (++checkpoint_info_.checkpoint_failures == 1 || checkpoint_info_.checkpoint_failures % 100 == 0) {
      options_.log(absl::StrCat("ps shard ", options_.shard, ": checkpoint of step ",
                                checkpoint->step, " failed (", checkpoint_info_.checkpoint_failures,
                                " so far): ", written.ToString()));
    }
    return;
  }
  ++checkpoint_info_.checkpoints_written;
  checkpoint_info_.checkpoint_step = std::max(checkpoint_info_.checkpoint_step, checkpoint->step);
  checkpoint_info_.checkpoint_seconds = seconds;
  checkpoint_info_.checkpoint_seconds_total += seconds;
  checkpoint_info_.checkpoint_bytes = bytes;
}

absl::StatusOr<int64_t> ParameterShard::Rollback(absl::string_view job_id, int rank, int64_t step,
                                                 int64_t incarnation) {
  absl::MutexLock lock(&mu_);
  if (auto s = CheckCaller(job_id, rank); !s.ok()) return s;
  if (auto s = CheckReady(); !s.ok()) return s;
  bool at_step = true;
  for (int slot = 0; slot < store_.num_chunks(); ++slot) {
    at_step = at_step && store_.chunk(slot).version == step;
  }
  if (options_.policy != SyncPolicy::kBsp) {
    if (at_step) return step;
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard, " runs ", SyncPolicyName(options_.policy),
                     ": only BSP shards go back to a step"));
  }
  if (incarnation < incarnation_ || (incarnation == incarnation_ && step != incarnation_step_)) {
    return absl::AbortedError(absl::StrCat(
        "shard ", options_.shard, " is in incarnation ", incarnation_, " of the job (from step ",
        incarnation_step_, "), not in incarnation ", incarnation, " from step ", step));
  }
  if (incarnation == incarnation_) {  // Another rank went back first: this one joins.
    rank_incarnation_[rank] = incarnation;
    return step;
  }
  if (at_step) {
    policy_->Reset(/*restored=*/true);  // The weights stay; the pushes held are dropped.
  } else {
    if (!checkpoints_.has_value()) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", options_.shard, " is at step ", store_.MinVersion(),
                       " and has no --checkpoint_dir to go back to step ", step));
    }
    auto checkpoint = checkpoints_->Load(step);
    if (!checkpoint.ok()) return checkpoint.status();
    if (auto s = RestoreLocked(*checkpoint); !s.ok()) return s;
    ++checkpoint_info_.rollbacks;
    last_snapshot_step_ = step;
    options_.log(absl::StrCat("ps shard ", options_.shard, ": went back to the checkpoint of step ",
                              step, " (asked by rank ", rank, ", incarnation ", incarnation, ")"));
  }
  ++generation_;
  first_push_.clear();
  incarnation_ = incarnation;
  incarnation_step_ = step;
  rank_incarnation_[rank] = incarnation;
  return step;
}

absl::Status ParameterShard::KeepBuffers(absl::string_view job_id, int rank, int64_t step,
                                         absl::Span<const float> values, bool epoch_end) {
  absl::MutexLock lock(&mu_);
  if (auto s = CheckCaller(job_id, rank); !s.ok()) return s;
  if (auto s = CheckReady(); !s.ok()) return s;
  const int64_t every = options_.checkpoints.every;
  if (options_.policy != SyncPolicy::kBsp || every <= 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard, " keeps no batch-norm statistics: it ",
        every <= 0 ? "takes no checkpoints (--checkpoint_every)"
                   : absl::StrCat("runs ", SyncPolicyName(options_.policy), ", not bsp")));
  }
  const int64_t version = store_.MinVersion();
  if (step % every != 0 || step <= last_snapshot_step_ || step > version + 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", step, " is not the next checkpoint step of shard ", options_.shard, " (at step ",
        version, ", a checkpoint every ", every, " steps)"));
  }
  return rank_buffers_.Keep(rank, step, values, epoch_end);
}

absl::StatusOr<std::vector<float>> ParameterShard::Buffers(absl::string_view job_id, int rank,
                                                           int64_t step) {
  absl::MutexLock lock(&mu_);
  if (auto s = CheckCaller(job_id, rank); !s.ok()) return s;
  if (auto s = CheckReady(); !s.ok()) return s;
  return rank_buffers_.Held(rank, step);
}

int ParameterShard::num_chunks() const {
  absl::MutexLock lock(&mu_);
  return store_.num_chunks();
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
  Info info = checkpoint_info_;
  info.initialized = store_.initialized();
  info.job_id = store_.job_id();
  info.version = store_.MinVersion();
  info.weight_bytes = store_.num_elements() * static_cast<int64_t>(sizeof(float));
  info.pushes = stats_.pushes;
  info.max_staleness = stats_.max_staleness;
  info.mean_staleness =
      stats_.pushes > 0 ? static_cast<double>(stats_.sum_staleness) / stats_.pushes : 0;
  info.nonfinite_steps = stats_.nonfinite_steps;
  info.nonfinite_pushes = stats_.nonfinite_pushes;
  info.rank_steps = rank_steps_;
  info.rank_seen = rank_seen_;
  info.incarnation = incarnation_;
  info.incarnation_step = incarnation_step_;
  info.rank_incarnations = rank_incarnation_;
  info.learning_rate = RateAt(info.version);
  return info;
}

}  // namespace dptrain
