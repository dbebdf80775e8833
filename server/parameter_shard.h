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
// Thread-safe: every method may be called concurrently from any thread.
#ifndef DPTRAIN_SERVER_PARAMETER_SHARD_H_
#define DPTRAIN_SERVER_PARAMETER_SHARD_H_

#include <atomic>
#include <cstdint>
#include <functional>
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
#include "common/shard_map.h"
#include "server/model_limits.h"

namespace dptrain {

// How pushes of different workers are combined.
//   kBsp:   a step completes when every worker pushed it; gradients are averaged in rank
//           order (bit-reproducible) and applied once.
//   kSsp:   each push is applied as it arrives (scaled by 1/num_workers, so one push from
//           every worker moves the weights as far as one BSP step); a worker finishing step t
//           waits until the slowest worker has pushed step t - staleness.
//   kAsync: as kSsp without any wait.
enum class SyncPolicy { kBsp, kSsp, kAsync };

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
  SyncPolicy policy = SyncPolicy::kBsp;
  int staleness = 0;  // kSsp: how many steps a worker may run ahead of the slowest.
  // What an Init may declare; checked before anything is built from the declaration.
  ModelLimits limits;
  // Where the shard reports what it decided on its own (e.g. a non-finite gradient).
  LogSink log = StderrLog();
};

// Parses "bsp", "ssp" or "async".
absl::StatusOr<SyncPolicy> ParseSyncPolicy(absl::string_view name);

// A chunk's payload as received: a view into the request, valid during the call.
struct ChunkView {
  int tensor_id = 0;
  int chunk_index = 0;
  DType dtype = DType::kUnspecified;
  absl::string_view data;
};

// What PullChunk returns besides the weights.
struct PulledChunk {
  int64_t version = 0;    // The chunk's version (BSP: step + 1; SSP/async: pushes applied).
  int64_t staleness = 0;  // SSP/async: other pushes applied since this rank last pulled it.
  // The step was not applied to this chunk because a gradient had inf/NaN (BSP: any
  // worker's push of the step; SSP/async: this rank's own push).
  bool skipped = false;
};

// Receives the shard's weights, chunk by chunk in (tensor_id, chunk_index) order. Called
// with the shard's lock held: copy, do not call back into the shard.
using ChunkSink = std::function<void(const ChunkSpec&, absl::Span<const float>)>;

class ParameterShard {
 public:
  // InvalidArgument for inconsistent options or an invalid optimizer.
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

  // Wakes every waiting call with Unavailable; later calls fail the same way.
  void Shutdown();

  struct Info {
    bool initialized = false;
    std::string job_id;
    int64_t version = 0;
    int64_t pushes = 0;         // Chunk pushes counted (all ranks, all chunks).
    int64_t max_staleness = 0;  // Over all chunk pushes.
    double mean_staleness = 0;
    // BSP steps skipped because a gradient (sum) held inf/NaN that no worker flagged.
    int64_t nonfinite_steps = 0;
    // SSP/async pushes dropped for the same reason.
    int64_t nonfinite_pushes = 0;
  };
  Info GetInfo() const;
  const ParameterShardOptions& options() const { return options_; }

 private:
  explicit ParameterShard(const ParameterShardOptions& options,
                          std::unique_ptr<Optimizer> optimizer);

  struct OwnedChunk {
    ChunkSpec spec;
    int global_index = 0;      // Into the shard map's chunks().
    int64_t local_offset = 0;  // Into weights_.
    OptimizerState state;
    // BSP: steps applied; SSP/async: pushes applied.
    int64_t version = 0;
    // BSP: the gradients of step `version`, per rank (data null = not pushed yet), each
    // kept alive by its hold until the step completes.
    std::vector<const float*> grads;
    std::vector<std::shared_ptr<const void>> holds;
    int num_pushed = 0;
    bool overflow = false;           // Some push of the open step had inf/NaN.
    bool last_skipped = false;       // The last completed step was skipped.
    std::vector<bool> rank_skipped;  // SSP/async: each rank's last push was dropped.
    // SSP/async: pushes applied per rank, the version each rank last received and the
    // staleness its last push observed.
    std::vector<int64_t> clock;
    std::vector<int64_t> base_version;
    std::vector<int64_t> observed;
  };

  absl::Status CheckCaller(absl::string_view job_id, int rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckModel(const ModelDescription& model) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckReady() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The slot of an owned chunk, or the status saying why `chunk` is not one (unknown,
  // another shard's, wrong dtype or size).
  absl::StatusOr<int> SlotOf(const ChunkView& chunk, const ShardMap& map,
                             const std::vector<OwnedChunk>& owned) const;
  // Checks that `chunks` holds each owned chunk exactly once; on success fills
  // order[slot] = index into chunks of owned[slot].
  absl::Status MatchChunks(absl::Span<const ChunkView> chunks, const ShardMap& map,
                           const std::vector<OwnedChunk>& owned, std::vector<int>& order) const;
  // Whether rank may push `step` of `chunk` now (OutOfRange naming the window if not).
  absl::Status CheckStep(const OwnedChunk& chunk, int rank, int64_t step) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records (BSP) or applies (SSP/async) a push that CheckStep accepted.
  void Push(OwnedChunk& chunk, int rank, int64_t step, absl::string_view data,
            std::shared_ptr<const void> hold, bool overflow) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyStep(OwnedChunk& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The learning rate of `step`.
  float RateAt(int64_t step) const;
  // The rank-order average of the open step's gradients of `chunk` (in sum_ or a push).
  const float* AverageGradients(const OwnedChunk& chunk) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts (and the first time, logs) an unflagged non-finite gradient of `step`.
  void NoteNonFinite(int64_t step, const ChunkSpec& spec, bool dropped_push)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CountStaleness(int64_t s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t MinVersion() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Emit(const ChunkSink& sink) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ParameterShardOptions options_;
  const std::unique_ptr<Optimizer> optimizer_;

  mutable absl::Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<ShardMap> map_ ABSL_GUARDED_BY(mu_);  // Set by Init.
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  uint64_t init_fingerprint_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<OwnedChunk> owned_ ABSL_GUARDED_BY(mu_);
  std::vector<float> weights_ ABSL_GUARDED_BY(mu_);  // Owned chunks back to back.
  std::vector<float> sum_ ABSL_GUARDED_BY(mu_);      // Scratch of the largest chunk's size.
  int64_t pushes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t max_staleness_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t sum_staleness_ ABSL_GUARDED_BY(mu_) = 0;
  // BSP: the latest step found non-finite (-1: none); its chunks that complete later skip.
  int64_t nonfinite_step_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t nonfinite_steps_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t nonfinite_pushes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_PARAMETER_SHARD_H_
