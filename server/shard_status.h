// The status view of a shard: what GetShardInfo answers, the JSON of /status on the metrics
// port, and the one line `ps_status` prints per shard.
#ifndef DPTRAIN_SERVER_SHARD_STATUS_H_
#define DPTRAIN_SERVER_SHARD_STATUS_H_

#include <string>

#include "proto/ps.pb.h"
#include "server/parameter_shard.h"

namespace dptrain {

// Fills `response` from the shard's options and current Info.
void FillShardInfo(const ParameterShard& shard, proto::ShardInfoResponse* response);

// The same as a JSON object (nlohmann-json; field names as in the proto).
std::string ShardInfoJson(const proto::ShardInfoResponse& info);

// One line: shard, job, version, each rank's step, the slowest rank, staleness, checkpoints.
std::string ShardStatusLine(const proto::ShardInfoResponse& info);

// A shard's sparse tables (SparseTables.Status): one line each for ps_status ("  sparse
// table 'x': step ..."), or a JSON array of objects (field names as in the proto).
std::string SparseTableLine(const proto::SparseTableStatus& table);
std::string SparseTablesJson(const proto::SparseStatusResponse& tables);

}  // namespace dptrain

#endif  // DPTRAIN_SERVER_SHARD_STATUS_H_
