// Checkpoints of the row-sparse embedding tables (server/sparse_table.h) of one shard: the
// rows the shard holds (only those ever touched) with their optimizer state and the table's
// step, one file per table and step:
//   DIR/shard-<s>-sparse-<table>-step-<012d step>.dptsparse
// Layout: "DPTSPRS1", the manifest's length (u64 LE) and the manifest (JSON: format version,
// job id, shard, shard count, step, row count and the table's spec), then the row ids (i64),
// the weights (f32, rows x dim), the optimizer state (adagrad: the sums; adam: exp_avg,
// exp_avg_sq, f32 rows x dim, and the per-row step counts, i64) and a CRC-32 (zlib) of
// everything before it. The row ids are 64-bit, which safetensors' F32-only reader here
// (common/safetensors.h) does not hold; hence a format of its own, as small as the job needs.
// A write goes to a temporary file, is fsynced and renamed (as server/checkpoint.h's).
#ifndef DPTRAIN_SERVER_SPARSE_CHECKPOINT_H_
#define DPTRAIN_SERVER_SPARSE_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/file_system.h"
#include "common/log_sink.h"
#include "server/sparse_table.h"

namespace dptrain {

std::string SerializeSparseCheckpoint(const SparseTableCheckpoint& checkpoint);
// DataLoss for a checksum mismatch or a truncated file, InvalidArgument for content that is
// not a sparse table checkpoint. Never crashes on any input.
absl::StatusOr<SparseTableCheckpoint> ParseSparseCheckpoint(absl::string_view bytes);

// The sparse tables' checkpoints of one shard in one directory. Thread-compatible.
class SparseCheckpointDir {
 public:
  // `fs` is not owned. Removes temporary files a crash left behind.
  static absl::StatusOr<SparseCheckpointDir> Open(const std::string& dir, int shard, int keep,
                                                  FileSystem* fs, LogSink log);

  // Writes atomically under the table's name and step, then keeps the table's newest `keep`.
  absl::Status Write(const SparseTableCheckpoint& checkpoint);
  // Table name -> its checkpointed steps, newest first (validity not checked).
  absl::StatusOr<std::map<std::string, std::vector<int64_t>>> Tables();
  // The newest checkpoint of `table` that reads back valid (invalid ones are skipped with a
  // log line); NotFound if there is none.
  absl::StatusOr<SparseTableCheckpoint> LoadNewest(const std::string& table);
  // The checkpoint of exactly `step`: NotFound naming the steps there are, or its error.
  absl::StatusOr<SparseTableCheckpoint> Load(const std::string& table, int64_t step);
  std::string PathOf(const std::string& table, int64_t step) const;

 private:
  SparseCheckpointDir(std::string dir, int shard, int keep, FileSystem* fs, LogSink log)
      : dir_(std::move(dir)), shard_(shard), keep_(keep), fs_(fs), log_(std::move(log)) {}
  absl::StatusOr<SparseTableCheckpoint> Read(const std::string& table, int64_t step);

  std::string dir_;
  int shard_ = 0;
  int keep_ = 3;
  FileSystem* fs_ = nullptr;
  LogSink log_;
};

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_SPARSE_CHECKPOINT_H_
