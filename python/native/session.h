// One process of a dptrain.torch job (python/dptrain/torch): what a PyTorch script gets from
// the same synchronisers gpu_worker uses, behind plain spans of fp32 values.
//
//   - Generic collectives among the workers (Broadcast, AllReduce, CheckSame) run on a ring
//     (worker/comm/allreduce_group.h: rendezvous at rank 0's master address and port, then
//     TCP links), formed at Create in allreduce mode and at the first collective otherwise.
//   - The gradient average of DistributedOptimizer (RegisterGradients, then ReduceGradients
//     once per step) goes through the job's mode: the ring (allreduce), the parameter-server
//     shards (ps; they run ps_server --optimizer=none and answer each push with the mean
//     gradient) or a reducer that rank 0 hosts on its master port + 1 (master; the same
//     average-only shard, in-process).
//   - ServerOptimizer (ps mode): StartServer, then PushPull once per step, through the shards'
//     own optimizer (their weights come back), with BSP/SSP/async, checkpoints and recovery
//     as gpu_worker has them.
//
// Every call is collective unless it says otherwise: every rank makes the same calls in the
// same order, with the same sizes (CheckSame verifies descriptions). Errors are Status with
// one-line messages; a peer that died or stopped answering fails the call within `timeout`
// naming its rank. Not thread-safe: one thread at a time (the Python side serialises calls on
// its communication thread).
#ifndef DPTRAIN_PYTHON_NATIVE_SESSION_H_
#define DPTRAIN_PYTHON_NATIVE_SESSION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/credentials.h"
#include "common/dtype.h"
#include "common/shard_map.h"
#include "proto/ps.pb.h"
#include "worker/comm/gradient_readiness.h"
#include "worker/comm/step_sync.h"

namespace dptrain {

class AllReduceGroup;
class AllReduceSync;
class PsClient;
class PsServer;
class SparseClient;

struct SessionOptions {
  std::string mode = "allreduce";  // "allreduce", "ps" or "master".
  int rank = 0;
  int world_size = 1;
  std::string job_id = "dptrain";
  std::vector<std::string> ps;  // ps mode: shard addresses, in shard order.
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // Rank 0 may pick a free one (0); the others need rank 0's.
  std::string bind_address = "0.0.0.0";
  std::string advertise_host;  // Where peers reach this rank; empty: toward master_addr.
  SecurityOptions security;    // Files; none: plaintext.
  // Longest wait for one message or step of the others (a dead peer fails the call after it).
  absl::Duration timeout = absl::Seconds(60);
  absl::Duration connect_timeout = absl::Seconds(60);  // Rendezvous, shards, the reducer.
  // ps mode: how long a step rides out a shard that went away (ServerOptimizer).
  absl::Duration reconnect_timeout = absl::Seconds(60);
  // What the gradients travel as (PsClientOptions::wire_dtype; the ring's NarrowingLink).
  DType wire_dtype = DType::kFp32;
};

class Session {
 public:
  // Validates the options and loads the security files; allreduce mode forms the ring, master
  // mode's rank 0 starts the reducer. InvalidArgument for bad options (naming them).
  static absl::StatusOr<std::unique_ptr<Session>> Create(const SessionOptions& options);
  ~Session();

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  const std::string& mode() const { return options_.mode; }
  // Rank 0's master port (the rendezvous), once it listens; 0 before.
  int master_port() const { return master_port_; }

  // `data` of rank `root` reaches every rank bit for bit (any dtype, viewed as fp32 words).
  absl::Status Broadcast(absl::Span<float> data, int root);
  // The sum over ranks (or the mean, `average`), the same bits on every rank. A `gradient`
  // (DistributedOptimizer's buckets) travels as options().wire_dtype.
  absl::Status AllReduce(absl::Span<float> data, bool average, bool gradient = false);
  // Every rank's `description` of `what` equals rank 0's: OK, or on every rank a
  // FailedPrecondition; the rank that differs names the first differing line of both.
  absl::Status CheckSame(const std::string& what, const std::string& description);

  // DistributedOptimizer: the gradient's tensors (names and element counts, in the order the
  // flat buffer lays them out). Checks them across ranks (CheckSame), then connects the
  // mode's synchroniser. Once per session.
  absl::Status RegisterGradients(const std::vector<TensorInfo>& tensors);
  // `gradient_and_flag`: the registered tensors back to back, then one slot that is non-zero
  // if this rank's gradient overflowed. On return it holds the mean over ranks; skipped when
  // some rank flagged or the mean has inf/NaN (then the values are undefined: the caller
  // skips the step on every rank).
  absl::StatusOr<bool> ReduceGradients(absl::Span<float> gradient_and_flag);
  // The same in three parts, so that ps and master mode push while backward runs:
  // BeginReduce starts the step's push on a thread of its own with nothing final yet (the
  // flag slot must be set); ReadyUpTo(n) says that the first n values are final (backward
  // produces them in that order), and a chunk leaves for its shard once they cover it;
  // EndReduce waits, leaves the mean in place and returns what ReduceGradients would.
  // CancelReduce (backward failed) ends the push without any shard counting it; EndReduce
  // then returns Cancelled. FailedPrecondition in allreduce mode, for a lone process, or out
  // of order.
  absl::Status BeginReduce(absl::Span<float> gradient_and_flag);
  void ReadyUpTo(int64_t n);
  void CancelReduce();
  absl::StatusOr<bool> EndReduce();

  // ServerOptimizer (ps mode): the shards apply their own optimizer. Rank 0's `weights`
  // initialise the shards (a job in progress keeps its own), then every rank pulls the
  // current weights into `weights`; returns the step the job is at (a rejoining worker
  // resumes there). Once per session, instead of RegisterGradients.
  absl::StatusOr<int64_t> StartServer(const std::vector<TensorInfo>& tensors,
                                      absl::Span<float> weights);
  // Pushes `gradient_and_flag` of `step` and pulls the new weights into `weights`.
  absl::StatusOr<StepOutcome> PushPull(int64_t step, absl::Span<float> gradient_and_flag,
                                       absl::Span<float> weights);

  // Row-sparse embedding tables on the shards of DPTRAIN_PS (in any mode: the dense part
  // keeps the job's mode), worker/comm/sparse_client.h; FailedPrecondition without shards.
  // Declare returns the table's next step.
  absl::StatusOr<int64_t> SparseDeclare(const proto::SparseTableSpec& table);
  absl::Status SparsePull(const std::string& table, int dim, absl::Span<const int64_t> ids,
                          absl::Span<float> out);
  absl::Status SparsePush(const std::string& table, int dim, int64_t step,
                          absl::Span<const int64_t> ids, absl::Span<const float> grads);
  // After a shard restart: the table's lowest next step over the shards, and every shard's
  // table back to `step` (SparseClient::Steps, Rollback).
  absl::StatusOr<int64_t> SparseStep(const std::string& table);
  absl::Status SparseRollback(const std::string& table, int64_t step);
  // ServerOptimizer: every shard back to `step`, its weights into `weights` (PsClient::Rewind).
  absl::Status Rewind(int64_t step, absl::Span<float> weights);

 private:
  explicit Session(const SessionOptions& options);
  absl::Status EnsureRing();
  uint64_t NextTag();
  absl::StatusOr<std::unique_ptr<PsClient>> ConnectStore(const std::vector<TensorInfo>& tensors,
                                                         bool server_optimizer);

  const SessionOptions options_;
  std::shared_ptr<const Credentials> credentials_;
  std::unique_ptr<AllReduceGroup> ring_;          // Null until formed (and for world size 1).
  std::unique_ptr<PsServer> reducer_;             // master mode, rank 0.
  std::unique_ptr<AllReduceSync> gradient_ring_;  // allreduce mode, after RegisterGradients.
  std::unique_ptr<PsClient> store_;               // ps/master, after RegisterGradients/StartServer.
  std::unique_ptr<SparseClient> sparse_;          // After the first SparseDeclare.
  int master_port_ = 0;
  uint64_t sequence_ = 0;       // Of the collectives on the ring.
  int64_t gradient_step_ = -1;  // -1: RegisterGradients not called.
  int64_t size_ = 0;            // Registered elements.
  // BeginReduce .. EndReduce.
  std::unique_ptr<GradientReadiness> readiness_;
  std::thread reduce_thread_;
  absl::StatusOr<StepOutcome> reduced_;
  std::vector<float> mean_;
  absl::Span<float> reducing_;
};

}  // namespace dptrain

#endif  // DPTRAIN_PYTHON_NATIVE_SESSION_H_
