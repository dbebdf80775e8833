// Shard checkpoints: what a restarted ps_server needs to resume exactly where a step ended.
//
// Format (documented in docs/checkpoints.md): one safetensors file per checkpoint,
//   DIR/shard-<s>-step-<012d step>.safetensors
// holding, for every chunk the shard owns, the F32 tensors
//   chunk/<tensor_id>/<chunk_index>/weights
//   chunk/<tensor_id>/<chunk_index>/momentum_buffer | exp_avg | exp_avg_sq   (when present)
// and two metadata entries: "dptrain_manifest" (JSON: format version, job id, shard, shard
// count, init fingerprint, model description, optimizer, sync policy, step, and per chunk its
// version and optimizer step count) and "dptrain_crc32" (CRC-32 of the manifest followed by
// the whole data section), so a truncated or corrupted file is detected, never loaded.
// A write goes to a temporary file, is fsynced, renamed over the final name and the
// directory is fsynced: a crash leaves the previous checkpoint usable.
#ifndef DPTRAIN_SERVER_CHECKPOINT_H_
#define DPTRAIN_SERVER_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_system.h"
#include "common/log_sink.h"
#include "common/optimizer.h"
#include "server/model_limits.h"

namespace dptrain {

struct ChunkCheckpoint {
  int tensor_id = 0;
  int chunk_index = 0;
  int64_t version = 0;
  std::vector<float> weights;
  OptimizerState state;
};

struct ShardCheckpoint {
  std::string job_id;
  int shard = 0;
  int num_shards = 1;
  uint64_t init_fingerprint = 0;
  ModelDescription model;
  std::string optimizer;  // OptimizerOptions::name.
  std::string policy;     // "bsp", "ssp" or "async".
  // The step every worker had completed on this shard when it was taken (BSP: every chunk's
  // version).
  int64_t step = 0;
  std::vector<ChunkCheckpoint> chunks;  // In the shard's chunk order.
  // The job's world size and every rank's batch-norm running statistics (world_size equal
  // parts): in all-reduce mode (gpu_worker --save_dir, rank 0's checkpoint of the ring) in the
  // order of the ring's segments (common/ring_allreduce.h); in a BSP shard's, in rank order,
  // as the workers handed them in (rank_buffers.h). 0 and empty when there are none.
  int world_size = 0;
  std::vector<float> buffers;
};

absl::StatusOr<std::string> SerializeCheckpoint(const ShardCheckpoint& checkpoint);

struct ParseCheckpointOptions {
  // false skips the CRC comparison (leveldb's ReadOptions::verify_checksums): for the fuzzer,
  // so that its mutations reach the manifest and tensor checks behind the checksum. Every
  // reader of a file on disk keeps it true.
  bool verify_checksum = true;
};
// DataLoss for a checksum mismatch or a truncated file; InvalidArgument for content that is
// not a shard checkpoint of this format. Never crashes on any input.
absl::StatusOr<ShardCheckpoint> ParseCheckpoint(absl::string_view bytes,
                                                const ParseCheckpointOptions& options = {});

struct CheckpointDirOptions {
  std::string dir;
  int shard = 0;
  int keep = 3;                  // Newest checkpoints kept; older ones are removed.
  FileSystem* fs = nullptr;      // Not owned.
  LogSink log = StderrLog();     // A skipped (invalid) checkpoint is reported here.
};

// The checkpoints of one shard in one directory. Thread-compatible.
class CheckpointDir {
 public:
  // Creates the directory if needed and removes temporary files a crash left behind.
  static absl::StatusOr<CheckpointDir> Open(const CheckpointDirOptions& options);

  // Writes `checkpoint` atomically under its step, then keeps the newest `keep`.
  absl::Status Write(const ShardCheckpoint& checkpoint);
  // The newest checkpoint that reads back valid; invalid ones are skipped with a log line.
  // NotFound if there is none.
  absl::StatusOr<ShardCheckpoint> LoadNewest();
  // The checkpoint of exactly `step`: NotFound naming the steps there are, or its error.
  absl::StatusOr<ShardCheckpoint> Load(int64_t step);
  // Steps with a checkpoint file, newest first (validity not checked).
  absl::StatusOr<std::vector<int64_t>> Steps();
  std::string PathOf(int64_t step) const;

 private:
  explicit CheckpointDir(const CheckpointDirOptions& options) : options_(options) {}
  absl::StatusOr<ShardCheckpoint> Read(int64_t step);

  CheckpointDirOptions options_;
};

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_CHECKPOINT_H_
