// How a gpu_worker synchronises, built from its WorkerConfig: one factory per mode (ps:
// a PsClient to the shards; master: rank 0's embedded reducer and a client to it; allreduce:
// the ring, with the optimizer sharded over it or applied by every replica). This is part of
// the composition root: master mode embeds server/'s PsServer.
#ifndef DPTRAIN_WORKER_SYNC_FACTORY_H_
#define DPTRAIN_WORKER_SYNC_FACTORY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/credentials.h"
#include "common/file_system.h"
#include "common/metrics.h"
#include "common/trace.h"
#include "server/ps_server.h"
#include "worker/comm/allreduce_group.h"
#include "worker/ring_checkpoints.h"
#include "worker/trainer.h"
#include "worker/worker_config.h"

namespace dptrain {

// What the model and the process add to the configuration.
struct SyncSetup {
  // allreduce mode: the replicas apply the averaged gradient themselves (a GradientReducer
  // and Model::ApplyUpdate), else the ring shards the optimizer (ShardedRingStore).
  bool replicas_apply = false;
  bool on_gpu = false;  // The model's weights are on a GPU.
  std::vector<TensorInfo> tensors;
  std::shared_ptr<const Credentials> credentials;  // Of every server and channel.
  TraceRecorder* trace = nullptr;                  // --trace_out; not owned.
  MetricsRegistry* metrics = nullptr;              // The worker's; not owned.
};

// The synchroniser and what keeps it alive.
struct Sync {
  std::unique_ptr<PsServer> master;       // master mode, rank 0: the reducer.
  std::unique_ptr<AllReduceGroup> group;  // allreduce mode: peers and rendezvous.
  OwnedStepSync sync;
  std::string description;
  PosixFileSystem fs;                       // Of `saves`.
  std::unique_ptr<RingCheckpointer> saves;  // allreduce mode with --save_dir.
  bool resume = false;                      // --resume, with `saves`.
  // ps mode: the shards' rate when every step has the same (for the metrics); 0: unknown.
  double shard_learning_rate = 0;
};

// Connects (or starts) the mode's synchroniser into `out`. Errors name the flag or the peer.
absl::Status MakeSync(const WorkerConfig& config, const SyncSetup& setup, Sync& out);

// master mode, rank 0, after its last step: waits (up to --step_timeout) until every rank has
// pushed that step too, so that the reducer outlives the job (under SSP or async rank 0 may
// finish first). Nothing to do elsewhere. DeadlineExceeded naming the ranks behind.
absl::Status DrainMaster(const WorkerConfig& config, Sync& sync);

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_SYNC_FACTORY_H_
