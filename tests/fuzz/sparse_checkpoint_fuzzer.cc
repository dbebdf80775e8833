// Fuzzes the sparse tables' checkpoint reader (server/sparse_checkpoint.h) and a table's
// Restore from what it accepts: the path from a file on disk to a restarted shard's rows.
// Input: a checkpoint without its trailing CRC-32, which the target appends (almost every
// mutation would break the checksum, so the parser behind it would never be reached); the
// bytes are also parsed as they are. Checks: errors are DataLoss or InvalidArgument only;
// a checkpoint that parses serialises back to bytes that parse to the same rows; restoring
// it into a table of its spec succeeds and the table then holds exactly its rows.
#include <zlib.h>

#include <cstdint>
#include <string>

#include "server/sparse_checkpoint.h"
#include "server/sparse_table.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  const uint32_t crc = static_cast<uint32_t>(
      crc32_z(crc32_z(0, nullptr, 0), reinterpret_cast<const Bytef*>(body.data()), body.size()));
  std::string with_crc = body;
  with_crc.append(reinterpret_cast<const char*>(&crc), sizeof(crc));
  const std::string& bytes = with_crc;
  for (const std::string* input : {&body, &bytes}) {
    absl::StatusOr<dptrain::SparseTableCheckpoint> cp = dptrain::ParseSparseCheckpoint(*input);
    if (!cp.ok()) {
      FUZZ_CHECK(absl::IsDataLoss(cp.status()) || absl::IsInvalidArgument(cp.status()));
      continue;
    }
    const std::string again = dptrain::SerializeSparseCheckpoint(*cp);
    absl::StatusOr<dptrain::SparseTableCheckpoint> back = dptrain::ParseSparseCheckpoint(again);
    FUZZ_CHECK(back.ok() && back->ids == cp->ids && back->step == cp->step);
    if (cp->spec.dim > 4096 || cp->ids.size() > (1u << 16)) continue;  // Bounded work.
    dptrain::SparseTableOptions options;
    options.shard = cp->shard;
    options.num_shards = cp->num_shards;
    dptrain::SparseTable table(cp->spec, options);
    FUZZ_CHECK(table.Restore(&*cp).ok());
    FUZZ_CHECK(table.rows_held() == static_cast<int64_t>(cp->ids.size()));
    FUZZ_CHECK(table.step() == cp->step);
  }
  return 0;
}
