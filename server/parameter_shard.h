// One parameter-server shard: the weights and optimizer state of the chunks it owns, and
// the aggregation of the gradients that workers push. Plain C++, no network: the gRPC
// service (ps_service.h) and the tensor stream (tensor_stream_service.h) decode requests
// into these calls.
//
// Protocol, per shard:
//   1. Rank 0 calls Init with the model description and the initial weights of the chunks
//      this shard owns. Repeating the same Init is accepted; a different one is rejected.
//   2. Every rank may Pull the current weights (waiting for Init up to its deadline).
//   3. Each step t, every rank pushes its gradient for every owned chunk and pulls the new
//      weights. Every chunk has its own version: under BSP, when all num_workers ranks pushed
//      step t of a chunk, their gradients are summed in rank order (bit-reproducible),
//      averaged, the optimizer is applied to that chunk and its version becomes t+1 — so a
//      streamed step pipelines: chunk 0's new weights travel back while chunk 1 arrives.
//      PushPull does a whole step in one call; PushChunk + PullChunk do it chunk by chunk.
// A push for step t of a chunk is accepted while the chunk's version is t; a repeat of a
// push already counted (a retry) never counts twice. Invalid requests change nothing.
//
// Non-finite gradients: the shard does not trust the workers' overflow flag. A gradient
// sum (BSP) or a push (SSP/async) holding inf/NaN is treated exactly like a flagged
// overflow: BSP skips the step (answered `skipped`), SSP/async drop the push. A unary
// PushPull is checked before it is recorded, so it is skipped on every chunk of this shard.
// A streamed step is checked where each chunk is summed (BSP; SSP/async: scaled), and under
// BSP every chunk of that step completing after the detection is skipped too (a chunk
// already applied earlier in the pipeline stays applied). Sums of finite gradients that
// overflow to inf are caught the same way. Counted in Info; the first occurrence of each
// kind is logged through options.log.
//
// The state lives in a ShardStore (shard_store.h); what a push does is the policy's
// (aggregation_policy.h: BSP, SSP, async).
//
// Checkpoints (options.checkpoints): every `every` completed steps the store is snapshotted
// under the lock and written atomically by the pushing thread after the lock is released
// (checkpoint.h). Create restores the newest valid checkpoint of the directory, so a
// restarted shard resumes at that step. Rollback(step) goes back to the checkpoint of
// `step` (BSP): the way workers bring every shard back to the step a restarted shard
// resumed at; calls waiting on the shard then end with Aborted. Each going back opens a
// numbered incarnation of the job; the first Rollback of it goes back, the other ranks'
// Rollbacks of the same incarnation only let them in, and a rank's pushes count only once it
// is in the shard's incarnation (Aborted otherwise), so that a rank still on the old side of
// a going back can neither complete a step of the new one nor make it go back again (two
// ranks each sending the shards back under the other would never end). With checkpoints under BSP,
// workers hand in their batch-norm running statistics of each checkpoint step (KeepBuffers,
// rank_buffers.h); the checkpoint holds them and Buffers gives each rank its own back.
//
// Thread-safe: every method may be called concurrently from any thread.
#ifndef DPTRAIN_SERVER_PARAMETER_SHARD_H_
#define DPTRAIN_SERVER_PARAMETER_SHARD_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/log_sink.h"
#include "common/lr_schedule.h"
#include "common/optimizer.h"
#include "common/file_system.h"
#include "common/shard_map.h"
#include "server/aggregation_policy.h"
#include "server/checkpoint.h"
#include "server/model_limits.h"
#include "server/rank_buffers.h"
#include "server/shard_observer.h"
#include "server/shard_store.h"

namespace dptrain {

struct ParameterShardOptions {
  int shard = 0;
  int num_shards = 1;
  int num_workers = 1;
  // Longest wait for other workers (or for Init) before a call fails.
  absl::Duration step_timeout = absl::Seconds(60);
  OptimizerOptions optimizer;
  // The rate as a function of the step (the step a BSP chunk completes, the pushing
  // worker's step under SSP/async); none: optimizer.learning_rate throughout.
  std::optional<LrScheduleOptions> lr_schedule;
  SyncPolicy policy = SyncPolicy::kBsp;  // aggregation_policy.h.
  int staleness = 0;  // kSsp: how many steps a worker may run ahead of the slowest.
  // What an Init (or a checkpoint) may declare; checked before anything is built from it.
  ModelLimits limits;
  // Where the shard reports what it decided on its own (e.g. a non-finite gradient).
  LogSink log = StderrLog();
  // Told about pushes, optimizer runs, completed steps and waits (metrics, trace); not
  // owned, must outlive the shard. Null: nobody.
  ShardObserver* observer = nullptr;
  struct Checkpoints {
    std::string dir;           // Empty: no checkpoints (and no restore, no Rollback).
    int64_t every = 0;         // Steps between checkpoints (0: none written, restore only).
    int keep = 3;              // Newest checkpoints kept.
    FileSystem* fs = nullptr;  // Not owned; null: the machine's.
  } checkpoints;
};

class ParameterShard {
 public:
  // InvalidArgument for inconsistent options or an invalid optimizer. With a checkpoint
  // directory, restores its newest valid checkpoint (invalid ones are skipped with a log
  // line); FailedPrecondition if that belongs to another shard layout or optimizer.
  static absl::StatusOr<std::unique_ptr<ParameterShard>> Create(
      const ParameterShardOptions& options);

  // Returns the version (0 for a fresh init; the current one for an accepted repeat).
  // InvalidArgument naming the field for a model outside options.limits, checked first.
  absl::StatusOr<int64_t> Init(absl::string_view job_id, int rank, const ModelDescription& model,
                               absl::Span<const ChunkView> chunks);

  // Waits until initialised (or `deadline`, whichever is first), then emits the weights.
  absl::StatusOr<int64_t> Pull(absl::string_view job_id, int rank, const ModelDescription& model,
                               absl::Time deadline, const ChunkSink& sink);

  // Records rank's gradient for `step` (every owned chunk), waits as the policy requires (or
  // until `deadline`: DeadlineExceeded naming the ranks waited for), then emits the weights
  // and returns their version (BSP: step + 1; SSP/async: the number of pushes applied).
  // `staleness`, if not null, receives how many other pushes were applied since this rank
  // last got weights (the most over the chunks).
  // `overflow`: this worker's gradient has inf/NaN (mixed precision): under BSP nobody's
  // gradient of that step is applied, so every replica skips it; `skipped` (if not null)
  // says whether the step was skipped.
  absl::StatusOr<int64_t> PushPull(absl::string_view job_id, int rank, int64_t step,
                                   absl::Span<const ChunkView> chunks, absl::Time deadline,
                                   const ChunkSink& sink, int64_t* staleness = nullptr,
                                   bool overflow = false, bool* skipped = nullptr);

  // The chunk-by-chunk form of PushPull (a streamed step). PushChunk records rank's
  // gradient of `step` for one owned chunk and returns the chunk's slot (its position in
  // this shard's chunk order, 0..num_chunks()-1). If `hold` is set it keeps chunk.data
  // alive and the shard keeps the view until the step completes instead of copying it.
  absl::StatusOr<int> PushChunk(absl::string_view job_id, int rank, int64_t step,
                                const ChunkView& chunk, std::shared_ptr<const void> hold,
                                bool overflow = false);
  // Waits as the policy requires for the chunk at `slot` after rank pushed `step` (or until
  // `deadline`: DeadlineExceeded naming the ranks waited for), then emits its weights.
  // `abandoned`, if not null, ends the wait early with Cancelled once it is true and
  // WakeWaiters() was called after setting it (the caller's RPC went away or failed).
  absl::StatusOr<PulledChunk> PullChunk(int rank, int64_t step, int slot, absl::Time deadline,
                                        const ChunkSink& sink,
                                        const std::atomic<bool>* abandoned = nullptr);
  // Makes every waiting call re-check its `abandoned` flag. Thread-safe, non-blocking
  // beyond the shard's lock.
  void WakeWaiters();
  // How many chunks this shard owns (0 before Init).
  int num_chunks() const;

  // Puts rank in `incarnation` of the job, which begins at `step` (BSP only). The first
  // Rollback of an incarnation newer than the shard's goes back to the checkpoint of `step`
  // (unless every chunk is at `step` already: then only the pushes held are dropped) and
  // waiting calls end with Aborted; a later one of the same incarnation and step changes
  // nothing but rank's incarnation. Returns `step`. Aborted for an older incarnation or the
  // same one begun at another step; FailedPrecondition without a checkpoint directory or
  // under SSP/async; NotFound (naming the steps there are) without a checkpoint of that step.
  absl::StatusOr<int64_t> Rollback(absl::string_view job_id, int rank, int64_t step,
                                   int64_t incarnation);

  // Keeps rank's batch-norm running statistics as they are before it computes `step`, for
  // the checkpoint of `step`: the next checkpoint step, at most one ahead of the shard's
  // version (a worker calls it before pushing step - 1). FailedPrecondition without a
  // checkpoint interval, under SSP/async or for another step; InvalidArgument for values
  // that do not fit (rank_buffers.h). `epoch_end`: step begins an epoch, and the workers
  // average their statistics before it; the checkpoint keeps that mean.
  absl::Status KeepBuffers(absl::string_view job_id, int rank, int64_t step,
                           absl::Span<const float> values, bool epoch_end = false);
  // rank's statistics of `step` from the checkpoint of that step (the newest one taken or
  // restored). NotFound if it holds none of that step.
  absl::StatusOr<std::vector<float>> Buffers(absl::string_view job_id, int rank, int64_t step);

  // Wakes every waiting call with Unavailable; later calls fail the same way.
  void Shutdown();

  struct Info {
    bool initialized = false;
    std::string job_id;
    int64_t version = 0;
    int64_t weight_bytes = 0;   // fp32 bytes of the chunks this shard owns (0 before Init).
    int64_t pushes = 0;         // Chunk pushes counted (all ranks, all chunks).
    int64_t max_staleness = 0;  // Over all chunk pushes.
    double mean_staleness = 0;
    // BSP steps skipped because a gradient (sum) held inf/NaN that no worker flagged.
    int64_t nonfinite_steps = 0;
    // SSP/async pushes dropped for the same reason.
    int64_t nonfinite_pushes = 0;
    int64_t restored_step = -1;    // The checkpoint Create restored (-1: none).
    int64_t checkpoint_step = -1;  // The newest checkpoint written (-1: none).
    int64_t checkpoints_written = 0;
    int64_t checkpoint_failures = 0;
    double checkpoint_seconds = 0;  // The newest write's duration.
    double checkpoint_seconds_total = 0;  // Of every write that succeeded.
    int64_t checkpoint_bytes = 0;   // The newest checkpoint's file size.
    int64_t rollbacks = 0;
    // The incarnation of the job the shard is in (0: the job's start or the shard's) and the
    // step it began at.
    int64_t incarnation = 0;
    int64_t incarnation_step = 0;
    std::vector<int64_t> rank_incarnations;  // Per rank: the incarnation it is in here.
    // Per rank: the newest step it pushed (-1: none yet) and when it was last heard from
    // (a push or a pull; absl::InfinitePast() if never).
    std::vector<int64_t> rank_steps;
    std::vector<absl::Time> rank_seen;
    double learning_rate = 0;  // Of the next step (the schedule's, if any).
  };
  Info GetInfo() const;
  const ParameterShardOptions& options() const { return options_; }

 private:
  ParameterShard(const ParameterShardOptions& options, std::unique_ptr<Optimizer> optimizer);

  absl::Status CheckCaller(absl::string_view job_id, int rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckReady() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Aborted unless rank is in the shard's incarnation (its pushes may count).
  absl::Status CheckIncarnation(int rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  float RateAt(int64_t step) const;
  // Replaces the store's state with `checkpoint`'s (validated against options.limits).
  absl::Status RestoreLocked(const ShardCheckpoint& checkpoint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before recording rank's push of `step`: its position and the step's first push.
  void NotePush(int rank, int64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a push: tells the observer about every step it completed.
  void NoteCompleted() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After a push: the snapshot to write if a checkpoint step completed.
  std::optional<ShardCheckpoint> DueCheckpoint() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes it (without holding mu_), one write at a time; failures are logged and counted.
  void WriteCheckpoint(std::optional<ShardCheckpoint> checkpoint) ABSL_LOCKS_EXCLUDED(mu_);

  const ParameterShardOptions options_;
  const std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<FileSystem> own_fs_;
  std::optional<CheckpointDir> checkpoints_;  // Set when options.checkpoints.dir is.
  absl::Mutex write_mu_;                       // One checkpoint write at a time.

  mutable absl::Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  ShardStore store_ ABSL_GUARDED_BY(mu_);
  ShardStats stats_ ABSL_GUARDED_BY(mu_);
  RankBuffers rank_buffers_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<AggregationPolicy> policy_ ABSL_GUARDED_BY(mu_);
  // Changes when the store is replaced (Rollback): waiting calls then end with Aborted.
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // The incarnation of the job and its first step (Rollback).
  int64_t incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t incarnation_step_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_snapshot_step_ ABSL_GUARDED_BY(mu_) = -1;
  Info checkpoint_info_ ABSL_GUARDED_BY(mu_);  // The checkpoint and rollback fields.
  ShardObserver no_observer_;
  ShardObserver* const observer_;  // options.observer or no_observer_.
  std::vector<int64_t> rank_steps_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> rank_seen_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> rank_incarnation_ ABSL_GUARDED_BY(mu_);  // Each rank's incarnation.
  // The first push of each step not yet completed on every chunk (BSP; OnStepComplete).
  std::map<int64_t, absl::Time> first_push_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_PARAMETER_SHARD_H_
