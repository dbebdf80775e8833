// Fuzzes the shard checkpoint reader (server/checkpoint) and what a restarting shard does
// with a checkpoint that reads back valid (ValidateModel, then ShardStore::Restore), the
// path from a file on disk to the shard's state. Input: the file's bytes, read with the
// checksum verified and without (almost every mutation breaks the CRC, so only the second
// reaches the manifest and tensor checks behind it). Checks: errors are DataLoss (truncated,
// corrupt, checksum) or InvalidArgument (not this format) only; a file that reads back valid
// with the checksum reads the same without it; a valid checkpoint serialises back to one that
// parses to the same step and chunk count; Restore either succeeds with every chunk's weights
// in place or fails without a crash.
#include <cstdint>
#include <string>

#include "server/checkpoint.h"
#include "server/model_limits.h"
#include "server/shard_store.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<dptrain::ShardCheckpoint> verified = dptrain::ParseCheckpoint(bytes);
  dptrain::ParseCheckpointOptions unverified;
  unverified.verify_checksum = false;
  absl::StatusOr<dptrain::ShardCheckpoint> cp = dptrain::ParseCheckpoint(bytes, unverified);
  if (!verified.ok()) {
    FUZZ_CHECK(absl::IsDataLoss(verified.status()) || absl::IsInvalidArgument(verified.status()));
  } else {
    FUZZ_CHECK(cp.ok() && cp->step == verified->step &&
               cp->chunks.size() == verified->chunks.size());
  }
  if (!cp.ok()) {
    FUZZ_CHECK(absl::IsDataLoss(cp.status()) || absl::IsInvalidArgument(cp.status()));
    return 0;
  }
  absl::StatusOr<std::string> again = dptrain::SerializeCheckpoint(*cp);
  if (again.ok()) {
    absl::StatusOr<dptrain::ShardCheckpoint> back = dptrain::ParseCheckpoint(*again);
    FUZZ_CHECK(back.ok());
    FUZZ_CHECK(back->step == cp->step && back->chunks.size() == cp->chunks.size());
  }
  dptrain::ModelLimits limits;
  limits.max_model_bytes = int64_t{1} << 24;  // What a fuzzer may make the store allocate.
  limits.max_chunks = 1 << 10;
  if (!dptrain::ValidateModel(cp->model, limits).ok()) return 0;
  dptrain::OptimizerOptions o;
  o.name = cp->optimizer == "adam" || cp->optimizer == "adamw" ? cp->optimizer : "sgd";
  auto optimizer = dptrain::CreateOptimizer(o);
  FUZZ_CHECK(optimizer.ok());
  if (cp->shard < 0 || cp->shard >= cp->num_shards || cp->num_shards > 64) return 0;
  dptrain::ShardStore store(cp->shard, cp->num_shards, optimizer->get());
  if (store.Restore(*cp).ok()) {
    FUZZ_CHECK(store.initialized());
    FUZZ_CHECK(store.num_chunks() == static_cast<int>(cp->chunks.size()));
    for (int slot = 0; slot < store.num_chunks(); ++slot) {
      FUZZ_CHECK(store.weights(slot).size() == cp->chunks[slot].weights.size());
    }
  }
  return 0;
}
