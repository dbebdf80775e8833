// All-reduce mode's checkpoints (gpu_worker --mode=allreduce --save_dir): every --save_every
// steps the ranks all-gather their batch-norm statistics and, where the ring shards the
// optimizer (ShardedRingStore), their optimizer segments; where every replica applies the
// update itself (AllReduceSync + Model::ApplyUpdate) they hold the same state and rank 0's is
// taken from its model. Rank 0 writes them with the weights and the step in the shard
// checkpoint format (server/checkpoint.h); --resume gives every rank rank 0's newest valid one
// (then the weights by the trainer's Start).
//
// Like main.cc, part of gpu_worker's composition root: the one worker library that uses
// server/'s checkpoint format, so that both modes write the same files.
#ifndef DPTRAIN_WORKER_RING_CHECKPOINTS_H_
#define DPTRAIN_WORKER_RING_CHECKPOINTS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/file_system.h"
#include "common/shard_map.h"
#include "server/checkpoint.h"
#include "worker/comm/allreduce_sync.h"
#include "worker/comm/sharded_ring_store.h"
#include "worker/nn/model.h"
#include "worker/trainer.h"

namespace dptrain {

struct RingCheckpointOptions {
  std::string dir;    // Where rank 0 keeps the checkpoints (the other ranks never look).
  int64_t every = 0;  // Steps between checkpoints; 0: none.
  std::string job_id;
  int rank = 0;
  int world_size = 1;
  std::vector<TensorInfo> tensors;  // The model's, in order.
  std::string optimizer;            // OptimizerOptions::name.
  FileSystem* fs = nullptr;         // Not owned.
};

class RingCheckpointer final : public StepCheckpointer {
 public:
  // The ring's sharded optimizer. `store` must outlive the checkpointer. Rank 0 opens (creates)
  // the directory.
  static absl::StatusOr<std::unique_ptr<RingCheckpointer>> Create(
      const RingCheckpointOptions& options, ShardedRingStore* store);
  // The replicas' own optimizer (the model's ExportOptimizerState / ImportOptimizerState, which
  // a device model refuses with Unimplemented at the first save or the resume). `sync` must
  // outlive the checkpointer.
  static absl::StatusOr<std::unique_ptr<RingCheckpointer>> Create(
      const RingCheckpointOptions& options, AllReduceSync* sync);

  // A collective before training: rank 0 loads the newest valid checkpoint into `model`'s
  // weights, and every rank takes its optimizer state, batch-norm statistics and step from it.
  // NotFound (rank 0) when the directory has none; InvalidArgument when it is another job's,
  // model's, optimizer's or world size's. `description` receives a line for the log.
  absl::Status Resume(nn::Model& model, std::string* description);

  // At a multiple of `every`: the collective snapshot, then rank 0's write. A failed write is
  // logged and training goes on (as a parameter shard does); a failed collective stops it.
  absl::Status AfterStep(int64_t next_step, nn::Model& model) override;

 private:
  // The collectives of one kind of ring: a snapshot at `step`, and rank 0's snapshot to every
  // rank's model and sync.
  struct Collectives {
    std::function<absl::StatusOr<RingSnapshot>(int64_t step, nn::Model& model)> snapshot;
    std::function<absl::Status(const RingSnapshot& snapshot, nn::Model& model)> resume;
    std::function<int64_t()> resume_step;
  };
  static absl::StatusOr<std::unique_ptr<RingCheckpointer>> Create(
      const RingCheckpointOptions& options, Collectives collectives);
  RingCheckpointer(const RingCheckpointOptions& options, Collectives collectives,
                   std::optional<CheckpointDir> dir)
      : options_(options), collectives_(std::move(collectives)), dir_(std::move(dir)) {}

  const RingCheckpointOptions options_;
  const Collectives collectives_;
  std::optional<CheckpointDir> dir_;  // Rank 0's.
};

}  // namespace dptrain

#endif  // DPTRAIN_WORKER_RING_CHECKPOINTS_H_
