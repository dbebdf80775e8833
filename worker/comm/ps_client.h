// The ParameterStore (step_sync.h) of ps and master mode: S parameter-server shards: each step, one
// call per shard, all shards in flight at once, each carrying the shard's chunks of the gradient
// and bringing back the same chunks of the new weights. A shard holding at least `stream_min_bytes`
// gets a tensor stream (shard_step_call.h: no copies, chunks pipelined); a smaller one one unary
// PushPull, whose fixed cost is lower (measured: LeNet through 2 shards trains ~20 % faster
// that way, while a 64 MiB shard's push+pull takes a third of the unary time streamed).
#ifndef DPTRAIN_WORKER_COMM_PS_CLIENT_H_
#define DPTRAIN_WORKER_COMM_PS_CLIENT_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/credentials.h"
#include "common/dtype.h"
#include "common/log_sink.h"
#include "common/shard_map.h"
#include "common/trace.h"
#include "grpcpp/generic/generic_stub.h"
#include "proto/ps.grpc.pb.h"
#include "worker/comm/gradient_readiness.h"
#include "worker/comm/step_sync.h"

namespace dptrain {

struct PsClientOptions {
  std::vector<std::string> shard_addresses;  // "host:port", in shard order.
  std::string job_id = "dptrain";
  int rank = 0;
  int world_size = 1;
  std::vector<TensorInfo> tensors;  // The model's parameters, in order.
  int64_t max_chunk_elements = int64_t{1} << 20;
  absl::Duration connect_timeout = absl::Seconds(30);
  // Per call. Longer than the servers' --step_timeout, so that their error (which names the
  // missing ranks) arrives first.
  absl::Duration rpc_timeout = absl::Minutes(10);
  // If > 0, the learning rate the worker expects; a shard applying another one is an error.
  double expected_learning_rate = 0;
  // The optimizer settings this worker was given explicitly: a shard applying others is
  // refused (FailedPrecondition naming both). The name ("" : any) and, by the flag's name,
  // "momentum", "weight_decay", "beta1", "beta2", "eps", "warmup_steps" values; and the
  // schedule's name ("": any).
  std::string expected_optimizer;
  std::map<std::string, double> expected_optimizer_values;
  std::string expected_lr_schedule;
  // Where the steps' calls are traced, one track pair per shard (push; wait, pull). Not owned.
  TraceRecorder* trace = nullptr;
  // TLS and the job token of every call (default: plaintext).
  std::shared_ptr<const Credentials> credentials = Credentials::Plaintext();
  // Shards holding at least this many bytes of the model use the tensor stream.
  int64_t stream_min_bytes = int64_t{1} << 20;
  // How long a step that lost a shard (UNAVAILABLE), or found it gone back (ABORTED,
  // OUT_OF_RANGE), keeps trying to recover before it fails; 0: it fails at once.
  absl::Duration reconnect_timeout = absl::Seconds(60);
  LogSink log = StderrLog();  // Recovery is reported here.
  // What the gradients travel as (--wire_dtype): kFp32, or kBf16/kFp16 (rounded to nearest
  // even here, widened by the shards, which sum and keep fp32: half the bytes pushed).
  DType wire_dtype = DType::kFp32;
};

class PsClient final : public ParameterStore {
 public:
  // Connects to every shard and checks that each is the shard its position says, for the
  // same shard count and world size. Unavailable if a shard cannot be reached within
  // connect_timeout; FailedPrecondition on a mismatch; InvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<PsClient>> Connect(const PsClientOptions& options);

  // Rank 0 initialises every shard (a repeat of the job's Init is recognised), then every
  // rank pulls the current weights: a rank that rejoins a running job resumes at the step
  // the shards are at (resume_step()).
  absl::Status Start(absl::Span<float> weights) override;
  int64_t resume_step() const override { return resume_step_; }
  // BSP: the greatest common divisor of the shards' checkpoint intervals (each can only go
  // back to a step it checkpointed); 0 without checkpoints or under SSP/async.
  int64_t rewind_interval() const override { return rewind_interval_; }
  // The step is skipped when any shard says so (BSP: some rank flagged it).
  // Recovery (reconnect_timeout > 0): a step that failed because a shard went away or went
  // back is retried with backoff until every shard answers again. If every shard is still at
  // `step` or past it and none went back, the same gradient is pushed again (a shard never
  // counts a push twice); if one came back from an older checkpoint (BSP), every shard is
  // rolled back to the oldest step they are at in a new incarnation of the job
  // (RollbackRequest), its weights are pulled, and the answer is rewind_to = that step. A
  // rank that finds another went back first joins that incarnation, at its step: two ranks
  // never send each other's progress back. The first failure of a step's calls cancels the
  // others (cancellation.h). `gradient_and_flag` is left unchanged. A shard that came back without
  // its model (no checkpoint) is FailedPrecondition; no recovery within the timeout is Unavailable
  // naming the last error.
  absl::StatusOr<StepOutcome> PushPull(int64_t step, absl::Span<float> gradient_and_flag,
                                       absl::Span<float> weights) override;
  // The same while backward still computes `gradient_and_flag`: a chunk leaves once `ready`
  // covers it (the flag must be set before the call). A cancelled `ready`, or one not
  // complete within the call's timeout, ends the step with Cancelled / DeadlineExceeded.
  absl::StatusOr<StepOutcome> PushPull(int64_t step, absl::Span<float> gradient_and_flag,
                                       absl::Span<float> weights, GradientReadiness* ready);
  // Through shard 0 (retried like a step while shard 0 is away).
  absl::Status AverageBuffers(int64_t round, absl::Span<float> buffers) override;
  // Through shard 0 as well, which keeps every rank's statistics with its checkpoints:
  // KeepBuffers sends only at shard 0's checkpoint steps (BSP), and does nothing otherwise.
  absl::Status KeepBuffers(int64_t step, absl::Span<const float> buffers, bool epoch_end) override;
  absl::Status RestoreBuffers(int64_t step, absl::Span<float> buffers) override;
  CommStats stats() const override { return stats_; }

  const ShardMap& shard_map() const { return map_; }
  // The shards' learning rate when it is the same at every step (a constant schedule without
  // warmup); 0 otherwise (a schedule: only the shards know the rate of a step).
  double constant_learning_rate() const { return constant_learning_rate_; }
  // Rolls every shard back to `step` (BSP, each needs its checkpoint of it), then pulls its
  // weights; what PushPull does when a shard came back from an older checkpoint, for a
  // caller that learnt of an older step elsewhere (the sparse tables of the same shards).
  // Joins the incarnation another rank opened at `step`, or opens a new one.
  absl::Status Rewind(int64_t step, absl::Span<float> weights, absl::Duration timeout);

 private:
  PsClient(const PsClientOptions& options, ShardMap map);

  // Fills a request's model description.
  template <typename Request>
  void Describe(Request& request) const;
  // Copies the weights of shard s's chunks out of `response` into `weights`.
  absl::Status Unpack(int s, const proto::PullResponse& response, absl::Span<float> weights);
  // One attempt of PushPull.
  absl::StatusOr<StepOutcome> PushPullOnce(int64_t step, absl::Span<const float> gradient_and_flag,
                                           GradientReadiness* ready, absl::Span<float> weights);
  // Pulls every shard's weights into `weights`; returns the lowest version.
  absl::StatusOr<int64_t> PullAll(absl::Span<float> weights, absl::Duration timeout);
  // Where going back leads (BSP): the incarnation of the job and its first step.
  struct RewindTarget {
    int64_t incarnation = 0;
    int64_t step = 0;
  };
  // Whether the shard counts this rank's pushes (it is in the shard's incarnation there).
  bool Admitted(const proto::ShardInfoResponse& info) const;
  // Into the newest incarnation if no step of it completed yet and every shard can get to
  // its first step (a rank opened it, and this one is not in it on every shard); otherwise
  // into a new one from `step`.
  RewindTarget ChooseRewind(const std::vector<proto::ShardInfoResponse>& infos, int64_t step) const;
  // Sends every shard into `target` (Rollback) and pulls the weights of its step; this rank
  // is then in that incarnation. Aborted if a shard is elsewhere after it.
  absl::Status RewindTo(const RewindTarget& target, absl::Span<float> weights,
                        absl::Duration timeout);
  // Every shard's info (GetShardInfo), within `timeout`.
  absl::StatusOr<std::vector<proto::ShardInfoResponse>> Infos(absl::Duration timeout);
  // Calls shard 0 through `call`, retried with backoff while it is away (UNAVAILABLE) for up
  // to reconnect_timeout; the error names `method` and the address.
  absl::Status CallShard0(absl::string_view method,
                          const std::function<grpc::Status(grpc::ClientContext&)>& call);

  PsClientOptions options_;
  ShardMap map_;
  std::vector<std::unique_ptr<proto::ParameterServer::Stub>> stubs_;
  std::vector<std::unique_ptr<grpc::GenericStub>> stream_stubs_;  // The tensor stream.
  // Unary shards: one reusable request each, keys filled once; only the bytes change.
  std::vector<proto::PushPullRequest> push_requests_;
  std::vector<uint16_t> narrowed_;  // The gradient in options_.wire_dtype, when 16-bit.
  std::vector<proto::PullResponse> responses_;
  CommStats stats_;
  bool bsp_ = true;  // The shards' sync policy is BSP (versions are steps).
  int64_t resume_step_ = 0;
  int64_t incarnation_ = 0;  // Of the job, as this rank last went back (RewindTarget).
  int64_t rewind_interval_ = 0;
  int64_t buffer_interval_ = 0;
  double constant_learning_rate_ = 0;  // Shard 0's checkpoint interval under BSP; 0: none.
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_COMM_PS_CLIENT_H_
