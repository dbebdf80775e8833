// Row-sparse embedding tables on the parameter-server shards (server/sparse_table.h): which
// shard owns a row, and a row's initial values. Both are pure functions, so a table is never
// sent anywhere at its start and every process (a shard creating a row on first touch, a test
// building its reference) computes the same numbers.
#ifndef DPTRAIN_COMMON_SPARSE_ROWS_H_
#define DPTRAIN_COMMON_SPARSE_ROWS_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace dptrain {

// The shard that holds `row` of every table: row mod num_shards (rows >= 0, num_shards >= 1).
int RowShard(int64_t row, int num_shards);

// Row `row` of table `table` at its start: out.size() values drawn from N(0, 1) (as
// nn.Embedding starts) by a counter-based generator keyed by (seed, table, row, index).
void InitialRow(uint64_t seed, absl::string_view table, int64_t row, absl::Span<float> out);

}  // namespace dptrain

#endif  // DPTRAIN_COMMON_SPARSE_ROWS_H_
